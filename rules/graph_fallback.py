"""TA014 graph-fallback: decode iterations that fall out of the FULL aclgraph and run slower."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.kit import (
    COMPUTE_TASK_TYPES,
    SHARE,
    Evidence,
    Finding,
    KeyFigure,
    Param,
    RuleContext,
    analysed_window_ns,
    cost_over,
    covered_fraction,
    kernel_tasks,
    phases,
    rule,
    serving_steps,
)
from traceanalyzer.kit import text as fmt

DECODE = ("decode", "spec_decode")
EVIDENCE_SHOWN = 5
GRID = (
    "vLLM's default capture sizes are 1, 2, 4, then every 8 up to 256, then every 16; "
    "vllm-ascend from v0.18 takes the largest as max_num_seqs x (1 + speculative tokens), "
    "rounded down to that grid, so an off-stride max_num_seqs leaves its largest batches "
    "without a graph (vllm-ascend #16049)"
)
DATA_PARALLEL = (
    "On a data-parallel deployment the graph mode is the lowest of the DP ranks' "
    "(_sync_metadata_across_dp): a decode rank runs piecewise or eager while a peer runs a "
    "prefill or a batch above the largest size, so check the peers' steps at those times."
)


@rule(
    id="TA014",
    name="graph-fallback",
    severity="warning",
    summary="Decode iterations fall out of the FULL aclgraph (eager or piecewise) where other "
    "decode iterations replay it, and run slower.",
    fix="Capture the batch sizes that fell out (cudagraph_capture_sizes, "
    "max_cudagraph_capture_size), align max_num_seqs to the capture grid, keep cudagraph "
    "padding on.",
    params={
        "min_share": Param(
            0.02,
            "Report when the fell-out iterations' cost is at least this share of the decode "
            "iterations' time.",
        ),
        "min_steps": Param(2, "... in at least this many fell-out decode iterations."),
    },
    requires=[phases(*DECODE)],
    units={"decode_share": SHARE},
)
def graph_fallback(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Decode and speculative-decode iterations (the `steps` table's) that ran **without a FULL
    graph replay** (`graph` is `piecewise` or `eager`) in a session where other decode
    iterations do replay the FULL graph. For each it reads the real batch (`batch`: the
    annotation, the eager attention's shapes, or the sampler's rows, which run outside the
    graph) and estimates what a replay at that size would have taken from the session's own
    replays (`graph_size`, the capture size each replay ran at): the median decode iteration
    at the smallest captured size that holds the batch, or, above the largest, a line through
    the two largest sizes. `cost_ns` is the fell-out iterations' time beyond those estimates,
    summed; `batch_sizes` the real batches that fell out. It fires when the cost is at least
    `min_share` of the decode iterations' time, in at least `min_steps` iterations.

    ## Why it matters
    vllm-ascend runs uniform decode batches as FULL aclgraph replays: one host call for the
    whole forward. A batch with no captured size (above the largest, or between sizes with
    padding off) runs eagerly, or piecewise with the attention launched layer by layer: the
    host launches every kernel again, and decode runs several times slower exactly at the
    loads that matter (vllm-ascend #16049: an off-stride `max_num_seqs`, ~7.5x slower at the
    largest batches; #16637: padding off, 333 -> 107 tok/s).

    ## How to fix
    - Batches above the largest captured size: capture sizes up to the largest batch
      (`compilation_config.cudagraph_capture_sizes`, or a larger
      `max_cudagraph_capture_size`), or cap `max_num_seqs` at the largest captured size; align
      `max_num_seqs` to the capture grid (1, 2, 4, every 8 to 256, then every 16).
    - Batches between captured sizes: keep cudagraph padding on (a batch replays the next size
      up), or capture those sizes; on v0.11-v0.20 in PIECEWISE mode the capture list is
      trimmed to the stream budget (`HCCL_OP_EXPANSION_MODE=AIV` leaves more streams).
    - On a data-parallel deployment the mode is the lowest of the DP ranks': a peer's prefill
      makes every rank's decode piecewise in that step; look at the peers first.

    ## Example
    ```
    TA014 graph-fallback [warning] rank 0 (decode)
    6 of 16 decode iterations fall out of the FULL graph (eager) at batch sizes 40, 64, above
    the largest captured size 32: they take 2.1 ms more each than a replay (61% of the decode
    time)
    ```
    Silent when every decode batch replays (covered), in PIECEWISE-only or eager mode (no
    decode replays a FULL graph: nothing to fall out of), and on prefill and mixed iterations,
    which run piecewise by design.

    ## References
    - vllm-ascend #16049 (off-stride max_num_seqs, decode eager at the largest batches),
      #16637 (padding off), #1168 (capture sizes limited by the stream budget).
    - vLLM `cudagraph_dispatcher.py` (FULL keys for uniform decode batches; padding to the
      next captured size); vllm-ascend `platform.py` (`_get_default_max_cudagraph_capture_size`),
      `model_runner_v1.py` (`_determine_batch_execution_and_padding`, `_sync_metadata_across_dp`).
    """
    p = ctx.params
    steps = serving_steps(ctx).filter(pl.col("phase").is_in(DECODE) & pl.col("graph").is_not_null())
    windows = analysed_window_ns(ctx)
    for (rank,), mine in steps.group_by("rank", maintain_order=True):
        found = _fell_out(_with_busy(ctx, int(rank), mine))
        if isinstance(found, str):
            ctx.note(f"rank {rank}: {found}", rank=rank)
            continue
        fell, replays = found
        cost = float(fell["excess_ns"].sum())
        decode_ns = float(mine["step_ns"].sum())
        share = cost / decode_ns if decode_ns else 0.0
        if share < p.min_share or fell.height < p.min_steps:
            ctx.note(
                f"rank {rank}: {fell.height} decode iterations without a FULL replay cost "
                f"{fmt.duration(cost)}, {share:.1%} of the decode time (min_share "
                f"{p.min_share:.0%}, min_steps {p.min_steps})",
                rank=rank,
                cost_share=share,
            )
            continue
        yield _finding(ctx, int(rank), fell, replays, mine, cost, share, windows.get(rank))


