"""TA012 moe-load-imbalance: a hot expert rank makes the rest of its EP group wait."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    HARDWARE_PROCESS,
    NS,
    PATH_NAMES,
    RATIO,
    SHARE,
    Evidence,
    FigureContext,
    Finding,
    Imbalance,
    KeyFigure,
    NotEvaluated,
    Param,
    Requirement,
    RuleContext,
    analysed_window_ns,
    compress_ranks,
    cost_over,
    moe_exchange_paths,
    moe_imbalance,
    rule,
)
from traceanalyzer.kit import text as fmt

EVIDENCE_INSTANCES, PEERS_SHOWN = 4, 3
EPLB = (
    "rebalance the experts with vllm-ascend's EPLB: dynamic EPLB (`eplb_config` "
    "`dynamic_eplb: true`, with `DYNAMIC_EPLB=true`) moves and replicates the hot experts as "
    "the load is measured; or record the load (`expert_map_record_path`) and serve a static "
    "map with redundant copies of the hot rank's experts (`expert_map_path`)"
)
CAPACITY = (
    "the hot rank changes from step to step: the routing follows each batch, which a static "
    "expert map cannot balance; bound the burst one step routes to one rank with the "
    "token-capacity settings (smaller prefill chunks: `max_num_batched_tokens`; MC2 serves up "
    "to its token capacity, the largest capture size), and let dynamic EPLB follow the "
    "longer-term load (a shorter `num_iterations_eplb_update`)"
)


@rule(
    id="TA012",
    name="moe-load-imbalance",
    severity="warning",
    scope="global",
    summary="One EP rank's experts get more tokens: the rest of its group waits for it in the "
    "exchange after every MoE layer.",
    fix="Balance the expert load: EPLB (dynamic, or a static map with redundant experts) when "
    "the same rank stays hot; the token-capacity settings when the hot rank moves.",
    params={
        "persistent_share": Param(
            0.5,
            "A hot rank hot in at least this share of the judged steps is persistent: the fix is "
            "EPLB; below it the hot spot moves and the fix is the token capacity.",
        ),
    },
    uses=[moe_imbalance, moe_exchange_paths],
    requires=[
        Requirement(
            "slices",
            ("name",),
            what="MoE expert kernels (GroupedMatmul) on the device",
            collect_with="ProfilerActivity.NPU with an MoE model",
            where=(pl.col("process") == HARDWARE_PROCESS)
            & pl.col("name").str.contains("GroupedMatmul"),
        )
    ],
    units={
        "phase_share": SHARE,
        "wait_ns_per_step": NS,
        "hot_share": SHARE,
        "expert_ratio": RATIO,
        "token_ratio": RATIO,
        "hot_expert_ns": NS,
        "median_expert_ns": NS,
    },
)
def moe_load_imbalance(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Expert load imbalance in a mixture-of-experts model served with expert parallelism (EP).
    Per **MoE layer instance** (the k-th MoE layer of a step, matched across the ranks of an EP
    group) it measures each rank's **expert compute** -- the `expert_kernels`
    (`GroupedMatmul` and its routing neighbours: `MoeInitRouting*`, `MoeTokenPermute` /
    `Unpermute`, `MoeFinalizeRouting`, the `SwiGlu` between the grouped matmuls) between the EP
    exchange there (MC2 `MoeDistributeDispatch*`, an all-to-all, an all-gather) and the one
    back (`MoeDistributeCombine*`, all-to-all, reduce-scatter) -- and, where kernel_details.csv
    has `Input Shapes` of eagerly run grouped matmuls, its **routed tokens** (msprof-analyze
    `ep_load_balance`'s count: the first dims of the inputs but the last two; a replayed graph's
    shapes are its capture size's and say nothing). A rank is **hot** in an instance when its
    expert compute, divided by its device's speed against its peers (its dense kernels' time
    over theirs, so a throttled device is not hot), exceeds the group's median by
    `min_expert_excess` and `min_expert_excess_us`, with `min_token_excess` more tokens where
    they are known. The **cost** is what the others wait for it in the exchange back: each
    rank's time in that exchange beyond the shortest one of the instance (the last arriver's),
    up to how much longer the hot rank computed, summed over the waiting ranks, the MoE layers
    and the judged steps (`cost_ns`).

    Only steps in which every profiled rank of the group served the workload are judged:
    dummy batches (`_dummy_run`: padding tokens all route to the same experts), warm-up and
    idle steps are left out. Findings are per EP group and phase; a rank is named hot when it
    is hot in at least `min_hot_share` of the judged steps; it fires when the waits are at
    least `min_wait_share` of the waiting ranks' time in those steps, in at least `min_hot_steps`
    steps. EP groups come from `parallel_group_info` (group names matching `ep_groups`:
    vLLM's `ep`, vllm-ascend's `mc2`), else from the communicator of the exchange collectives
    (communication.json), else all ranks with MoE layers. The finding also says which exchange
    each step used and how much of it was exposed (MC2 within the token capacity, all-to-all
    above it), and names the steps whose path does not fit their size.

    ## Why it matters
    An MoE layer's exchange back completes on every rank when the slowest arrives: one rank
    whose experts draw 2x the tokens sets every layer's pace for the whole group, and on the
    others it looks like communication time. Step times stay equal across ranks, so
    `slow-rank` does not see it, and `collective-straggler` sees only the all-to-all path (MC2
    dispatch/combine are kernels, not collectives); both refer to this finding, which owns the
    cost, when the late rank is a hot expert rank.

    ## How to fix
    - The same rank stays hot (persistent, at least `persistent_share` of the judged steps):
      rebalance the experts with EPLB -- vllm-ascend's dynamic EPLB (`eplb_config`
      `dynamic_eplb: true` with `DYNAMIC_EPLB=true`), or a recorded expert map
      (`expert_map_record_path`) served with redundant copies of the hot experts
      (`expert_map_path`).
    - The hot rank moves from step to step: the load follows each batch; bound the burst with
      the token-capacity settings (smaller prefill chunks, `max_num_batched_tokens`; MC2's
      capacity is the largest capture size) and let dynamic EPLB follow the longer-term load.

    ## Example
    ```
    TA012 moe-load-imbalance [warning] rank 1 (1/4) (decode)
    rank 1 is the hot expert rank of EP group `ep` (ranks 0-3) in 8 of 8 decode steps: its
    expert compute 2.0x the group's median per MoE layer (147 µs vs 74.6 µs); the other 3
    ranks wait 146 µs per step each for it in the exchange back (18% of their time)
    ```
    Silent on a balanced run (a slow link makes the others wait, but nobody computes longer),
    on a rank that is late for another reason (host-bound launches, a throttled device: its
    dense kernels are as much slower as its experts), and on imbalance seen only in dummy or
    warm-up steps. Not evaluated without grouped matmuls (not an MoE model) or without an EP
    exchange after them; inconclusive when no step has every rank of the group serving.

    ## References
    - vllm-ascend RFC #16795 (expert load diagnostics: hot rank, persistence, dummy runs
      excluded); vllm-ascend's EPLB guide (dynamic EPLB, expert maps, redundant experts).
    - msprof-analyze `ep_load_balance` (GroupedMatmul input tokens per rank and EP group; Db
      export only, EP group named `exp`).
    - DeepSeek-V3 technical report (EPLB, redundant experts).
    """
    verdict = moe_imbalance(ctx)
    if verdict.unavailable:
        raise NotEvaluated(verdict.unavailable)
    if verdict.undecided:
        ctx.inconclusive(verdict.undecided)
        return
    left_out = ", ".join(f"{n} in {phase} steps" for phase, n in sorted(verdict.excluded.items()))
    if left_out:
        ctx.note(f"MoE layer instances left out (not every rank serving): {left_out}")
    if not verdict.findings:
        judged = verdict.rows.filter(pl.col("judged"))
        hot = judged.filter(pl.col("hot"))
        ctx.note(
            f"expert load balanced: {hot.height} hot rank-layers in "
            f"{judged.select('group', 'sidx', 'step', 'layer').unique().height} judged MoE layer "
            f"instances of {len(verdict.groups)} EP group(s), their peers' wait below "
            f"{ctx.params.min_wait_share:.0%} of their time",
            instances=judged.height,
        )
        return
    paths = moe_exchange_paths(ctx)
    windows = analysed_window_ns(ctx)
    for found in verdict.findings:
        yield _finding(ctx, found, paths, windows)


