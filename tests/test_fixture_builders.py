"""StoreBuilder and RankBuilder speak one set of verbs, and both link a task to its host launch."""

from __future__ import annotations

import inspect

import polars as pl
import pytest

from traceanalyzer.kit import host_launches
from traceanalyzer.kit.testing import Launch, RankBuilder, StoreBuilder, ingested, us
from traceanalyzer.kit.testing.verbs import VERBS, FixtureVerbs
from traceanalyzer.synth.fmt import EPOCH_NS


def test_the_shared_verbs_are_defined_once() -> None:
    """One definition per verb (kit/testing/verbs.py): the rank builder inherits it, and the
    store builder's takes the rank and session its rows belong to, then the same arguments."""
    for verb in VERBS:
        shared = getattr(FixtureVerbs, verb)
        assert getattr(RankBuilder, verb) is shared, verb
        in_store = getattr(StoreBuilder, verb)
        assert in_store.__wrapped__ is shared and in_store.__doc__ == shared.__doc__, verb
        own, *keywords = inspect.signature(shared).parameters.values()
        params = list(inspect.signature(in_store).parameters.values())
        assert [p.name for p in params[:3]] == [own.name, "rank", "session"], verb
        assert params[3:] == keywords, verb


def test_a_builder_imported_from_the_kit_says_where_it_moved() -> None:
    """The builders were the kit's until they moved to kit.testing: a user's fixture that
    imports one the old way is told the new place, not only that the name is missing."""
    with pytest.raises(ImportError, match=r"from traceanalyzer\.kit\.testing import StoreBuilder"):
        from traceanalyzer.kit import StoreBuilder  # noqa: F401
    import traceanalyzer.kit as kit

    assert not hasattr(kit, "no_such_name")  # any other name is missing as usual


# What only one side can write, and how the other says so.
REFUSED = [
    (lambda: RankBuilder().api("aclrtMemcpy", start_ns=0, dur_ns=1, connection_id=7),
     r"RankBuilder\.api cannot write connection_id=7: the generator numbers"),
    (lambda: RankBuilder().span("f", start_ns=0, dur_ns=1, cat="python_function"),
     r"RankBuilder\.span cannot write cat='python_function'"),
    (lambda: RankBuilder().counter("HBM", ts_ns=0, value=1.0),
     r"RankBuilder\.counter cannot write .*'AI Core Freq' counter \(MHz\) only"),
    (lambda: StoreBuilder().task(0, "s", "EVENT_WAIT", stream=2, start_ns=0, dur_ns=1,
                                 args={"k": 1}),
     r"StoreBuilder\.task cannot write args=\{'k': 1\}: the store holds"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "refused"), REFUSED)
def test_a_keyword_one_side_cannot_write_is_refused_by_name(call, refused) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=refused):
        call()


def test_a_task_takes_a_connection_id_or_a_launch() -> None:
    with pytest.raises(ValueError, match="connection_id or a launch"):
        StoreBuilder().task(0, "s", "X", stream=2, start_ns=0, dur_ns=1, connection_id=1,
                            launch=Launch(0))  # fmt: skip


def test_times_are_exact_int_ns() -> None:
    assert us(1100.5) == 1_100_500 and us("0.001") == 1 and us(-5) == -5_000
    with pytest.raises(TypeError, match=r"int nanoseconds.*us\(\.\.\.\)"):
        StoreBuilder().api(0, "s", "aclrtMemcpy", start_ns=1.5, dur_ns=10)
    with pytest.raises(TypeError, match="int nanoseconds"):
        RankBuilder().task("EVENT_WAIT", stream=2, start_ns=0, dur_ns=2.5)
    with pytest.raises(ValueError, match="linked_by"):
        Launch(0, linked_by="magic")  # type: ignore[arg-type]


LINKS = {2: "both", 3: "connection_id", 4: "flow"}  # stream -> how its kernel is linked
EXPECTED = {"both": "connection_id", "connection_id": "connection_id", "flow": "HostToDevice"}


def _launched(frames: tuple[pl.LazyFrame, pl.LazyFrame], epoch: int) -> None:
    out = host_launches(*frames).filter(pl.col("name") == "MatMulV2")
    rows = {r["stream"]: r for r in out.iter_rows(named=True)}
    assert rows.keys() == LINKS.keys()
    for stream, linked_by in LINKS.items():
        row = rows[stream]
        assert row["link"] == EXPECTED[linked_by], linked_by
        assert row["launch_name"] == "Node@launch" and row["launch_op"] == "AscendCL@aclnnMm"
        assert row["start_ns"] == epoch + us(100 * stream + 40)
        assert row["launch_start_ns"] == epoch + us(100 * stream) + us(20) // 4


