"""Large traces through the DuckDB reader: read as chunk copies in parallel (the tables must not
depend on it), and parsed again with a larger budget when DuckDB runs out of memory.

Chunking normally starts at 64 MB; these tests lower the threshold so small files take the
chunked path, and compare with the whole-file path. The native reader is turned off here
(tests/test_ingest_native.py covers its own ranges).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from traceanalyzer.discover import discover
from traceanalyzer.ingest.session import ingest_session
from traceanalyzer.parse import json_array, trace_duckdb, trace_view
from traceanalyzer.store import Store

TRACE_TABLES = ("slices", "counters", "flows", "threads")


def _tables(rank_dir: Path, out: Path) -> dict[str, pl.DataFrame]:
    session = discover(rank_dir).sessions[0]
    out.mkdir(parents=True)
    outcome = ingest_session(session, out, threads=2)
    assert outcome.status == "ingested", outcome
    store = Store.open(out)
    # Rows equal in every sort key may come in either order; compare as sets of rows.
    return {t: store.table(t).collect().sort(pl.all(), nulls_last=True) for t in TRACE_TABLES}


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_bytes())


@pytest.fixture(autouse=True)
def duckdb_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEANALYZER_NATIVE", "0")


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_duckdb, "_CHUNKED_MIN_BYTES", 0)


def test_chunks_hold_every_event_once(real_g2: Path, tmp_path: Path) -> None:
    trace = real_g2 / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    chunks = json_array.split(trace, tmp_path, parts=5)
    assert chunks is not None and len(chunks) == 5
    assert [e for c in chunks for e in _events(c)] == _events(trace)


def test_chunked_and_whole_file_give_the_same_tables(
    real_g2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = real_g2 / "rank0_ascend_pt"
    monkeypatch.setattr(trace_duckdb, "_CHUNKED_MIN_BYTES", 1 << 62)
    whole = _tables(rank, tmp_path / "whole")
    monkeypatch.setattr(trace_duckdb, "_CHUNKED_MIN_BYTES", 0)
    chunked = _tables(rank, tmp_path / "chunked")
    for table in TRACE_TABLES:
        assert chunked[table].equals(whole[table]), table


def _rank_with_trace(root: Path, real_g2: Path, trace: bytes) -> Path:
    rank = root / "r_ascend_pt"
    shutil.copytree(real_g2 / "rank0_ascend_pt", rank)
    target = rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    target.chmod(0o644)
    target.write_bytes(trace)
    return rank


def test_false_boundary_inside_a_string_falls_back_to_the_whole_file(
    chunked: None, real_g2: Path, tmp_path: Path
) -> None:
    # A call stack full of "}, {" around the middle of the file, where the cut is searched.
    tricky = {
        "ph": "X",
        "name": "aten::copy_",
        "pid": 1,
        "tid": 1,
        "ts": "1736408883704643.212",
        "dur": 1.5,
        "args": {"Call stack": "f(){}, {g}; " * 20000},
    }
    head = {**tricky, "args": {}, "name": "first"}
    tail = {**tricky, "args": {}, "name": "last"}
    trace = json.dumps([head, tricky, tail]).encode()
    path = tmp_path / "trace.json"
    path.write_bytes(trace)
    chunks = json_array.split(path, tmp_path / "chunks", parts=2)
    assert chunks is not None  # the byte pattern was found, inside the string
    with pytest.raises(json.JSONDecodeError):
        _events(chunks[0])

    rank = _rank_with_trace(tmp_path / "in", real_g2, trace)
    slices = _tables(rank, tmp_path / "out")["slices"]
    assert sorted(slices["name"]) == ["aten::copy_", "first", "last"]
    assert slices.filter(pl.col("name") == "aten::copy_")["args"].str.len_bytes()[0] > 200_000


def test_truncated_file_is_recovered_when_chunked(
    real_g2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = (real_g2 / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_bytes()
    rank = _rank_with_trace(tmp_path / "in", real_g2, full[: int(len(full) * 0.9)])
    monkeypatch.setattr(trace_duckdb, "_CHUNKED_MIN_BYTES", 1 << 62)
    whole = _tables(rank, tmp_path / "whole")
    monkeypatch.setattr(trace_duckdb, "_CHUNKED_MIN_BYTES", 0)
    session = discover(rank).sessions[0]
    (tmp_path / "out").mkdir()
    outcome = ingest_session(session, tmp_path / "out", threads=2)
    assert any("truncated" in w for w in outcome.warnings), outcome.warnings
    assert outcome.rows["slices"] == whole["slices"].height > 0
    assert not list((tmp_path / "out").glob(".scratch.*")), "chunk copies must be removed"


def test_not_an_array_is_not_split(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}]}')
    assert json_array.split(path, tmp_path / "chunks", parts=2) is None


def test_chunks_without_kernel_copy(
    real_g2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where copy_file_range is missing or refuses (not Linux, across file systems)."""

    def refuse(*args: object) -> int:
        raise OSError("EXDEV")

    monkeypatch.setattr(json_array.os, "copy_file_range", refuse, raising=False)
    trace = real_g2 / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    chunks = json_array.split(trace, tmp_path, parts=3)
    assert chunks is not None
    assert [e for c in chunks for e in _events(c)] == _events(trace)


