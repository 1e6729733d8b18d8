"""`annotate OUT` / `run --annotate`: each rank's trace, copied with the findings' marks merged in,
opens as is in Perfetto and MindStudio Insight (both read the Chrome JSON trace format)."""

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
from traceanalyzer.report.annotated import NotAnnotatable, annotated_path, splice_trace
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
        ours = overlay_events(inputs, where=(rank, session))
        # the trace's own events, untouched and in order, after the overlay's
        assert events == ours + original
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


@pytest.mark.parametrize(
    ("trace", "expected"),
    [
        (b"[]", ["mark"]),
        (b'\n[ {"ph": "i", "pid": 1, "tid": 1, "ts": "5.000", "name": "a"} ]\n', ["mark", "a"]),
        (b'{"traceEvents": [{"ph":"i","pid":1,"tid":1,"ts":1,"name":"a"}], "x": 1}', ["mark", "a"]),
    ],
)
def test_splice_keeps_every_form_valid(tmp_path: Path, trace: bytes, expected: list) -> None:
    source, target = tmp_path / "in.json", tmp_path / "out" / "trace_view.json"
    source.write_bytes(trace)
    mark = {"ph": "X", "pid": PID, "tid": 1, "ts": "1.000", "dur": 1.0, "name": "mark"}
    splice_trace(source, target, [mark])
    events = check_chrome_trace(json.loads(target.read_bytes()))
    assert [e["name"] for e in events] == expected
    assert events[0] == mark


def test_a_truncated_trace_stays_as_openable_as_the_original(tmp_path: Path) -> None:
    """No closing bracket (allowed by the format): the marks go first, the rest is copied as is."""
    source, target = tmp_path / "in.json", tmp_path / "out.json"
    body = b'{"ph":"X","pid":1,"tid":1,"ts":"1.000","dur":2,"name":"a"},{"ph":"X","pid":1,'
    source.write_bytes(b"[" + body)
    splice_trace(source, target, [{"ph": "M", "pid": PID, "tid": 0, "name": "process_name"}])
    assert target.read_bytes().endswith(b"," + body)
    with pytest.raises(NotAnnotatable):
        (tmp_path / "not.json").write_bytes(b"PROF data")
        splice_trace(tmp_path / "not.json", target, [])


def test_the_copy_streams(tmp_path: Path) -> None:
    """A large trace is copied in chunks, never held whole in Python."""
    source, target = tmp_path / "big.json", tmp_path / "out.json"
    event = b'{"ph":"X","pid":1,"tid":1,"ts":"1736408883000050.000","dur":24.27,"name":"aclnnMm"},'
    with source.open("wb") as fh:
        fh.write(b"[")
        fh.write(event * (48 * 1024 * 1024 // len(event)))
        fh.write(event[:-1] + b"]")
    tracemalloc.start()
    try:
        splice_trace(source, target, [{"ph": "M", "pid": PID, "tid": 0, "name": "process_name"}])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, peak
    assert target.stat().st_size > source.stat().st_size


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