def _with_busy(ctx: RuleContext, rank: int, steps: pl.DataFrame) -> pl.DataFrame:
    """The steps with ``busy_ns``: the time compute kernels ran in each (a graph replay runs
    the same kernels as an eager iteration of its size, without the host's launches)."""
    kernels = kernel_tasks(ctx.table("slices"), COMPUTE_TASK_TYPES, ranks=[rank])
    covered = covered_fraction(
        steps.with_row_index("_step"), kernels, span_id="_step", on=("rank", "session")
    )
    return covered.rename({"covered_ns": "busy_ns"}).drop("_step", "covered_fraction")


def _fell_out(steps: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame] | str:
    """The decode iterations of one rank that fell out of the FULL graph, each with its
    ``estimate_ns`` (a replay at its batch) and ``excess_ns``; and the replays' median time and
    overhead (time beyond their kernels') per captured size. Or why there is nothing to judge."""
    full = steps.filter(pl.col("graph") == "full")
    fell = steps.filter(pl.col("graph") != "full")
    if full.is_empty():
        return (
            f"no decode iteration replays a FULL graph ({fell.height} run "
            f"{', '.join(sorted(set(fell['graph'].to_list())))}): PIECEWISE-only or eager mode, "
            "nothing fell out of a graph"
        )
    if fell.is_empty():
        return f"all {full.height} decode iterations replay the FULL graph"
    per_size = [
        pl.col("step_ns").median().alias("replay_ns"),
        (pl.col("step_ns") - pl.col("busy_ns")).median().alias("overhead_ns"),
        pl.len().alias("replays"),
    ]
    replays = (
        full.filter(pl.col("graph_size").is_not_null())
        .group_by("graph_size")
        .agg(per_size)
        .sort("graph_size")
    )
    if replays.is_empty():  # no shapes: every replay as one size
        replays = full.select(pl.lit(None, dtype=pl.Int64).alias("graph_size"), *per_size)
    rows = replays.rows(named=True)
    estimate = [
        _replay_estimate(b, busy, rows) for b, busy in fell.select("batch", "busy_ns").iter_rows()
    ]
    fell = fell.with_columns(pl.Series("estimate_ns", estimate, dtype=pl.Float64)).with_columns(
        (pl.col("step_ns") - pl.col("estimate_ns")).clip(0).alias("excess_ns")
    )
    return fell, replays


def _replay_estimate(batch: int | None, busy_ns: int, replays: list[dict]) -> float:
    """What a replay of a fell-out iteration would take, from the session's own replays
    (``replays``: per captured size, its median iteration and its overhead beyond its kernels):
    a batch a replayed size holds replays the smallest such size; one above the largest (or of
    unknown size) runs its own kernels (``busy_ns``) plus the largest size's overhead."""
    for replay in replays:
        if batch is not None and replay["graph_size"] is not None and replay["graph_size"] >= batch:
            return float(replay["replay_ns"])
    return float(busy_ns) + max(float(replays[-1]["overhead_ns"] or 0.0), 0.0)


