"""The fixture builder: a few lines give a complete rank dir, and our own ingest reads back what was built."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from synth_support import load_trace

from traceanalyzer.kit.testing import us
from traceanalyzer.kit.testing.rank_builder import RankBuilder, build_store
from traceanalyzer.synth import generate
from traceanalyzer.synth.fmt import EPOCH_NS


def _stall(rank: int = 0, level: int = 1) -> RankBuilder:
    b = RankBuilder(rank=rank, generation="g2", level=level)
    b.span("batch_get_into_multi_buffers", start_ns=us(1000), dur_ns=us(2_000_000))
    b.memcpy_async(start_ns=us(1100.5), stream=9, task_start_ns=us(1_990_000), task_dur_ns=us(800))
    b.api("aclrtSynchronizeStream", start_ns=us(1120), dur_ns=us(1_990_000))
    b.task(
        "Notify Wait",
        stream=39,
        task_type="NOTIFY_WAIT_SQE",
        start_ns=us(900),
        dur_ns=us(1_980_000),
    )
    b.task(
        "EVENT_WAIT", stream=40, task_type="EVENT_WAIT_SQE", start_ns=us(950), dur_ns=us(1_970_000)
    )
    b.capture(start_ns=us(2_100_000), dur_ns=us(3000), memcpy_calls=12)
    b.kernel(start_ns=us(10), dur_ns=us(5.5))
    return b


def test_builder_writes_exact_times_and_consistent_files(tmp_path: Path) -> None:
    d = _stall(level=2).write(tmp_path)
    assert d.name.endswith("_ascend_pt") and (d / "profiler_info_0.json").is_file()
    text = (d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text()
    assert '"ts": "1736408883001000.000"' in text  # span start, exact
    assert '"ts": "1736408883001100.500"' in text  # memcpy call, exact half µs
    events = load_trace(d)
    span = next(e for e in events if e["name"] == "batch_get_into_multi_buffers")
    assert span["dur"] == 2_000_000.0 and span["cat"] == "cpu_op"
    with open(d / "ASCEND_PROFILER_OUTPUT" / "api_statistic.csv", newline="") as fh:
        api = {(r["Level"], r["API Name"]): int(r["Count"]) for r in csv.DictReader(fh)}
    assert api[("acl", "aclrtMemcpy")] == 12 and api[("runtime", "MemCopySync")] == 12
    assert api[("acl", "aclmdlRICaptureBegin")] == api[("acl", "aclmdlRICaptureEnd")] == 1
    flows = [e for e in events if e.get("cat") == "HostToDevice"]
    assert {e["ph"] for e in flows} == {"s", "f"} and len({e["id"] for e in flows}) == 1


def test_builder_metadata_steps_and_ranks(tmp_path: Path) -> None:
    b = RankBuilder(rank=1, generation="g3", level=1).metadata(
        **{"traceanalyzer.window": "store_transfer"}
    )
    b.step(7, start_ns=0, dur_ns=us(500)).kernel(start_ns=us(100), dur_ns=us(20))
    d = b.write(tmp_path)
    assert (
        json.loads((d / "profiler_metadata.json").read_text())["traceanalyzer.window"]
        == "store_transfer"
    )
    assert json.loads((d / "profiler_info_1.json").read_text())["rank_id"] == "1"
    with open(d / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["Step Id"] == "7" and rows[0]["Device_id"] == "1"


def _ingest_available() -> bool:
    try:
        from traceanalyzer.ingest import ingest  # noqa: F401
        from traceanalyzer.store import Store  # noqa: F401
    except ImportError:
        return False
    return True


needs_ingest = pytest.mark.skipif(
    not _ingest_available(), reason="traceanalyzer.ingest not available"
)


@needs_ingest
def test_build_store_round_trips_times(tmp_path: Path) -> None:
    import polars as pl

    from traceanalyzer.store import Store

    out = build_store(tmp_path, _stall(0), _stall(1))
    slices = Store.open(out).table("slices").collect()
    span = slices.filter(pl.col("name") == "batch_get_into_multi_buffers")
    assert span.height == 2
    assert set(span["start_ns"].to_list()) == {EPOCH_NS + 1_000_000}
    assert set(span["dur_ns"].to_list()) == {2_000_000_000}
    memcpy = slices.filter(pl.col("name") == "AscendCL@aclrtMemcpyAsync")
    assert set(memcpy["start_ns"].to_list()) == {EPOCH_NS + 1_100_500}
    waits = slices.filter(pl.col("task_type") == "NOTIFY_WAIT_SQE")
    assert set(waits["stream_id"].to_list()) == {39}


@needs_ingest
def test_generated_counts_round_trip_through_ingest(tmp_path: Path) -> None:
    import polars as pl

    from traceanalyzer.ingest import ingest
    from traceanalyzer.store import Store

    dirs = generate("store-stall", tmp_path / "in", ranks=2, sick="1", layers=1)
    ingest(tmp_path / "in", tmp_path / "out")
    store = Store.open(tmp_path / "out")
    slices = store.table("slices").collect()
    for rank, d in enumerate(dirs):
        events = [e for e in load_trace(d) if e["ph"] == "X"]
        mine = slices.filter(pl.col("rank") == rank)
        assert mine.height == len(events)
        want = sorted(int(e["ts"].replace(".", "")) for e in events)
        assert sorted(mine["start_ns"].to_list()) == want
        kernels = store.table("kernels").filter(pl.col("rank") == rank).collect()
        with open(d / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="") as fh:
            assert kernels.height == sum(1 for _ in csv.DictReader(fh))
