"""Steps, steady state and host call sites: shared by the rules that judge host calls per step.

A step is a host span matching ``step_pattern`` (``ProfilerStep#N``, one per ``prof.step()``).
Steps numbered up to ``warmup_steps`` are warm-up (the first iterations allocate, compile and
cache); the others are the steady state. A call belongs to the step it starts in. Its call
site is the torch op around it on the same OS thread: the outermost one under the step (what
the model code called, e.g. ``aten::item``) and the innermost (``aten::_local_scalar_dense``).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceanalyzer.kit import (
    CANN_PROCESS,
    NOT_HOST_PROCESSES,
    PYTHON_PROCESS,
    Param,
    RuleContext,
    containing_call,
    outermost,
    overlap_join,
)

STEP_PARAMS = {
    "step_pattern": Param(
        r"^ProfilerStep#(\d+)$",
        "Regex on host span names that mark steps; group 1, when present, is the step number.",
    ),
    "warmup_steps": Param(
        1, "Steps numbered up to this are warm-up, not steady state (ProfilerStep#1 ...)."
    ),
}
NO_STEPS = (
    "no step windows (`ProfilerStep#N` spans; profile with a schedule and call prof.step() "
    "every iteration, or set step_pattern)"
)
STEP_SCHEMA = {
    "rank": pl.Int32,
    "session": pl.String,
    "step": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}


def step_windows(ctx: RuleContext) -> pl.DataFrame:
    """Steps per rank and session: ``step``, ``start_ns``, ``end_ns``, ``dur_ns``, ``steady``."""
    p = ctx.params
    spans = (
        ctx.table("slices")
        .filter(~pl.col("process").is_in(NOT_HOST_PROCESSES) & pl.col("name").str.contains(p.step_pattern))
        .select(
            "rank",
            "session",
            pl.col("name").str.extract(p.step_pattern, 1).cast(pl.Int64, strict=False).alias("step"),
            "start_ns",
            "end_ns",
        )
        .collect()
        .cast(STEP_SCHEMA)
    )
    steps = outermost(spans).sort("rank", "session", "start_ns")
    # A pattern without a number (an `execute_model` span): number the steps from 1 per session.
    ordinal = pl.int_range(1, pl.len() + 1).over("rank", "session")
    return steps.with_columns(
        pl.col("step").fill_null(ordinal),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
    ).with_columns((pl.col("step") > p.warmup_steps).alias("steady"))


def host_calls(ctx: RuleContext, names: Sequence[str] = (), pattern: str | None = None) -> pl.DataFrame:
    """CANN calls named in ``names`` or matching ``pattern`` (on ``api_name``)."""
    match = pl.col("api_name").is_in(list(names))
    if pattern:
        match = match | pl.col("api_name").str.contains(pattern)
    return (
        ctx.table("slices")
        .filter((pl.col("process") == CANN_PROCESS) & match)
        .select("rank", "session", "process", "thread", "name", "api_name", "start_ns", "end_ns", "dur_ns")
        .collect()
    )


def in_steps(calls: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The calls that start inside a step, with its ``step`` number, ``steady`` flag and bounds."""
    windows = steps.select(
        "rank", "session", "step", "steady", "start_ns", "end_ns",
        pl.col("start_ns").alias("step_start_ns"), pl.col("end_ns").alias("step_end_ns"),
    )  # fmt: skip
    joined = overlap_join(windows, calls, mode="start_within", suffix="_call")
    return joined.select(
        *calls.columns[:2],
        "step", "steady", "step_start_ns", "step_end_ns",
        *(pl.col(f"{c}_call").alias(c) if f"{c}_call" in joined.columns else pl.col(c)
          for c in calls.columns[2:]),
    )  # fmt: skip


def call_sites(ctx: RuleContext, calls: pl.DataFrame) -> pl.DataFrame:
    """Add ``site`` (outermost torch op around each call, under the step) and ``site_op``
    (the innermost one); null when the call runs outside any torch op."""
    ops = (
        ctx.table("slices")
        .filter(
            (pl.col("process") == PYTHON_PROCESS)
            & (pl.col("cat") == "cpu_op")
            & ~pl.col("name").str.contains(ctx.params.step_pattern)
        )
        .select("rank", "session", "thread", pl.col("name").alias("_op"), "start_ns", "end_ns")
        .with_columns(pl.lit(CANN_PROCESS).alias("process"))  # CANN threads are the OS threads
        .collect()
    )
    points = calls.with_columns(pl.col("start_ns").alias("_at"))
    inner = containing_call(points, ops, at="_at")["_op"]
    outer = containing_call(points, ops, at="_at", outer=True)["_op"]
    return calls.with_columns(site=outer, site_op=inner)