def _finding(
    ctx: RuleContext,
    rank: int,
    fell: pl.DataFrame,
    replays: pl.DataFrame,
    decode: pl.DataFrame,
    cost: float,
    share: float,
    wall: int | None,
) -> Finding:
    batches = sorted({int(b) for b in fell["batch"].drop_nulls().to_list()})
    unknown = fell["batch"].null_count()
    sizes = [int(s) for s in replays["graph_size"].drop_nulls().to_list()]
    largest = max(sizes) if sizes else None
    above = [b for b in batches if largest is not None and b > largest]
    between = [b for b in batches if b not in above]
    modes = ", ".join(sorted(set(fell["graph"].to_list())))
    phase_names = sorted(set(fell["phase"].to_list()))
    where = []
    if between:
        where.append(
            f"{', '.join(map(str, between))} between the sizes replayed, "
            f"{', '.join(map(str, sizes))}"
        )
    if above:
        where.append(f"{', '.join(map(str, above))} above the largest, {largest}")
    batch_text = ", ".join(map(str, batches)) if batches else "unknown"
    title = (
        f"{fell.height} of {decode.height} {'/'.join(phase_names)} iterations fall out of the "
        f"FULL graph ({modes}) at batch sizes {batch_text}"
        + (f" ({'; '.join(where)})" if where else "")
        + f": they take {fmt.duration(cost / fell.height)} more each than a replay "
        f"({share:.0%} of the decode time)"
    )
    per_size = ", ".join(
        f"{int(s)}: {fmt.duration(t)} ({n})"
        for s, t, n in replays.drop_nulls("graph_size")
        .select("graph_size", "replay_ns", "replays")
        .iter_rows()
    )
    lines = [
        f"{decode.height - fell.height} decode iterations replay the FULL graph at captured "
        f"sizes {', '.join(map(str, sizes)) or 'unknown'} (median iteration per size: "
        f"{per_size or 'n/a'}).",
        f"{fell.height} run {modes} at real batches {batch_text}"
        + (f" ({unknown} with no batch the export tells)" if unknown else "")
        + f", {fmt.duration(float(fell['step_ns'].median()))} per iteration (median) against "
        f"{fmt.duration(float(fell['estimate_ns'].median()))} for a replay at their size (the "
        "session's own replays at the neighbouring captured sizes).",
        f"Cost: {fmt.duration(cost)}, {share:.1%} of the decode iterations' time.",
    ]
    fixes = []
    if above:
        fixes.append(
            f"Capture sizes up to {max(above)} (compilation_config.cudagraph_capture_sizes, "
            f"or a larger max_cudagraph_capture_size), or cap max_num_seqs at {largest}: "
            f"{GRID}."
        )
    if between:
        fixes.append(
            f"Keep cudagraph padding on, so batches {', '.join(map(str, between))} replay the "
            "next captured size, or capture those sizes (on v0.11-v0.20 PIECEWISE mode trims "
            "the capture list to the stream budget: HCCL_OP_EXPANSION_MODE=AIV leaves more)."
        )
    if not batches:
        fixes.append(
            "Capture the decode batch sizes the server runs (the batches are not in the "
            "export: collect profiler_level=Level1 for kernel_details.csv shapes)."
        )
    fixes.append(DATA_PARALLEL)
    return ctx.finding(
        rank=rank,
        sessions=sorted(fell["session"].unique().to_list()),
        title=title,
        message="\n".join(lines),
        location={"graph": "decode"},
        phases=phase_names,
        cost=cost_over(cost, wall),
        metrics={
            "decode_share": share,
            "batch_sizes": batches,  # type: ignore[dict-item]
            "steps": fell.height,
            "decode_steps": decode.height,
            "largest_capture": largest,
        },
        evidence=[
            Evidence(
                rank=rank,
                session=r["session"],
                name=f"{r['phase']} without a FULL replay ({r['graph']})",
                start_ns=r["start_ns"],
                dur_ns=r["step_ns"],
                detail=f"batch {r['batch'] if r['batch'] is not None else 'unknown'}: "
                f"{fmt.duration(r['excess_ns'])} beyond a replay's "
                f"{fmt.duration(r['estimate_ns'])}",
            )
            for r in fell.sort("excess_ns", descending=True)
            .head(EVIDENCE_SHOWN)
            .iter_rows(named=True)
        ],
        fix=" ".join(fixes),
        series={
            "start_ns": decode["start_ns"].to_list(),
            "step_ns": decode["step_ns"].to_list(),
            "graph": decode["graph"].to_list(),
        },
        score=cost,
    )


@graph_fallback.key_figures(
    KeyFigure(
        "decode_graph_share",
        "decode iterations that replay the FULL graph",
        better="higher",
        unit="ratio",
    ),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Per rank: the share of its decode iterations that replay the FULL graph."""
    steps = serving_steps(ctx).filter(pl.col("phase").is_in(DECODE) & pl.col("graph").is_not_null())
    return steps.group_by("rank").agg(
        (pl.col("graph") == "full").mean().alias("decode_graph_share")
    )