# --------------------------------------------------------------------------- the finding


def _per_rank(f: Imbalance) -> pl.DataFrame:
    """Per rank of the group: its median expert compute and routed tokens per MoE layer where
    it is hot, and its device speed."""
    return f.instances.group_by("rank").agg(
        pl.col("expert_ns").filter(pl.col("hot")).median().alias("hot_expert_ns"),
        pl.col("tokens").filter(pl.col("hot")).median().alias("hot_tokens"),
        pl.col("speed").first(),
    )


def _finding(
    ctx: RuleContext, f: Imbalance, paths: pl.DataFrame, windows: dict[int, int]
) -> Finding:
    p = ctx.params
    rows = f.instances
    per_rank = _per_rank(f)
    top = f.hot_ranks[0]
    hot, around = f.hot_rows, f.hot_instances
    hot_expert = float(hot["expert_ns"].median())  # type: ignore[arg-type]
    median_expert = float(around["expert_ns"].median())  # type: ignore[arg-type]
    hot_tokens, median_tokens = hot["tokens"].median(), around["tokens"].median()
    ratio = hot_expert / median_expert if median_expert else 0.0
    token_ratio = (
        float(hot_tokens) / float(median_tokens)  # type: ignore[arg-type]
        if hot_tokens is not None and median_tokens
        else None
    )
    layers = int(rows.select("sidx", "step", "layer").unique().height)
    per_layer = layers / f.judged_steps if f.judged_steps else 0
    waiting = len(f.waiting_ranks)
    per_step = f.cost_ns / f.judged_steps / waiting if f.judged_steps and waiting else 0.0
    persistent = f.hot_share.get(top, 0.0) >= p.persistent_share
    back = rows.filter(pl.col("rank").is_in(f.waiting_ranks))["name"].mode().sort()
    exchange = _op_type(str(back[0])) if back.len() else "the exchange back"
    phase_word = f"{f.phase} " if f.phase else ""
    group = f"EP group `{f.group.name}` (ranks {compress_ranks(f.group.members)})"
    tokens_text = f", {token_ratio:.1f}x the routed tokens" if token_ratio else ""
    cost = cost_over(f.cost_ns, sum(windows.get(r, 0) for r in f.waiting_ranks))
    load = (
        f"expert compute {ratio:.1f}x the group's median per MoE layer "
        f"({fmt.duration(hot_expert)} vs {fmt.duration(median_expert)}){tokens_text}"
    )
    wait = (
        f"wait {fmt.duration(per_step)} per step each for it in the exchange back "
        f"({f.share:.0%} of their time)"
    )
    if persistent and len(f.hot_ranks) == 1:
        hot_steps = round(f.hot_share[top] * f.judged_steps)
        title = (
            f"rank {top} is the hot expert rank of {group} in {hot_steps} of {f.judged_steps} "
            f"{phase_word}steps: its {load}; the other {waiting} ranks {wait}"
        )
    else:
        names = ", ".join(f"{r} ({f.hot_share[r]:.0%})" for r in f.hot_ranks)
        how = "persistently hot" if persistent else "the hot rank moves"
        title = (
            f"expert load imbalanced in {group} in {f.hot_steps} of {f.judged_steps} "
            f"{phase_word}steps, {how} (ranks {names} of the steps): the hot rank's {load}; "
            f"the others {wait}"
        )
    lines = [
        f"{group}, from {_source(f.group.source)}: {layers} MoE layer instances "
        f"({per_layer:.0f} per step) in {f.judged_steps} judged {phase_word}steps (every "
        "profiled rank of the group serving; dummy, warm-up and idle steps left out); a rank "
        "is hot in one when its expert compute, corrected for its device's speed, is at least "
        f"{p.min_expert_excess:.0%} and {p.min_expert_excess_us:g} µs above the group's median"
        + (f" with {p.min_token_excess:.0%} more routed tokens" if token_ratio else "")
        + f"; {f.hot_steps} steps have a hot rank."
    ]
    for r in f.hot_ranks:
        row = per_rank.filter(pl.col("rank") == r).row(0, named=True)
        first, last, run = f.windows.get(r, (0, 0, 0))
        share = f.hot_share.get(r, 0.0)
        tokens = (
            f", {row['hot_tokens']:.0f} routed tokens per layer"
            if row["hot_tokens"] is not None
            else ""
        )
        lines.append(
            f"Rank {r}: hot in {round(share * f.judged_steps)} of {f.judged_steps} judged steps "
            f"({share:.0%}; longest run of consecutive judged steps: {_run(first, last, run)}), "
            "there its expert "
            f"compute {fmt.duration(row['hot_expert_ns'])} per layer{tokens}; its device's "
            f"speed {row['speed']:.2f}x its peers' (dense kernels)."
        )
    lines.append(
        f"The group's median in those layers: {fmt.duration(median_expert)}"
        + (f", {median_tokens:.0f} routed tokens." if median_tokens is not None else ".")
    )
    lines.append(
        f"Ranks {compress_ranks(f.waiting_ranks)} wait for the hot rank in the exchange back "
        f"({exchange}): {fmt.duration(f.cost_ns)} in all over {waiting} ranks, "
        f"{per_layer:.0f} layers and {f.judged_steps} steps, {fmt.duration(per_step)} per step "
        f"each, {f.share:.1%} of their time in those steps"
        + (f", {cost.share:.1%} of their analysed window." if cost.share is not None else ".")
    )
    lines.append(_evidence_line(f, p.routed_count_paths))
    lines += _path_lines(paths, f)
    advice = EPLB if persistent else CAPACITY
    lines.append(
        ("Persistent" if persistent else "Moving")
        + f" hot spot: rank {top} is hot in {f.hot_share.get(top, 0.0):.0%} of the judged steps "
        f"(persistent from {p.persistent_share:.0%}), so the fix is "
        + ("EPLB." if persistent else "the token capacity, not a static expert map.")
    )
    return ctx.finding(
        rank=f.hot_ranks,
        sessions=sorted(rows.filter(pl.col("rank").is_in(f.hot_ranks))["session"].unique()),
        title=title,
        message="\n".join(lines),
        location={
            "group": f.group.name,
            "members": compress_ranks(f.group.members),  # groups of one name: one per EP block
            "phase": f.phase or "any",
        },
        phases=[f.phase] if f.phase else [],
        cost_ranks=f.waiting_ranks,  # the wait is theirs
        cost=cost,
        metrics={
            "phase_share": f.share,
            "wait_ns_per_step": per_step,
            "judged_steps": f.judged_steps,
            "hot_steps": f.hot_steps,
            "hot_share": f.hot_share.get(top, 0.0),
            "longest_hot_run": f.windows.get(top, (0, 0, 0))[2],
            "expert_ratio": ratio,
            "token_ratio": token_ratio,
            "hot_expert_ns": hot_expert,
            "median_expert_ns": median_expert,
            "layers": layers,
            "waiting_ranks": waiting,
            "persistent": int(persistent),
        },
        evidence=_evidence(f),
        fix=f"On {group}: {advice}.",
        series=_series(f),
        score=f.cost_ns,
    )


