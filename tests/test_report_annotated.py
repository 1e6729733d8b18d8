"""`annotate OUT` / `run --annotate`: each rank session's timeline, rebuilt from the store with
the findings' marks merged in, opens as is in Perfetto and MindStudio Insight (both read the
Chrome JSON trace format), for Text and Db sessions alike."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from report_support import SAMPLES, findings, run_sample

from traceanalyzer.cli import main
from traceanalyzer.report.annotated import annotated_path
from traceanalyzer.report.annotations import PID, PROCESS_NAME, overlay_events
from traceanalyzer.report.inputs import TRACE_FILE, ReportInputs


def check_chrome_trace(doc: Any) -> list[dict[str, Any]]:
    """The Chrome JSON trace format as Perfetto and MindStudio Insight read it."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert isinstance(events, list)
    for e in events:
        assert {"ph", "pid", "tid"} <= e.keys(), e
        if e["ph"] != "M":  # metadata events carry no time (torch_npu writes none either)
            assert "ts" in e, e
            Decimal(e["ts"])  # a number or an exact µs string
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name"):
            assert isinstance(e["args"]["name"], str) and e["args"]["name"], e
    return events


def annotated(out: Path) -> dict[tuple[int, str], Path]:
    result = CliRunner().invoke(main, ["annotate", str(out)])
    assert result.exit_code == 0, result.output
    assert f"annotated traces: {out / 'annotated'}" in result.output
    inputs = ReportInputs.load(out)
    return {key: annotated_path(out, *key) for key in inputs.session_paths()}


def test_each_rank_trace_gets_its_own_findings_on_named_tracks() -> None:
    out = run_sample("store_stall_2rank_rank1_sick")
    (finding,) = findings(out)
    inputs = ReportInputs.load(out)
    copies = annotated(out)
    assert sorted(rank for rank, _ in copies) == [0, 1]
    for (rank, session), path in copies.items():
        source = inputs.session_paths()[rank, session] / TRACE_FILE
        assert source.parent not in path.parents  # into OUT, never next to the input
        events = check_chrome_trace(json.loads(path.read_bytes()))
        original = json.loads(source.read_bytes())
        ours = overlay_events(inputs.prepare(figures=False), where=(rank, session))
        # the overlay first, then every event of the trace: the same slices, on the same clock
        assert events[: len(ours)] == ours
        assert _events(events[len(ours) :], "X") == _events(original, "X")
        assert _events(events[len(ours) :], "C") == _events(original, "C")
        threads = [e["args"]["name"] for e in ours if e.get("name") == "thread_name"]
        slices = [e for e in ours if e["ph"] == "X"]
        assert {e["pid"] for e in ours} == {PID}
        assert ours[0]["args"]["name"] == PROCESS_NAME
        if rank in finding["ranks"]:
            assert any("store-transfer-stall" in name for name in threads)
            assert slices and all(e["args"]["session"] == session for e in slices)
            for e in slices:  # exact, on the trace's own clock
                assert Decimal(e["ts"]) * 1000 == int(e["args"]["start_ns"])
        else:
            assert not threads and not slices


def test_run_annotate_writes_the_copies() -> None:
    out = run_sample("capture_growth_2rank").parent / "capture_growth_annotate"
    result = CliRunner().invoke(
        main,
        ["run", str(SAMPLES / "capture_growth_2rank"), "--out", str(out), "-q", "--annotate"],
    )
    assert result.exit_code == 0, result.output
    copies = list((out / "annotated").glob("rank=*/*/trace_view.json"))
    assert len(copies) == 2
    for path in copies:
        events = check_chrome_trace(json.loads(path.read_bytes()))
        assert any(e.get("cat") == "capture" for e in events)


def _events(events: list[dict[str, Any]], ph: str) -> list[tuple[Any, ...]]:
    """The events of phase ``ph`` by what they are: name, pid, tid, exact start and duration."""
    return sorted(
        (e["name"], e["pid"], e["tid"], Decimal(str(e["ts"])), Decimal(str(e.get("dur", 0))))
        for e in events
        if e["ph"] == ph
    )


def test_a_db_session_gets_its_timeline_too(tmp_path: Path) -> None:
    """A Db export has no trace_view.json: its timeline is built from the store, with the same
    processes, threads, slices, counters and flows as its Text twin's."""
    from traceanalyzer.synth import generate

    stores = {}
    for export in ("text", "db"):
        generate(
            "store-stall", tmp_path / export / "in", ranks=2, export=export, layers=1, sick="1"
        )
        out = tmp_path / export / "out"
        result = CliRunner().invoke(
            main, ["run", str(tmp_path / export / "in"), "--out", str(out), "-q", "--annotate"]
        )
        assert result.exit_code == 0, result.output
        assert "annotated traces" in result.output and "not annotated" not in result.output
        stores[export] = {
            key: check_chrome_trace(json.loads(path.read_bytes()))
            for key, path in annotated(out).items()
        }
    for (text_key, text_events), (db_key, db_events) in zip(
        sorted(stores["text"].items()), sorted(stores["db"].items()), strict=True
    ):
        assert text_key[0] == db_key[0]
        for ph in ("X", "C"):
            assert len(_events(db_events, ph)) == len(_events(text_events, ph)), ph
        names = {e["args"]["name"] for e in db_events if e.get("name") == "process_name"}
        assert {"Python", "CANN", "Ascend Hardware", "traceanalyzer findings"} <= names
        assert sum(e["ph"] == "s" for e in db_events) == sum(e["ph"] == "f" for e in db_events) > 0
    rank1 = stores["db"][next(k for k in stores["db"] if k[0] == 1)]
    assert any(e["ph"] == "X" and e.get("cat") == "store-transfer-stall" for e in rank1) or any(
        "store-transfer-stall" in str(e.get("args", {}).get("name", "")) for e in rank1
    )


def test_the_timeline_streams(tmp_path: Path) -> None:
    """A large session is written a row group at a time, never held whole in Python."""
    from traceanalyzer.store_trace import session_events, write_trace

    out = run_sample("inference_baseline")
    store = ReportInputs.load(out).store
    rank, session = next(iter(ReportInputs.load(out).session_paths()))
    tracemalloc.start()
    try:
        chunks = 0
        for chunk in session_events(store, rank, session):
            chunks += 1
            assert len(chunk) < 64 * 1024 * 1024
        with (tmp_path / "t.json").open("wb") as fh:
            write_trace(fh, [], session_events(store, rank, session))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert chunks and peak < 32 * 1024 * 1024, peak
    check_chrome_trace(json.loads((tmp_path / "t.json").read_bytes()))


def test_perfetto_trace_processor_loads_the_copy() -> None:
    """Perfetto's own parser, when its trace_processor binary is on this machine (the Python
    package downloads it at run time otherwise, which the tests never do)."""
    tp_module = pytest.importorskip("perfetto.trace_processor")
    binary = os.environ.get("PERFETTO_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
    if not binary:
        pytest.skip("no trace_processor binary (set PERFETTO_TRACE_PROCESSOR)")
    out = run_sample("store_stall_2rank_rank1_sick")
    path = next(p for (rank, _), p in annotated(out).items() if rank == 1)
    config = tp_module.TraceProcessorConfig(bin_path=binary)
    with tp_module.TraceProcessor(trace=str(path), config=config) as tp:
        names = {row.name for row in tp.query("select name from thread")}
    assert any(name and "store-transfer-stall" in name for name in names)
