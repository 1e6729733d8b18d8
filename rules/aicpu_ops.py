"""TA008 aicpu-ops: operators that run on the AI CPU take a real share of device time."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    AI_CPU_TASK_TYPES,
    COMPUTE_TASK_TYPES,
    HARDWARE_PROCESS,
    NS,
    SHARE,
    AnyOf,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Param,
    RuleContext,
    analysed_window_ns,
    cost_over,
    device_tasks,
    kernel_details,
    rule,
)
from traceanalyzer.kit import text as fmt

# Fixes by op type (lower case, as kernel_details `Type`); the dtype fixes below apply to any op.
OP_FIXES = {
    "nonzero": (
        "`NonZero` has a data-dependent output shape (from `torch.nonzero`, `tensor[mask]`, "
        "`masked_select`): keep shapes fixed with `torch.where(mask, x, y)` / `masked_fill`, or "
        "compute the indices once outside the hot path"
    ),
    "maskedselect": (
        "`masked_select` has a data-dependent output shape: use `torch.where` or `masked_fill` "
        "and keep the full tensor"
    ),
    "unique": "`torch.unique` runs on the AI CPU: precompute it, or keep the values on the host",
    "uniquewithcountsandsorting": "`torch.unique` runs on the AI CPU: precompute it",
    "indexput": (
        "`x[idx] = v` / boolean-mask assignment: use `index_put_` with int32 indices, "
        "`scatter_` or `masked_fill_`"
    ),
    "indexputv2": (
        "`x[idx] = v` / boolean-mask assignment: use `index_put_` with int32 indices, "
        "`scatter_` or `masked_fill_`"
    ),
    "index": "advanced indexing `x[idx]`: use `index_select` or `gather` with int32 indices",
    "argmin": "`argmin` has an AI Core kernel from CANN 7.0.RC1 on: upgrade CANN",
    "scatterelements": "use `scatter_` with int32 indices (int64 indices fall back to AI CPU)",
    "gatherelements": "use `gather` with int32 indices (int64 indices fall back to AI CPU)",
}
DTYPE_FIXES = (
    (
        "INT64",
        "cast int64 inputs to int32 (`.int()`) before the op: many AI Core kernels take int32",
    ),
    ("DOUBLE", "use float32 instead of float64 (`.float()`): the AI Core has no float64"),
    ("FLOAT64", "use float32 instead of float64 (`.float()`): the AI Core has no float64"),
    ("COMPLEX", "split complex tensors into real/imaginary float32 parts"),
)
GENERIC_FIX = (
    "this op/dtype has no AI Core kernel in this CANN: try a newer CANN, or replace the op by an "
    "equivalent one with an AI Core kernel"
)
FIX = (
    "Per op type, as listed in the finding: cast int64 to int32 and float64 to float32 before "
    "the op, replace data-dependent ops (NonZero, Unique, masked indexing) by fixed-shape ones "
    "(`torch.where`, `masked_fill`, `index_select`), or upgrade CANN where a newer one has the "
    "AI Core kernel."
)
COMM_CORES = ("HCCL", "COMMUNICATION")


@rule(
    id="TA008",
    name="aicpu-ops",
    severity="warning",
    summary="Operators that run on the AI CPU take a real share of device time.",
    fix=FIX,
    params={
        "min_share": Param(
            0.05, "Fire when AI CPU ops take at least this share of device compute time (0.05)."
        ),
        "min_total_us": Param(100.0, "... and at least this much AI CPU time in total (µs)."),
        "aicpu_cores": Param(
            AI_CPU_TASK_TYPES,
            "`Accelerator Core` (kernel_details) or `Task Type` (trace) values of AI CPU tasks.",
        ),
        "comm_cores": Param(
            COMM_CORES, "Accelerator Core values that are communication, not compute time."
        ),
        "ops_shown": Param(8, "Op types listed in the finding and its evidence."),
    },
    requires=[
        AnyOf(
            kernel_details(),
            device_tasks(
                "device tasks with a task type (trace_view.json Ascend Hardware)",
                columns=("task_type",),
            ),
        )
    ],
    units={"aicpu_ns": NS, "aicpu_share": SHARE, "device_compute_ns": NS},
)
def aicpu_ops(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Device operators that run on the **AI CPU** (kernel_details `Accelerator Core` `AI_CPU`, or
    the trace's `Task Type` when kernel_details has no core type, e.g. at Level0) and together
    take at least `min_share` of the rank's device compute time (all kernels except
    communication) and at least `min_total_us`. The ops are grouped by type, with their input
    dtypes and shapes, count, time and share, and each type gets the fix that fits it: its op
    (NonZero, IndexPut, Unique, ...) or its dtypes (int64, float64).

    ## Why it matters
    The AI CPU is a few general-purpose cores beside the AI Cores: an op that falls back there
    runs tens to hundreds of times slower, and data-dependent ops (NonZero, masked indexing) are
    often followed by a host sync to read the output size. A few AI CPU ops per decode step can
    cost more than the matmuls around them.

    ## How to fix
    - int64 inputs: cast to int32 before the op (`.int()`); float64: use float32.
    - NonZero / masked_select / `tensor[mask]`: use fixed-shape ops (`torch.where`,
      `masked_fill`), or compute the indices once outside the hot path.
    - IndexPut / Index: `index_put_`, `index_select`, `gather`, `scatter_` with int32 indices.
    - Otherwise: a newer CANN may have the AI Core kernel (e.g. `ArgMin` from 7.0.RC1).

    ## Example
    ```
    TA008 aicpu-ops [warning] rank 0 (1/2)
    AI CPU ops take 18% of device compute time (2.1 ms of 11.7 ms): NonZero 1.2 ms (INT64),
    IndexPutV2 0.9 ms (FLOAT;INT64)
    ```
    Silent when AI CPU ops are a tiny share (below `min_share`) or none run at all.

    ## References
    - msprof-analyze advisor `AicpuChecker` (`advisor/rules/en/aicpu_rules.yaml`: per-CANN
      dtype tables, the double → float suggestion) and its AI CPU operator replacement guide.
    - torch_npu export format: kernel_details.csv `Accelerator Core` values.
    """
    tasks = ctx.once(_device_tasks)
    if tasks.is_empty():
        ctx.note("no device compute tasks")
        return
    window = analysed_window_ns(ctx)
    for (rank,), rank_tasks in tasks.group_by("rank", maintain_order=True):
        yield from _judge(ctx, int(rank), rank_tasks, window.get(int(rank)))