def _evidence_line(f: Imbalance, routed_paths: tuple[str, ...]) -> str:
    """Which evidence named the hot ranks: routed token counts, or the time alone (and why)."""
    if f.by_tokens:
        return (
            "Evidence: the routed tokens (the grouped matmuls' Input Shapes on the "
            f"{', '.join(PATH_NAMES.get(x, x) for x in routed_paths)} path) and the expert "
            "compute time."
        )
    hot_paths = sorted(set(f.hot_rows["path"].drop_nulls().to_list()))
    capacity = [PATH_NAMES.get(x, x) for x in hot_paths if x not in routed_paths]
    why = (
        f"on the {', '.join(capacity)} path the grouped matmuls are shaped by the dispatch "
        "capacity, the same on every rank, not by the routed tokens"
        if capacity
        else "no routed token count in the shapes (a replayed graph's shapes are its capture "
        "size's; or no Input Shapes: collect profiler_level=Level1)"
    )
    return f"Evidence: the expert compute time and the peers' waits alone ({why})."


def _run(first: int, last: int, steps: int) -> str:
    return f"step {first}" if steps == 1 else f"steps {first}-{last}, {steps} steps"


def _op_type(name: str) -> str:
    """``hcom_alltoallv__586_3_1`` -> ``hcom_alltoallv``; ``aclnnX_Op_Op`` -> ``Op``."""
    return name.split("__")[0] if name.startswith("hcom_") else name.rsplit("_", 1)[-1]


