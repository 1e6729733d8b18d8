"""Exit codes mean the same for every command: 1 is only ever "a finding" (or a failed fixture),
mistakes in the invocation and refusals are 2 (README "Exit codes")."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from click.testing import CliRunner

from traceanalyzer.cli import main
from traceanalyzer.exitcodes import EXIT_USAGE


def test_unknown_rule_is_a_usage_error() -> None:
    for args in (["rules", "explain", "nope"], ["rules", "test", "nope"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == EXIT_USAGE, (args, result.output)
        assert "unknown rule 'nope'" in result.output


def test_recipe_render_into_a_non_empty_folder_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = CliRunner().invoke(
        main, ["recipe", "render", "graph-capture-repeat", "--out", str(tmp_path)]
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert "holds keep.txt: not files a recipe writes" in result.output
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_outputs_follow_the_umask(tmp_path: Path) -> None:
    from traceanalyzer.store import write_atomic_text

    target = tmp_path / "report.md"
    write_atomic_text(target, "x")
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


def test_ray_address_without_the_ray_executor_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["run", str(tmp_path), "--ray-address", "auto", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == EXIT_USAGE
    assert "--ray-address is only used with --executor ray" in result.output


def test_a_failed_gate_names_the_findings_and_the_exit_code(tmp_path: Path) -> None:
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"
    result = CliRunner().invoke(
        main, ["run", str(sample), "--out", str(tmp_path / "o"), "--fail-on", "warning", "-q"]
    )
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("failed: 1 finding(s) at or above --fail-on warning"), last
    assert "capture-memcpy-growth on ranks 0, 1" in last and last.endswith("exit 1")


def test_quiet_still_says_what_lost_data(tmp_path: Path) -> None:
    import shutil

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"
    # the second session of the sample is rank 1 (its profiler_info_1.json)
    rank1 = next(p for p in sample.iterdir() if (p / "profiler_info_1.json").exists())
    shutil.copytree(rank1, tmp_path / "in" / rank1.name)
    result = CliRunner().invoke(
        main, ["run", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "-q"]
    )
    assert "missing ranks: 0" in result.output, result.output
    # a problem of the whole collection names no file: no "-:" where a path would be
    assert "\nwarning  missing ranks: 0 (1 of 2 expected)\n" in "\n" + result.output


def test_could_not_judge_is_its_own_status_everywhere(tmp_path: Path) -> None:
    """A rule that ran but could not decide is "inconclusive" in findings.json, the terminal,
    report.md and report.html; never "clean" (slow-rank on one rank has no peers)."""
    import json

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_healthy"
    out = tmp_path / "o"
    result = CliRunner().invoke(
        main, ["run", str(sample), "--out", str(out), "--set", "slow-rank.min_ranks=1"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "findings.json").read_text())
    [slow] = [r for r in doc["rules"] if r["name"] == "slow-rank"]
    assert slow["status"] == "inconclusive", slow
    assert slow["reason"].startswith("inconclusive: ")
    assert doc["summary"]["inconclusive"] >= 1
    assert "inconclusive  slow-rank" in result.output and "undecided" not in result.output
    for report in ("report.md", "report.html"):  # one name, never "could not judge"
        text = (out / report).read_text()
        assert "Inconclusive" in text and "ould not judge" not in text, report


def test_findings_on_damaged_input_say_so(tmp_path: Path) -> None:
    """A rank whose trace was truncated: each of its findings carries the caveat in findings.json,
    the terminal, report.md and report.html (its numbers stand on partial data)."""
    import json
    import shutil

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "store_stall_2rank_rank1_sick"
    root = tmp_path / "in"
    shutil.copytree(sample, root)
    rank1 = next(p for p in root.iterdir() if (p / "profiler_info_1.json").exists())
    trace = rank1 / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    data = trace.read_bytes()
    trace.write_bytes(data[: int(len(data) * 0.97)])
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["run", str(root), "--out", str(out)])
    assert result.exit_code == 3, result.output  # partial: events were lost
    doc = json.loads((out / "findings.json").read_text())
    [stall] = [f for f in doc["findings"] if f["name"] == "store-transfer-stall"]
    assert stall["ranks"] == [1]
    assert stall["caveats"] and "rank 1's input was incomplete" in stall["caveats"][0]
    assert "trace_view.json" in stall["caveats"][0]
    assert "[on incomplete input" in result.output
    assert "**Caveat:**" in (out / "report.md").read_text()
    assert 'class="caveat"' in (out / "report.html").read_text()
