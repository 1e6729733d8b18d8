"""The top-N tables of a rank session: kernels, host APIs and collectives by total time."""

from __future__ import annotations

import polars as pl

from traceanalyzer.overview.breakdown import COMPUTE_CLASSES
from traceanalyzer.vocabulary import CANN_PROCESS, COMMUNICATION_PROCESSES, STEP_SPAN_PREFIX

PYTHON_OP_CATEGORY = "cpu_op"  # torch ops (aten::*, npu::*) on the Python side
# `hcom_allReduce__586_0_1` -> `allReduce`: the collective's kind, without group and op ids
COLLECTIVE_KIND = r"^(?:hcom_)?([A-Za-z][A-Za-z0-9]*)"


def _stats(frame: pl.DataFrame, by: list[str], whole: pl.DataFrame, n: int) -> pl.DataFrame:
    """count, total, mean, p95 of ``dur_ns`` per ``by``; the ``n`` largest per session; share
    of ``whole`` (session, whole_ns)."""
    return (
        frame.group_by("session", *by)
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.col("dur_ns").mean().round(0).cast(pl.Int64).alias("mean_ns"),
            pl.col("dur_ns").quantile(0.95, "nearest").cast(pl.Int64).alias("p95_ns"),
        )
        .sort(["session", "total_ns", *by], descending=[False, True, *([False] * len(by))])
        .group_by("session", maintain_order=True)
        .head(n)
        .join(whole, on="session", how="left")
        .with_columns((pl.col("total_ns") / pl.col("whole_ns")).alias("share"))
        .drop("whole_ns")
    )


def top_kernels(tasks: pl.DataFrame, n: int) -> pl.DataFrame:
    """Compute tasks (classified device tasks) by total device time; share of all compute."""
    kernels = tasks.filter(pl.col("cls").is_in(COMPUTE_CLASSES)).with_columns(
        pl.coalesce("accelerator", "task_type").alias("accelerator")
    )
    whole = kernels.group_by("session").agg(pl.col("dur_ns").sum().alias("whole_ns"))
    return _stats(kernels, ["name", "accelerator"], whole, n)


def top_host_apis(slices: pl.LazyFrame, windows: pl.DataFrame, n: int) -> pl.DataFrame:
    """CANN APIs and Python ops by total (inclusive) time; share of the session's window."""
    calls = (
        slices.filter(
            (pl.col("process") == CANN_PROCESS)
            | (
                (pl.col("cat") == PYTHON_OP_CATEGORY)
                & ~pl.col("name").str.starts_with(STEP_SPAN_PREFIX)  # the step itself
            )
        )
        .select(
            "session",
            pl.when(pl.col("process") == CANN_PROCESS)
            .then(pl.lit("CANN"))
            .otherwise(pl.lit("Python"))
            .alias("kind"),
            "name",
            "dur_ns",
        )
        .collect()
    )
    window = windows.group_by("session").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("whole_ns")
    )
    return _stats(calls, ["kind", "name"], window, n)


def top_collectives(comm_ops: pl.DataFrame, tasks: pl.DataFrame, n: int) -> pl.DataFrame:
    """Collectives by total elapsed time, from communication.json (with wait and transit), or
    else from the communication ops on the timeline (total only)."""
    if not comm_ops.is_empty():
        ops = comm_ops.with_columns(_kind("op_name"))
        grouped = ops.group_by("session", "name").agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("elapse_ns").sum().alias("total_ns"),
            pl.col("wait_ns").sum().alias("wait_ns"),
            pl.col("transit_ns").sum().alias("transit_ns"),
            pl.lit("communication.json").alias("source"),
        )
    else:
        # the ops themselves (one per collective, on `Group N Communication`), not their tasks
        ops = tasks.filter(
            pl.col("process").is_in(COMMUNICATION_PROCESSES) & pl.col("task_type").is_null()
        ).with_columns(_kind("name"))
        grouped = ops.group_by("session", "name").agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("dur_ns").sum().alias("total_ns"),
            pl.lit(None, dtype=pl.Int64).alias("wait_ns"),
            pl.lit(None, dtype=pl.Int64).alias("transit_ns"),
            pl.lit("events").alias("source"),
        )
    return (
        grouped.with_columns((pl.col("wait_ns") / pl.col("total_ns")).alias("wait_share"))
        .sort(["session", "total_ns", "name"], descending=[False, True, False])
        .group_by("session", maintain_order=True)
        .head(n)
    )


def _kind(column: str) -> pl.Expr:
    return pl.col(column).str.extract(COLLECTIVE_KIND, 1).fill_null(pl.col(column)).alias("name")
