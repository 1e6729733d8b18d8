"""The native trace reader (parse/_trace_scan.c, parse/trace_native.py) against the DuckDB one.

Both write the slices, counters, flows and threads tables; on every trace either reads, the
tables must be equal row for row. The native reader takes a well-formed file only: anything
else must reach the DuckDB reader (which salvages damage), never crash the process.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from fuzz.limits import same_rows
from test_ingest_variants import CANN_PID, HW_PID, PY_PID, T0, _g2_trace, _m, _x

from traceanalyzer.ingest.sink import PartitionSink
from traceanalyzer.parse import native_scan, trace_native, trace_view
from traceanalyzer.parse.trace_shared import ARG_COLUMNS, TraceResult

REPO = Path(__file__).resolve().parents[1]
TRACE_TABLES = ("slices", "counters", "flows", "threads")

pytestmark = pytest.mark.skipif(
    not trace_native.available() and os.environ.get("TRACEANALYZER_REQUIRE_NATIVE") != "1",
    reason="native scanner not built (no C compiler at install)",
)


def test_native_scanner_is_built_when_required() -> None:
    # CI sets TRACEANALYZER_REQUIRE_NATIVE=1, so a build that silently lost the scanner fails.
    assert trace_native.available()


def test_the_built_scanner_is_not_older_than_its_source() -> None:
    # An editable install compiles in place; a scanner left from an older source would be tested
    # instead of the current one.
    source = REPO / "traceanalyzer" / "parse" / "_trace_scan.c"
    built = list(source.parent.glob("_trace_scan.*.so")) + list(
        source.parent.glob("_trace_scan.*.pyd")
    )
    for module in built:
        assert module.stat().st_mtime >= source.stat().st_mtime, (
            f"{module.name} is older than _trace_scan.c: reinstall (pip install -e .)"
        )


def _parse(
    trace: Path, tmp: Path, native: bool, monkeypatch: pytest.MonkeyPatch, threads: int = 2
) -> tuple[dict[str, pl.DataFrame], TraceResult]:
    monkeypatch.setenv("TRACEANALYZER_NATIVE", "1" if native else "0")
    out = tmp / ("native" if native else "duckdb")
    sink = PartitionSink(out, 0, "s")
    result = trace_view.parse_trace_view(trace, sink, tmp / "scratch", threads=threads)
    tables = {
        t: pl.read_parquet(out / "tables" / t / "rank=0" / "session=s" / "part-0.parquet")
        for t in TRACE_TABLES
    }
    return tables, result


def _same_tables(trace: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, **kw: object) -> None:
    """Both readers give the same rows (order among rows equal in every sort key aside)."""
    native, native_result = _parse(trace, tmp, True, monkeypatch, **kw)
    duck, duck_result = _parse(trace, tmp, False, monkeypatch, **kw)
    assert native_result.reader == "native" and duck_result.reader == "duckdb"
    for table in TRACE_TABLES:
        a, b = native[table], duck[table]
        assert a.schema == b.schema, table
        assert same_rows(a, b), table
    for field in ("rows", "start_ns", "end_ns", "processes", "hw_stream_arg", "incomplete"):
        assert getattr(native_result, field) == getattr(duck_result, field), field
    assert sorted(native_result.warnings) == sorted(duck_result.warnings)


def _sample_traces() -> list[Path]:
    return sorted((REPO / "sample_traces").glob("*/*/ASCEND_PROFILER_OUTPUT/trace_view.json"))


@pytest.mark.parametrize("trace", _sample_traces(), ids=lambda p: p.parts[-4])
def test_same_tables_on_every_sample(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_tables(trace, tmp_path, monkeypatch)


@pytest.mark.parametrize("rank", ["rank0_ascend_pt", "rank1_ascend_pt"])
def test_same_tables_on_the_real_export(
    real_g2: Path, rank: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_tables(
        real_g2 / rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", tmp_path, monkeypatch
    )


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"stream_key": "Stream Id"},  # G1
        {"comm_process": "Communication", "prefix": "Communication@"},  # current
    ],
)
@pytest.mark.parametrize("join", [", ", ","])  # `},{` joins seen in real files
def test_same_tables_on_each_generation(
    variant: dict, join: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace_view.json"
    trace.write_bytes(_g2_trace(**variant).replace(b"}, {", ("}" + join + "{").encode()))
    _same_tables(trace, tmp_path, monkeypatch)


def _quirks() -> list[dict]:
    """JSON the scanner must read as DuckDB does: escapes, odd values and key orders."""
    return [
        *_m(PY_PID, "Python", {PY_PID: 'thread "main" \u00e9'}),
        *_m(HW_PID, "Ascend Hardware", {7: "Stream 7"}, label="NPU"),
        *_m(CANN_PID, "CANN", {11: "Thread 11"}),
        _x('aten::"quoted"\\name \U0001f600', PY_PID, PY_PID, f"{T0}.100", 2.5, {"a\nb": [1, {"x": None}]}),
        _x("no args", PY_PID, PY_PID, f"{T0}.101", 0.0),
        _x("empty args", PY_PID, PY_PID, f"{T0}.102", 1.0, {}),
        _x("int ts", PY_PID, PY_PID, int(T0), 1.0),  # type: ignore[arg-type]
        _x("tab ts", PY_PID, PY_PID, f"{T0}.103\t", 1.0),
        {"ph": "X", "name": "string dur", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.104", "dur": "2.5"},
        {"ph": "X", "name": "null dur", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.105", "dur": None},
        {"ph": "X", "name": "no ts", "pid": PY_PID, "tid": PY_PID, "dur": 1.0},
        {"ph": "X", "name": "args null", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.106", "dur": 1.0, "args": None},
        {"ph": "X", "name": "args array", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.107", "dur": 1.0, "args": [1, 2]},
        {"ph": "X", "name": "args text", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.108", "dur": 1.0, "args": "a \"b\""},
        {"ph": "X", "name": "args number", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.109", "dur": 1.0, "args": 1.5e3},
        {"name": "kernel", "pid": HW_PID, "tid": 7, "ts": f"{T0}.110", "dur": 3.25,
         "args": {"Task Type": "AI_CORE", "Task Id": 4294967295, "Physic Stream Id": "7", "Model Id": 18446744073709551615,
                  "connection_id": 12, "data size(Byte)": 4096, "memcpy direction": "h2d"}, "ph": "X"},
        {"name": "hccl task", "pid": HW_PID, "tid": 7, "ts": f"{T0}.111", "dur": 1.0,
         "args": {"task type": "Notify Wait", "task id": 5, "stream id": 9, "Model Id": 3}, "ph": "X"},
        {"name": "AscendCL@aclrtMemcpy", "pid": CANN_PID, "tid": 11, "ts": f"{T0}.112", "dur": 1.0,
         "args": {"level": "acl", "Mode": "sync", "id": 17, "size(B)": "64", "operation": "d2h"}, "ph": "X"},
        {"name": "AscendCL@dup", "pid": CANN_PID, "tid": 11, "ts": f"{T0}.113", "dur": 1.0,
         "args": {"level": "acl", "level": "node"}, "ph": "X"},  # noqa: F601 - a repeated key
        {"ph": "i", "name": "instant", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.114", "s": "t"},
        {"ph": "C", "name": "HBM", "pid": HW_PID, "tid": 0, "ts": f"{T0}.120",
         "args": {"Read(MB/s)": 1.5, "Write(MB/s)": "2.25", "bad": "x", "nested": {"a": 1}, "flag": True}},
        {"ph": "C", "name": "AI Core Freq", "pid": HW_PID, "tid": 0, "ts": int(T0), "args": {"MHz": 1800}},
        {"ph": "s", "name": "torch_to_npu", "id": 99, "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.100", "cat": "async_npu"},
        {"ph": "f", "name": "torch_to_npu", "id": 99, "pid": HW_PID, "tid": 7, "ts": f"{T0}.110", "cat": "async_npu", "bp": "e"},
        {"ph": "s", "name": "HostToDevice", "id": "4294967296", "pid": CANN_PID, "tid": 11, "ts": f"{T0}.112", "cat": "HostToDevice"},
        {"ph": "f", "name": "lonely", "id": "7", "pid": HW_PID, "tid": 7, "ts": f"{T0}.113"},
        {"ph": "b", "name": "async begin", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.115", "id": 1},
        {"ph": "X", "name": "unnamed pid", "pid": 42, "tid": 43, "ts": f"{T0}.116", "dur": 1.0},
    ]  # fmt: skip


@pytest.mark.parametrize("style", ["compact", "spaced", "pretty"])
def test_same_tables_on_quirky_json(
    style: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _quirks()
    text = {
        "compact": lambda: json.dumps(events, separators=(",", ":")),
        "spaced": lambda: json.dumps(events),
        "pretty": lambda: "\ufeff" + json.dumps(events, indent=2, ensure_ascii=False),
    }[style]()
    trace = tmp_path / "trace_view.json"
    trace.write_text(text, encoding="utf-8")
    _same_tables(trace, tmp_path, monkeypatch)


def _impossible_times() -> str:
    """Times no profile holds, written as JSON can write them (numbers, strings, escapes)."""
    ok = f"{T0}.100"
    events = [
        *_m(PY_PID, "Python", {PY_PID: "main"}),
        *_m(HW_PID, "Ascend Hardware", {7: "Stream 7"}),
        _x("ok", PY_PID, PY_PID, ok, 2.5),
        _x("exponent ts", PY_PID, PY_PID, "1.736408883704643e15", 2.5),  # DuckDB: 1970
        _x("exponent number ts", PY_PID, PY_PID, "@1.736408883704643e15@", 2.5),
        _x("ts 1e20", PY_PID, PY_PID, "@1e20@", 1.0),  # past int64: no time at all
        _x("ts 1e300", PY_PID, PY_PID, "@1e300@", 1.0),
        _x("ts NaN text", PY_PID, PY_PID, "NaN", 1.0),
        _x("ts hex", PY_PID, PY_PID, "0x1e5", 1.0),
        _x("ts 1970", PY_PID, PY_PID, "5.000", 1.0),
        _x("ts negative", PY_PID, PY_PID, "-5.000", 1.0),
        _x("ts 2200", PY_PID, PY_PID, "7258118400000000.000", 1.0),
        _x("dur 1e300", PY_PID, PY_PID, ok, "@1e300@"),  # natively 0, dropped by DuckDB
        _x("dur negative", PY_PID, PY_PID, ok, -5.0),
        _x("dur 12 days", PY_PID, PY_PID, ok, 1e12),
        _x("dur text", PY_PID, PY_PID, ok, "abc"),
        _x("dur hex", PY_PID, PY_PID, ok, "0x10"),
        _x("dur underscores", PY_PID, PY_PID, ok, "1_000"),
        _x("dur nan", PY_PID, PY_PID, ok, "nan"),
        _x("dur true", PY_PID, PY_PID, ok, "@true@"),
        _x("dur object", PY_PID, PY_PID, ok, {"a": 1}),
        _x("dur escaped", PY_PID, PY_PID, ok, "@\"\\u0032.5\"@"),  # "2.5", kept
        _x("dur spaced", PY_PID, PY_PID, ok, " 2.5\t"),  # kept
        {"ph": "C", "name": "HBM", "pid": HW_PID, "tid": 0, "ts": "@1e20@", "args": {"r": 1, "w": 2}},
        {"ph": "C", "name": "HBM", "pid": HW_PID, "tid": 0, "ts": ok, "args": {"r": 3}},
        {"ph": "s", "name": "torch_to_npu", "id": 9, "pid": PY_PID, "tid": PY_PID, "ts": "NaN", "cat": "async_npu"},
        {"ph": "f", "name": "torch_to_npu", "id": 9, "pid": HW_PID, "tid": 7, "ts": ok, "cat": "async_npu", "bp": "e"},
    ]  # fmt: skip
    # "@...@": the value as it is in the file (a JSON number or literal, not a string)
    return (
        json.dumps(events)
        .replace('"@', "")
        .replace('@"', "")
        .replace('\\"', '"')
        .replace("\\\\", "\\")
    )


def test_impossible_times_are_dropped_alike_with_one_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One conversion and one answer: an exponent ts is read through a double by both readers
    (DuckDB put it in 1970), a dur that is no number is no duration for both (natively it was
    0, DuckDB dropped the event as malformed), and every time no profile holds drops its event
    with one note, the same whichever reader read the file."""
    trace = tmp_path / "trace_view.json"
    trace.write_text(_impossible_times())
    _same_tables(trace, tmp_path, monkeypatch)
    tables, result = _parse(trace, tmp_path, True, monkeypatch)
    assert sorted(tables["slices"]["name"].to_list()) == [
        "dur escaped", "dur spaced", "exponent number ts", "exponent ts", "ok",
    ]  # fmt: skip
    assert set(tables["slices"]["start_ns"].to_list()) >= {1736408883704643000}
    assert tables["slices"].filter(pl.col("name") == "dur escaped")["dur_ns"].item() == 2500
    assert tables["counters"]["series"].to_list() == ["r"]
    assert tables["flows"]["start_ns"].to_list() == [None]
    assert result.incomplete is None
    assert sorted(result.warnings) == [
        "trace_view.json: counters: 2 row(s) with an impossible time dropped "
        "(ts_ns not a time in 2000-2100: 2)",
        "trace_view.json: flows: 1 row(s) with an impossible time dropped "
        "(ts not a time in 2000-2100: 1)",
        "trace_view.json: slices: 16 row(s) with an impossible time dropped "
        "(dur_ns not a duration of 0 to 7 days: 9, start_ns not a time in 2000-2100: 7)",
    ]


