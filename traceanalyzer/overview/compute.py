"""The overview of one rank, from the store: its summary tables, one frame per table.

Runs in a worker on a store restricted to the rank (like the rank-scoped rules), reads only the
columns it needs, and returns frames keyed by ``session``; the ``summary`` stage
(:mod:`traceanalyzer.overview.stage`) writes them as the rank's ``summary_*`` partitions.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.derived.captures import capture_windows_in
from traceanalyzer.derived.device import EXCHANGE_PARAMS
from traceanalyzer.derived.exchanges import exchanges_of
from traceanalyzer.derived.launches import host_calls, launches_of
from traceanalyzer.derived.moe_layers import LAYER_PARAMS
from traceanalyzer.derived.phases import IDLE_PHASE
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.host_gaps import GapSettings, stream_gaps_of
from traceanalyzer.overview.breakdown import (
    COMPUTE_CLASSES,
    MC2_EXPOSED,
    MEASURED_COLUMNS,
    STEP_COLUMNS,
    STEP_META,
    UNMEASURED_COLUMN,
    VECTOR_TASK_TYPES,
    breakdown,
    check_against_step_trace,
    classify_tasks,
    from_step_trace,
    split_compute,
    split_sessions,
)
from traceanalyzer.overview.memory import memory_tables
from traceanalyzer.overview.model import TopSizes
from traceanalyzer.overview.tops import top_collectives, top_host_apis, top_kernels
from traceanalyzer.step_components import COMPONENT_NAMES, COMPONENTS
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    CAPTURE_BEGIN_API,
    CAPTURE_END_API,
    DEVICE_PROCESSES,
    GRAPH_REPLAY_APIS,
)

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
    # keys are joined, in the tasks' order: a join of the whole frame copies every column.
    keys = ["session", "stream_id", "start_ns"]
    found = tasks.select(keys).join(accelerators, on=keys, how="left", maintain_order="left")
    return classify_tasks(tasks.with_columns(found["accelerator"]))


def host_bound_gaps(
    store: Store, rank: int, tasks: pl.DataFrame, cann: pl.DataFrame
) -> pl.DataFrame:
    """Stream gaps the host caused: session, ``cls`` (``host_gap``: launch-bound, ``sync_gap``:
    after a host synchronisation), start_ns, end_ns.

    host-launch-bound's gaps, at its default parameters (:func:`stream_gaps_of`: one
    derivation, the rule's in the same run when its parameters are these): the idle of a
    compute stream before a task whose launch ended after the stream ran dry, where nothing
    else ran on the device and the host was not compiling or allocating; gaps shorter than the
    dispatch latency, pauses and gaps in a graph capture are not.

    The launches are the rules' (the ``launches`` table, derived once before them).
    ``tasks``: :func:`device_tasks`; ``cann``: the rank's CANN calls (``launches.host_calls``;
    at Level0 there are none, nothing tells a synchronisation's gap, it counts as launch-bound,
    and the summary says that idle sync was not measured).
    """
    found = stream_gaps_of(
        store,
        [rank],
        GapSettings(),
        lambda: (
            store.table("slices").filter(pl.col("rank") == rank),
            launches_of(store, [rank]),
            cann,
            capture_windows_in(cann),
            tasks.select("rank", "session", "start_ns", "end_ns"),
        ),
        (GRAPH_REPLAY_APIS, CAPTURE_BEGIN_API, CAPTURE_END_API),
    )
    return found.idle.select("session", "cls", "start_ns", "end_ns")


# the steps the export's own breakdown has a row for, each; of the others, the session's total
CHECKED_ONE_BY_ONE = "profiler_step"
ONE_BY_ONE = pl.col("step_source") == CHECKED_ONE_BY_ONE
CHECK_SCOPE = (
    pl.when(ONE_BY_ONE).then(pl.lit("step")).otherwise(pl.lit("session")).alias("check_scope")
)


def _tiles(windows: pl.DataFrame, sessions: pl.DataFrame) -> pl.DataFrame:
    """``windows`` (session, step, start_ns, end_ns) and the time around them, as windows with
    a null start of ``_step`` (``_between``), so that a session's tiles cover it and their
    breakdowns sum to the session's."""
    bounds = sessions.select(
        "session", pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64)
    )
    edges = pl.concat(
        [
            windows.select("session", "start_ns", "end_ns"),
            # zero-length marks at the session's ends: the time before the first window and
            # after the last is a tile too
            bounds.select("session", "start_ns", pl.col("start_ns").alias("end_ns")),
            bounds.select("session", pl.col("end_ns").alias("start_ns"), "end_ns"),
        ]
    ).sort("session", "start_ns")
    reached = pl.col("end_ns").cum_max().over("session")
    between = (
        edges.with_columns(reached.shift(1).over("session").alias("_from"))
        .filter(pl.col("_from").is_not_null() & (pl.col("start_ns") > pl.col("_from")))
        .select(
            "session",
            pl.lit(None, dtype=pl.Int64).alias("step"),
            pl.col("_from").alias("start_ns"),
            pl.col("start_ns").alias("end_ns"),
            pl.lit(True).alias("_between"),
        )
    )
    return pl.concat(
        [
            windows.with_columns(pl.lit(False).alias("_between")),
            between.select(windows.columns + ["_between"]),
        ],
        how="vertical_relaxed",
    ).sort("session", "start_ns")


