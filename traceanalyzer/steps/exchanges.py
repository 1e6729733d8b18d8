"""The ``exchanges`` derived table: the expert-parallel (EP) exchange each step of an MoE rank
used, and how much of it no compute hid.

An MoE layer on an EP rank sends each token to the ranks holding its experts and back: MC2
``MoeDistributeDispatch*`` / ``Combine*`` kernels, an all-to-all, or an all-gather there and a
reduce-scatter back (``serving_profiles.md`` §3). vllm-ascend takes MC2 up to a token capacity
and all-to-all above it, so a step's path should fit its size.

Derived in the steps' task, from the device tasks they read and the steps just derived, at the
default patterns: ``moe-load-imbalance`` and the overview read it (``kit.moe``); a rule whose
patterns differ derives its own (:func:`exchange_paths_in`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import polars as pl

from traceanalyzer.engine.params import Param, Params
from traceanalyzer.primitives import any_of, covered_fraction, union_intervals, window_of
from traceanalyzer.steps.windows import compute_tasks
from traceanalyzer.store import DERIVED_READERS, Store, stored_or_derived
from traceanalyzer.vocabulary import DEVICE_PROCESSES

TABLE = "exchanges"
EXCHANGE_PARAMS = {
    "mc2_ops": Param(
        r"MoeDistribute(?:Dispatch|Combine)",
        "Regex on device task names of the MC2 exchange (dispatch/combine kernels).",
    ),
    "alltoall_ops": Param(
        r"(?i)^hcom_all_?to_?all", "Regex on collective names of the all-to-all exchange."
    ),
    "allgather_ops": Param(
        r"(?i)^hcom_(?:all_?gather|reduce_?scatter)",
        "Regex on collective names of the all-gather exchange (all-gather there, "
        "reduce-scatter back).",
    ),
}
DEFAULTS = Params({name: param.default for name, param in EXCHANGE_PARAMS.items()})
# the device tasks' columns read here: the exchanges', the compute kernels' and the experts'
DEVICE_COLUMNS = (
    "rank", "session", "process", "thread", "name", "task_type", "stream_id", "start_ns", "end_ns",
)  # fmt: skip
SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "step": pl.Int64, "phase": pl.String,
    "tokens": pl.Int64, "path": pl.String, "paths": pl.String, "exchanges": pl.Int64,
    "exchange_ns": pl.Int64, "exposed_ns": pl.Int64, "fits": pl.Boolean,
}  # fmt: skip


def device_slices(slices: pl.LazyFrame) -> pl.DataFrame:
    """The device tasks (device and communication processes, ``end_ns > start_ns``) of
    ``slices``, in their order, with :data:`DEVICE_COLUMNS`: what the exchanges, the compute
    kernels and the expert kernels are read from."""
    return (
        slices.filter(
            pl.col("process").is_in(DEVICE_PROCESSES) & (pl.col("end_ns") > pl.col("start_ns"))
        )
        .select(DEVICE_COLUMNS)
        .collect()
    )


def _path_of(p: Any) -> pl.Expr:
    name = pl.col("name")
    return (
        pl.when(name.str.contains(p.mc2_ops))
        .then(pl.lit("mc2"))
        .when(name.str.contains(p.alltoall_ops))
        .then(pl.lit("alltoall"))
        .when(name.str.contains(p.allgather_ops))
        .then(pl.lit("allgather"))
    )


def exchange_ops_in(device: pl.DataFrame, p: Any) -> pl.DataFrame:
    """EP exchange ops of ``device`` (:func:`device_slices`): rank, session, name, process,
    thread, start_ns, end_ns, path (MC2 kernels on a compute stream, HCCL ops on their group
    row)."""
    return (
        device.lazy()
        # the few exchange ops first, then their path
        .filter(pl.col("name").str.contains(any_of((p.mc2_ops, p.alltoall_ops, p.allgather_ops))))
        .with_columns(_path_of(p).alias("path"))
        .filter(pl.col("path").is_not_null())
        .select("rank", "session", "name", "process", "thread", "start_ns", "end_ns", "path")
        .unique(["rank", "session", "name", "start_ns"])  # a trace with repeated events
        .collect()
        .sort("rank", "session", "start_ns")
    )


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


def exchange_inputs(
    device: pl.DataFrame, compute: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The EP exchange ops of ``device`` (device tasks: at least :data:`DEVICE_COLUMNS`) at the
    default patterns, and its compute kernels (``compute`` when the caller derived them, else
    derived here; None without an exchange op: not an MoE rank, nothing more to derive)."""
    device = device.select(DEVICE_COLUMNS)
    ops = exchange_ops_in(device, DEFAULTS)
    if ops.is_empty():
        return ops, None
    return ops, compute if compute is not None else compute_tasks(device.lazy())


def derive_exchanges(
    ops: pl.DataFrame, compute: pl.DataFrame | None, steps: pl.DataFrame
) -> pl.DataFrame:
    """The ``exchanges`` rows at the default patterns of ranks with these exchange ops and
    compute kernels (:func:`exchange_inputs`) and ``steps`` (their steps)."""
    if compute is None:
        return pl.DataFrame(schema=SCHEMA)
    return exchange_paths_in(ops, compute, steps)


def exchanges_of(store: Store, ranks: Collection[int]) -> pl.DataFrame:
    """The exchanges of ``ranks`` at the default patterns: the store's ``exchanges`` table,
    derived here for a rank it has none for (a fixture's store, or one written before they were
    derived), once per store."""
    from traceanalyzer.steps.tables import steps_of

    def derive(rank: int) -> pl.DataFrame:
        device = device_slices(store.scan("slices").filter(pl.col("rank") == rank))
        return derive_exchanges(*exchange_inputs(device), steps_of(store, [rank]))

    return stored_or_derived(store, TABLE, ranks, derive, SCHEMA).sort("rank", "session", "step")


DERIVED_READERS[TABLE] = exchanges_of
