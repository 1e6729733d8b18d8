"""The gaps on device streams, and which of them the host caused: the one definition of "the
device waited on the host" that host-launch-bound judges and the overview's breakdown counts
(idle host, idle sync), so the two give one figure.

:func:`stream_gaps` finds the gap before each device task; :func:`classify_gaps` says which the
host caused: host-bound (launched after the stream ran dry), after a host synchronisation, or
neither. :func:`compute_stream_gaps` derives them for the compute streams, those that run
kernels (``compute_task_types``): their tasks are the launches table's (each with the host call
that launched it), profiler markers left out, and waits the communication plane records for
them fill their time too. What a counted gap costs is the part of it that nothing hides: no
task of any stream or plane of the rank ran then (the device did something else: that time is
that work's, as the breakdown places it), and no host call of another cause's (compiling,
allocating: their own rules report it) ran then.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import polars as pl

from traceanalyzer.intervals import Frame, asof_join, uncovered, union_intervals
from traceanalyzer.vocabulary import (
    ALLOC_APIS,
    COMMUNICATION_PROCESSES,
    COMPILE_CALLS,
    COMPUTE_TASK_TYPES,
    DEVICE_PROCESSES,
    DISPATCH_LATENCY_US,
    FREE_APIS,
    PAUSE_MS,
    PROFILER_MARKER_TASKS,
    SYNC_APIS,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
)

STREAM_KEYS: tuple[str, ...] = ("rank", "session", "stream")


def stream_gaps(tasks: Frame, *, stream: str = "stream_id") -> Frame:
    """The idle gap before each device task, per (rank, session, stream).

    ``tasks`` are device tasks (normally the ``Ascend Hardware`` slices) with ``rank``,
    ``session``, the ``stream`` column (``stream_id`` in the store), ``start_ns``, ``end_ns`` and
    ``name``. A task that starts after everything earlier on its stream has ended follows a gap:
    the returned row carries that next task's columns (its ``start_ns``, ``name``, ids, ...), plus
    ``stream``, ``prev_end_ns`` (when the stream last became free), ``prev_name`` (the task that
    ended then) and ``gap_ns``. The stream's end is a running maximum, so a task nested in or
    overlapping a longer one leaves no gap, and the first task of a stream has none.
    """
    keys = list(STREAM_KEYS)
    ordered = tasks.with_columns(pl.col(stream).alias("stream")).sort([*keys, "start_ns", "end_ns"])
    reach = pl.col("end_ns").cum_max()
    # The name of the task that set the running maximum, carried forward to the tasks after it.
    holder = pl.when(pl.col("end_ns") == reach).then(pl.col("name")).forward_fill()
    return (
        ordered.with_columns(
            reach.shift(1).over(keys).alias("prev_end_ns"),
            holder.over(keys).alias("_holder"),
        )
        .with_columns(
            pl.col("_holder").shift(1).over(keys).alias("prev_name"),
            (pl.col("start_ns") - pl.col("prev_end_ns")).alias("gap_ns"),
        )
        .filter(pl.col("gap_ns") > 0)
        .drop("_holder")
    )


def classify_gaps(
    gaps: pl.DataFrame,
    syncs: pl.DataFrame,
    captures: pl.DataFrame,
    other: pl.DataFrame,
    *,
    min_gap_ns: float,
    max_gap_ns: float,
) -> pl.DataFrame:
    """Flag each stream gap ``host_bound`` (launched after the stream went idle) or
    ``after_sync``: the one definition of "the device waited on the host" that the overview's
    breakdown and host-launch-bound share.

    ``gaps``: :func:`stream_gaps` rows with their next task's launch (:func:`host_launches`:
    ``launch_start_ns``, ``launch_end_ns``, ``link``); ``syncs``, ``captures``, ``other``: host
    intervals (rank, session, start_ns, end_ns) of synchronisations, graph captures, and calls
    whose time is another cause's (compiling, allocating). Gaps under ``min_gap_ns`` are the
    device's dispatch latency and over ``max_gap_ns`` pauses (``pause``): neither counts.

    A gap during which the host waited in a sync is the sync's (``after_sync``); one that
    overlaps a graph capture is start-up, not dispatch. A host-bound gap costs its length less
    the host time spent in ``other`` calls inside it (``other_ns``: compiling, allocating;
    their own rules report that time).
    """
    marked = _gap_overlaps(_gap_overlaps(gaps, syncs, "in_sync"), captures, "in_capture")
    other_ns = _covered_before(marked, other, "start_ns") - _covered_before(
        marked, other, "prev_end_ns"
    )
    late = pl.col("launch_end_ns") > pl.col("prev_end_ns")
    # Which replay queued a graph task is a guess (the last one before it); when the host runs
    # ahead that is a later replay than the task's own. Only a replay that began after the
    # stream ran dry proves nothing was queued.
    replay = pl.col("link") == "graph_replay"
    late = (late & (~replay | (pl.col("launch_start_ns") > pl.col("prev_end_ns")))).fill_null(False)
    pause = pl.col("gap_ns") > max_gap_ns
    counted = late & (pl.col("gap_ns") >= min_gap_ns) & ~pause & ~pl.col("in_capture")
    return (
        marked.with_columns(other_ns.alias("other_ns"))
        .with_columns(
            pause.alias("pause"),
            (counted & ~pl.col("in_sync")).alias("host_bound"),
            (counted & pl.col("in_sync")).alias("after_sync"),
            (pl.col("launch_end_ns") - pl.col("prev_end_ns")).alias("late_ns"),
            (pl.col("gap_ns") - pl.col("other_ns")).alias("cost_ns"),
        )
        .sort("rank", "session", "stream", "start_ns")
    )


def _gap_overlaps(gaps: pl.DataFrame, intervals: pl.DataFrame, flag: str) -> pl.DataFrame:
    """Add ``flag``: the gap ``[prev_end_ns, start_ns)`` overlaps one of the merged ``intervals``."""
    keys = ["rank", "session"]
    merged = union_intervals(intervals).rename({"start_ns": "_s", "end_ns": "_e"}).sort("_s")
    return (
        gaps.sort("start_ns")
        .pipe(asof_join, merged, "start_ns", "_s", keys, allow_exact_matches=False)
        .with_columns((pl.col("_e").fill_null(-1) > pl.col("prev_end_ns")).alias(flag))
        .drop("_s", "_e")
    )


def _covered_before(points: pl.DataFrame, merged: pl.DataFrame, at: str) -> pl.Series:
    """Per row of ``points``: how much of the disjoint ``merged`` intervals lies before ``at``."""
    keys = ["rank", "session"]
    before = merged.sort("start_ns").with_columns(
        (
            (pl.col("end_ns") - pl.col("start_ns")).cum_sum()
            - (pl.col("end_ns") - pl.col("start_ns"))
        )
        .over(keys)
        .alias("_before")
    )
    hit = (
        points.select(*keys, at)
        .with_row_index("_row")
        .sort(at)
        .pipe(asof_join, before.rename({"start_ns": "_s", "end_ns": "_e"}), at, "_s", keys)
        .sort("_row")
    )
    inside = pl.min_horizontal(pl.col(at), pl.col("_e")) - pl.col("_s")
    return hit.select((pl.col("_before") + inside).fill_null(0))["_before"]


KEYS = ["rank", "session"]


@dataclass(frozen=True)
class GapSettings:
    """What makes a gap count (host-launch-bound's parameters of the same names; the overview
    takes these defaults)."""

    min_gap_us: float = DISPATCH_LATENCY_US  # shorter: the device's own dispatch latency
    max_gap_ms: float = PAUSE_MS  # longer: a pause, nothing was due
    compute_task_types: tuple[str, ...] = COMPUTE_TASK_TYPES
    wait_task_types: tuple[str, ...] = WAIT_TASK_TYPES
    wait_names: tuple[str, ...] = WAIT_TASK_NAMES
    marker_tasks: tuple[str, ...] = PROFILER_MARKER_TASKS
    sync_apis: tuple[str, ...] = SYNC_APIS
    other_cause_apis: tuple[str, ...] = (*COMPILE_CALLS, *ALLOC_APIS, *FREE_APIS)


@dataclass(frozen=True)
class StreamGaps:
    """``tasks``: the compute streams' tasks with their launch (the launches table's columns);
    ``gaps``: every gap before one, classified (:func:`classify_gaps`' columns; ``cost_ns`` of a
    host-bound or after-sync gap: its time nothing hides, else 0); ``idle``: those times as
    intervals (rank, session, ``cls``: ``host_gap`` or ``sync_gap``, start_ns, end_ns)."""

    tasks: pl.DataFrame
    gaps: pl.DataFrame
    idle: pl.DataFrame


def compute_stream_gaps(
    slices: pl.LazyFrame,
    launches: pl.DataFrame,
    cann: pl.DataFrame,
    captures: pl.DataFrame,
    settings: GapSettings = GapSettings(),
    device: pl.DataFrame | None = None,
) -> StreamGaps:
    """The gaps of the compute streams of ``slices`` (one or more ranks' slices) and what they
    cost. ``launches``: their device tasks with the host call that launched each (the launches
    table); ``cann``: their CANN calls; ``captures``: their graph capture windows (rank,
    session, start_ns, end_ns); ``device``: their device tasks (rank, session, start_ns,
    end_ns; read from ``slices`` when None)."""
    s = settings
    launched = launches.filter(~pl.col("name").is_in(list(s.marker_tasks)))
    compute = (
        launched.filter(pl.col("task_type").is_in(list(s.compute_task_types)))
        .select(*KEYS, "stream")
        .unique()
    )
    tasks = launched.join(compute, on=[*KEYS, "stream"])
    # Waits the communication plane records for a compute stream fill its time too.
    plane_waits = (
        slices.filter(
            pl.col("process").is_in(COMMUNICATION_PROCESSES)
            & (
                pl.col("task_type").is_in(list(s.wait_task_types))
                | pl.col("name").is_in(list(s.wait_names))
            )
        )
        .select(*KEYS, pl.col("stream_id").alias("stream"), "start_ns", "end_ns", "name")
        .collect()
        .join(compute, on=[*KEYS, "stream"])
    )
    occupied = pl.concat([tasks, plane_waits], how="diagonal_relaxed")
    interval = [*KEYS, "start_ns", "end_ns"]
    syncs = cann.filter(pl.col("api_name").is_in(list(s.sync_apis))).select(interval)
    other = union_intervals(
        cann.filter(pl.col("api_name").is_in(list(s.other_cause_apis))).select(interval)
    )
    gaps = classify_gaps(
        stream_gaps(occupied, stream="stream"), syncs, captures, other,
        min_gap_ns=s.min_gap_us * 1e3, max_gap_ns=s.max_gap_ms * 1e6,
    ).with_row_index("_gap")  # fmt: skip
    if device is None:
        device = (
            slices.filter(
                pl.col("process").is_in(DEVICE_PROCESSES) & (pl.col("end_ns") > pl.col("start_ns"))
            )
            .select(interval)
            .collect()
        )
    counted = gaps.filter(pl.col("host_bound") | pl.col("after_sync"))
    hiding = pl.concat([device.select(interval), other.select(interval)], how="vertical_relaxed")
    pieces = uncovered(
        counted.select(
            "_gap", *KEYS, pl.col("prev_end_ns").alias("start_ns"), pl.col("start_ns").alias("end_ns")
        ),
        hiding.cast({"rank": counted.schema["rank"]}),
        span_id="_gap",
    )  # fmt: skip
    idle = pieces.join(
        counted.select(
            "_gap", *KEYS,
            pl.when(pl.col("host_bound")).then(pl.lit("host_gap")).otherwise(pl.lit("sync_gap"))
            .alias("cls"),
        ),
        on="_gap",
    )  # fmt: skip
    cost = idle.group_by("_gap").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_cost"))
    gaps = (
        gaps.join(cost, on="_gap", how="left")
        .with_columns(pl.col("_cost").fill_null(0).alias("cost_ns"))
        .drop("_gap", "_cost")
    )
    return StreamGaps(tasks, gaps, idle.select(*KEYS, "cls", "start_ns", "end_ns"))


# what compute_stream_gaps reads: slices, launches, cann, captures, device (None: from slices)
GapInputs = tuple[pl.LazyFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame | None]

_T = TypeVar("_T")


class RunMemo(Protocol):
    """What keeps a value for the rest of a run (``Store.memo_for_run``): named by its method,
    since this base module stands below the store."""

    def memo_for_run(self, key: Hashable, compute: Callable[[], _T]) -> _T: ...


def stream_gaps_of(
    store: RunMemo,
    ranks: Collection[int],
    settings: GapSettings,
    read: Callable[[], GapInputs],
    inputs_by: Hashable = (),
) -> StreamGaps:
    """:func:`compute_stream_gaps` of ``ranks`` at ``settings`` on the inputs ``read()`` gives,
    once per run for host-launch-bound and the overview's breakdown, which ask for the same
    gaps at the default parameters (``Store.memo_for_run``): ``inputs_by`` is what else the
    inputs depend on (the replay APIs the launches are linked by, the capture patterns), so
    callers that read them alike share one derivation and others do not."""

    def derive() -> StreamGaps:
        slices, launches, cann, captures, device = read()
        return compute_stream_gaps(slices, launches, cann, captures, settings, device)

    return store.memo_for_run(("stream gaps", tuple(sorted(ranks)), settings, inputs_by), derive)
