"""StoreBuilder and RankBuilder speak one vocabulary, and both link a task to its host launch."""

from __future__ import annotations

import inspect

import polars as pl
import pytest

from traceanalyzer.kit import Launch, RankBuilder, StoreBuilder, host_launches, ingested, us
from traceanalyzer.synth.fmt import EPOCH_NS

# Keywords only one builder has, and why: the store builder writes rows a generator composes
# from events (their ids, categories and series); the generator writes what files carry.
ONLY_IN_STORE_BUILDER = {"connection_id", "cat", "process", "series"}
ONLY_IN_RANK_BUILDER = {"mode", "args"}


def verbs(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_") and name not in ("store", "write")
    }


def test_shared_verbs_take_the_same_arguments() -> None:
    store_verbs, rank_verbs = verbs(StoreBuilder), verbs(RankBuilder)
    shared = store_verbs.keys() & rank_verbs.keys()
    assert {"api", "replay", "span", "step", "task", "kernel", "counter"} <= shared
    for verb in sorted(shared):
        # a StoreBuilder verb adds the rank and session its row belongs to, nothing else
        store = [p for p in store_verbs[verb].parameters.values() if p.name != "self"]
        assert [p.name for p in store[:2]] == ["rank", "session"], verb
        store_params = {p.name: p for p in store[2:]}
        rank_params = {p.name: p for p in rank_verbs[verb].parameters.values() if p.name != "self"}
        assert store_params.keys() - rank_params.keys() <= ONLY_IN_STORE_BUILDER, verb
        assert rank_params.keys() - store_params.keys() <= ONLY_IN_RANK_BUILDER, verb
        for name in store_params.keys() & rank_params.keys():
            assert store_params[name].kind == rank_params[name].kind, (verb, name)


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
