"""The worked example: a rule written outside traceanalyzer/ (the `rules new` scaffold) gets its
figure in report.html, its key figures in `diff` and its marks in annotations.json, exactly
like a built-in rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"
# every host memcpy is "slow" at min_ms=0: the scaffold fires on a sample it was not written for
WATCH = ["--set", "slow-sync.api_pattern=^aclrtMemcpy$"]


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("external")
    rules = root / "myrules"
    cli("rules", "new", "slow-sync", "--dir", str(rules))
    out = {"fired": root / "fired", "clean": root / "clean"}
    for name, min_ms in (("fired", "0"), ("clean", "1000")):
        cli("run", str(SAMPLE), "--out", str(out[name]), "--rules", str(rules), "-q", "-j", "1",
            *WATCH, "--set", f"slow-sync.min_ms={min_ms}")  # fmt: skip
    return out


def _finding(out: Path) -> dict:
    doc = json.loads((out / "findings.json").read_text())
    (finding,) = [f for f in doc["findings"] if f["name"] == "slow-sync"]
    return finding


def test_its_figure_is_in_its_finding_section(runs: dict[str, Path]) -> None:
    finding = _finding(runs["fired"])
    html = (runs["fired"] / "report.html").read_text()
    section = re.search(
        rf'<section class="finding [a-z]+" id="f-{finding["fingerprint"]}">(.*?)</section>',
        html,
        re.S,
    )
    assert section is not None
    assert '<img src="data:image/png;base64,' in section.group(1)
    assert "Duration of each slow call, in time order, per rank." in section.group(1)
    assert (runs["fired"] / "plots" / f"slow-sync-{finding['fingerprint']}.png").is_file()


def test_its_marks_are_on_the_timeline(runs: dict[str, Path]) -> None:
    finding = _finding(runs["fired"])
    events = json.loads((runs["fired"] / "annotations.json").read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    marks = [e for e in events if e["ph"] == "X" and e["cat"] == "slow-sync"]
    assert len(marks) == len(finding["evidence"])
    assert all(tracks[m["tid"]].endswith(": slow calls") for m in marks)
    assert {m["args"]["fingerprint"] for m in marks} == {finding["fingerprint"]}


def test_its_key_figures_are_in_diff(runs: dict[str, Path], tmp_path: Path) -> None:
    output = cli("diff", str(runs["fired"]), str(runs["clean"]), "--out", str(tmp_path))
    assert "resolved  slow-sync" in output
    doc = json.loads((tmp_path / "diff.json").read_text())
    (change,) = [c for c in doc["findings"] if c["name"] == "slow-sync"]
    deltas = {d["key"]: d for d in change["figure_deltas"]}
    assert deltas["slow_calls"]["base"] > 0 and deltas["slow_calls"]["target"] == 0
    assert deltas["calls"]["base"] == deltas["calls"]["target"]  # same trace, other threshold
    assert "slow calls: " in output
    per_rank = {(d["ranks"][0], d["key"]) for d in doc["figures"] if d["rule"] == "slow-sync"}
    assert {(0, "slow_calls"), (1, "slow_calls")} <= per_rank