def _device_tasks(ctx: RuleContext) -> pl.DataFrame:
    """Compute tasks: kernel_details rows that name their core (with op info), and the trace's
    kernels that kernel_details lacks (Level0, or a task only the trace has)."""
    p = ctx.params
    cols = (
        "rank",
        "session",
        "stream_id",
        "name",
        "op_type",
        "core",
        "start_ns",
        "dur_ns",
        "input_data_types",
        "input_shapes",
        "source",
    )
    kernels = (
        ctx.table("kernels")
        .filter(
            pl.col("accelerator_core").is_not_null()
            & (pl.col("accelerator_core") != "N/A")
            & ~pl.col("accelerator_core").is_in(p.comm_cores)
        )
        .select(
            "rank",
            "session",
            "stream_id",
            "name",
            pl.coalesce(pl.col("type").replace("N/A", None), pl.col("name")).alias("op_type"),
            pl.col("accelerator_core").alias("core"),
            "start_ns",
            "dur_ns",
            "input_data_types",
            "input_shapes",
            pl.lit("kernel_details").alias("source"),
        )
        .collect()
    )
    trace = (
        ctx.table("slices")
        .filter(
            (pl.col("process") == HARDWARE_PROCESS)
            & pl.col("task_type").is_in([*COMPUTE_TASK_TYPES, *p.aicpu_cores])
        )
        .select(
            "rank",
            "session",
            "stream_id",
            "name",
            pl.col("name").alias("op_type"),
            pl.col("task_type").alias("core"),
            "start_ns",
            "dur_ns",
            pl.lit(None, pl.String).alias("input_data_types"),
            pl.lit(None, pl.String).alias("input_shapes"),
            pl.lit("trace").alias("source"),
        )
        .collect()
        # the same task in both files starts at the same ns on the same stream: count it once,
        # with kernel_details' op info
        .join(kernels, on=["rank", "session", "stream_id", "start_ns"], how="anti")
    )
    return pl.concat([kernels.select(cols), trace.select(cols)]).sort("rank", "start_ns")


