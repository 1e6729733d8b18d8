"""The ``kernel_layers`` derived table: each device kernel's decoder layer and module.

A decoder layer runs its attention kernel once (FusedInferAttentionScore, PagedAttention,
SparseFlashAttention, ...), whether the iteration ran eagerly or replayed a graph: the attention
is the anchor layers are cut at, with no annotation. A layer starts some kernels before its
attention (the input norm, the QKV projection, the rope, the KV-cache write): how many is read
from the sequence itself. The kernels before the first attention of an iteration are the
embedding and that layer's start; the two sequences before the first and the second attention
agree back to the start of the layer (module for module), and no further (the embedding is no
layer's tail). Each layer then runs to the next one's start; the last one as long as the
spacing of the attentions before it. The kernels of the main sequence (the attention's stream)
are cut so; the other streams' kernels and the communication ops take the layer their start
lies in. The kernels from the step's sampler on (the sampler, a drafter's forward) and those
after the last layer (the final norm, the LM head) are in no layer.

``module`` is what the kernel does, from its name (each pattern a parameter): attention (with
its KV-cache write and rope), linear, MoE expert compute, MoE routing and exchange, norm,
activation, TP communication, sampling and logits (the sampler, and the final norm and LM head
after the last layer), other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

import polars as pl

from traceanalyzer.derived import captures
from traceanalyzer.derived.captures import attribute as attribute_captures
from traceanalyzer.derived.derive import COMPUTE_KERNELS
from traceanalyzer.derived.device import DEVICE_TASKS
from traceanalyzer.derived.launches import CALLS
from traceanalyzer.derived.launches import TABLE as LAUNCHES
from traceanalyzer.derived.stage import TABLE as STEPS
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.intervals import asof_join, window_of
from traceanalyzer.stages import Read, Stage, declare, rows_of
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import COMMUNICATION_PROCESSES

TABLE = "kernel_layers"
MODULES = (
    "attention", "tp_comm", "moe_routing", "moe_experts", "sampling", "norm", "activation",
    "linear", "other",
)  # fmt: skip
LAYER_PARAMS = {
    "layer_anchor": Param(
        r"FusedInferAttentionScore|PagedAttention|SparseFlashAttention|UnpadFlashAttention"
        r"|RINGMLA|RingMLA|IncreFlashAttention|PromptFlashAttention",
        "Regex on kernel names: the attention kernel each decoder layer runs once, where the "
        "iterations are cut into layers.",
    ),
    "module_attention": Param(
        r"FusedInferAttentionScore|PagedAttention|SparseFlashAttention|FlashAttention|RINGMLA"
        r"|RingMLA|ReshapeAndCache|ScatterPaKvCache|[Rr]otary|[Rr]ope|MlaProlog|MlaPreprocess"
        r"|LightningIndexer|GatherPaKvCache|PagedCacheLoad|AttentionUpdate|KvRmsNormRopeCache",
        "Regex on kernel names of the attention module (the attention, its KV-cache write and "
        "rope, MLA's prolog).",
    ),
    "module_tp_comm": Param(
        r"hcom_|[Aa]ll[Rr]educe|[Aa]llGather|[Rr]educeScatter|MatmulAllReduce",
        "Regex on kernel and op names of tensor-parallel communication.",
    ),
    "module_moe_routing": Param(
        r"MoeGatingTopK|MoeDistributeDispatch|MoeDistributeCombine|MoeInitRouting|MoeTokenPermute"
        r"|MoeTokenUnpermute|MoeFinalizeRouting|[Aa]ll[Tt]o[Aa]ll|DispatchFFNCombine",
        "Regex on kernel names of MoE routing and the expert-parallel exchange.",
    ),
    "module_moe_experts": Param(r"GroupedMatmul", "Regex on kernel names of MoE expert compute."),
    "module_sampling": Param(
        r"ArgMax|(?:^|_|aclnn)TopK|ApplyTopKTopP|Sort|Multinomial|Exponential|(?i:rejection)",
        "Regex on kernel names of sampling.",
    ),
    "module_norm": Param(r"RmsNorm|LayerNorm", "Regex on kernel names of normalisation."),
    "module_activation": Param(
        r"SwiGlu|Swiglu|Gelu|Silu|Sigmoid", "Regex on kernel names of activations."
    ),
    "module_linear": Param(
        r"MatMul|Matmul|Mm_|^aclnnMm|Gemm|GEMM",
        "Regex on kernel names of linear layers (matmuls).",
    ),
    **captures.CAPTURE_PARAMS,
}
DEFAULTS = Params({name: param.default for name, param in LAYER_PARAMS.items()})
SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "stream_id": pl.Int64, "start_ns": pl.Int64,
    "end_ns": pl.Int64, "name": pl.String, "step": pl.Int64, "phase": pl.String,
    "layer": pl.Int64, "module": pl.String, "attribution": pl.String, "call_site": pl.String,
    "host_op": pl.String, "host_module": pl.String, "capture_note": pl.String,
}  # fmt: skip
SAMPLING = "sampling"
TAIL = 1 << 30  # the segment after an iteration's last layer


def module_of(p: Any) -> pl.Expr:
    """A kernel's module from its name, the first module whose pattern matches."""
    name = pl.col("name")
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.String))
    for module in MODULES[:-1]:
        expr = expr.when(name.str.contains(getattr(p, f"module_{module}"))).then(pl.lit(module))
    return expr.otherwise(pl.lit("other"))