def test_an_id_that_is_no_integer_is_null_in_both_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB's cast read ``-0.0`` as 0 and ``2.5`` as 3 (the fuzzer's first finding of the
    readers side by side); the scanner takes integers only."""
    odd = [-0.0, 2.5, "1e3", " 5", "0x10", "1_000", "+7", "-", 18446744073709551616, "-12"]
    events = [*_m(HW_PID, "Ascend Hardware", {7: "Stream 7"})] + [
        _x(f"task {i}", HW_PID, 7, f"{T0}.{100 + i}", 1.0,
           {"Task Type": "AI_CORE", "connection_id": v, "Task Id": v, "data size(Byte)": v})
        for i, v in enumerate(odd)
    ]  # fmt: skip
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(events))
    _same_tables(trace, tmp_path, monkeypatch)
    tables, _ = _parse(trace, tmp_path, True, monkeypatch)
    ids = dict(tables["slices"].select("name", "connection_id").iter_rows())
    assert [ids[f"task {i}"] for i in range(len(odd))] == [None] * 9 + [-12]


def test_numbers_in_args_are_the_same_json_in_both_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch_npu writes args with Python's json, so 1e-05 and 1.2345e+17 as such; DuckDB
    writes them 0.00001 and 123450000000000000.0 (the fuzzer's case 3,326 of campaign 4, a
    Sequence number of 1e+308): the same values, as every reader of ``args`` parses them."""
    values = [1e-05, 2.5e-07, 1.2345e17, 1e308, -1, 17.0]
    events = [*_m(PY_PID, "Python", {1: "Thread 1"})] + [
        _x(f"op {i}", PY_PID, 1, f"{T0}.{100 + i}", 1.0, {"Sequence number": v})
        for i, v in enumerate(values)
    ]
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(events))
    _same_tables(trace, tmp_path, monkeypatch)
    tables, _ = _parse(trace, tmp_path, False, monkeypatch)
    args = tables["slices"].sort("name")["args"].to_list()
    assert [json.loads(text)["Sequence number"] for text in args] == values


