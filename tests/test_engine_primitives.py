"""Primitives on hand-made frames, including the edge cases rules trip over."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from traceanalyzer.api_layers import one_api_layer
from traceanalyzer.host_gaps import stream_gaps
from traceanalyzer.intervals import (
    count_in_windows,
    covered_fraction,
    outermost,
    overlap_join,
    pair_windows,
    total_length,
    union_intervals,
    window_of,
)
from traceanalyzer.kit.testing import us
from traceanalyzer.kit.testing.store_builder import StoreBuilder
from traceanalyzer.launch_links import containing_call, host_launches
from traceanalyzer.stats import growth_ratio, mann_kendall, spearman, theil_sen_slope, trend


def frame(intervals, **extra):
    n = len(intervals)
    return pl.DataFrame(
        {
            "rank": extra.pop("rank", [0] * n),
            "session": extra.pop("session", ["s"] * n),
            "start_ns": [s for s, _ in intervals],
            "end_ns": [e for _, e in intervals],
            **extra,
        }
    )


# --- overlap_join ------------------------------------------------------------------------------


def test_overlap_join_clips_and_respects_keys():
    spans = frame([(10, 20)], sid=[1])
    tasks = frame([(0, 12), (15, 30), (25, 40), (12, 14)], rank=[0, 0, 0, 1], tid=[1, 2, 3, 4])
    out = overlap_join(spans, tasks).sort("tid")
    assert out["tid"].to_list() == [1, 2]  # tid 3 is after the span, tid 4 is another rank
    assert out["overlap_ns"].to_list() == [2, 5]
    assert out["overlap_start_ns"].to_list() == [10, 15]


def test_overlap_join_zero_length_task_is_a_point():
    spans = frame([(10, 20)], sid=[1])
    tasks = frame([(10, 10), (20, 20), (15, 15)], tid=[1, 2, 3])
    out = overlap_join(spans, tasks)
    assert sorted(out["tid"].to_list()) == [1, 3]  # half-open: a point at the end is outside
    assert out["overlap_ns"].to_list() == [0, 0]


def test_overlap_join_modes():
    spans = frame([(10, 20)], sid=[1])
    tasks = frame([(5, 12), (12, 18), (18, 25)], tid=[1, 2, 3])
    assert overlap_join(spans, tasks, mode="contain")["tid"].to_list() == [2]
    assert overlap_join(spans, tasks, mode="start_within")["tid"].to_list() == [2, 3]


def test_overlap_join_lazy_in_lazy_out():
    out = overlap_join(frame([(0, 10)], sid=[1]).lazy(), frame([(5, 6)]).lazy())
    assert isinstance(out, pl.LazyFrame)
    assert out.collect().height == 1


# --- unions and coverage -----------------------------------------------------------------------


def test_union_merges_overlapping_and_touching_drops_empty():
    merged = union_intervals(frame([(0, 5), (5, 9), (3, 4), (20, 30), (25, 26), (40, 40)]))
    assert merged.select("start_ns", "end_ns").rows() == [(0, 9), (20, 30)]


def test_union_is_per_group():
    f = frame([(0, 10), (5, 15)], rank=[0, 1])
    assert union_intervals(f).height == 2
    assert union_intervals(f, by=()).rows() == [(0, 15)]


def test_union_of_many_groups_in_order_of_the_keys_then_time():
    """Against a plain merge, on shuffled intervals of groups with text keys and a null key:
    one row per merged run, by the keys (nulls first), then start."""
    import random

    rng = random.Random(7)
    rows = [
        (rng.choice([1, 0]), rng.choice(["b", "a", None]), start, start + rng.randint(-2, 40))
        for start in (rng.randint(0, 2_000) for _ in range(600))
    ]
    intervals = pl.DataFrame(rows, schema=["rank", "session", "start_ns", "end_ns"], orient="row")
    expected: list[list] = []
    kept = (r for r in rows if r[3] > r[2])
    for rank, session, start, end in sorted(kept, key=lambda r: (r[0], r[1] is not None, r)):
        last = expected[-1] if expected else None
        if last and last[:2] == [rank, session] and start <= last[3]:
            last[3] = max(last[3], end)
        else:
            expected.append([rank, session, start, end])
    merged = union_intervals(intervals, by=["rank", "session"])
    assert merged.rows() == [tuple(r) for r in expected]
    assert union_intervals(intervals.lazy(), by=["session"]).collect().height < merged.height


def test_total_length_counts_overlap_once():
    f = frame([(0, 10), (5, 15), (20, 25)])
    assert total_length(f)["covered_ns"].to_list() == [20]


def test_covered_fraction_unions_overlapping_waits():
    spans = frame([(0, 100), (200, 300), (400, 400)], sid=[1, 2, 3])
    waits = frame([(10, 60), (40, 90), (150, 250), (500, 600)])
    out = covered_fraction(spans, waits, span_id="sid").sort("sid")
    assert out["covered_ns"].to_list() == [80, 50, 0]
    assert out["covered_fraction"].to_list() == [0.8, 0.5, 0.0]  # zero-length span: 0, not NaN


def test_outermost_drops_contained_keeps_partial_overlaps():
    f = frame([(0, 100), (10, 20), (90, 150), (0, 100)], tag=["a", "b", "c", "d"])
    assert outermost(f)["tag"].to_list() == ["a", "c"]


# --- windows -----------------------------------------------------------------------------------


def events(rows):
    return pl.DataFrame(
        rows, schema=["rank", "session", "thread", "name", "start_ns", "end_ns"], orient="row"
    )


def test_pair_windows_nested_and_per_thread():
    ev = events(
        [
            (0, "s", "t1", "B", 0, 1),
            (0, "s", "t2", "B", 1, 2),  # another thread: its own stack
            (0, "s", "t1", "B", 2, 3),
            (0, "s", "t1", "E", 5, 6),
            (0, "s", "t1", "E", 9, 10),
            (0, "s", "t2", "E", 7, 8),
        ]
    )
    w = pair_windows(ev, is_begin=pl.col("name") == "B", is_end=pl.col("name") == "E")
    t1 = w.filter(pl.col("thread") == "t1")
    assert t1.select("start_ns", "end_ns", "depth").rows() == [(0, 10, 0), (2, 6, 1)]
    assert w.filter(pl.col("thread") == "t2").select("start_ns", "end_ns").rows() == [(1, 8)]


def test_pair_windows_unpaired_begin_and_end():
    ev = events(
        [
            (0, "s", "t", "E", 0, 1),  # profiling started mid-capture
            (0, "s", "t", "B", 2, 3),
            (0, "s", "t", "E", 4, 5),
            (0, "s", "t", "B", 8, 9),  # profiling stopped mid-capture
        ]
    )
    kw = {"is_begin": pl.col("name") == "B", "is_end": pl.col("name") == "E"}
    assert pair_windows(ev, **kw).select("start_ns", "end_ns").rows() == [(2, 5)]
    kept = pair_windows(ev, keep_unpaired=True, **kw)
    assert kept.select("start_ns", "end_ns", "paired").rows() == [(2, 5, True), (8, None, False)]


def test_pair_windows_same_timestamp_uses_file_order():
    ev = events([(0, "s", "t", "B", 5, 5), (0, "s", "t", "E", 5, 6)]).with_columns(
        pl.Series("seq", [0, 1])
    )
    w = pair_windows(ev, is_begin=pl.col("name") == "B", is_end=pl.col("name") == "E")
    assert w.select("start_ns", "end_ns").rows() == [(5, 6)]


def test_pair_windows_empty_input_has_schema():
    w = pair_windows(events([]), is_begin=pl.col("name") == "B", is_end=pl.col("name") == "E")
    assert w.is_empty()
    assert "window" in w.columns and w.schema["start_ns"] == pl.Int64


def test_count_in_windows_zero_rows_and_start_rule():
    windows = frame([(0, 10), (20, 30), (40, 50)]).with_row_index("wid")
    calls = frame([(1, 2), (9, 15), (10, 11), (25, 26)])  # (10, 11) starts at the end: outside
    out = count_in_windows(windows, calls, window_id="wid").sort("wid")
    assert out["count"].to_list() == [2, 1, 0]


# --- trends ------------------------------------------------------------------------------------


def test_theil_sen_ignores_outliers():
    y = [float(i) for i in range(20)]
    y[5] = 500.0
    assert theil_sen_slope(y) == pytest.approx(1.0)
    assert theil_sen_slope([3, 3]) == 0.0
    assert theil_sen_slope([1, 2], x=[4, 4]) == 0.0


def test_mann_kendall_known_values():
    mk = mann_kendall(list(range(10)))
    assert mk.s == 45 and mk.tau == 1.0
    # var = 10*9*25/18 = 125; z = 44/sqrt(125)
    assert mk.z == pytest.approx(44 / math.sqrt(125))
    assert mk.p_increasing == pytest.approx(0.5 * math.erfc(mk.z / math.sqrt(2)))
    assert mk.p_increasing < 1e-4
    down = mann_kendall(list(range(10, 0, -1)))
    assert down.p_increasing > 1 - 0.5e-3  # two-sided p < 1e-3


def test_mann_kendall_ties_and_tiny_inputs():
    assert mann_kendall([5, 5, 5, 5]).p_increasing == 1.0
    assert mann_kendall([1, 2]).p_increasing == 1.0
    tied = mann_kendall([1, 1, 2, 2, 3, 3])
    assert 0 < tied.p_increasing < 0.05


def test_mann_kendall_noise_is_not_significant():
    rng = np.random.default_rng(0)
    assert 0.025 < mann_kendall(rng.normal(20, 3, 40)).p_increasing < 0.975  # two-sided p > 0.05


def test_spearman():
    rho, p = spearman([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5])
    assert rho == pytest.approx(0.8286, abs=1e-3)
    assert 0 < p < 0.1
    assert math.isnan(spearman([1, 1, 1, 1], [1, 2, 3, 4])[0])
    assert spearman([1, 2, 3], [1, 2, 3])[1] == 1.0


def test_growth_ratio_edges():
    assert growth_ratio([10, 20, 40]) == 4.0
    assert growth_ratio([10, 12, 38, 42], edge=2) == 40 / 11
    assert growth_ratio([0, 5]) == math.inf
    assert growth_ratio([0, 0]) == 1.0
    assert math.isnan(growth_ratio([]))


def test_trend_verdict():
    t = trend([12 + 2.5 * i for i in range(33)])
    assert t.grows(min_slope=0.05, alpha=0.01, min_ratio=1.5)
    flat = trend([20, 22, 19, 21, 20, 18, 22, 20, 21, 19])
    assert not flat.grows(min_slope=0.05, alpha=0.01, min_ratio=1.5)


def test_one_api_layer_never_counts_a_call_twice():
    # rank 0 has the runtime layer (Level2): each AscendCL call also shows as its runtime call;
    # rank 1 is Level1 (AscendCL only).
    calls = pl.DataFrame(
        {
            "rank": [0, 0, 0, 1],
            "api_layer": ["AscendCL", "Runtime", "Runtime", "AscendCL"],
            "api_name": ["aclrtMemcpy", "MemCopySync", "rtMemcpy", "aclrtMemcpy"],
        }
    )
    auto = one_api_layer(calls, "auto")
    assert auto.sort("rank", "api_name")["api_name"].to_list() == [
        "MemCopySync", "rtMemcpy", "aclrtMemcpy",
    ]  # fmt: skip
    assert one_api_layer(calls.lazy(), "auto").collect().equals(auto)
    assert one_api_layer(calls, "acl")["rank"].to_list() == [0, 1]
    assert one_api_layer(calls, "runtime")["api_name"].to_list() == ["MemCopySync", "rtMemcpy"]
    assert one_api_layer(calls, "all").height == 4


# --- stream_gaps ------------------------------------------------------------------------------


def tasks_frame(rows):
    """rows: (stream, start, end, name[, rank])"""
    return pl.DataFrame(
        {
            "rank": [r[4] if len(r) > 4 else 0 for r in rows],
            "session": ["s"] * len(rows),
            "stream_id": [r[0] for r in rows],
            "start_ns": [r[1] for r in rows],
            "end_ns": [r[2] for r in rows],
            "name": [r[3] for r in rows],
        }
    )


def test_stream_gaps_per_stream_with_running_end():
    tasks = tasks_frame(
        [
            (2, 0, 100, "long"),
            (2, 10, 20, "nested"),  # inside `long`: no gap, and it does not end the stream
            (2, 150, 160, "after"),  # gap 50 after `long`, not after `nested`
            (2, 160, 170, "touching"),  # back to back: no gap
            (3, 0, 10, "other stream"),
            (3, 40, 50, "second"),
            (2, 500, 510, "other rank", 1),  # first task of its (rank, stream): no gap
        ]
    )
    out = stream_gaps(tasks).sort("stream", "start_ns")
    assert out.select(
        "stream", "prev_end_ns", "start_ns", "gap_ns", "prev_name", "name"
    ).rows() == [
        (2, 100, 150, 50, "long", "after"),
        (3, 10, 40, 30, "other stream", "second"),
    ]
    assert "end_ns" in out.columns  # the next task's own columns come along


def test_stream_gaps_lazy_in_lazy_out_and_empty():
    lazy = stream_gaps(tasks_frame([(2, 0, 10, "a"), (2, 30, 40, "b")]).lazy())
    assert isinstance(lazy, pl.LazyFrame)
    assert lazy.collect()["gap_ns"].to_list() == [20]
    assert stream_gaps(tasks_frame([])).is_empty()


# --- host_launches ----------------------------------------------------------------------------


def test_containing_call_prefers_innermost_then_outermost():
    calls = pl.DataFrame(
        {
            "rank": [0, 0, 0],
            "session": ["s"] * 3,
            "process": ["CANN"] * 3,
            "thread": ["T"] * 3,
            "call": ["outer", "inner", "sibling"],
            "start_ns": [0, 10, 40],
            "end_ns": [100, 20, 50],
        }
    )
    points = pl.DataFrame(
        {
            "rank": [0] * 4,
            "session": ["s"] * 4,
            "process": ["CANN"] * 4,
            "thread": ["T"] * 4,
            "ts_ns": [15, 30, 200, 45],
        }  # fmt: skip
    )
    out = containing_call(points, calls)
    assert out["call"].to_list() == ["inner", "outer", None, "sibling"]
    assert out["call_start_ns"].to_list() == [10, 0, None, 40]
    # every point held by its latest call, or before any call: the outer calls are not needed
    held = containing_call(points.with_columns(pl.Series("ts_ns", [15, 45, -5, 5])), calls)
    assert held["call"].to_list() == ["inner", "sibling", None, "outer"]
    assert containing_call(points, calls, outer=True)["call"].to_list() == [
        "outer", "outer", None, "outer"
    ]  # fmt: skip


def launch_store() -> StoreBuilder:
    b = StoreBuilder()
    b.session(0, "s", start_ns=0, end_ns=us(10_000))
    # aclnnMm -> Node@launch (connection 7) -> kernel on stream 2
    b.api(0, "s", "aclnnMm", start_ns=us(100), dur_ns=us(50), thread="Thread 9")
    b.api(
        0, "s", "Node@launch", start_ns=us(120), dur_ns=us(20), thread="Thread 9", connection_id=7
    )
    b.task(
        0,
        "s",
        "MatMulV2",
        stream=2,
        start_ns=us(300),
        dur_ns=us(40),
        task_type="AI_CORE",
        connection_id=7,
    )
    # linked by a HostToDevice flow only: its `s` end lies inside the call
    b.api(0, "s", "aclnnAdd", start_ns=us(400), dur_ns=us(50), thread="Thread 9")
    b.api(0, "s", "Node@launch", start_ns=us(410), dur_ns=us(30), thread="Thread 9")
    b.task(0, "s", "Add", stream=2, start_ns=us(600), dur_ns=us(5), task_type="AI_VECTOR_CORE")
    b.flow(0, "s", start_ns=us(425), end_ns=us(600), stream=2, thread="Thread 9")
    # a graph replay: captured tasks (model id) run after aclmdlRIExecuteAsync
    b.api(0, "s", "aclmdlRIExecuteAsync", start_ns=us(1_000), dur_ns=us(30), thread="Thread 1")
    b.task(
        0,
        "s",
        "graph kernel",
        stream=2,
        start_ns=us(1_100),
        dur_ns=us(10),
        task_type="AI_CORE",
        model_id=3,
        connection_id=99,
    )
    b.task(
        0,
        "s",
        "graph kernel 2",
        stream=2,
        start_ns=us(1_200),
        dur_ns=us(10),
        task_type="AI_CORE",
        model_id=3,
    )
    # Level0-like: only the torch op's async_npu flow
    b.span(0, "s", "aten::mul", start_ns=us(2_000), dur_ns=us(20), cat="cpu_op", thread="Thread 1")
    b.task(0, "s", "Mul", stream=2, start_ns=us(2_100), dur_ns=us(5), task_type="AI_VECTOR_CORE")
    b.flow(0, "s", start_ns=us(2_000), end_ns=us(2_100), stream=2, thread="Thread 1",
           process="Python", cat="async_npu")  # fmt: skip
    # nothing launched it that the trace shows
    b.task(0, "s", "EVENT_WAIT", stream=2, start_ns=us(3_000), dur_ns=us(5))
    return b


def test_host_launches_every_link_kind():
    store = launch_store().store()
    out = host_launches(store.table("slices"), store.table("flows"))
    rows = {
        r["name"]: (
            r["link"],
            r["launch_name"],
            r["launch_op"],
            r["launch_start_ns"],
            r["launch_end_ns"],
        )
        for r in out.iter_rows(named=True)
    }
    assert rows["MatMulV2"] == (
        "connection_id",
        "Node@launch",
        "AscendCL@aclnnMm",
        120_000,
        140_000,
    )
    assert rows["Add"] == ("HostToDevice", "Node@launch", "AscendCL@aclnnAdd", 410_000, 440_000)
    replay = ("graph_replay", "AscendCL@aclmdlRIExecuteAsync", "AscendCL@aclmdlRIExecuteAsync")
    assert rows["graph kernel"][:3] == replay  # beats its (capture-time) connection id
    assert rows["graph kernel 2"][:3] == replay
    assert rows["Mul"] == ("async_npu", "aten::mul", "aten::mul", 2_000_000, 2_020_000)
    assert rows["EVENT_WAIT"] == (None, None, None, None, None)
    assert out["launch_thread"].to_list()[:2] == ["Thread 9", "Thread 9"]
    assert out.columns[:5] == ["rank", "session", "stream", "start_ns", "end_ns"]


def test_a_connection_id_two_calls_carry_links_the_earliest_in_any_order():
    """Which call a repeated connection id links to does not depend on the order the calls
    are read in: before, a sort left their tie open and the first kept won."""
    b = StoreBuilder()
    b.session(0, "s", start_ns=0, end_ns=us(1_000))
    for start in (300, 100, 200):
        b.api(0, "s", "Node@launch", start_ns=us(start), dur_ns=us(10), thread="Thread 9",
              connection_id=5)  # fmt: skip
    b.task(0, "s", "MatMulV2", stream=2, start_ns=us(500), dur_ns=us(5), connection_id=5)
    slices = b.store().table("slices").collect()
    linked = {
        host_launches(order)["launch_start_ns"].item()
        for order in (slices, slices.reverse(), slices.sample(fraction=1.0, shuffle=True, seed=3))
    }
    assert linked == {us(100)}


def test_host_launches_without_flows_or_host_calls():
    b = StoreBuilder()
    b.session(0, "s", start_ns=0, end_ns=us(100))
    b.task(0, "s", "MatMulV2", stream=2, start_ns=us(10), dur_ns=us(5), connection_id=1)
    store = b.store()
    out = host_launches(store.table("slices"))
    assert out.height == 1 and out["link"].to_list() == [None]


def test_window_of_gives_each_point_the_window_it_lies_in() -> None:
    windows = pl.DataFrame(
        {"rank": [0, 0, 1], "session": ["s"] * 3, "start_ns": [0, 100, 0],
         "end_ns": [50, 200, 500], "step": [1, 2, 1]}
    )  # fmt: skip
    points = pl.DataFrame(
        {"rank": [0, 0, 0, 1, 0], "session": ["s"] * 5, "start_ns": [120, 10, 60, 300, 200]}
    )
    got = window_of(points, windows, keep=["step"], bounds=("ws", "we"))
    assert got["start_ns"].to_list() == [120, 10, 60, 300, 200]  # the points' order
    assert got["step"].to_list() == [2, 1, None, 1, None]  # in a gap, at an end: none
    assert got["ws"].to_list() == [100, 0, None, 0, None]
    empty = window_of(points.head(0), windows, keep=["step"])
    assert empty.columns == ["rank", "session", "start_ns", "step"] and empty.is_empty()