def derive_kernel_layers(
    store: Store,
    ranks: list[int],
    params: None,
    *,
    compute_kernels: pl.DataFrame,
    device_tasks: pl.DataFrame,
    steps: pl.DataFrame,
    launches: pl.DataFrame,
    captures: Callable[[], pl.DataFrame],
) -> pl.DataFrame:
    """The ``kernel_layers`` rows (:data:`SCHEMA`) of ``ranks``' sessions whose iterations run
    an attention kernel, at the default patterns: ``compute_kernels``, their compute kernels
    (rank, session, name, stream_id, start_ns, end_ns); ``device_tasks``, their device tasks
    (the communication ops are read from them); ``steps``, their steps; ``launches``, their
    device tasks' launches (a graph's kernel: its replay); ``captures``, what reads the
    launches of the graphs' captures in the profile (:func:`captures_reader`), which replayed
    kernels are mapped to, called only when some kernel was replayed."""
    p = DEFAULTS
    anchors = compute_kernels.filter(pl.col("name").str.contains(p.layer_anchor))
    if anchors.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    sessions = anchors["session"].unique().implode()
    comm = device_tasks.filter(
        pl.col("process").is_in(COMMUNICATION_PROCESSES) & pl.col("session").is_in(sessions)
    ).select(compute_kernels.columns)
    kernels = (
        pl.concat(
            [compute_kernels.filter(pl.col("session").is_in(sessions)), comm],
            how="vertical_relaxed",
        )
        .with_columns(module_of(p).alias("module"))
        .sort("rank", "session", "start_ns")
    )
    # a step's kernels: those that start from its beginning to the next step's (the device
    # runs behind the host)
    reach = (
        steps.filter(pl.col("step").is_not_null())
        .sort("rank", "session", "start_ns")
        .with_columns(
            pl.col("start_ns")
            .shift(-1)
            .over("rank", "session")
            .fill_null(pl.col("end_ns"))
            .alias("end_ns")
        )
    )
    placed = window_of(kernels, reach, by=["rank", "session"], keep=["step", "phase"])
    placed = placed.filter(pl.col("step").is_not_null())
    if placed.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    layered = _cut(placed, p)
    replays = launches.filter(
        pl.col("model_id").is_not_null() & (pl.col("link") == "graph_replay")
    ).select(
        "rank", "session", pl.col("stream").alias("stream_id"), "start_ns",
        pl.col("launch_start_ns").alias("_replay"),
    )  # fmt: skip
    keys = ["rank", "session", "stream_id", "start_ns"]
    layered = layered.join(
        replays.cast({"rank": layered.schema["rank"]}), on=keys, how="left"
    ).join(
        steps.select("rank", "session", "step", "graph", "graph_size").cast(
            {"rank": layered.schema["rank"]}
        ),
        on=["rank", "session", "step"],
        how="left",
    )
    attributed = attribute_captures(layered, captures)
    return attributed.select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]