def _source(source: str) -> str:
    return {
        "metadata": "parallel_group_info",
        "communication": "the exchange collectives' communicator (communication.json)",
    }.get(source, "the ranks that run MoE layers (no EP group in the metadata)")


def _path_lines(paths: pl.DataFrame, f: Imbalance) -> list[str]:
    """Which exchange the judged steps used, how much of it was exposed, and the steps whose
    path does not fit their size."""
    steps = f.instances.select("rank", "session", "step").unique()
    mine = paths.join(steps.cast({"rank": paths.schema["rank"]}), on=["rank", "session", "step"])
    if mine.is_empty():
        return []
    per_path = (
        mine.with_columns(pl.col("step").n_unique().over("path", "rank").alias("_n"))
        .group_by("path")
        .agg(
            pl.col("_n").max().alias("steps"),
            pl.col("exposed_ns").median(),
            pl.col("tokens").min().alias("lo"),
            pl.col("tokens").max().alias("hi"),
        )
        .sort("steps", descending=True)
    )
    parts = []
    for path, n, exposed, lo, hi in per_path.iter_rows():
        size = "" if lo is None else (f", {lo} tokens" if lo == hi else f", {lo}-{hi} tokens")
        parts.append(
            f"{PATH_NAMES.get(path, path)} in {n} steps ({fmt.duration(exposed or 0)} exposed "
            f"per step and rank, median{size})"
        )
    out = [f"Exchange per step: {'; '.join(parts)}."]
    odd = mine.filter(pl.col("fits") == False)  # noqa: E712 - null is "unknown", not a misfit
    if odd.height:
        shown = ", ".join(
            f"step {s} ({PATH_NAMES.get(pa, pa)}, {t} tokens)"
            for s, pa, t in odd.select("step", "path", "tokens")
            .unique()
            .sort("step")
            .head(5)
            .iter_rows()
        )
        out.append(
            f"Information: {odd.select('step').n_unique()} step(s) took an exchange that does "
            f"not fit their size (MC2 serves up to its token capacity, all-to-all beyond): "
            f"{shown}."
        )
    return out


