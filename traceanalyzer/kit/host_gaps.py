"""The gaps on compute streams and which of them the host caused: the one derivation of "the
device waited on the host" that host-launch-bound judges and the overview's breakdown counts
(idle host, idle sync), so the two give one figure.

A compute stream is one that runs kernels (``compute_task_types``); its tasks are the launches
table's (each with the host call that launched it), profiler markers left out, and waits the
communication plane records for it fill its time too. The gap before each task is classified by
:func:`~traceanalyzer.primitives.classify_gaps`: host-bound (launched after the stream ran dry),
after a host synchronisation, or neither. What a counted gap costs is the part of it that
nothing hides: no task of any stream or plane of the rank ran then (the device did something
else: that time is that work's, as the breakdown places it), and no host call of another
cause's (compiling, allocating: their own rules report it) ran then.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

import polars as pl

from traceanalyzer.primitives import classify_gaps, stream_gaps, uncovered, union_intervals
from traceanalyzer.store import Store
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


def stream_gaps_of(
    store: Store,
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
