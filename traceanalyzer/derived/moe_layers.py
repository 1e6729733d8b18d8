"""The ``moe_layers`` and ``moe_dense`` derived tables: each MoE layer instance of an
expert-parallel (EP) rank, and the time of its dense kernels per step.

An MoE layer on an EP rank runs the router, the exchange that sends each token to the ranks
holding its experts, the rank's **expert compute** (``MoeInitRouting*``, ``GroupedMatmul``,
``SwiGlu``, ``MoeTokenUnpermute``, ``MoeFinalizeRouting``), then the exchange back; the
exchange back ends on every rank when the last one arrives (``serving_profiles.md`` §3).
``moe_layers`` has one row per stretch of expert kernels before an exchange op (one that holds
an ``expert_core`` kernel): its expert time, its routed tokens where the shapes tell them, and
when the rank arrived at the exchange. ``moe_dense`` has, per step and kernel name, the time of
the kernels that are neither experts nor exchanges: what a rank's device speed is compared on
(a throttled rank runs every kernel longer, a hot expert rank only its experts).

One stage, ``moe``, derived in the steps' task at the default patterns, from the device tasks,
EP exchange ops and compute kernels read there once for it, the exchanges and the collectives
(``derived.device``); ``analyses.moe`` reads them, and derives its own from the store for patterns that
differ (:func:`layers_in`, :func:`dense_in`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import polars as pl

from traceanalyzer.derived.derive import COMPUTE_KERNELS
from traceanalyzer.derived.device import DEVICE_TASKS, EXCHANGE_OPS, EXCHANGE_PARAMS
from traceanalyzer.derived.stage import TABLE as STEPS
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.intervals import asof_join, window_of
from traceanalyzer.patterns import any_of
from traceanalyzer.stages import Stage, declare, rows_of
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import HARDWARE_PROCESS

LAYERS, DENSE = "moe_layers", "moe_dense"
LAYER_PARAMS = {
    "expert_kernels": Param(
        r"GroupedMatmul|MoeInitRouting|MoeTokenPermute|MoeTokenUnpermute|MoeFinalizeRouting"
        r"|Swi[Gg]lu",
        "Regex on kernel names of a rank's expert compute (the grouped matmuls and their "
        "routing neighbours), counted between two EP exchanges.",
    ),
    "expert_core": Param(
        r"GroupedMatmul",
        "Regex on kernel names: a stretch between two exchanges is an MoE layer's expert "
        "compute when it holds one of these.",
    ),
    "token_inputs_dropped": Param(
        2,
        "Routed tokens of a GroupedMatmul: the first dims of its non-empty Input Shapes but "
        "the last this many (msprof-analyze ep_load_balance's count).",
    ),
}
# the patterns the tables are derived at
DERIVED_PARAMS = {**EXCHANGE_PARAMS, **LAYER_PARAMS}
DEFAULTS = Params({name: param.default for name, param in DERIVED_PARAMS.items()})
LAYER_SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "name": pl.String, "path": pl.String,
    "expert_ns": pl.Int64, "tokens": pl.Int64, "arrival_ns": pl.Int64, "exchange_ns": pl.Int64,
    "first_ns": pl.Int64,
}  # fmt: skip
DENSE_SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "step": pl.Int64, "phase": pl.String,
    "name": pl.String, "dur_ns": pl.Int64, "kernels": pl.Int64,
}  # fmt: skip


def routed_tokens(shapes: str | None, dropped: int) -> int | None:
    """msprof-analyze ep_load_balance's routed tokens of one GroupedMatmul: the sum of the
    first dims of its non-empty input shapes but the last ``dropped`` (group list and the
    like); None when it has one input or fewer, or a first dim is no number."""
    if not shapes:
        return None
    parts = [part.strip(' "') for part in shapes.strip('"').split(";")]
    parts = [part for part in parts if part]
    if len(parts) <= 1:
        return None
    total = 0
    for part in parts[: max(len(parts) - dropped, 0)]:
        first = part.split(",")[0].strip()
        if not first.lstrip("-").isdigit():
            return None
        total += int(first)
    return total


def expert_shapes(kernels: pl.LazyFrame, p: Any) -> pl.DataFrame:
    """The ``expert_core`` kernels of ``kernels`` (the store's kernels table, kernel_details.csv)
    with their routed ``tokens`` (rank, session, name, start_ns, tokens): null for a replayed
    graph's kernel, whose shapes are its capture size's."""
    shapes = (
        kernels.filter(pl.col("name").str.contains(p.expert_core))
        .select("rank", "session", "name", "start_ns", "model_id", "input_shapes")
        .unique(["rank", "session", "name", "start_ns"])
        .collect()
    )
    dropped = int(p.token_inputs_dropped)
    return shapes.with_columns(
        pl.when(pl.col("model_id").is_null())
        .then(
            pl.col("input_shapes").map_elements(
                lambda s: routed_tokens(s, dropped), return_dtype=pl.Int64
            )
        )
        .alias("tokens")
    ).select("rank", "session", "name", "start_ns", "tokens")


def layers_in(
    device: pl.DataFrame, ops: pl.DataFrame, shapes: pl.DataFrame, p: Any
) -> pl.DataFrame:
    """One row per (rank, session, MoE layer instance) (:data:`LAYER_SCHEMA`): the stretch of
    expert kernels before each exchange op that holds an ``expert_core`` kernel. ``name`` and
    ``path``: the exchange back; ``expert_ns``: the expert kernels' time; ``tokens``: routed
    tokens, when every grouped matmul of the layer has them; ``arrival_ns``: when the rank is
    ready for the exchange (its start, or its last expert kernel's end if later);
    ``exchange_ns``: from then to the exchange's end; ``first_ns``: the first expert kernel's
    start. ``device``: :func:`~traceanalyzer.derived.device.device_slices`; ``ops``:
    :func:`~traceanalyzer.derived.device.exchange_ops_in`; ``shapes``: :func:`expert_shapes`."""
    kernels = (
        device.lazy()
        .filter(
            (pl.col("process") == HARDWARE_PROCESS)
            & pl.col("name").str.contains(p.expert_kernels)
            & ~pl.col("name").str.contains(p.mc2_ops)
        )
        .select("rank", "session", "name", "start_ns", "end_ns")
        .unique(["rank", "session", "name", "start_ns"])
        .collect()
        .sort("start_ns")
    )
    if kernels.is_empty() or ops.is_empty():
        return pl.DataFrame(schema=LAYER_SCHEMA)
    # each kernel's exchange: the first op that ends after the kernel starts (an HCCL op on
    # its own stream may begin before the last expert kernel ends)
    following = (
        ops.with_row_index("_x")
        .select("rank", "session", "_x", pl.col("end_ns").alias("_xe"))
        .sort("_xe")
    )
    placed = asof_join(
        kernels,
        following.cast({"rank": kernels.schema["rank"]}),
        "start_ns",
        "_xe",
        ["rank", "session"],
        strategy="forward",
    ).filter(pl.col("_x").is_not_null())
    placed = placed.join(
        shapes.cast({"rank": placed.schema["rank"]}),
        on=["rank", "session", "name", "start_ns"],
        how="left",
    )
    core = pl.col("name").str.contains(p.expert_core)
    per = (
        placed.group_by("rank", "session", "_x")
        .agg(
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("expert_ns"),
            pl.col("start_ns").min().alias("first_ns"),
            pl.col("end_ns").max().alias("last_ns"),
            core.any().alias("_core"),
            # the layer's count only when every grouped matmul in it has one (not replayed)
            pl.when(core.filter(core).len() == pl.col("tokens").filter(core).count())
            .then(pl.col("tokens").filter(core).max())
            .alias("tokens"),
        )
        .filter(pl.col("_core"))
    )
    xs = ops.with_row_index("_x").select("_x", "name", "path", "start_ns", "end_ns")
    out = (
        per.join(xs, on="_x")
        .with_columns(pl.max_horizontal("start_ns", "last_ns").alias("arrival_ns"))
        .with_columns((pl.col("end_ns") - pl.col("arrival_ns")).clip(0).alias("exchange_ns"))
        .sort("rank", "session", "first_ns")
    )
    return out.select(list(LAYER_SCHEMA)).cast(LAYER_SCHEMA)  # type: ignore[arg-type]


def dense_in(compute: pl.DataFrame, steps: pl.DataFrame, p: Any) -> pl.DataFrame:
    """Per rank, session, step and kernel name (:data:`DENSE_SCHEMA`): the time (``dur_ns``)
    and count (``kernels``) of the compute kernels that are neither expert kernels nor MC2
    exchanges and start in the step (its ``phase`` too). ``compute``: the compute kernels
    (:func:`~traceanalyzer.derived.windows.compute_tasks`); ``steps``: the ranks' steps."""
    dense = compute.filter(~pl.col("name").str.contains(any_of((p.expert_kernels, p.mc2_ops))))
    windows = steps.filter(pl.col("step").is_not_null())
    placed = window_of(dense, windows, keep=["step", "phase"]).filter(pl.col("step").is_not_null())
    out = (
        placed.group_by("rank", "session", "step", "phase", "name")
        .agg(
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("dur_ns"), pl.len().alias("kernels")
        )
        .sort("rank", "session", "step", "name")
    )
    return out.select(list(DENSE_SCHEMA)).cast(DENSE_SCHEMA)  # type: ignore[arg-type]


def derive_moe(
    store: Store,
    ranks: list[int],
    params: None,
    *,
    device_tasks: pl.DataFrame,
    exchange_ops: pl.DataFrame,
    compute_kernels: pl.DataFrame,
    steps: pl.DataFrame,
) -> dict[str, pl.DataFrame]:
    """The ``moe_layers`` and ``moe_dense`` rows of ``ranks`` at the default patterns, from
    their device tasks, EP exchange ops (none: no MoE layer, nothing more read), compute
    kernels and steps."""
    empty = {LAYERS: pl.DataFrame(schema=LAYER_SCHEMA), DENSE: pl.DataFrame(schema=DENSE_SCHEMA)}
    if exchange_ops.is_empty():
        return empty
    moe_ranks = sorted(exchange_ops["rank"].unique().to_list())
    shapes = expert_shapes(store.scan("kernels").filter(pl.col("rank").is_in(moe_ranks)), DEFAULTS)
    layers = layers_in(device_tasks, exchange_ops, shapes, DEFAULTS)
    if layers.is_empty():
        return empty
    with_layers = layers["rank"].unique().implode()
    return {
        LAYERS: layers,
        DENSE: dense_in(compute_kernels.filter(pl.col("rank").is_in(with_layers)), steps, DEFAULTS),
    }


def moe_tables_of(store: Store, ranks: Collection[int] | None) -> dict[str, pl.DataFrame]:
    """The ``moe_layers`` and ``moe_dense`` rows of ``ranks`` (every rank: None) at the default
    patterns: the store's tables, derived here for a rank they were not derived for (a
    fixture's store, or one written before they were), once per store (both tables at once)."""
    return {table: store.derived(table, ranks).collect() for table in (LAYERS, DENSE)}


MOE = declare(
    Stage(
        name="moe",
        tables=(LAYERS, DENSE),
        derive=derive_moe,
        inputs=("slices", "kernels", STEPS),
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the steps' task's
        reads=(DEVICE_TASKS, EXCHANGE_OPS, COMPUTE_KERNELS, rows_of(STEPS)),
    )
)