def summarize_rank(store: Store, rank: int, sizes: TopSizes) -> dict[str, pl.DataFrame]:
    """Every ``summary_*`` table but ``summary_ranks`` for ``rank``, keyed by session."""
    ranks = [rank]
    slices = store.table("slices").filter(pl.col("rank") == rank)
    sessions = store.table("sessions").filter(pl.col("rank") == rank).collect()
    steps = steps_of(store, ranks).drop("rank")
    windows = steps.select("session", "step", "start_ns", "end_ns", *STEP_META)
    # first, while nothing else is held: the host calls are the rank's most rows
    host_apis = top_host_apis(slices, steps, sizes.host_apis)
    tasks = device_tasks(store, ranks)
    step_times = store.table("step_times").filter(pl.col("rank") == rank).collect()
    with_tasks = set(tasks["session"].unique().to_list())
    cann = host_calls(store, ranks)
    gaps = host_bound_gaps(store, rank, tasks, cann)
    interval_columns = ["session", "cls", "start_ns", "end_ns"]
    intervals = pl.concat(
        [tasks.select(interval_columns), gaps.select(interval_columns), mc2_exchanges(tasks)]
    )
    measured = _measured(
        intervals, windows.filter(pl.col("session").is_in(list(with_tasks))), sessions, step_times
    )
    listed = None  # kernel_details' kernels, where a session has no device task of its own
    if not set(sessions["session"].to_list()) <= with_tasks:
        listed = (
            store.table("kernels")
            .filter((pl.col("rank") == rank) & ~pl.col("session").is_in(list(with_tasks)))
            .select("session", "name", "accelerator_core", "start_ns", "dur_ns")
            .collect()
        )
    csv_only = step_times.filter(~pl.col("session").is_in(list(with_tasks)))
    if not csv_only.is_empty():
        csv_rows = _from_step_trace(csv_only, windows, sessions).select(MEASURED_COLUMNS)
        if listed is not None:
            csv_rows = split_compute(csv_rows, listed)
        measured = pl.concat([measured.select(MEASURED_COLUMNS), csv_rows], how="vertical_relaxed")
    blind = _unmeasured(sessions, tasks, cann, listed)
    measured = measured.join(blind, on="session", how="left").join(
        ep_exchanges(store, rank, tasks), on=["session", "step"], how="left"
    )
    comm_ops = store.table("comm_ops").filter(pl.col("rank") == rank).collect()
    return {
        "summary_steps": measured.select(STEP_COLUMNS).sort("session", "start_ns", nulls_last=True),
        "summary_kernels": top_kernels(tasks, steps, sizes.kernels, listed),
        "summary_host_apis": host_apis,
        "summary_collectives": top_collectives(comm_ops, tasks, sizes.collectives),
        **memory_tables(store, rank),
    }


def mc2_exchanges(tasks: pl.DataFrame) -> pl.DataFrame:
    """The MC2 exchange kernels of ``tasks`` (:func:`device_tasks`) as ``exchange`` intervals
    (session, cls, start_ns, end_ns), at the exchanges table's default pattern: what of them no
    other compute hides is the rank waiting on the exchange (:func:`breakdown`)."""
    mc2 = tasks.filter(
        pl.col("cls").is_in(COMPUTE_CLASSES)
        & pl.col("name").str.contains(EXCHANGE_PARAMS["mc2_ops"].default)
    )
    return mc2.select("session", pl.lit("exchange").alias("cls"), "start_ns", "end_ns")


def _unmeasured(
    sessions: pl.DataFrame,
    tasks: pl.DataFrame,
    cann: pl.DataFrame,
    listed: pl.DataFrame | None,
) -> pl.DataFrame:
    """Per session (session, :data:`UNMEASURED_COLUMN`), the components its data cannot
    measure: AI Vector compute when no compute task's accelerator says AI Vector apart from
    AI Core (kernel_details' Accelerator Core, or the trace's Task Type), idle sync when it
    recorded no CANN call (so no synchronisation); without a device timeline, every component
    the export's own step breakdown does not give (``Component.no_timeline``), the
    accelerators but where kernel_details.csv (``listed``) splits the compute."""
    compute = tasks.filter(pl.col("cls").is_in(COMPUTE_CLASSES))
    told = compute.filter(
        pl.col("accelerator").is_not_null() | pl.col("task_type").is_in(VECTOR_TASK_TYPES)
    )

    # each frame's sessions, not its rows: the tasks and calls are a rank's 100k+ rows
    def of(frame: pl.DataFrame) -> set[str]:
        return set(frame["session"].unique().to_list())

    no_timeline = of(sessions) - of(tasks)
    split = set() if listed is None else set(split_sessions(listed))
    blind = {
        "compute_ai_vector_ns": of(compute) - of(told),
        "idle_sync_ns": of(sessions) - of(cann),
    }
    for c in COMPONENTS:
        if c.no_timeline:
            unsplit = no_timeline - split if c.group == "compute" else no_timeline
            blind[c.key] = blind.get(c.key, set()) | unsplit
    ordered = [key for key in COMPONENT_NAMES if key in blind]
    return sessions.select(
        "session",
        pl.concat_str(
            *(
                pl.when(pl.col("session").is_in(list(blind[key]))).then(pl.lit(key))
                for key in ordered
            ),
            separator=",",
            ignore_nulls=True,
        )
        .replace("", None)
        .alias(UNMEASURED_COLUMN),
    )