def _judge(
    ctx: RuleContext, rank: int, tasks: pl.DataFrame, window_ns: int | None
) -> Iterator[Finding]:
    p = ctx.params
    total_ns = int(tasks["dur_ns"].sum())
    aicpu = tasks.filter(pl.col("core").is_in(p.aicpu_cores))
    aicpu_ns = int(aicpu["dur_ns"].sum()) if aicpu.height else 0
    fraction = aicpu_ns / total_ns if total_ns else 0.0
    if aicpu.is_empty() or fraction < p.min_share or aicpu_ns < p.min_total_us * 1e3:
        ctx.note(
            f"rank {rank}: AI CPU ops take {fraction:.1%} of device compute time "
            f"({fmt.duration(aicpu_ns)}; thresholds {p.min_share:.0%} and {p.min_total_us:g} µs)",
            rank=rank,
            aicpu_ns=aicpu_ns,
            aicpu_share=fraction,
        )
        return
    groups = op_groups(aicpu, total_ns)
    shown = groups.head(p.ops_shown)
    listed = ", ".join(
        f"{g['op_type']} {fmt.duration(g['total_ns'])}"
        + (f" ({g['dtypes']})" if g["dtypes"] else "")
        for g in shown.iter_rows(named=True)
    )
    lines = [
        f"{g['op_type']}: {g['count']} task(s), {fmt.duration(g['total_ns'])} "
        f"({g['share']:.1%} of device compute), longest {fmt.duration(g['max_ns'])}"
        + (f", inputs {g['dtypes']}" if g["dtypes"] else "")
        + (f", shapes {g['shapes']}" if g["shapes"] else "")
        for g in shown.iter_rows(named=True)
    ]
    from_trace = (aicpu["source"] == "trace").all()
    message = "\n".join(
        [
            f"Device compute time on rank {rank}: {fmt.duration(total_ns)} in {tasks.height} "
            f"task(s); AI CPU ops: {fmt.duration(aicpu_ns)} in {aicpu.height} task(s) "
            f"({fraction:.1%}, threshold {p.min_share:.0%}).",
            *lines,
            *(
                [
                    "Only the trace's task types were available: dtypes and shapes need "
                    "kernel_details.csv (collect with profiler_level=Level1)."
                ]
                if from_trace
                else []
            ),
        ]
    )
    fix = "; ".join(
        f"{g['op_type']}: {op_fix(g['op_type'], g['dtypes'])}" for g in shown.iter_rows(named=True)
    )
    yield ctx.finding(
        rank=rank,
        sessions=sorted(aicpu["session"].unique().to_list()),
        title=(
            f"AI CPU ops take {fraction:.0%} of device compute time ({fmt.duration(aicpu_ns)} of "
            f"{fmt.duration(total_ns)}): {listed}"
        ),
        message=message,
        location={"core": "AI_CPU"},
        cost=cost_over(aicpu_ns, window_ns),
        metrics={
            "aicpu_ns": aicpu_ns,
            "aicpu_share": fraction,
            "aicpu_tasks": aicpu.height,
            "device_compute_ns": total_ns,
            "op_types": groups.height,
        },
        evidence=_evidence(rank, aicpu, shown),
        fix=fix,
        series={
            "op_type": shown["op_type"].to_list(),
            "op_ns": shown["total_ns"].to_list(),
            "op_share": shown["share"].to_list(),
        },
        score=float(aicpu_ns),
    )


