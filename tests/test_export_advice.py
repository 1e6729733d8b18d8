"""Advice that fits the export: what to collect is said from what the export says it collected
(profiler_info's level, activities and settings, the files present), and what an export
cannot measure is shown as n/a with the reason, never as 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_support import SAMPLES, run_sample

from traceanalyzer.cli import main
from traceanalyzer.engine.advice import ExportFacts, collect_hint

NPU = frozenset({"ProfilerActivity.CPU", "ProfilerActivity.NPU"})


def test_the_hint_says_what_the_export_lacks() -> None:
    level0 = ExportFacts(("Level0",), NPU)
    assert collect_hint("profiler_level=Level1", level0, "slices") == (
        " (collect with profiler_level=Level1)"
    )
    level1 = ExportFacts(("Level1",), NPU)
    assert collect_hint("profiler_level=Level1 in a multi-rank job", level1, "comm_ops") == (
        " (this Level1 export records them but has none; they appear only in a multi-rank job)"
    )
    no_trace = ExportFacts(("Level2",), NPU, (("trace_view.json", (0, 1)),))
    assert collect_hint("ProfilerActivity.NPU", no_trace, "slices") == (
        " (this export with ProfilerActivity.NPU records them in trace_view.json, which is missing)"
    )
    cpu_only = ExportFacts(("Level1",), frozenset({"ProfilerActivity.CPU"}))
    assert collect_hint("ProfilerActivity.NPU", cpu_only, "slices") == (
        " (collect with ProfilerActivity.NPU)"
    )


def _run(path: Path, out: Path) -> tuple[str, dict]:
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out), "-j", "1"])
    assert result.exit_code in (0, 3), result.output
    assert "Traceback" not in result.output
    return result.output, json.loads((out / "findings.json").read_text("utf-8"))


@pytest.fixture(scope="module")
def level2_without_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    root = tmp_path_factory.mktemp("no_trace")
    shutil.copytree(SAMPLES / "inference_baseline_current_level2", root / "in")
    for trace in (root / "in").glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        trace.unlink()
    return _run(root / "in", root / "out")


def test_a_level2_export_without_its_trace_is_told_the_trace_is_missing(
    level2_without_trace: tuple[str, dict],
) -> None:
    output, doc = level2_without_trace
    reasons = " ".join(r["reason"] for r in doc["not_evaluated"])
    for wrong in ("collect with profiler_level", "collect with ProfilerActivity.NPU", "Level0"):
        assert wrong not in reasons and wrong not in output, wrong
    assert "this Level2 export records them in trace_view.json, which is missing" in reasons


def test_unmeasured_is_never_zero(level2_without_trace: tuple[str, dict]) -> None:
    """No trace_view.json: idle host, idle sync, idle stream and copies are n/a with the reason;
    the compute is split by kernel_details.csv's kernels, not lumped into "other"."""
    _output, doc = level2_without_trace
    overview = doc["summary"]["overview"]
    blind = {"device_other_ns", "idle_host_ns", "idle_sync_ns", "idle_stream_ns"}
    assert set(overview["unmeasured"]) == blind
    for what in overview["unmeasured"].values():
        assert what["ranks"] == [0, 1] and "no device timeline" in what["reason"]
        assert "trace_view.json, which is missing" in what["reason"]
    mean = overview["mean"]
    assert mean["compute_ai_core_ns"] > mean["compute_mix_ns"] > mean["compute_ai_vector_ns"] > 0
    assert mean["compute_other_ns"] == 0
    from traceanalyzer.overview.model import read_overview
    from traceanalyzer.report.overview_text import overview_table

    table = overview_table(read_overview(overview))
    header, row = (line.split() for line in table.splitlines()[2:4])
    assert row[header.index("host") - 1] == "n/a"  # "idle host" is two words
    assert "copies, idle host, idle sync, idle stream not measured on ranks 0, 1" in table


def test_a_level1_export_is_never_told_to_collect_level1() -> None:
    doc = json.loads((run_sample("inference_baseline") / "findings.json").read_text("utf-8"))
    reasons = " ".join(r["reason"] for r in doc["not_evaluated"])
    assert "collect with profiler_level=Level1" not in reasons
    assert "they appear only with an MoE model" in reasons


def test_a_setting_that_was_on_makes_its_file_missing(tmp_path: Path) -> None:
    """profiler_info says profile_memory: true, and memory_record.csv is absent: it is missing
    (the profiler was asked and wrote none), not "not collected" with advice to turn it on."""
    from traceanalyzer.ingest import ingest

    shutil.copytree(SAMPLES / "inference_baseline", tmp_path / "in")
    (info,) = (tmp_path / "in").glob("*/profiler_info_*.json")
    doc = json.loads(info.read_text("utf-8"))
    doc["config"]["common_config"]["profile_memory"] = True
    info.write_text(json.dumps(doc), "utf-8")
    (outcome,) = ingest(tmp_path / "in", tmp_path / "out", jobs=1).outcomes
    assert "memory_record.csv (profile_memory=True was set)" in outcome.missing_files
    assert not any("memory_record.csv" in n for n in outcome.not_collected)
    assert "l2_cache.csv (l2_cache=True)" in outcome.not_collected  # that one was off
