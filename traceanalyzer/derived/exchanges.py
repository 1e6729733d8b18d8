"""The ``exchanges`` derived table: the expert-parallel (EP) exchange each step of an MoE rank
used, and how much of it no compute hid.

An MoE layer on an EP rank sends each token to the ranks holding its experts and back: MC2
``MoeDistributeDispatch*`` / ``Combine*`` kernels, an all-to-all, or an all-gather there and a
reduce-scatter back (``serving_profiles.md`` §3). vllm-ascend takes MC2 up to a token capacity
and all-to-all above it, so a step's path should fit its size.

A stage derived in the steps' task, from the EP exchange ops (``derived.device``) and compute
kernels the steps' slices hold and the steps just derived, at the default patterns:
``moe-load-imbalance`` and the overview read it (``analyses.moe``); a rule whose patterns differ
derives its own (:func:`exchange_paths_in`).
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceanalyzer.derived.derive import COMPUTE_KERNELS
from traceanalyzer.derived.device import EXCHANGE_OPS
from traceanalyzer.derived.stage import TABLE as STEPS
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.intervals import covered_fraction, union_intervals, window_of
from traceanalyzer.stages import Stage, declare, rows_of
from traceanalyzer.store import Store

TABLE = "exchanges"
SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "step": pl.Int64, "phase": pl.String,
    "tokens": pl.Int64, "path": pl.String, "paths": pl.String, "exchanges": pl.Int64,
    "exchange_ns": pl.Int64, "exposed_ns": pl.Int64, "fits": pl.Boolean,
}  # fmt: skip


def exchange_paths_in(
    exchanges: pl.DataFrame, kernels: pl.DataFrame, steps: pl.DataFrame
) -> pl.DataFrame:
    """Per rank, session and step that ran an EP exchange (:data:`SCHEMA`): ``phase`` and
    ``tokens`` (the steps'), ``path`` (``mc2``, ``alltoall`` or ``allgather``; the most used
    when a step ran several), ``paths`` (all of them, comma-separated), ``exchanges`` (ops),
    ``exchange_ns`` (time in them, overlaps counted once), ``exposed_ns`` (of it, the time no
    compute kernel ran on any stream of the rank) and ``fits`` (:func:`fits`). ``exchanges``:
    :func:`exchange_ops_in`; ``kernels``: the compute kernels; ``steps``: the ranks' steps."""
    steps = steps.filter(pl.col("step").is_not_null())
    ops = window_of(exchanges, steps, keep=["step", "phase"]).filter(pl.col("step").is_not_null())
    if ops.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    ranks = sorted(ops["rank"].unique().to_list())
    compute = kernels.filter(pl.col("rank").is_in(ranks))
    compute = compute.join(
        ops.select("rank", "session", "name", "start_ns"),
        on=["rank", "session", "name", "start_ns"],
        how="anti",  # an MC2 exchange is a kernel too: it is not compute that hides it
    )
    covered = covered_fraction(
        ops.with_row_index("_op"), compute.select("rank", "session", "start_ns", "end_ns"),
        span_id="_op",
    )  # fmt: skip
    per_step = (
        covered.with_columns(
            (pl.col("end_ns") - pl.col("start_ns") - pl.col("covered_ns")).alias("exposed_ns")
        )
        .group_by("rank", "session", "step")
        .agg(
            pl.col("phase").first(),
            pl.col("path").mode().sort().first().alias("path"),
            pl.col("path").unique().sort().str.join(",").alias("paths"),
            pl.len().alias("exchanges"),
            pl.col("exposed_ns").sum(),
        )
    )
    spans = union_intervals(
        ops.select("rank", "session", "step", "start_ns", "end_ns"), by=["rank", "session", "step"]
    )
    busy = spans.group_by("rank", "session", "step").agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("exchange_ns")
    )
    tokens = steps.select("rank", "session", "step", "tokens").cast({"rank": ops.schema["rank"]})
    out = (
        per_step.join(busy, on=["rank", "session", "step"], how="left")
        .join(tokens, on=["rank", "session", "step"], how="left")
        .pipe(fits)
        .sort("rank", "session", "step")
    )
    return out.select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]


def fits(steps: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (rank, path, tokens) with ``fits``: False when the path does not fit the step's
    size (an all-to-all step with fewer tokens than an MC2 step of the same rank, an MC2 step
    with more tokens than an all-to-all one, or an all-gather step beside MC2 or all-to-all
    steps); null when the step's tokens are unknown."""
    known = pl.col("tokens").is_not_null()
    bounds = steps.group_by("rank").agg(
        pl.col("tokens").filter(known & (pl.col("path") == "mc2")).max().alias("_mc2_max"),
        pl.col("tokens").filter(known & (pl.col("path") == "alltoall")).min().alias("_a2a_min"),
        pl.col("path").is_in(["mc2", "alltoall"]).any().alias("_routed"),
    )
    path, tokens = pl.col("path"), pl.col("tokens")
    fit = (
        pl.when(~known)
        .then(None)
        .when(path == "mc2")
        .then(pl.col("_a2a_min").is_null() | (tokens <= pl.col("_a2a_min")))
        .when(path == "alltoall")
        .then(pl.col("_mc2_max").is_null() | (tokens >= pl.col("_mc2_max")))
        .otherwise(~pl.col("_routed"))
    )
    return (
        steps.join(bounds, on="rank", how="left")
        .with_columns(fit.alias("fits"))
        .drop("_mc2_max", "_a2a_min", "_routed")
    )


def exchanges_of(store: Store, ranks: Collection[int]) -> pl.DataFrame:
    """The exchanges of ``ranks`` at the default patterns: the store's ``exchanges`` table,
    derived here for a rank it has none for (a fixture's store, or one written before they were
    derived), once per store."""
    return store.derived(TABLE, ranks).collect()


def derive_exchanges(
    store: Store,
    ranks: list[int],
    params: None,
    *,
    exchange_ops: pl.DataFrame,
    compute_kernels: pl.DataFrame,
    steps: pl.DataFrame,
) -> pl.DataFrame:
    """The ``exchanges`` rows of ``ranks`` at the default patterns, from their EP exchange ops
    (none: not an MoE rank), compute kernels and steps."""
    if exchange_ops.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    return exchange_paths_in(exchange_ops, compute_kernels, steps)


EXCHANGES = declare(
    Stage(
        name=TABLE,
        tables=(TABLE,),
        derive=derive_exchanges,
        inputs=("slices", STEPS),
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the steps' task's
        reads=(EXCHANGE_OPS, COMPUTE_KERNELS, rows_of(STEPS)),
        order=("rank", "session", "step"),
    )
)
