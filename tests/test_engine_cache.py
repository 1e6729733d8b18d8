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
    (cache / "rank=1").mkdir()
    for path in (cache / "rank=0.pkl", cache / "rank=1.pkl", cache / "rank=1" / f"{STALL}.pkl"):
        path.write_bytes(pickle.dumps(("key", _Planted(marker))))
    again = run(out)
    assert not marker.exists()
    assert again["findings"] == first["findings"]


def test_corrupt_and_foreign_entries_are_ignored_with_a_note(warm: tuple[Path, dict]) -> None:
    out, first = warm
    cache = out / ".cache" / "rules"
    (cache / "rank=1.json").write_text('{"format": "traceanalyzer.rule-outco')  # torn
    doc = json.loads((cache / "rank=0.json").read_text())
    doc["rules"][STALL]["outcome"] = {"rule": STALL, "status": "evaluated"}  # not ours
    (cache / "rank=0.json").write_text(json.dumps(doc))
    again = run(out)
    assert again["findings"] == first["findings"]
    (status,) = [r for r in again["rules"] if r["rule"] == STALL]
    notes = " | ".join(n["text"] for n in status["notes"])
    assert "rank 1: cached outcome in .cache/rules/rank=1.json ignored, corrupt" in notes
    assert "rank 0: cached outcome in .cache/rules/rank=0.json ignored, corrupt (KeyError" in notes
    # evaluated again, and the entries are sound once more
    assert "ignored" not in json.dumps(run(out)["rules"])


class _Recording(LocalExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[tuple] = []

    def _map(self, fn, args, width, timeouts):  # noqa: ANN001, ANN201
        self.tasks += args
        return super()._map(fn, args, width, timeouts)


def test_a_changed_parameter_re_evaluates_only_that_rule(warm: tuple[Path, dict]) -> None:
    from traceanalyzer.engine.loader import load_rules
    from traceanalyzer.engine.shards import evaluate_store

    out, _ = warm
    executor = _Recording()
    overrides = ["store-transfer-stall.min_fraction=0.999"]
    changed = evaluate_store(out, executor, load_rules(), overrides=overrides, config_path=False)
    assert not [f for f in changed.findings if f.rule == STALL]
    assert sorted((task[5], task[3]) for task in executor.tasks) == [
        ((0,), (STALL,)),
        ((1,), (STALL,)),
    ]
    executor.tasks.clear()
    evaluate_store(out, executor, load_rules(), overrides=overrides, config_path=False)
    assert executor.tasks == []  # all cached now, the other rules' entries kept


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


def test_rules_built_in_memory_have_a_digest_of_their_code() -> None:
    """A rule defined in a notebook cell or with sql_rule: another query, another digest."""
    from traceanalyzer.engine.loader import rule_digest
    from traceanalyzer.kit import sql_rule

    doc = "## What it detects\nx\n## Why it matters\nx\n## How to fix\nx\n## Example\nx\n## References\nx"

    def make(query: str):  # noqa: ANN202
        return sql_rule(id="TA191", name="sql-thing", severity="info", summary="s", doc=doc,
                        query=query, title="t", message="m", location=[])  # fmt: skip

    first, same, other = (
        make("SELECT rank FROM slices"),
        make("SELECT rank FROM slices"),
        make("SELECT rank FROM sessions"),
    )
    assert rule_digest(first) == rule_digest(same) != rule_digest(other)


def test_a_run_loads_its_rules_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One load per run: evaluation, the in-process workers and the reports share the rules."""
    import traceanalyzer.engine.loader as loader

    loads: list[Path] = []
    real = loader.load_folder
    monkeypatch.setattr(
        loader, "load_folder", lambda folder, loaded: (loads.append(folder), real(folder, loaded))
    )
    run(tmp_path / "out", "--force")
    assert loads == [loader.builtin_rules_dir()]


def test_rules_over_every_rank_are_cached_too(
    warm: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    from traceanalyzer.engine import shards

    out, first = warm
    cache = out / ".cache" / "rules" / "global.json"
    entries = json.loads(cache.read_text())["rules"]
    assert {"TA003", "TA010"} <= set(entries)  # slow-rank, collective-straggler
    evaluated: list[str] = []
    real = shards.evaluate_rule

    def counting(rule, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        evaluated.append(rule.id)
        return real(rule, *args, **kwargs)

    monkeypatch.setattr(shards, "evaluate_rule", counting)
    assert run(out)["findings"] == first["findings"]
    assert evaluated == []  # a warm re-run evaluates no rule, global ones included
    cache.write_text("{not json")
    again = run(out)
    assert again["findings"] == first["findings"]
    assert sorted(evaluated) == sorted(entries)
    (status,) = [r for r in again["rules"] if r["rule"] == "TA003"]
    assert "all ranks: cached outcome in .cache/rules/global.json ignored, corrupt" in " | ".join(
        n["text"] for n in status["notes"]
    )


def test_a_findings_cost_round_trips_through_the_cache() -> None:
    """The cost, typed, comes back from an entry's JSON as it went in: numpy values as numbers,
    an unknown part as None, a grouped finding's occurrences with their own."""
    import numpy as np

    from traceanalyzer.engine.cache import _plain, outcome_from_json, outcome_to_json
    from traceanalyzer.engine.findings import Cost, Finding, group_findings
    from traceanalyzer.engine.runner import RuleOutcome

    def finding(rank: int, cost: Cost | None) -> Finding:
        return Finding(
            rule="TA999", name="x", severity="info", ranks=[rank], sessions=["s"], title="t",
            message="m", fix="f", metrics={"calls": 3}, location={"at": "here"}, cost=cost,
        )  # fmt: skip

    costs = [Cost(np.int64(5_000), np.float64(0.25)), Cost(None, 0.5), Cost(), None]
    findings = [finding(r, c) for r, c in enumerate(costs)]
    (grouped,) = group_findings(findings)
    outcome = RuleOutcome("TA999", frozenset({0, 1, 2, 3}), "evaluated", [*findings, grouped])
    back = outcome_from_json(json.loads(json.dumps(outcome_to_json(outcome), default=_plain)))
    assert [f.cost for f in back.findings] == [*costs, costs[0]]
    assert [o.cost for o in back.findings[-1].occurrences] == costs
    assert [f.to_dict() for f in back.findings] == [f.to_dict() for f in outcome.findings]


def test_a_warm_run_costs_its_findings_as_the_cold_one(warm: tuple[Path, dict]) -> None:
    """Findings answered from the cache cost what the cold run's did."""
    from traceanalyzer.engine.loader import load_rules
    from traceanalyzer.engine.shards import evaluate_store
    from traceanalyzer.json_shape import to_json
    from traceanalyzer.overview import finding_costs
    from traceanalyzer.overview.model import read_overview

    out, first = warm
    executor = _Recording()
    cached = evaluate_store(out, executor, load_rules(), config_path=False)
    assert executor.tasks == []  # every outcome from the cache
    overview = first["summary"]["overview"]
    costs = finding_costs(cached.findings, read_overview(overview))
    assert overview["costs"] and to_json(costs) == overview["costs"]