def _evidence(f: Imbalance) -> list[Evidence]:
    """The worst instances: the hot rank's expert compute, then the peers that wait longest
    in the exchange back."""
    rows = f.instances
    key = ["sidx", "step", "layer"]
    worst = (
        rows.group_by(key).agg(pl.col("owned_ns").sum()).sort("owned_ns", descending=True)
    ).head(EVIDENCE_INSTANCES)
    out: list[Evidence] = []
    for sidx, step, layer, _cost in worst.iter_rows():
        inst = rows.filter(
            (pl.col("sidx") == sidx) & (pl.col("step") == step) & (pl.col("layer") == layer)
        )
        for r in inst.filter(pl.col("hot")).iter_rows(named=True):
            out.append(
                Evidence(
                    rank=r["rank"],
                    session=r["session"],
                    name=f"MoE layer {layer + 1} experts",
                    process=HARDWARE_PROCESS,
                    start_ns=r["start_ns"],
                    dur_ns=r["arrival_ns"] - r["start_ns"],
                    detail=f"step {step}: hot: expert compute {fmt.duration(r['expert_ns'])}"
                    + (f", {r['tokens']} routed tokens" if r["tokens"] is not None else ""),
                )
            )
        for r in (
            inst.filter(~pl.col("hot"))
            .sort("owned_ns", descending=True)
            .head(PEERS_SHOWN)
            .iter_rows(named=True)
        ):
            out.append(
                Evidence(
                    rank=r["rank"],
                    session=r["session"],
                    name=r["name"],
                    process=HARDWARE_PROCESS if r["path"] == "mc2" else None,
                    start_ns=r["arrival_ns"],
                    dur_ns=r["exchange_ns"],
                    detail=f"step {step}, MoE layer {layer + 1}: waits "
                    f"{fmt.duration(r['owned_ns'])} for the hot rank (expert compute "
                    f"{fmt.duration(r['expert_ns'])})",
                )
            )
    return out


