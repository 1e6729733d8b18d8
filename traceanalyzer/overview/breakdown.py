"""Where each step's time goes: the step's wall time split into components that sum to it.

One sweep over the device timeline of a rank session. Every task is an interval of one class:
compute (by accelerator), communication (the HCCL / Communication ops), a wait task (EVENT_WAIT,
Notify Wait), or another device task (memory copies, runtime tasks); host-bound stream gaps (the
stream ran dry before the host had launched its next task) are intervals too. The boundaries of
every interval and every step cut the timeline into elementary segments, and each segment takes
the first class that is active in it, in this order:

1. compute and communication at once -> ``overlapped``;
2. an MoE expert exchange that runs as kernels (MC2 dispatch/combine), with no other compute
   -> ``comm_exposed``: the rank is waiting on the exchange, as it would inside an all-to-all;
3. compute -> ``compute_<accelerator>``, split between the accelerators active in it by count;
4. communication -> ``comm_exposed``;
5. another device task -> ``device_other``;
6. a wait task -> ``idle_stream`` (waiting on another stream);
7. a host-bound stream gap -> ``idle_host`` (launch-bound);
8. a stream gap after a host synchronisation -> ``idle_sync``;
9. nothing -> ``idle_other``.

The stream gaps are classified as host-launch-bound classifies them
(:func:`~traceanalyzer.host_gaps.classify_gaps`): one definition of waiting on the host.

So the components sum to the step's wall time exactly (integer ns; the accelerator split rounds
within a segment, at most 1 ns per segment). Computing, Communication(Not Overlapped) and
Overlapped are defined as in ``step_trace_time.csv`` (the profiler's Overlap Analysis), which is
what :func:`check_against_step_trace` compares with (the profiler counts an MC2 exchange as
Computing: the check counts it so, :data:`MC2_EXPOSED`).

The windows are the ``steps`` table's (:mod:`traceanalyzer.derived`): ProfilerStep#N spans, else
the engine iterations vLLM marked, else bursts of device work, else the session. Step time is the
window's wall time: the time before the step's first device task
(``Preparing`` in step_trace_time.csv) is in the idle components, where a performance engineer
looks for it.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.step_components import COMPONENT_NAMES, COMPONENTS, COMPUTE
from traceanalyzer.vocabulary import (
    COMMUNICATION_PROCESSES,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
)

# accelerator of a compute task, from kernel_details' Accelerator Core (exact) or else the
# trace's Task Type (which calls AI Vector kernels AI_CORE in older exports)
ACCELERATORS: dict[str, str] = {
    "AI_CORE": "ai_core",
    "AI_VECTOR_CORE": "ai_vector",
    "MIX_AIC": "mix",
    "MIX_AIV": "mix",
    "AI_CPU": "ai_cpu",
    "AICPU": "ai_cpu",
}
# compute classes and the component each one's time goes to
COMPUTE_COMPONENTS: dict[str, str] = {
    c.task_class: c.key for c in COMPONENTS if c.group == "compute" and c.task_class
}
COMPUTE_CLASSES = tuple(COMPUTE_COMPONENTS)
# the trace's task types that say AI Vector (a G2 trace says AI_CORE for both kinds of core)
VECTOR_TASK_TYPES = tuple(k for k, v in ACCELERATORS.items() if v == "ai_vector")
# task types that run kernels on an accelerator whose name is not in ACCELERATORS
OTHER_COMPUTE_TASKS = ("FFTS_PLUS", "KERNEL_AICORE", "KERNEL_AIVEC", "KERNEL_AICPU", "MIX")
# "exchange" marks an MC2 exchange kernel, which is also a compute interval of its accelerator
CLASSES = (*COMPUTE_CLASSES, "comm", "device_other", "wait", "host_gap", "sync_gap", "exchange")
# a window's MC2 exchange time with no other compute, in comm_exposed_ns: the self-check moves
# it back to Computing, where the profiler's step_trace_time.csv has it (not stored)
MC2_EXPOSED = "mc2_exposed_ns"

_COUNT = {c: f"n_{c}" for c in CLASSES}
# a row of the breakdown (summary_steps without rank), as computed and as stored
WINDOW_COLUMNS = (
    "session", "step", "start_ns", "end_ns", "step_ns", "device_start_ns", "device_end_ns",
    *COMPONENT_NAMES,
)  # fmt: skip
# what a row keeps of its step (the steps table): how the window was found, what it served
STEP_META = (
    "step_source", "phase", "phase_source", "phase_reason", "tokens", "graph", "graph_size",
    "batch", "batch_source", "padded_tokens",
)  # fmt: skip
MEASURED_COLUMNS = (
    *WINDOW_COLUMNS, *STEP_META, "source", "check_scope", "check_deviation", "check_component",
)  # fmt: skip
# the components a step could not measure (comma-separated keys; null: none)
UNMEASURED_COLUMN = "unmeasured"
# the EP exchange a step of an MoE model used (the exchanges table; nulls elsewhere)
EP_COLUMNS = ("ep_path", "ep_exchange_ns", "ep_exposed_ns", "ep_fits")
STEP_COLUMNS = (*MEASURED_COLUMNS, UNMEASURED_COLUMN, *EP_COLUMNS)  # a summary_steps row


def unmeasured(steps: pl.DataFrame) -> list[str]:
    """The components (in their order) that some of ``steps`` (summary_steps rows) could not
    measure (``Component.unmeasured``, ``Component.no_timeline``)."""
    said = set(steps[UNMEASURED_COLUMN].drop_nulls().str.split(",").explode().to_list())
    return [key for key in COMPONENT_NAMES if key in said]


def classify_tasks(tasks: pl.DataFrame) -> pl.DataFrame:
    """Add ``cls`` (one of :data:`CLASSES` but host_gap) to device tasks.

    ``tasks`` needs process, task_type and accelerator (kernel_details' Accelerator Core, null
    where unknown).
    """
    kind = pl.coalesce(pl.col("accelerator"), pl.col("task_type"))
    accel = kind.replace_strict(ACCELERATORS, default=None)
    waits = (*WAIT_TASK_TYPES, *WAIT_TASK_NAMES)
    return tasks.with_columns(
        pl.when(pl.col("process").is_in(COMMUNICATION_PROCESSES))
        .then(pl.lit("comm"))
        .when(pl.col("task_type").is_in(waits) | pl.col("name").is_in(WAIT_TASK_NAMES))
        .then(pl.lit("wait"))
        .when(accel.is_not_null())
        .then(accel)
        .when(kind.is_in(OTHER_COMPUTE_TASKS))
        .then(pl.lit("compute_other"))
        .otherwise(pl.lit("device_other"))
        .alias("cls")
    )


def breakdown(intervals: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per window: step_ns, device_start_ns/device_end_ns and every component (ns).

    ``intervals``: session, cls, start_ns, end_ns (device tasks classified by
    :func:`classify_tasks`, plus host-bound gaps as ``host_gap`` and MC2 exchange kernels again
    as ``exchange``). ``windows``: session, step, start_ns, end_ns. Windows of one session must
    not overlap (steps do not). Also returns :data:`MC2_EXPOSED`.
    """
    ivals = intervals.filter(pl.col("end_ns") > pl.col("start_ns"))
    deltas = [
        pl.when(pl.col("cls") == c).then(pl.col("d")).otherwise(0).alias(_COUNT[c]) for c in CLASSES
    ]
    edges = pl.concat(
        [
            ivals.select("session", "cls", pl.col("start_ns").alias("ts"), pl.lit(1).alias("d")),
            ivals.select("session", "cls", pl.col("end_ns").alias("ts"), pl.lit(-1).alias("d")),
        ]
    ).with_columns(deltas)
    bounds = pl.concat(
        [windows.select("session", pl.col(c).alias("ts")) for c in ("start_ns", "end_ns")]
    ).with_columns(pl.lit(0, dtype=pl.Int32).alias(n) for n in _COUNT.values())
    # after a stable sort by time, the last edge at each instant carries the counts of every
    # edge up to it, and only that one is followed by a segment of non-zero length (by time,
    # then stably by session: faster than one sort by both)
    counts = (
        pl.concat([edges.drop("cls", "d"), bounds])
        .sort("ts", maintain_order=True)
        .sort("session", maintain_order=True)
        .with_columns(
            pl.col(list(_COUNT.values())).cum_sum().over("session"),
            (pl.col("ts").shift(-1).over("session") - pl.col("ts")).alias("len"),
        )
        .filter(pl.col("len") > 0)
    )
    seg = counts.join_asof(
        windows.select(
            "session", "step", pl.col("start_ns").alias("ws"), pl.col("end_ns").alias("we")
        ).sort("session", "ws"),
        left_on="ts",
        right_on="ws",
        by="session",
        strategy="backward",
        check_sortedness=False,  # both sides sorted by (session, time) above
    ).filter(pl.col("ws").is_not_null() & (pl.col("ts") < pl.col("we")))
    n = {c: pl.col(_COUNT[c]) for c in CLASSES}
    computing = pl.sum_horizontal(*(n[c] for c in COMPUTE_CLASSES))
    comm = n["comm"] > 0
    exchanging = (computing > 0) & ~comm & (n["exchange"] >= computing)
    only_compute = (computing > 0) & ~comm & ~exchanging
    length = pl.col("len")
    rest = (computing == 0) & ~comm
    shares = {
        component: pl.when(only_compute).then(length * n[c] / computing).otherwise(0.0)
        for c, component in COMPUTE_COMPONENTS.items()
    }
    whole = {
        "overlapped_ns": pl.when((computing > 0) & comm).then(length).otherwise(0),
        "comm_exposed_ns": pl.when((comm & (computing == 0)) | exchanging)
        .then(length)
        .otherwise(0),
        MC2_EXPOSED: pl.when(exchanging).then(length).otherwise(0),
    }
    # with neither compute nor communication, the first class active in the segment takes it
    for key, cls in (
        ("device_other_ns", "device_other"),
        ("idle_stream_ns", "wait"),
        ("idle_host_ns", "host_gap"),
        ("idle_sync_ns", "sync_gap"),
    ):
        whole[key] = pl.when(rest & (n[cls] > 0)).then(length).otherwise(0)
        rest = rest & (n[cls] == 0)
    busy = (computing > 0) | comm
    per_window = seg.group_by("session", "step", "ws").agg(
        *(e.sum().alias(k) for k, e in (shares | whole).items()),
        pl.col("ts").filter(busy).min().alias("device_start_ns"),
        (pl.col("ts") + length).filter(busy).max().alias("device_end_ns"),
    )
    out = windows.join(
        per_window.rename({"ws": "start_ns"}),
        on=["session", "step", "start_ns"],
        how="left",
        nulls_equal=True,
    ).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"),
        # accelerator shares are fractions of a segment: each is rounded to the ns, and
        # idle_other (the rest of the step) absorbs the residue
        pl.col(list(shares)).fill_null(0.0).round(0).cast(pl.Int64),
        pl.col(list(whole)).fill_null(0).cast(pl.Int64),
    )
    accounted = pl.sum_horizontal(*(pl.col(c) for c in COMPONENT_NAMES if c != "idle_other_ns"))
    out = out.with_columns((pl.col("step_ns") - accounted).alias("idle_other_ns"))
    return out.select(*WINDOW_COLUMNS, MC2_EXPOSED)