def op_groups(aicpu: pl.DataFrame, total_ns: int) -> pl.DataFrame:
    """AI CPU tasks by op type: count, time, share, longest, dtypes and shapes (by time)."""
    by_shape = (
        aicpu.group_by("op_type", "input_data_types", "input_shapes")
        .agg(pl.col("dur_ns").sum().alias("t"))
        .sort("t", descending=True)
    )
    detail = by_shape.group_by("op_type", maintain_order=True).agg(
        pl.col("input_data_types").drop_nulls().unique(maintain_order=True).head(3).alias("dt"),
        pl.col("input_shapes").drop_nulls().unique(maintain_order=True).head(2).alias("sh"),
    )
    return (
        aicpu.group_by("op_type")
        .agg(
            pl.len().alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").max().alias("max_ns"),
        )
        .join(detail, on="op_type", how="left")
        .with_columns(
            (pl.col("total_ns") / max(total_ns, 1)).alias("share"),
            pl.col("dt").list.join(" | ").alias("dtypes"),
            pl.col("sh").list.join(" | ").alias("shapes"),
        )
        .drop("dt", "sh")
        .sort(["total_ns", "op_type"], descending=[True, False])
    )


def op_fix(op_type: str, dtypes: str | None) -> str:
    """The fix for one AI CPU op type: by its op, else by its input dtypes, else generic."""
    key = op_type.lower().replace("_", "")
    if key in OP_FIXES:
        return OP_FIXES[key]
    upper = (dtypes or "").upper()
    for dtype, fix in DTYPE_FIXES:
        if dtype in upper:
            return fix
    return GENERIC_FIX


def _evidence(rank: int, aicpu: pl.DataFrame, shown: pl.DataFrame) -> list[Evidence]:
    """The longest task of each op type shown, with its dtypes and shapes."""
    longest = (
        aicpu.filter(pl.col("op_type").is_in(shown["op_type"].to_list()))
        .sort("dur_ns", descending=True)
        .group_by("op_type", maintain_order=True)
        .first()
    )
    return [
        Evidence(
            rank=rank,
            session=row["session"],
            name=row["name"],
            process=HARDWARE_PROCESS,
            thread=f"Stream {row['stream_id']}" if row["stream_id"] is not None else None,
            stream=row["stream_id"],
            start_ns=row["start_ns"],
            dur_ns=row["dur_ns"],
            detail=", ".join(
                x
                for x in (
                    f"type {row['op_type']}",
                    f"inputs {row['input_data_types']}" if row["input_data_types"] else "",
                    f"shapes {row['input_shapes']}" if row["input_shapes"] else "",
                )
                if x
            ),
        )
        for row in longest.iter_rows(named=True)
    ]


# --------------------------------------------------------------------------- presentation


@aicpu_ops.figure(caption="Share of device compute time of each AI CPU op type.")
def _figure(fig: FigureContext) -> Any:
    """Time share of each AI CPU op type (horizontal bars)."""
    series: Mapping[str, Any] = fig.finding.get("series") or {}
    names, shares = series.get("op_type") or [], series.get("op_share") or []
    if not names:
        return None
    figure_, (ax,) = fig.new(6.0, 0.4 + 0.35 * len(names))
    ax.barh(names[::-1], [100 * s for s in shares[::-1]], color="#c0504d")
    ax.set_xlabel("share of device compute time (%)")
    return figure_


@aicpu_ops.key_figures(
    KeyFigure("aicpu_ns", "AI CPU op time", better="lower", unit="ns"),
    KeyFigure("aicpu_share", "AI CPU share of device compute", better="lower", unit="ratio"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Per rank: AI CPU time and its share of device compute time (null without compute tasks)."""
    p = ctx.params
    tasks = ctx.once(_device_tasks)
    return (
        tasks.group_by("rank")
        .agg(
            pl.col("dur_ns").filter(pl.col("core").is_in(p.aicpu_cores)).sum().alias("aicpu_ns"),
            pl.col("dur_ns").sum().alias("_total"),
        )
        .with_columns(
            pl.when(pl.col("_total") > 0)
            .then(pl.col("aicpu_ns") / pl.col("_total"))
            .alias("aicpu_share")
        )
        .drop("_total")
    )