def test_store_builder_links_a_kernel_to_its_launch() -> None:
    b = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(1_000))
    for stream, linked_by in LINKS.items():
        launch = Launch(us(100 * stream), linked_by=linked_by)  # type: ignore[arg-type]
        b.kernel(0, "s", "MatMulV2", stream=stream, start_ns=us(100 * stream + 40),
                 dur_ns=us(10), launch=launch)  # fmt: skip
    store = b.store()
    assert store.table("kernels").collect().height == 3
    _launched((store.table("slices"), store.table("flows")), 0)


def test_rank_builder_links_a_kernel_to_its_launch() -> None:
    b = RankBuilder(rank=0)
    for stream, linked_by in LINKS.items():
        launch = Launch(us(100 * stream), linked_by=linked_by)  # type: ignore[arg-type]
        b.kernel("MatMulV2", stream=stream, start_ns=us(100 * stream + 40), dur_ns=us(10),
                 launch=launch)  # fmt: skip
    store = ingested(b)
    _launched((store.table("slices"), store.table("flows")), EPOCH_NS)


# One fixture written twice: the same calls on both builders give the same rows.
CALLS = [
    ("span", ("aten::mm",), {"start_ns": us(1), "dur_ns": us(100), "thread": "Thread 7"}),
    ("api", ("aclrtMemcpy",), {"start_ns": us(10), "dur_ns": us(5), "thread": "Thread 7"}),
    ("memcpy_async", (), {"stream": 9, "start_ns": us(20), "task_start_ns": us(40),
                          "task_dur_ns": us(8), "thread": "Thread 7"}),
    ("kernel", ("MatMulV2",), {"stream": 2, "start_ns": us(60), "dur_ns": us(10),
                               "launch": Launch(us(45), thread="Thread 7")}),
    ("task", ("EVENT_WAIT",), {"stream": 3, "start_ns": us(70), "dur_ns": us(5),
                               "task_type": "EVENT_WAIT_SQE"}),
]  # fmt: skip
COMPARED = ["process", "thread", "name", "stream_id", "task_type", "start_ns", "dur_ns",
            "memcpy_size", "memcpy_direction"]  # fmt: skip


def _rows(frames: pl.LazyFrame, epoch: int) -> list[tuple]:
    rows = (
        frames.filter(pl.col("process").is_in(["Python", "CANN", "Ascend Hardware"]))
        .with_columns(pl.col("start_ns") - epoch)
        .select(COMPARED)
        .collect()
    )
    return sorted(rows.iter_rows(), key=str)


def test_the_same_calls_give_the_same_rows_on_both_builders() -> None:
    store_builder = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(1_000))
    rank_builder = RankBuilder(rank=0)
    for verb, args, kwargs in CALLS:
        getattr(store_builder, verb)(0, "s", *args, **kwargs)
        getattr(rank_builder, verb)(*args, **kwargs)
    in_memory, through_files = store_builder.store(), ingested(rank_builder)
    rows = _rows(in_memory.table("slices"), 0)
    assert len(rows) == 8  # the span, 2 calls + Node@launch + the launch's aclnnMm, 3 tasks
    assert rows == _rows(through_files.table("slices"), EPOCH_NS)
    flows = [s.table("flows").collect().height for s in (in_memory, through_files)]
    assert flows == [2, 2]  # the copy's and the launch's HostToDevice flows


def test_the_memory_verb_gives_the_same_records_on_both_builders() -> None:
    """A memory_record row lands in the store as ingest reads it from memory_record.csv: the
    torch rows with their active total and stream, GE and APP without."""
    records = [
        ("PTA", {"ts_ns": us(10), "allocated_mb": 1187.9814453125, "reserved_mb": 1452.0}),
        ("GE", {"ts_ns": us(11), "allocated_mb": 73.0625, "reserved_mb": 74.75}),
        ("PTA+GE", {"ts_ns": us(11), "allocated_mb": 1261.0439453125, "reserved_mb": 1526.75}),
        ("APP", {"ts_ns": us(20), "reserved_mb": 2113.73046875}),
    ]
    store_builder = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(1_000))
    rank_builder = RankBuilder(rank=0)
    for component, kwargs in records:
        store_builder.memory(0, "s", component, **kwargs)
        rank_builder.memory(component, **kwargs)
    columns = ["component", "ts_ns", "total_allocated_mb", "total_reserved_mb",
               "total_active_mb", "stream_ptr", "device_type"]  # fmt: skip

    def rows(store, epoch: int) -> list[tuple]:  # noqa: ANN001
        frame = store.table("memory_records").with_columns(pl.col("ts_ns") - epoch)
        return sorted(frame.select(columns).collect().iter_rows(), key=str)

    in_memory = rows(store_builder.store(), 0)
    assert len(in_memory) == 4
    assert in_memory == rows(ingested(rank_builder), EPOCH_NS)
    with pytest.raises(ValueError, match="APP records reserved_mb only"):
        StoreBuilder().memory(0, "s", "APP", ts_ns=0, reserved_mb=1.0, allocated_mb=1.0)