def test_nul_padding_after_the_array_is_noted_by_both_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scanned in ranges cut within the events, a trace followed by a crash's NULs is read
    natively; it said nothing of them, where DuckDB (which salvages it) noted them."""
    trace = tmp_path / "trace_view.json"
    trace.write_bytes(json.dumps(_quirks()).encode())
    with open(trace, "r+b") as fh:
        fh.truncate(64 << 20)
    _same_tables(trace, tmp_path, monkeypatch, threads=2)
    _, result = _parse(trace, tmp_path, True, monkeypatch)
    assert any(
        "byte(s) after the closing bracket ignored (NUL padding" in w for w in result.warnings
    )


def test_both_readers_convert_every_time_text_as_timeutil_does(tmp_path: Path) -> None:
    """One conversion in three languages: the scanner's C, DuckDB's SQL (the other reader) and
    polars' (the CSVs), text by text, for a ts and for a dur (absent or null: 0)."""
    from test_timeutil import _texts

    from traceanalyzer.parse import trace_duckdb
    from traceanalyzer.timeutil import us_series_to_ns

    texts = _texts()
    events = [
        {"ph": "X", "name": str(i), "pid": 1, "tid": 1, "ts": t, "dur": t}
        for i, t in enumerate(texts)
    ]
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(events))
    expected = us_series_to_ns(pl.Series(texts, dtype=pl.String))
    expected_dur = pl.Series(
        [0 if t is None else ns for t, ns in zip(texts, expected, strict=True)]
    )
    scanned = trace_native.scan_trace(trace, 1)
    native = scanned.decode("slices", "name", scanned.slices)
    duck = trace_duckdb.read_events(trace, tmp_path / "scratch", 1, 256, TraceResult()).slices
    for reader, slices in (("native", native), ("duckdb", duck)):
        got = slices.sort(pl.col("name").cast(pl.Int64))
        for column, want in (("ts", expected), ("dur_ns", expected_dur)):
            wrong = [(t, g, w) for t, g, w in zip(texts, got[column], want, strict=True) if g != w]
            assert not wrong, (reader, column, wrong[:10])