def test_out_of_budget_parses_again_with_twice_the_budget(
    real_g2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets: list[int] = []
    read = trace_duckdb.read_events

    def tight_first(path, scratch, threads, budget_mb, result):  # noqa: ANN001, ANN202
        budgets.append(budget_mb)
        if len(budgets) == 1:
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
        return read(path, scratch, threads, budget_mb, result)

    monkeypatch.setattr(trace_duckdb, "read_events", tight_first)
    session = discover(real_g2 / "rank0_ascend_pt").sessions[0]
    (tmp_path / "out").mkdir()
    outcome = ingest_session(session, tmp_path / "out", threads=2)
    assert outcome.status == "ingested"
    assert budgets == [128, 256]
    assert any("parsed again with 256 MB" in w for w in outcome.warnings), outcome.warnings
    assert outcome.rows["slices"] > 0


def test_boundary_near_finds_a_boundary_that_straddles_the_middle(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(b'[{"a":1}, {"b":2}]')
    # The middle of (1, 17) is byte 9, inside the separator "}, {" (bytes 7..10).
    assert json_array.boundary_near(path, 1, 17) == 8
    assert json_array.boundary_near(path, 8, 17) is None  # one event: nothing strictly inside
    assert json_array.array_body(path) == (1, 17, True)
    path.write_bytes(b'[{"a":1}, {"b":2}]' + b"\x00" * 70_000)  # NUL padding from a crash
    assert json_array.array_body(path) == (1, 17, True)
    path.write_bytes(b'[{"a":1}, {"b"')  # truncated
    assert json_array.array_body(path) == (1, path.stat().st_size, False)


def test_parse_memory_settings(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_bytes(b"[]")
    assert trace_view.ParseMemory.parse("1.2x").limit_mb(trace) == 128  # the floor
    assert trace_view.ParseMemory.parse("2GB").limit_mb(trace) == 2048
    assert trace_view.ParseMemory.parse(" 800mb ").limit_mb(trace) == 800
    with open(trace, "wb") as fh:  # a sparse 1000 MB file
        fh.truncate(1000 << 20)
    assert trace_view.ParseMemory.parse("1.5x").limit_mb(trace) == 1500
    assert str(trace_view.ParseMemory.parse("3x")) == "3x"
    for bad in ("", "1.2", "-1x", "0x", "lots"):
        with pytest.raises(ValueError, match="expected a multiple of the trace size"):
            trace_view.ParseMemory.parse(bad)


def test_run_takes_a_parse_memory_and_rejects_a_bad_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from traceanalyzer.cli import main

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "inference_baseline"
    ok = CliRunner().invoke(
        main, ["run", str(sample), "--out", str(tmp_path / "o"), "-q", "--parse-memory", "256MB"]
    )
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(main, ["run", str(sample), "--parse-memory", "lots"])
    assert bad.exit_code == 2 and "--parse-memory" in bad.output and "'lots'" in bad.output


def test_parsing_connections_draw_no_progress_bar() -> None:
    """DuckDB draws one on stdout for queries over 2 s, even without a terminal: on a large trace
    it would corrupt `run --format json`."""
    from traceanalyzer.parse import csv_tables
    from traceanalyzer.parse.duckdb_connect import connect_duckdb

    for con in (connect_duckdb({"threads": 1}), csv_tables.CsvDatabase().cursor()):
        assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0] is False
