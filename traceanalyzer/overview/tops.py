"""The top-N tables of a rank session: kernels, host APIs and collectives by total time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import polars as pl

from traceanalyzer.overview.breakdown import ACCELERATORS, COMPUTE_CLASSES
from traceanalyzer.vocabulary import CANN_PROCESS, COMMUNICATION_PROCESSES, STEP_SPAN_PREFIX

PYTHON_OP_CATEGORY = "cpu_op"  # torch ops (aten::*, npu::*) on the Python side
# the host calls the top table counts: CANN calls, and torch ops but the step itself
CANN_CALL = pl.col("process") == CANN_PROCESS
TORCH_OP = (pl.col("cat") == PYTHON_OP_CATEGORY) & ~pl.col("name").str.starts_with(STEP_SPAN_PREFIX)
# `hcom_allReduce__586_0_1` -> `allReduce`: the collective's kind, without group and op ids
COLLECTIVE_KIND = r"^(?:hcom_)?([A-Za-z][A-Za-z0-9]*)"


ALL_PHASES = "all"  # the phase column of a top table's rows over the whole session
R = TypeVar("R")


def by_phase(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s rows twice: ``phase`` "all", and the phase of the step each starts in (rows
    outside every step only once). ``steps``: session, start_ns, end_ns, phase."""
    whole = frame.with_columns(pl.lit(ALL_PHASES).alias("phase"))
    spans = steps.select(
        "session", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e"), "phase"
    ).sort("_s")
    placed = (
        frame.sort("start_ns")
        .join_asof(spans, left_on="start_ns", right_on="_s", by="session", check_sortedness=False)
        .filter(pl.col("start_ns") < pl.col("_e"))
        .drop("_s", "_e")
    )
    return pl.concat([whole, placed.select(whole.columns)])


def _stats(frame: pl.DataFrame, by: list[str], whole: pl.DataFrame, n: int) -> pl.DataFrame:
    """count, total, mean, p95 of ``dur_ns`` per ``by``; the ``n`` largest per session and
    phase; share of ``whole`` (session, phase, whole_ns)."""
    keys = ["session", "phase"]
    return (
        frame.group_by(*keys, *by)
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").mean().round(0).cast(pl.Int64).alias("mean_ns"),
            pl.col("dur_ns").quantile(0.95, "nearest").cast(pl.Int64).alias("p95_ns"),
        )
        .sort([*keys, "total_ns", *by], descending=[False, False, True, *([False] * len(by))])
        .group_by(*keys, maintain_order=True)
        .head(n)
        .join(whole, on=keys, how="left")
        .with_columns((pl.col("total_ns") / pl.col("whole_ns")).alias("share"))
        .drop("whole_ns")
    )