def _cut(placed: pl.DataFrame, p: Any) -> pl.DataFrame:
    """``placed`` (kernels with their step) with ``layer``, and ``module`` ``sampling`` for the
    kernels after the last layer."""
    step = ["rank", "session", "step"]
    is_anchor = pl.col("name").str.contains(p.layer_anchor)
    # the main sequence: the attention's stream (the most common one per session)
    main = (
        placed.filter(is_anchor)
        .group_by("rank", "session")
        .agg(pl.col("stream_id").mode().min().alias("_main"))
    )
    placed = placed.join(main, on=["rank", "session"], how="left")
    on_main = pl.col("stream_id") == pl.col("_main")
    sampled = (
        pl.col("start_ns")
        .filter(pl.col("module") == SAMPLING)
        .min()
        .over(step)
        .fill_null(pl.col("start_ns").max().over(step) + 1)
    )
    placed = placed.with_columns(sampled.alias("_sampled"))
    seq = (
        placed.filter(on_main & (pl.col("start_ns") < pl.col("_sampled")))
        .sort("rank", "session", "start_ns")
        .with_columns(pl.int_range(pl.len()).over(step).alias("_pos"), is_anchor.alias("_anchor"))
    )
    lead = _layer_lead(seq)
    seq = seq.join(lead, on=["rank", "session"], how="left")
    # each layer starts `_lead` kernels before its attention; the last runs as long as the
    # attentions' spacing before it
    positions = (
        seq.filter(pl.col("_anchor"))
        .group_by(step)
        .agg(
            (pl.col("_pos") - pl.col("_lead")).clip(0).alias("_starts"),
            pl.col("_pos").diff().median().alias("_period"),
        )
    )
    starts = (
        positions.explode("_starts")
        .rename({"_starts": "_pos"})
        .with_columns(pl.lit(True).alias("_start"))
    )
    seq = seq.join(starts.select(*step, "_pos", "_start"), on=[*step, "_pos"], how="left")
    seq = seq.join(positions.select(*step, "_period"), on=step, how="left").with_columns(
        (pl.col("_start").fill_null(False).cum_sum().over(step) - 1).alias("_layer"),
    )
    last_start = pl.col("_pos").filter(pl.col("_start").fill_null(False)).max().over(step)
    past_end = pl.col("_pos") >= last_start + pl.col("_period").fill_null(pl.len().over(step))
    # a segment of the sequence: -1 before the first layer, each layer, TAIL after the last
    seq = seq.with_columns(
        pl.when(past_end.fill_null(False)).then(TAIL).otherwise(pl.col("_layer")).alias("_segment")
    )
    # every kernel takes the segment its start lies in: the main sequence's segments in time
    bounds = seq.group_by(*step, "_segment").agg(pl.col("start_ns").min().alias("_from"))
    out = asof_join(placed.sort("start_ns"), bounds.sort("_from"), "start_ns", "_from", step)
    segment = pl.col("_segment")
    before_sampling = pl.col("start_ns") < pl.col("_sampled")
    return out.with_columns(
        pl.col("module").alias("_named_module"),
        pl.when(before_sampling & (segment >= 0) & (segment < TAIL)).then(segment).alias("layer"),
        # the final norm and the LM head after the last layer compute the logits
        pl.when(before_sampling & (segment == TAIL))
        .then(pl.lit(SAMPLING))
        .otherwise(pl.col("module"))
        .alias("module"),
    )


def _layer_lead(seq: pl.DataFrame) -> pl.DataFrame:
    """Per session (rank, session, ``_lead``): how many kernels a layer runs before its
    attention, the most common over its steps of two attentions or more: the length of the
    longest common suffix (by module) of the sequences before the first and the second one."""
    rows = []
    for (rank, session), part in seq.group_by("rank", "session", maintain_order=True):
        leads: Counter[int] = Counter()
        for _, steps in part.group_by("step", maintain_order=True):
            if len(leads) and sum(leads.values()) >= 16:
                break
            modules = steps["module"].to_list()
            anchors = [i for i, a in enumerate(steps["_anchor"].to_list()) if a]
            if len(anchors) < 2:
                continue
            first, second = anchors[0], anchors[1]
            lead = 0
            while (
                lead < first
                and lead < second - first - 1
                and modules[first - 1 - lead] == modules[second - 1 - lead]
            ):
                lead += 1
            leads[lead] += 1
        rows.append(
            {"rank": rank, "session": session, "_lead": leads.most_common(1)[0][0] if leads else 0}
        )
    return pl.DataFrame(
        rows, schema={"rank": seq.schema["rank"], "session": pl.String, "_lead": pl.Int64}
    )


def captures_reader(
    store: Store, ranks: Collection[int], steps_params: Any, calls: pl.DataFrame
) -> Callable[[], pl.DataFrame]:
    """What reads the launches of the graph captures ``ranks``' profiles hold
    (:func:`~traceanalyzer.derived.captures.captured_launches`), when asked: ``steps_params``,
    the steps' parameters (the capture calls, the token kernels); ``calls``, their CANN calls
    (``launches.host_calls``; the captures' windows are taken from them now)."""
    windows = captures.capture_windows_in(
        calls, steps_params.capture_begin, steps_params.capture_end
    )
    return lambda: captures.captured_launches(
        store, ranks, windows, steps_params.token_kernels, DEFAULTS.layer_anchor, DEFAULTS
    )


# the capture windows, taken from the host calls once the launches are derived from them (the
# calls are let go then, not held for this stage)
CAPTURES = Read("captures", captures_reader, (CALLS,), params_of=STEPS)


KERNEL_LAYERS = declare(
    Stage(
        name=TABLE,
        tables=(TABLE,),
        derive=derive_kernel_layers,
        inputs=("slices", "kernels", LAUNCHES, STEPS),
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the steps' task's
        reads=(COMPUTE_KERNELS, DEVICE_TASKS, rows_of(STEPS), rows_of(LAUNCHES), CAPTURES),
    )
)