def computing_ns() -> pl.Expr:
    """step_trace_time.csv's Computing: every compute component plus the overlapped time (the
    headline's compute)."""
    return pl.sum_horizontal(*(c.key for c in COMPONENTS if c.part == COMPUTE))


def idle_ns() -> pl.Expr:
    return pl.sum_horizontal(*(c.key for c in COMPONENTS if c.group == "idle"))


# the export's own step breakdown, compared component by component (its column, our sum)
CHECKED_COMPONENTS = (
    ("Computing", "computing_ns"),
    ("Communication(Not Overlapped)", "communication_not_overlapped_ns"),
    ("Overlapped", "overlapped_ns"),
)


def check_against_step_trace(steps: pl.DataFrame, step_times: pl.DataFrame) -> pl.DataFrame:
    """Add ``check_deviation``: the worst of |events - export| over Computing, Communication(Not
    Overlapped) and Overlapped, as a share of the export's Stage (null: no row for the step);
    and ``check_component``, the one that differs most. ``step_times`` is the export's own step
    breakdown (step_trace_time.csv, or analysis.db's StepTraceTime).

    Stage itself is not compared: torch_npu measures it from the step's first to its last
    compute or communication task (``device_end_ns - device_start_ns`` here), but exports that
    did not come from torch_npu (the synthetic generator) write the ProfilerStep span instead.
    """
    exchange = pl.col(MC2_EXPOSED) if MC2_EXPOSED in steps.columns else pl.lit(0)
    mine = {
        "Computing": computing_ns() + exchange,
        "Communication(Not Overlapped)": pl.col("comm_exposed_ns") - exchange,
        "Overlapped": pl.col("overlapped_ns"),
    }
    csv = step_times.select(
        "session",
        "step",
        *(pl.col(column).alias(f"_{name}") for name, column in CHECKED_COMPONENTS),
        pl.col("stage_ns").alias("_stage"),
    ).unique(["session", "step"], keep="first")
    diffs = [(mine[name] - pl.col(f"_{name}")).abs() for name, _ in CHECKED_COMPONENTS]
    checked = pl.col("_stage") > 0
    worst = pl.concat_list(diffs).list.arg_max()
    names = pl.Series([name for name, _ in CHECKED_COMPONENTS])
    return (
        steps.join(csv, on=["session", "step"], how="left", nulls_equal=True)
        .with_columns(
            pl.when(checked)
            .then(pl.max_horizontal(*diffs) / pl.col("_stage"))
            .otherwise(None)
            .alias("check_deviation"),
            pl.when(checked)
            .then(worst.replace_strict(dict(enumerate(names)), return_dtype=pl.String))
            .otherwise(None)
            .alias("check_component"),
        )
        .drop(*(f"_{name}" for name, _ in CHECKED_COMPONENTS), "_stage")
    )