def top_kernels(
    tasks: pl.DataFrame, steps: pl.DataFrame, n: int, listed: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Compute tasks (classified device tasks) by total device time, over the session and per
    phase; share of all compute there. ``listed``: the kernels kernel_details.csv lists
    (session, name, accelerator_core, start_ns, dur_ns) of the sessions without device tasks
    (their trace lost or unreadable): their compute kernels stand in for them."""
    columns = ["session", "name", "accelerator", "start_ns", "dur_ns"]
    kernels = (
        tasks.filter(pl.col("cls").is_in(COMPUTE_CLASSES))
        .with_columns(pl.coalesce("accelerator", "task_type").alias("accelerator"))
        .select(columns)
    )
    if listed is not None and not listed.is_empty():
        compute = listed.filter(pl.col("accelerator_core").is_in(list(ACCELERATORS)))
        compute = compute.rename({"accelerator_core": "accelerator"}).select(columns)
        kernels = pl.concat([kernels, compute], how="vertical_relaxed")
    kernels = by_phase(kernels, steps)
    whole = kernels.group_by("session", "phase").agg(pl.col("dur_ns").sum().alias("whole_ns"))
    return _stats(kernels, ["name", "accelerator"], whole, n)


def top_host_apis(slices: pl.LazyFrame, steps: pl.DataFrame, n: int) -> pl.DataFrame:
    """CANN APIs and Python ops by total (inclusive) time, over the session and per phase;
    share of the session's steps there."""
    kind = pl.when(CANN_CALL).then(pl.lit("CANN")).otherwise(pl.lit("Python")).alias("kind")
    calls = (
        slices.filter(CANN_CALL | TORCH_OP)
        .select("session", kind, "name", "start_ns", "dur_ns")
        .collect()
    )
    calls = by_phase(calls, steps)
    span = pl.col("end_ns") - pl.col("start_ns")
    window = pl.concat(
        [
            steps.group_by("session").agg(
                span.sum().alias("whole_ns"), pl.lit(ALL_PHASES).alias("phase")
            ),
            steps.group_by("session", "phase").agg(span.sum().alias("whole_ns")),
        ],
        how="diagonal",
    )
    return _stats(calls, ["kind", "name"], window, n)


def top_collectives(comm_ops: pl.DataFrame, tasks: pl.DataFrame, n: int) -> pl.DataFrame:
    """Collectives by total elapsed time, from communication.json (with wait and transit), or
    else from the communication ops on the timeline (total only)."""
    split = ("wait_ns", "transit_ns")
    if not comm_ops.is_empty():
        ops = comm_ops.with_columns(collective_kind("op_name"))
        total, source = "elapse_ns", "communication.json"
        parts = [pl.col(c).sum() for c in split]
    else:
        # the ops themselves (one per collective, on `Group N Communication`), not their tasks
        ops = tasks.filter(
            pl.col("process").is_in(COMMUNICATION_PROCESSES) & pl.col("task_type").is_null()
        ).with_columns(collective_kind("name"))
        total, source = "dur_ns", "events"
        parts = [pl.lit(None, dtype=pl.Int64).alias(c) for c in split]
    grouped = ops.group_by("session", "name").agg(
        pl.len().cast(pl.Int64).alias("count"),
        pl.col(total).sum().alias("total_ns"),
        *parts,
        pl.lit(source).alias("source"),
    )
    return (
        grouped.with_columns((pl.col("wait_ns") / pl.col("total_ns")).alias("wait_share"))
        .sort(["session", "total_ns", "name"], descending=[False, True, False])
        .group_by("session", maintain_order=True)
        .head(n)
    )


def collective_kind(column: str) -> pl.Expr:
    """``name``: the collective's kind (:data:`COLLECTIVE_KIND`) of the op name in ``column``."""
    return pl.col(column).str.extract(COLLECTIVE_KIND, 1).fill_null(pl.col(column)).alias("name")


def combined_tops(
    frame: pl.DataFrame, by: list[str], n: int, row: Callable[..., R], extra: Iterable[pl.Expr] = ()
) -> list[R]:
    """Per-rank top tables combined: sums over ranks, p95 the worst rank's, share re-weighted;
    each a ``row`` (the document's class of that table's rows)."""
    if frame.is_empty():
        return []
    has_share = "share" in frame.columns
    aggs = [
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("count").sum(),
        pl.col("total_ns").sum(),
        *extra,
    ]
    if has_share:
        aggs.append((pl.col("total_ns") / pl.col("share")).sum().alias("_whole"))
    if "p95_ns" in frame.columns:
        aggs.append(pl.col("p95_ns").max())
    out = (
        frame.group_by(by)
        .agg(aggs)
        .with_columns((pl.col("total_ns") / pl.col("count")).round(0).alias("mean_ns"))
        .sort(["total_ns", *by], descending=[True, *([False] * len(by))])
        .head(n)
    )
    if has_share:
        out = out.with_columns((pl.col("total_ns") / pl.col("_whole")).alias("share")).drop(
            "_whole"
        )
    return [row(**r) for r in out.to_dicts()]