def ep_exchanges(store: Store, rank: int, tasks: pl.DataFrame) -> pl.DataFrame:
    """Per step of an MoE rank (one that ran expert kernels), the EP exchange it used and how
    much of it no compute hid: session, step and :data:`EP_COLUMNS` (none for a dense model,
    whose all-gathers are tensor or sequence parallelism, not an expert exchange)."""
    schema = {"session": pl.String, "step": pl.Int64, "ep_path": pl.String,
              "ep_exchange_ns": pl.Int64, "ep_exposed_ns": pl.Int64, "ep_fits": pl.Boolean}  # fmt: skip
    if not tasks["name"].str.contains(LAYER_PARAMS["expert_core"].default).any():
        return pl.DataFrame(schema=schema)
    paths = exchanges_of(store, [rank])  # derived beside the steps
    return paths.select(
        "session", "step", pl.col("path").alias("ep_path"),
        pl.col("exchange_ns").alias("ep_exchange_ns"),
        pl.col("exposed_ns").alias("ep_exposed_ns"), pl.col("fits").alias("ep_fits"),
    ).cast(schema)  # fmt: skip


def _measured(
    intervals: pl.DataFrame, windows: pl.DataFrame, sessions: pl.DataFrame, step_times: pl.DataFrame
) -> pl.DataFrame:
    """The breakdown of every window, checked against the export's own: a ProfilerStep by its
    row, any other window by its session's total (the export's session row, step empty)."""
    tiles = _tiles(windows.select("session", "step", "start_ns", "end_ns"), sessions)
    parts = breakdown(intervals, tiles.drop("_between")).join(
        tiles.select("session", "start_ns", "_between"), on=["session", "start_ns"], how="left"
    )
    rows = (
        parts.filter(~pl.col("_between"))
        .drop("_between")
        .join(
            windows.select("session", "start_ns", *STEP_META),
            on=["session", "start_ns"],
            how="left",
        )
        .with_columns(pl.lit("events").alias("source"))
    )
    # Between iterations the scheduler had nothing to run: no launch was due, so an idle
    # window's gaps are not the host's (the check below sums the components, unchanged).
    idle = pl.col("phase") == IDLE_PHASE
    waited = pl.col("idle_host_ns") + pl.col("idle_sync_ns")
    rows = rows.with_columns(
        pl.when(idle).then(pl.col("idle_other_ns") + waited).otherwise(pl.col("idle_other_ns"))
        .alias("idle_other_ns"),
        *(pl.when(idle).then(0).otherwise(pl.col(c)).alias(c)
          for c in ("idle_host_ns", "idle_sync_ns")),
    )  # fmt: skip
    by_session = set(rows.filter(~ONE_BY_ONE)["session"].unique().to_list())
    summed = [*COMPONENT_NAMES, MC2_EXPOSED]
    units = pl.concat(
        [
            rows.filter(ONE_BY_ONE).select("session", "step", *summed),
            parts.filter(pl.col("session").is_in(list(by_session)))
            .group_by("session")
            .agg(pl.col(summed).sum())
            .select("session", pl.lit(None, dtype=pl.Int64).alias("step"), *summed),
        ]
    )
    checked = check_against_step_trace(units, step_times).select(
        "session", "step", "check_deviation", "check_component"
    )
    return (
        rows.with_columns(pl.when(ONE_BY_ONE).then(pl.col("step")).alias("_unit"), CHECK_SCOPE)
        .join(
            checked.rename({"step": "_unit"}), on=["session", "_unit"], how="left", nulls_equal=True
        )
        .drop("_unit")
    )


def _from_step_trace(
    step_times: pl.DataFrame, windows: pl.DataFrame, sessions: pl.DataFrame
) -> pl.DataFrame:
    """Sessions with a step breakdown but no device tasks: the export's rows, for its steps
    (a ProfilerStep by its number, the session row as the session's one window)."""
    whole = sessions.select(
        "session",
        pl.lit(None, dtype=pl.Int64).alias("step"),
        pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64),
        pl.lit("session").alias("step_source"),
    )
    own = pl.concat(
        [windows.filter(ONE_BY_ONE), whole],
        how="diagonal_relaxed",
    )
    rows = from_step_trace(step_times, own)
    return rows.join(
        own.select("session", "step", *STEP_META),
        on=["session", "step"],
        how="left",
        nulls_equal=True,
    ).with_columns(
        pl.col("step_source").fill_null("session"),
        pl.col("phase").fill_null("unknown"),
        pl.col("phase_source").fill_null("none"),
        CHECK_SCOPE,
    )