def _series(f: Imbalance) -> dict[str, list[Any]]:
    """Per judged step: the hot ranks' expert compute, the others' (median) and their wait."""
    per = (
        f.instances.group_by("sidx", "step", "rank")
        .agg(pl.col("expert_ns").sum(), pl.col("owned_ns").sum())
        .group_by("sidx", "step")
        .agg(
            pl.col("expert_ns").filter(pl.col("rank").is_in(f.hot_ranks)).max().alias("hot"),
            pl.col("expert_ns").filter(~pl.col("rank").is_in(f.hot_ranks)).median().alias("peers"),
            pl.col("owned_ns").filter(~pl.col("rank").is_in(f.hot_ranks)).mean().alias("wait"),
        )
        .sort("sidx", "step")
    )
    return {
        "step": per["step"].to_list(),
        "hot_expert_ns": per["hot"].to_list(),
        "peer_expert_ns": per["peers"].to_list(),
        "wait_ns": per["wait"].to_list(),
    }


# --------------------------------------------------------------------------- presentation


@moe_load_imbalance.figure(
    caption="Expert compute per judged step (all MoE layers): the hot rank (red) against its "
    "peers (median, blue); grey bars: what each peer waits for it in the exchanges back."
)
def _figure(fig: FigureContext) -> Any:
    series = fig.finding.get("series") or {}
    if not series.get("step"):
        return None
    ranks = fig.finding.get("ranks") or ["?"]
    figure_, (ax,) = fig.new(8.0, 3.0)
    x = list(range(len(series["step"])))

    def ms(values: list[Any]) -> list[float]:
        return [float("nan") if v is None else v / 1e6 for v in values]

    ax.bar(x, ms(series["wait_ns"]), color="#d1d5db", label="peer wait (mean)")
    ax.plot(x, ms(series["peer_expert_ns"]), color="#4f81bd", label="peers (median)")
    label = "rank " + ", ".join(str(r) for r in ranks)
    ax.plot(x, ms(series["hot_expert_ns"]), color="#c0504d", label=label)
    ax.set_xlabel("judged step (in order)")
    ax.set_ylabel("per step (ms)")
    ax.legend(fontsize=7, frameon=False)
    return figure_


@moe_load_imbalance.key_figures(
    KeyFigure("moe_expert_ns_per_layer", "expert compute per MoE layer (median)", unit="ns"),
    KeyFigure(
        "moe_wait_ns_per_step",
        "wait for hot expert ranks per step",
        better="lower",
        unit="ns",
    ),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame | list[dict[str, Any]]:
    """Per rank: its median expert compute per judged MoE layer, and what it waits per judged
    step for the group's hot ranks."""
    verdict = moe_imbalance(ctx)
    if verdict.unavailable or verdict.rows.is_empty():
        return []
    judged = verdict.rows.filter(pl.col("judged"))
    return judged.group_by("rank").agg(
        pl.col("expert_ns").median().alias("moe_expert_ns_per_layer"),
        (pl.col("owned_ns").sum() / pl.struct("sidx", "step").n_unique()).alias(
            "moe_wait_ns_per_step"
        ),
    )