def test_a_nan_literal_is_salvaged_and_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NaN`` is no JSON: the scanner refuses the file, DuckDB reads it, and the events whose
    ts or dur it is are dropped with the note."""
    trace = tmp_path / "trace_view.json"
    events = [*_m(PY_PID, "Python", {PY_PID: "main"}), _x("ok", PY_PID, PY_PID, f"{T0}.100", 1.0),
              _x("ts", PY_PID, PY_PID, "@NaN@", 1.0), _x("dur", PY_PID, PY_PID, f"{T0}.100", "@NaN@")]  # fmt: skip
    trace.write_text(json.dumps(events).replace('"@', "").replace('@"', ""))
    tables, result = _parse(trace, tmp_path, True, monkeypatch)
    assert tables["slices"]["name"].to_list() == ["ok"]
    assert "trace_view.json: slices: 2 row(s) with an impossible time dropped" in " ".join(
        result.warnings
    )


def test_flattened_args_and_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(_quirks()))
    tables, result = _parse(trace, tmp_path, True, monkeypatch)
    assert result.reader == "native"
    slices = {r["name"]: r for r in tables["slices"].iter_rows(named=True)}
    kernel = slices["kernel"]
    assert (kernel["process"], kernel["thread"], kernel["stream_id"]) == (
        "Ascend Hardware",
        "Stream 7",
        7,
    )
    assert (kernel["task_type"], kernel["task_id"], kernel["model_id"]) == ("AI_CORE", None, None)
    assert (kernel["memcpy_size"], kernel["memcpy_direction"], kernel["connection_id"]) == (
        4096,
        "h2d",
        12,
    )
    hccl = slices["hccl task"]
    assert (hccl["task_type"], hccl["task_id"], hccl["stream_id"], hccl["model_id"]) == (
        "Notify Wait",
        5,
        9,
        3,
    )
    api = slices["AscendCL@aclrtMemcpy"]
    assert (api["api_layer"], api["api_name"], api["api_level"], api["api_mode"], api["api_id"]) == (
        "AscendCL", "aclrtMemcpy", "acl", "sync", "17",
    )  # fmt: skip
    assert (api["memcpy_size"], api["memcpy_direction"]) == (64, "d2h")
    assert slices['aten::"quoted"\\name \U0001f600']["thread"] == 'thread "main" \u00e9'
    assert slices["unnamed pid"]["process"] == "pid 42"
    assert slices["empty args"]["args"] is None and slices["no args"]["args"] is None
    assert json.loads(slices['aten::"quoted"\\name \U0001f600']["args"]) == {
        "a\nb": [1, {"x": None}]
    }
    assert slices["int ts"]["start_ns"] == int(T0) * 1000
    assert slices["tab ts"]["start_ns"] == int(T0) * 1000 + 103
    hbm = tables["counters"].filter(pl.col("name") == "HBM").sort("series")
    assert hbm["series"].to_list() == ["Read(MB/s)", "Write(MB/s)", "bad", "flag", "nested"]
    assert hbm["value"].to_list() == [1.5, 2.25, None, None, None]
    assert {c for c, _, _ in ARG_COLUMNS} <= set(tables["slices"].columns)


def _scan_bytes(data: bytes, block: int) -> None:
    """Feed ``data`` to a scanner in blocks of ``block`` bytes, as trace_native does."""
    scanner = native_scan.Scanner(ARG_COLUMNS)
    pending = b""
    for start in range(0, len(data) + 1, block):
        chunk = data[start : start + block]
        data_now = pending + chunk
        consumed = scanner.feed(data_now, not chunk)
        pending = data_now[consumed:]
        if not chunk:
            break
    scanner.take()


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_any_block_size_reads_the_same(block: int) -> None:
    data = json.dumps(_quirks(), ensure_ascii=False).encode()
    _scan_bytes(data, block)  # a character or token cut by a block's end is completed after


@pytest.mark.parametrize("block", [2, 7, 64])
def test_the_file_read_in_any_block_size_gives_the_same_tables(
    block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Events torn at every block's end, events longer than the buffer (it grows), and two
    # ranges read side by side, each wrapped as an array.
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(_quirks() * 3, ensure_ascii=False), "utf-8")
    expected, _ = _parse(trace, tmp_path / "whole", True, monkeypatch)
    monkeypatch.setattr(native_scan, "_BLOCK_BYTES", block)
    monkeypatch.setattr(native_scan, "_PARALLEL_MIN_BYTES", 0)
    assert len(native_scan.ranges(trace, 2)) == 2
    tables, result = _parse(trace, tmp_path / "blocks", True, monkeypatch)
    assert result.reader == "native"
    for table in TRACE_TABLES:
        assert tables[table].equals(expected[table]), table


def test_damaged_bytes_never_crash_the_scanner() -> None:
    """Cut or corrupted input raises ValueError (and the DuckDB reader takes over) or reads:
    the process never dies, whatever the bytes.

    After changing the scanner, run this under AddressSanitizer too: build the module with
    ``-fsanitize=address,undefined`` and run pytest with ``LD_PRELOAD`` set to gcc's libasan and
    libubsan and ``ASAN_OPTIONS=detect_leaks=0`` (clean on the commit that added it).
    """
    data = json.dumps(_quirks(), ensure_ascii=False).encode()
    rng = random.Random(7)
    cases = [data[:cut] for cut in range(0, len(data), 13)]
    for _ in range(400):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.choice(b'{}[]",:\\ \x00\xff\xc3tfn0-.eE')
        cases.append(bytes(mutated))
    cases += [b"", b"[", b"]", b"[]", b"{}", b"[1]", b'["x"]', b"[{}]  x", b"\xef\xbb\xbf[]"]
    for case in cases:
        for block in (5, 1 << 20):
            with contextlib.suppress(ValueError):
                _scan_bytes(case, block)


@pytest.mark.parametrize(
    ("damage", "incomplete"),
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b.replace(b'"name": "no args"', b'"name": "bad \xff byte"'), None),
        (lambda b: b + b"\x00" * 64, None),
        (lambda b: b.replace(b'"tid": 43', b'"tid": "t43"'), None),  # not an integer id
        (lambda b: b.replace(b'{"ph": "i"', b'{"ph": "i" "oops": 1, "x"', 1), "malformed"),
        # an escape JSON has not, in a key (campaign 3, case 385: the scanner kept the event)
        (lambda b: b.replace(b'"ph": "i"', b'"p\\h": "i"', 1), "malformed"),
    ],
    ids=["truncated", "invalid utf-8", "nul padding", "text tid", "malformed event", "bad escape"],
)
def test_what_the_scanner_does_not_read_goes_to_duckdb(
    damage: object, incomplete: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace_view.json"
    trace.write_bytes(damage(json.dumps(_quirks()).encode()))  # type: ignore[operator]
    with pytest.raises(trace_native.NativeUnreadable, match=str(trace)):
        trace_native.scan_trace(trace, 1)
    tables, result = _parse(trace, tmp_path, True, monkeypatch)
    assert result.reader == "duckdb"
    if incomplete:
        assert (result.incomplete or "").startswith(incomplete), result.incomplete
    else:
        assert result.incomplete is None, result.incomplete
    assert tables["slices"].height > 0


def test_ranges_scanned_side_by_side_give_the_same_tables(
    real_g2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three ranges of a small file: row numbers and interned codes are shifted across them.
    monkeypatch.setattr(native_scan, "_PARALLEL_MIN_BYTES", 0)
    trace = real_g2 / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    assert len(native_scan.ranges(trace, 3)) == 3
    _same_tables(trace, tmp_path, monkeypatch, threads=3)


def test_a_cut_inside_a_string_falls_back_to_one_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The boundary pattern inside a string is where the cut lands: that range fails to parse,
    # and the file is scanned whole.
    monkeypatch.setattr(native_scan, "_PARALLEL_MIN_BYTES", 0)
    filler = [_x(f"op{i}", PY_PID, PY_PID, f"{T0}.{i:03d}", 1.0) for i in range(300)]
    trap = _x("trap", PY_PID, PY_PID, f"{T0}.999", 1.0, {"text": "}, {" * 2000})
    events = [*_m(PY_PID, "Python", {PY_PID: "main"}), *filler[:150], trap, *filler[150:]]
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(events))
    ranges = native_scan.ranges(trace, 2)
    assert len(ranges) == 2
    scan = trace_native.scan_trace(trace, 2)
    assert scan.slices.height == 301
    _same_tables(trace, tmp_path, monkeypatch)


def test_a_refusal_without_damage_is_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The DuckDB reader finds nothing wrong with a text tid, so the slower path needs a word.
    trace = tmp_path / "trace_view.json"
    trace.write_bytes(json.dumps(_quirks()).encode().replace(b'"tid": 43', b'"tid": "t43"'))
    _, result = _parse(trace, tmp_path, True, monkeypatch)
    assert result.reader == "duckdb"
    assert any("native scanner refused" in w and "not an integer" in w for w in result.warnings)


def test_an_install_without_the_scanner_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_scan, "Scanner", None)
    assert "not built" in (trace_native.unavailable_note() or "")
    monkeypatch.undo()
    monkeypatch.setenv("TRACEANALYZER_NATIVE", "0")
    assert "turned off" in (trace_native.unavailable_note() or "")
    monkeypatch.setenv("TRACEANALYZER_NATIVE", "1")
    assert trace_native.unavailable_note() is None


def test_args_are_read_again_from_the_file_as_the_scan_saw_them(tmp_path: Path) -> None:
    """The scanner locates the slices' args; a row group reads them from the file, in any row
    order, as JSON text: objects minified, other values as written (as DuckDB gives them)."""
    trace = tmp_path / "trace_view.json"
    events = [
        _x("obj", PY_PID, PY_PID, f"{T0}.1", 1.0, {"k": [1, {"x": "a b"}], "s": '\\ "'}),
        _x("none", PY_PID, PY_PID, f"{T0}.2", 1.0),
        {**_x("text", PY_PID, PY_PID, f"{T0}.3", 1.0), "args": 'q"uote'},
    ]
    trace.write_text(json.dumps(events, indent=2))
    scan = trace_native.scan_trace(trace, 1)
    backwards = scan.slices.reverse()
    texts = scan.located_args.text(backwards["args_at"], backwards["args_len"]).to_list()
    scan.located_args.close()
    minified = json.dumps(events[0]["args"], separators=(",", ":"))
    assert texts == ['"q\\"uote"', None, minified]


def test_a_trace_changed_after_its_scan_is_read_by_duckdb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The args are read from the file after the scan: if it changed in between (a profiler
    still writing it), the DuckDB reader reads it whole, and nothing of the native read stays."""
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(_quirks()))
    scan = trace_native.scan_trace

    def scan_then_change(path: Path, threads: int):  # noqa: ANN202
        events = scan(path, threads)
        path.write_text(json.dumps(_quirks()[::-1]))  # same events, other offsets
        return events

    monkeypatch.setattr(trace_native, "scan_trace", scan_then_change)
    tables, result = _parse(trace, tmp_path, True, monkeypatch)
    assert result.reader == "duckdb"
    assert any("changed while it was being read" in w for w in result.warnings), result.warnings
    assert tables["slices"].filter(pl.col("name") == "empty args")["args"].to_list() == [None]


def test_an_args_range_outside_the_file_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace_view.json"
    trace.write_text(json.dumps(_quirks()))
    fd = os.open(trace, os.O_RDONLY)
    try:
        at, length = np.array([trace.stat().st_size - 2]), np.array([10], dtype=np.int32)
        with pytest.raises(ValueError, match="does not hold"):
            native_scan.args_text(fd, at, length, np.array([0]))
    finally:
        os.close(fd)
