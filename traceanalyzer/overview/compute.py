"""The overview of one rank, from the store: its summary tables, one frame per table.

Runs in a worker on a store restricted to the rank (like the rank-scoped rules), reads only the
columns it needs, and returns frames keyed by ``session``; :mod:`traceanalyzer.overview.run`
writes them as the rank's ``summary_*`` partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceanalyzer.kit.primitives import host_launches, stream_gaps
from traceanalyzer.overview.breakdown import (
    STEP_COLUMNS,
    breakdown,
    check_against_step_trace,
    classify_tasks,
    from_step_trace,
    step_windows,
)
from traceanalyzer.overview.tops import top_collectives, top_host_apis, top_kernels
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import DEVICE_PROCESSES, HARDWARE_PROCESS, HOST_PROCESSES


@dataclass(frozen=True)
class TopSizes:
    """How many rows each top-N table keeps (``run --top-kernels/--top-apis/--top-collectives``)."""

    kernels: int = 20
    host_apis: int = 20
    collectives: int = 10


DEFAULT_TOP = TopSizes()


# what the breakdown, the top tables and host_launches read of a slice
SLICE_COLUMNS = (
    "rank", "session", "process", "thread", "cat", "name", "start_ns", "end_ns", "dur_ns",
    "stream_id", "task_type", "task_id", "model_id", "connection_id", "api_layer", "api_name",
)  # fmt: skip


def device_tasks(store: Store, ranks: list[int], where: pl.Expr | None = None) -> pl.DataFrame:
    """Device and communication tasks with their class; accelerator from kernel_details.

    ``where`` narrows the scan (a session's time window, for a figure)."""
    tasks = (
        store.table("slices")
        .filter(
            pl.col("rank").is_in(ranks)
            & pl.col("process").is_in(DEVICE_PROCESSES)
            & (pl.col("end_ns") > pl.col("start_ns"))
            & (pl.lit(True) if where is None else where)
        )
        .select(SLICE_COLUMNS)
        .collect()
    )
    accelerators = (
        store.table("kernels")
        .filter(pl.col("rank").is_in(ranks) & pl.col("accelerator_core").is_not_null())
        .select("session", "stream_id", "start_ns", pl.col("accelerator_core").alias("accelerator"))
        .unique(["session", "stream_id", "start_ns"], keep="first")
        .collect()
    )
    # A kernel_details row is the task that starts at that instant on that stream. Only the
    # keys are joined, in the tasks' order: a join of the whole frame copied every column (on
    # a rank of 320,000 device tasks, 120 MB at once instead of 70).
    keys = ["session", "stream_id", "start_ns"]
    found = tasks.select(keys).join(accelerators, on=keys, how="left", maintain_order="left")
    return classify_tasks(tasks.with_columns(found["accelerator"]))


def host_bound_gaps(store: Store, rank: int, tasks: pl.DataFrame) -> pl.DataFrame:
    """Stream gaps the host caused: session, start_ns, end_ns.

    A gap before a task on its stream (``stream_gaps``) is host-bound when the host call that
    launched the task (``host_launches``) ended after the stream ran dry: the device could not
    have started it earlier, whatever else it did. Gaps whose next task has no known launch are
    not counted.

    Only the tasks after a gap are looked up, with the host calls and flows that can link them
    (the calls with their connection ids, the flows ending at their start): a tenth of a rank's
    tasks, and the same links as looking up every task. ``tasks``: :func:`device_tasks`.
    """
    hardware = tasks.filter(
        (pl.col("process") == HARDWARE_PROCESS) & pl.col("stream_id").is_not_null()
    ).select(SLICE_COLUMNS)
    after_gap = stream_gaps(hardware)
    flows = (
        store.table("flows")
        .filter((pl.col("rank") == rank) & pl.col("end_ns").is_in(after_gap["start_ns"].implode()))
        .collect()
    )
    hosts = store.table("slices").filter(
        (pl.col("rank") == rank) & pl.col("process").is_in(HOST_PROCESSES)
    )
    if after_gap["connection_id"].is_not_null().all() and after_gap["model_id"].is_null().all():
        ids = after_gap["connection_id"].unique().implode()
        hosts = hosts.filter(pl.col("connection_id").is_in(ids))
    task = ["session", "stream", "start_ns", "end_ns", "name"]
    launches = host_launches(
        pl.concat([after_gap.select(SLICE_COLUMNS), hosts.select(SLICE_COLUMNS).collect()]), flows
    )
    late = after_gap.join(
        launches.select(*task, "launch_end_ns").unique(task, keep="first"), on=task, how="inner"
    ).filter(pl.col("launch_end_ns") > pl.col("prev_end_ns"))
    return late.select(
        "session", pl.col("prev_end_ns").alias("start_ns"), pl.col("start_ns").alias("end_ns")
    )


def summarize_rank(store: Store, rank: int, sizes: TopSizes) -> dict[str, pl.DataFrame]:
    """Every ``summary_*`` table but ``summary_ranks`` for ``rank``, keyed by session."""
    ranks = [rank]
    slices = store.table("slices").filter(pl.col("rank") == rank)
    sessions = store.table("sessions").filter(pl.col("rank") == rank).collect()
    windows = step_windows(slices, sessions)
    tasks = device_tasks(store, ranks)
    step_times = store.table("step_times").filter(pl.col("rank") == rank).collect()
    with_tasks = set(tasks["session"].unique().to_list())
    gaps = host_bound_gaps(store, rank, tasks).with_columns(pl.lit("host_gap").alias("cls"))
    interval_columns = ["session", "cls", "start_ns", "end_ns"]
    intervals = pl.concat([tasks.select(interval_columns), gaps.select(interval_columns)])
    event_windows = windows.filter(pl.col("session").is_in(list(with_tasks)))
    steps = check_against_step_trace(
        breakdown(intervals, event_windows).with_columns(pl.lit("events").alias("source")),
        step_times,
    )
    csv_only = step_times.filter(~pl.col("session").is_in(list(with_tasks)))
    if not csv_only.is_empty():
        steps = pl.concat([steps, from_step_trace(csv_only, windows)], how="vertical_relaxed")
    comm_ops = store.table("comm_ops").filter(pl.col("rank") == rank).collect()
    return {
        "summary_steps": steps.select(STEP_COLUMNS).sort("session", "start_ns", nulls_last=True),
        "summary_kernels": top_kernels(tasks, sizes.kernels),
        "summary_host_apis": top_host_apis(slices, windows, sizes.host_apis),
        "summary_collectives": top_collectives(comm_ops, tasks, sizes.collectives),
    }