def from_step_trace(step_times: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The breakdown from step_trace_time.csv alone (no device tasks in the trace).

    Computing - Overlapped is compute of unknown accelerator, Free and Preparing are idle of
    unknown cause; the step's wall time is the ProfilerStep span when there is one, else Stage
    plus Preparing.
    """
    rows = step_times.join(
        windows.select("session", "step", "start_ns", "end_ns"),
        on=["session", "step"],
        how="left",
        nulls_equal=True,
    )
    compute = (pl.col("computing_ns") - pl.col("overlapped_ns")).clip(0)
    staged = pl.col("stage_ns") + pl.col("preparing_ns").fill_null(0)
    span = (pl.col("end_ns") - pl.col("start_ns")).fill_null(staged)
    zero = {
        c: pl.lit(0, dtype=pl.Int64)
        for c in COMPONENT_NAMES
        if c not in ("compute_other_ns", "overlapped_ns", "comm_exposed_ns", "idle_other_ns")
    }
    return (
        rows.with_columns(span.alias("step_ns"))
        .with_columns(
            compute.alias("compute_other_ns"),
            pl.col("overlapped_ns"),
            pl.col("communication_not_overlapped_ns").alias("comm_exposed_ns"),
            **zero,
        )
        .with_columns(
            (
                pl.col("step_ns")
                - pl.col("compute_other_ns")
                - pl.col("overlapped_ns")
                - pl.col("comm_exposed_ns")
            ).alias("idle_other_ns"),
            pl.lit(None, dtype=pl.Int64).alias("device_start_ns"),
            pl.lit(None, dtype=pl.Int64).alias("device_end_ns"),
            pl.lit("step_trace_time").alias("source"),
            pl.lit(None, dtype=pl.Float64).alias("check_deviation"),
            pl.lit(None, dtype=pl.String).alias("check_component"),
        )
        .select(*WINDOW_COLUMNS, "source", "check_deviation", "check_component")
    )


def split_sessions(kernels: pl.DataFrame) -> list[str]:
    """The sessions whose kernel_details.csv kernels (``kernels``) tell their compute's
    accelerators: :func:`split_compute` splits theirs."""
    known = kernels.filter(pl.col("accelerator_core").is_in(list(ACCELERATORS)))
    return known["session"].unique().to_list()


def split_compute(rows: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """Rows of :func:`from_step_trace` (no device timeline) with their compute
    (``compute_other_ns``) split between the accelerators in the proportions of the time of
    their session's compute kernels in kernel_details.csv (``kernels``: session,
    accelerator_core, dur_ns; without a timeline the steps' bounds are unknown, so the session's mix stands for
    each step's); a row of a session without such kernels keeps it whole."""
    shares = (
        kernels.drop_nulls("dur_ns")
        .filter(pl.col("accelerator_core").is_in(list(ACCELERATORS)))  # compute kernels only
        .with_columns(pl.col("accelerator_core").replace_strict(ACCELERATORS).alias("_cls"))
        .group_by("session")
        .agg(
            (pl.col("dur_ns").filter(pl.col("_cls") == c).sum() / pl.col("dur_ns").sum()).alias(
                f"_{c}"
            )
            for c in COMPUTE_CLASSES
            if c != "compute_other"
        )
    )
    if shares.is_empty():
        return rows
    total = pl.col("compute_other_ns")
    split = {
        COMPUTE_COMPONENTS[c]: (total * pl.col(f"_{c}").fill_null(0.0)).round(0).cast(pl.Int64)
        for c in COMPUTE_CLASSES
        if c != "compute_other"
    }
    known = pl.col(f"_{COMPUTE_CLASSES[0]}").is_not_null()
    return (
        rows.join(shares, on="session", how="left")
        .with_columns(
            pl.when(known).then(e).otherwise(pl.col(k)).alias(k) for k, e in split.items()
        )
        .with_columns(
            pl.when(known)
            .then(total - pl.sum_horizontal(*split))
            .otherwise(total)
            .alias("compute_other_ns")
        )
        .select(rows.columns)
    )
