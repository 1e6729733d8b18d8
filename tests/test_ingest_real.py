"""Ingest of the real two-rank G2 Level1 export, checked against counts computed independently."""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store


def _events(rank_dir: Path) -> list[dict]:
    return json.loads((rank_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text("utf-8"))


def _ns(ts: str) -> int:
    whole, _, frac = ts.partition(".")
    return int(whole) * 1000 + int((frac + "000")[:3])


def _rank_dirs(real_g2: Path) -> dict[int, Path]:
    return {int(p.name[4]): p for p in sorted(real_g2.glob("rank*_ascend_pt"))}


def test_row_counts_match_independent_count(real_g2: Path, real_g2_store: Path) -> None:
    store = Store.open(real_g2_store)
    for rank, rank_dir in _rank_dirs(real_g2).items():
        events = _events(rank_dir)
        by_ph = Counter(e["ph"] for e in events)
        counter_rows = sum(len(e.get("args", {})) for e in events if e["ph"] == "C")
        rows = {
            t: store.table(t).filter(pl.col("rank") == rank).select(pl.len()).collect().item()
            for t in store.table_names
        }
        assert rows["slices"] == by_ph["X"] + by_ph.get("i", 0)
        assert rows["counters"] == counter_rows
        with open(rank_dir / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="") as fh:
            assert rows["kernels"] == sum(1 for _ in csv.reader(fh)) - 1
        for table, name in (
            ("api_stats", "api_statistic.csv"),
            ("memory_records", "memory_record.csv"),
            ("op_memory", "operator_memory.csv"),
            ("module_memory", "npu_module_mem.csv"),
            ("l2_cache", "l2_cache.csv"),
        ):
            with open(rank_dir / "ASCEND_PROFILER_OUTPUT" / name, newline="") as fh:
                assert rows[table] == sum(1 for _ in csv.reader(fh)) - 1, table
        assert rows["sessions"] == 1


def test_slices_are_stored_by_process_in_time_order_parents_first(real_g2_store: Path) -> None:
    """In file order (what a reader sees without sorting): grouped by process, by start within
    it, the longer first; each row group holds few processes, and says which (its statistics),
    so that a scan of one process skips the others' row groups."""
    import pyarrow.parquet as pq

    for part in sorted((real_g2_store / "tables" / "slices").glob("**/*.parquet")):
        got = pl.read_parquet(part, columns=["process", "start_ns", "dur_ns"])
        expected = got.sort(
            ["process", "start_ns", "dur_ns"], descending=[False, False, True], maintain_order=True
        )
        assert got.equals(expected), part
        meta = pq.ParquetFile(part).metadata
        column = meta.schema.names.index("process")
        stats = [meta.row_group(i).column(column).statistics for i in range(meta.num_row_groups)]
        assert all(s is not None and s.has_min_max for s in stats), part


def test_every_timestamp_exact_to_the_ns(real_g2: Path, real_g2_store: Path) -> None:
    store = Store.open(real_g2_store)
    for rank, rank_dir in _rank_dirs(real_g2).items():
        expected = sorted(_ns(e["ts"]) for e in _events(rank_dir) if e["ph"] == "X")
        got = (
            store.table("slices")
            .filter(pl.col("rank") == rank)
            .select("start_ns")
            .collect()["start_ns"]
            .sort()
            .to_list()
        )
        assert got == expected
        # A float64 round trip would not survive this check: epoch ns need 61 bits.
        assert any((v % 1000) not in (0,) for v in got)


def test_memory_tables_exact_and_typed(real_g2: Path, real_g2_store: Path) -> None:
    store = Store.open(real_g2_store)
    for rank, rank_dir in _rank_dirs(real_g2).items():
        with open(rank_dir / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv", newline="") as fh:
            records = list(csv.DictReader(fh))
        got = store.table("memory_records").filter(pl.col("rank") == rank).collect()
        assert sorted(got["ts_ns"]) == sorted(_ns(r["Timestamp(us)"].strip()) for r in records)
        reserved = sorted(float(r["Total Reserved(MB)"]) for r in records)
        assert sorted(got["total_reserved_mb"]) == reserved
        ops = store.table("op_memory").filter(pl.col("rank") == rank).collect()
        assert ops["size_kb"].null_count() == 0 and ops["alloc_ns"].null_count() == 0
        l2 = store.table("l2_cache").filter(pl.col("rank") == rank).collect()
        assert l2["hit_rate"].null_count() > 0  # `N/A` became null


def test_processes_and_threads_are_named(real_g2_store: Path) -> None:
    store = Store.open(real_g2_store)
    slices = store.table("slices").collect()
    assert slices["process"].null_count() == 0 and slices["thread"].null_count() == 0
    assert not slices.filter(pl.col("process").str.starts_with("pid ")).height
    processes = set(slices["process"].unique())
    assert {"Python", "CANN", "Ascend Hardware", "HCCL", "Overlap Analysis"} <= processes
    hw = slices.filter(pl.col("process") == "Ascend Hardware")
    assert hw["stream_id"].null_count() == 0
    assert (hw["thread"] == ("Stream " + hw["stream_id"].cast(pl.String))).all()


def test_flows_are_paired(real_g2: Path, real_g2_store: Path) -> None:
    store = Store.open(real_g2_store)
    flows = store.table("flows").filter(pl.col("rank") == 0).collect()
    events = _events(_rank_dirs(real_g2)[0])
    starts = {(e["cat"], str(e["id"])) for e in events if e["ph"] == "s"}
    finishes = [(e["cat"], str(e["id"])) for e in events if e["ph"] == "f"]
    paired = flows.filter(pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null())
    assert paired.height == sum(1 for f in finishes if f in starts)
    torch_to_npu = flows.filter(pl.col("cat") == "async_npu")
    assert set(torch_to_npu["dst_process"].unique()) <= {"Ascend Hardware", "HCCL"}
    # torch_npu sets the async_npu flow id to the kernel start in ns.
    assert (torch_to_npu["flow_id"].cast(pl.Int64) == torch_to_npu["end_ns"]).all()


def test_flattened_args(real_g2_store: Path) -> None:
    slices = Store.open(real_g2_store).table("slices").collect()
    cann = slices.filter(pl.col("process") == "CANN")
    assert set(cann["api_level"].unique()) >= {"acl", "node"}
    assert cann["api_name"].null_count() == 0
    memcpy = slices.filter(pl.col("name") == "MEMCPY_ASYNC")
    assert set(memcpy["task_type"]) <= {"PCIE_DMA_SQE", "SDMA_SQE"} and memcpy.height > 0
    hw = slices.filter(pl.col("process") == "Ascend Hardware")
    assert hw["task_type"].null_count() == 0
    # Eager kernels carry the 4294967295 model-id sentinel: it becomes null.
    assert hw["model_id"].null_count() == hw.height
    # `args` is the event's object verbatim: its keys agree with the flattened columns.
    assert (hw["args"].str.json_path_match("$['Task Type']") == hw["task_type"]).all()


def test_sessions_metadata(real_g2_store: Path) -> None:
    sessions = Store.open(real_g2_store).sessions()
    assert sessions["rank"].to_list() == [0, 1]
    assert set(sessions["profiler_level"]) == {"Level1"}
    assert set(sessions["generation"]) == {"g2"}
    assert set(sessions["export_type"]) == {"text"}


def test_rerun_reuses_store_and_input_untouched(real_g2: Path, tmp_path: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in real_g2.rglob("*")}
    first = ingest(real_g2, tmp_path / "out", jobs=2)
    second = ingest(real_g2, tmp_path / "out", jobs=2)
    assert {o.status for o in first.outcomes} == {"ingested"}
    assert {o.status for o in second.outcomes} == {"cached"}
    assert {p: p.stat().st_mtime_ns for p in real_g2.rglob("*")} == before


def test_duckdb_and_polars_glob_queries(real_g2_store: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    glob = os.path.join(real_g2_store, "tables", "kernels", "**", "*.parquet")
    n_polars = pl.scan_parquet(glob, hive_partitioning=True).select(pl.len()).collect().item()
    query = f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning = true)"
    n_duck = duckdb.connect().execute(query).fetchall()[0][0]
    assert n_polars == n_duck == 382


def test_cli_run_on_the_real_healthy_export_is_clean(real_g2: Path, tmp_path: Path) -> None:
    """A healthy training run: no rule fires, nothing errors, and the reasons are stated."""
    from click.testing import CliRunner

    from traceanalyzer.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["run", str(real_g2), "--out", str(out), "--executor", "local", "--fail-on", "info"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "findings.json").read_text())
    assert doc["findings"] == [] and doc["errors"] == []
    reasons = {r["name"]: r["reason"] for r in doc["not_evaluated"]}
    assert "no transfer spans found" in reasons["store-transfer-stall"]
    for name in ("report.html", "report.md", "findings.sarif", "annotations.json"):
        assert (out / name).is_file()
