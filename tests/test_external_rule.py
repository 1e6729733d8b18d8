"""The worked example: a rule written outside traceanalyzer/ (the `rules new` scaffold) gets its
figure in report.html, its key figures in `diff` and its marks in annotations.json, exactly
like a built-in rule."""

from __future__ import annotations

import json
import re
import shutil
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
    # the same rule drawing with the whole of matplotlib instead of the SVG chart
    mpl_rules = root / "mplrules"
    shutil.copytree(rules, mpl_rules)
    rule_file = mpl_rules / "slow_sync.py"
    source = rule_file.read_text()
    assert source.count("fig.new(") == 1
    rule_file.write_text(source.replace("fig.new(", "fig.matplotlib("))
    out = {"fired": root / "fired", "clean": root / "clean", "matplotlib": root / "matplotlib"}
    for name, folder, min_ms in (
        ("fired", rules, "0"),
        ("clean", rules, "1000"),
        ("matplotlib", mpl_rules, "0"),
    ):
        cli("run", str(SAMPLE), "--out", str(out[name]), "--rules", str(folder), "-q", "-j", "1",
            *WATCH, "--set", f"slow-sync.min_ms={min_ms}")  # fmt: skip
    return out


def _finding(out: Path) -> dict:
    doc = json.loads((out / "findings.json").read_text())
    (finding,) = [f for f in doc["findings"] if f["name"] == "slow-sync"]
    return finding


def _section(out: Path, finding: dict) -> str:
    html = (out / "report.html").read_text()
    section = re.search(
        rf'<section class="finding [a-z]+" id="f-{finding["fingerprint"]}">(.*?)</section>',
        html,
        re.S,
    )
    assert section is not None
    assert "Duration of each slow call, in time order, per rank." in section.group(1)
    return section.group(1)


def test_its_figure_is_in_its_finding_section(runs: dict[str, Path]) -> None:
    finding = _finding(runs["fired"])
    section = _section(runs["fired"], finding)
    assert '<figure><svg xmlns="http://www.w3.org/2000/svg" class="chart"' in section
    assert "<img " not in section
    assert (runs["fired"] / "plots" / f"slow-sync-{finding['fingerprint']}.svg").is_file()


def test_a_matplotlib_figure_is_a_png(runs: dict[str, Path]) -> None:
    """A rule that draws with fig.matplotlib gets a PNG: the escape hatch to the whole API."""
    finding = _finding(runs["matplotlib"])
    assert '<img src="data:image/png;base64,' in _section(runs["matplotlib"], finding)
    plot = runs["matplotlib"] / "plots" / f"slow-sync-{finding['fingerprint']}.png"
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


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
