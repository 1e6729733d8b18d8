"""annotations.json: a Chrome-trace overlay whose slices sit exactly on the trace's own clock."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from report_support import findings, run_sample

from traceanalyzer.report.annotations import PID, PROCESS_NAME
from traceanalyzer.report.fmt import trace_us


def load(out: Path) -> list[dict]:
    doc = json.loads((out / "annotations.json").read_text("utf-8"))
    return doc["traceEvents"]


def test_trace_us_is_exact() -> None:
    ns = 1736408885527946217  # beyond float64's exact integers
    assert trace_us(ns) == "1736408885527946.217"
    assert Decimal(trace_us(ns)) * 1000 == ns
    assert trace_us(1_000_000_005) == "1000000.005"


def test_one_track_per_finding_with_evidence_at_exact_times() -> None:
    out = run_sample("store_stall_2rank_rank1_sick")
    events = load(out)
    (f,) = findings(out)
    meta = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)]["name"] == PROCESS_NAME
    assert "store-transfer-stall" in meta[("thread_name", 1)]["name"]
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] == PID and e["tid"] == 1 for e in slices)
    by_ts = {(e["ts"], e["args"].get("stream")) for e in slices}
    for ev in f["evidence"]:
        ts = f"{ev['start_ns'] // 1000}.{ev['start_ns'] % 1000:03d}"
        assert (ts, ev["stream"]) in by_ts
    waits = [e for e in slices if e["cat"] == "wait"]
    spans = [e for e in slices if e["cat"] == "span"]
    assert waits and spans
    for e in slices:
        assert isinstance(e["ts"], str) and Decimal(e["ts"]) * 1000 == int(e["args"]["start_ns"])


def test_slices_line_up_with_the_original_trace() -> None:
    """The transfer-span slice has the very ts string of the span event in trace_view.json."""
    out = run_sample("store_stall_2rank_rank1_sick")
    (f,) = findings(out)
    span = f["evidence"][0]
    rank_dir = next(
        p
        for p in (
            Path(__file__).parents[1] / "sample_traces/store_stall_2rank_rank1_sick"
        ).iterdir()
        if p.name == span["session"]
    )
    trace = json.loads((rank_dir / "ASCEND_PROFILER_OUTPUT/trace_view.json").read_text())
    original = {e["ts"] for e in trace if e.get("name") == span["name"] and e.get("ph") == "X"}
    ours = {e["ts"] for e in load(out) if e.get("cat") == "span"}
    assert ours and ours <= original


def test_capture_windows_carry_memcpy_counts() -> None:
    out = run_sample("capture_growth_2rank")
    (f,) = findings(out)
    captures = [e for e in load(out) if e.get("cat") == "capture"]
    expected = []
    for occ in f["occurrences"]:
        s = occ["series"]
        expected += [
            (trace_us(start), round(dur / 1000, 3), calls, occ["ranks"][0])
            for start, dur, calls in zip(
                s["start_ns"], s["capture_ns"], s["memcpy_calls"], strict=True
            )
        ]
    got = [(e["ts"], e["dur"], e["args"]["memcpy_calls"], e["args"]["rank"]) for e in captures]
    assert sorted(got) == sorted(expected)
    assert len(captures) == 44  # 22 captures on each of 2 ranks


def test_a_rule_whose_marks_fail_costs_the_overlay_only(tmp_path: Path) -> None:
    """The marks are gathered before rendering; a rule's failing marks function is said by
    annotations.json alone, and every other report is written."""
    import dataclasses
    import shutil

    from traceanalyzer.engine.loader import load_rules
    from traceanalyzer.report import write_reports

    out = tmp_path / "out"
    shutil.copytree(run_sample("store_stall_2rank_rank1_sick"), out)

    def broken(finding):  # noqa: ANN001, ANN202
        raise RuntimeError("no marks today")

    rules = [
        dataclasses.replace(r, presentation=dataclasses.replace(r.presentation, marks=broken))
        if r.name == "store-transfer-stall"
        else r
        for r in load_rules().rules
    ]
    files = write_reports(out, rules=rules)
    assert files.errors == {"annotations.json": "RuntimeError: no marks today"}
    assert {"report.html", "report.md", "findings.sarif"} <= set(files.written)
