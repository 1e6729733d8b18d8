"""The rule outcome cache: JSON keyed by code, parameters and inputs; never pickle; a corrupt or
foreign entry is ignored with a note; an edited rule is never answered from the cache."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.cli import main
from traceanalyzer.executor import LocalExecutor
from traceanalyzer.pipeline import analyse

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "store_stall_2rank_rank1_sick"
STALL = "TA002"

VERSIONED_RULE = '''
from traceanalyzer.kit import Requirement, rule


@rule(id="TA190", name="code-version", severity="info", summary="Says which code ran.",
      requires=[Requirement("sessions", ("rank",))])
def code_version(ctx):
    """## What it detects
    x
    ## Why it matters
    x
    ## How to fix
    x
    ## Example
    x
    ## References
    x
    """
    for rank in ctx.sessions()["rank"].unique().to_list():
        yield ctx.finding(rank=rank, title="VERSION", message="m", location={"code": "version"})
'''


def run(out: Path, *args: str) -> dict:
    result = CliRunner().invoke(
        main, ["run", str(SAMPLE), "--out", str(out), "-q", "--executor", "local", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads((out / "findings.json").read_text())


@pytest.fixture
def warm(tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "out"
    return out, run(out)


class _Planted:
    """Unpickling this creates a file: the proof that a pickle was loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_is_never_loaded(warm: tuple[Path, dict], tmp_path: Path) -> None:
    out, first = warm
    marker = tmp_path / "pwned"
    cache = out / ".cache" / "rules"
    for path in (cache / "rank=0.pkl", cache / "rank=1.pkl", cache / "rank=1" / f"{STALL}.pkl"):
        path.write_bytes(pickle.dumps(("key", _Planted(marker))))
    again = run(out)
    assert not marker.exists()
    assert again["findings"] == first["findings"]
    assert all(p.suffix == ".json" for p in (cache / "rank=1").iterdir() if p.stem != STALL)


def test_corrupt_and_foreign_entries_are_ignored_with_a_note(warm: tuple[Path, dict]) -> None:
    out, first = warm
    cache = out / ".cache" / "rules"
    (cache / "rank=1" / f"{STALL}.json").write_text('{"format": "traceanalyzer.rule-outco')
    (cache / "rank=0" / f"{STALL}.json").write_text(json.dumps({"format": "other", "key": 1}))
    again = run(out)
    assert again["findings"] == first["findings"]
    (status,) = [r for r in again["rules"] if r["rule"] == STALL]
    notes = " | ".join(n["text"] for n in status["notes"])
    assert f"rank 1: cached outcome .cache/rules/rank=1/{STALL}.json ignored, corrupt" in notes
    assert "rank 0: cached outcome" in notes and "ignored, not a traceanalyzer outcome" in notes
    # evaluated again, and the entries are sound once more
    assert "ignored" not in json.dumps(run(out)["rules"])


def test_a_changed_parameter_re_evaluates_only_that_rule(warm: tuple[Path, dict]) -> None:
    out, _ = warm
    cache = out / ".cache" / "rules" / "rank=1"
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    changed = run(out, "--set", "store-transfer-stall.min_fraction=0.999")
    after = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert not [f for f in changed["findings"] if f["rule"] == STALL]
    assert before[f"{STALL}.json"] != after[f"{STALL}.json"]
    assert all(before[name] == after[name] for name in before if name != f"{STALL}.json")


def test_an_edited_rule_is_never_answered_from_the_cache(tmp_path: Path) -> None:
    """In one long-lived process (a notebook), then in a fresh one: the edited code's text."""
    rules = tmp_path / "rules"
    rules.mkdir()
    rule_file = rules / "code_version.py"
    out = tmp_path / "out"

    def titles() -> set[str]:
        analysis = analyse(SAMPLE, out, executor=LocalExecutor(), rule_dirs=[rules])
        assert analysis.findings is not None
        return {f.title for f in analysis.findings.findings if f.name == "code-version"}

    rule_file.write_text(VERSIONED_RULE.replace("VERSION", "first code"))
    assert titles() == {"first code"}
    rule_file.write_text(VERSIONED_RULE.replace("VERSION", "edited code"))
    assert titles() == {"edited code"}
    fresh = run(out, "--rules", str(rules))
    assert {f["title"] for f in fresh["findings"] if f["name"] == "code-version"} == {"edited code"}
