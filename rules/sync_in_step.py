"""TA005 sync-in-step: host-device synchronisations inside a step, beyond the one per-step fetch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    CANN_PROCESS,
    HARDWARE_PROCESS,
    NO_STEPS,
    NS,
    PROFILER_MARKER_TASKS,
    SHARE,
    SYNC_APIS,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    RuleContext,
    analysed_window_ns,
    call_sites,
    cost_over,
    device_tasks,
    host_api,
    host_calls,
    in_steps,
    phases_in,
    rule,
    step_windows,
    text,
    union_intervals,
)

WORST_SHOWN = 5
NO_SITE = "an explicit synchronize"  # a sync outside any torch op: torch.npu.synchronize()


@rule(
    id="TA005",
    name="sync-in-step",
    severity="warning",
    summary="Host-device synchronisations inside steps, beyond the per-step token fetch, leave the device idle.",
    params={
        "sync_apis": Param(
            SYNC_APIS, "AscendCL calls that block the host until the device is done."
        ),
        "allowed_per_step": Param(
            1, "Stalls per step that are normal: the last one(s), fetching the step's result."
        ),
        "min_stall_us": Param(
            20.0, "A sync costing less than this (µs) is not a stall (the device was busy anyway)."
        ),
        "min_extra_per_step": Param(1.0, "Fire from this many extra stalls per steady step on."),
        "min_share": Param(
            0.01, "...and when they cost at least this share of the steady step time."
        ),
        "marker_tasks": Param(PROFILER_MARKER_TASKS, "Profiler marker tasks (not device work)."),
    },
    requires=[
        host_api("aclrtSynchronize*", "aclrtMemcpy"),
        device_tasks(),
    ],
    units={"steady_share": SHARE, "step_ns": NS},
)
def sync_in_step(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Host calls that wait for the device inside a step (`aclrtSynchronizeStream`,
    `aclrtSynchronizeDevice`, `aclrtSynchronizeEvent`, a synchronous device-to-host
    `aclrtMemcpy`: what `.item()`, `.tolist()`, `.cpu()` or a boolean-mask index do), each
    followed by device idle time while the host catches up. The syncs that return into the
    same device idle gap are one *stall* (an `.item()` is a stream sync plus a copy). Per step,
    the last `allowed_per_step` stalls are the normal fetch of the step's result (the sampled
    tokens); the others are extra. A stall costs the device idle that follows it, but at most
    the time the host was blocked: had the host not waited, it would have queued the next work
    that much earlier. It fires when the steady-state steps (not warm-up, dummy or idle)
    average at least `min_extra_per_step` extra stalls costing at least `min_share` of their time, and names
    the torch op around each sync (the call site).

    ## Why it matters
    Every synchronisation drains the device queue: the NPU waits while the host finishes the
    sync, runs Python and launches again. In decode this adds up per token: vllm-ascend #4805
    cut TPOT from 41.7 to 23.4 ms by removing them; PR #4063 saved hundreds of µs per step;
    PR #5809 removed a synchronize after every piecewise graph replay (~250 µs each).

    ## How to fix
    - Keep values on the device: `torch.where` instead of `if tensor.item()`, no `.tolist()` or
      boolean-mask indexing in the hot path.
    - Copy with `non_blocking=True` into pinned memory and read the result later.
    - Move the one fetch the step needs to its end; remove explicit `torch.npu.synchronize()`
      calls from the step.
    The finding names the call sites, and the fix says which of these they call for.

    ## Example
    ```
    TA005 sync-in-step [warning] rank 0
    2 extra host-device syncs per step at aten::item: the device idles 0.62 ms per step (41% of
    the steady step time) after them
    ```
    Silent on the one per-step fetch, on syncs that return while the device still has work, on
    warm-up steps, and below the thresholds. Without steps: not evaluated.

    ## References
    - vllm-ascend #4805 (TPOT 41.7 → 23.4 ms), PR #4063, PR #5809.
    - msprof-analyze advisor: SynchronizeStream checker (schedule group).
    """
    p = ctx.params
    steps = ctx.once(step_windows)
    if steps.is_empty():
        raise NotEvaluated(NO_STEPS)
    steady = steps.filter(pl.col("steady"))
    if steady.is_empty():
        raise NotEvaluated(
            "no steady step: only warm-up, dummy or idle steps were profiled (profile steps "
            "past the start-up)"
        )
    stalls = ctx.once(_step_stalls)
    for rank, rank_steps in steady.group_by("rank", maintain_order=True):
        rank = int(rank[0])
        mine = stalls.filter((pl.col("rank") == rank) & pl.col("steady"))
        extra = mine.filter(pl.col("extra"))
        step_ns = int(rank_steps["dur_ns"].sum())
        cost = int(extra["cost_ns"].sum())
        per_step = extra.height / rank_steps.height
        share = cost / max(step_ns, 1)
        if per_step < p.min_extra_per_step or share < p.min_share:
            ctx.note(
                f"rank {rank}: {per_step:.2g} extra sync stalls per steady step costing "
                f"{share:.1%} of {rank_steps.height} steady step(s) (thresholds "
                f"{p.min_extra_per_step:g} per step, {p.min_share:.0%})",
                rank=rank,
                extra_per_step=per_step,
                cost_share=share,
            )
            continue
        yield _finding(ctx, rank, rank_steps, extra, step_ns, cost)


def _step_stalls(ctx: RuleContext) -> pl.DataFrame:
    """The stalls of every profiled step (detection and key figures share them)."""
    return _stalls(ctx, ctx.once(step_windows))


def _stalls(ctx: RuleContext, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per stall: the syncs that return into one device idle gap, with its cost."""
    p = ctx.params
    keys = ["rank", "session"]
    syncs = in_steps(host_calls(ctx, p.sync_apis), steps)
    if syncs.is_empty():
        return syncs.with_columns(extra=pl.lit(False), cost_ns=pl.lit(0, pl.Int64))
    syncs = call_sites(ctx, syncs)
    busy = (
        union_intervals(
            ctx.table("slices")
            .filter((pl.col("process") == HARDWARE_PROCESS) & ~pl.col("name").is_in(p.marker_tasks))
            .select(*keys, "start_ns", "end_ns")
        )
        .collect()
        .sort("start_ns")
        .with_columns(pl.col("start_ns").shift(-1).over(keys).alias("next_start_ns"))
        .rename({"start_ns": "busy_start_ns", "end_ns": "drain_ns"})
    )
    placed = (
        syncs.sort("end_ns")
        .join_asof(
            busy,
            left_on="end_ns",
            right_on="busy_start_ns",
            by=keys,
            strategy="backward",
            check_sortedness=False,
        )  # fmt: skip
        # The sync returned while the device still had work: it drained nothing.
        .filter(pl.col("drain_ns").is_not_null() & (pl.col("drain_ns") <= pl.col("end_ns")))
    )
    stalls = (
        placed.group_by(*keys, "step", "drain_ns", maintain_order=True)
        .agg(
            pl.col("steady").first(),
            pl.col("step_end_ns").first(),
            pl.col("next_start_ns").first(),
            pl.col("start_ns").min().alias("sync_start_ns"),
            pl.col("end_ns").max().alias("sync_end_ns"),
            pl.col("dur_ns").sum().alias("blocked_ns"),
            pl.col("api_name").unique(maintain_order=True).alias("apis"),
            pl.col("site").fill_null(NO_SITE).first().alias("site"),
            pl.col("site_op").first(),
            pl.col("thread").first(),
            pl.len().alias("calls"),
        )
        .with_columns(
            pl.max_horizontal("drain_ns", "sync_start_ns").alias("idle_start_ns"),
            pl.min_horizontal(
                pl.col("next_start_ns").fill_null(pl.col("step_end_ns")), "step_end_ns"
            ).alias("idle_end_ns"),
        )
        .with_columns(
            (pl.col("idle_end_ns") - pl.col("idle_start_ns")).clip(lower_bound=0).alias("idle_ns")
        )
        .with_columns(pl.min_horizontal("idle_ns", "blocked_ns").alias("cost_ns"))
        .filter(pl.col("cost_ns") >= p.min_stall_us * 1000)
        .sort(*keys, "sync_start_ns")
    )
    from_end = pl.int_range(pl.len(), 0, -1).over(*keys, "step")  # the last stall of a step is 1
    return stalls.with_columns((from_end > p.allowed_per_step).alias("extra"))


def _fix(sites: list[str], apis: set[str]) -> str:
    """What to change, from the call sites and APIs the trace shows."""
    parts = []
    if any("item" in s or "_local_scalar_dense" in s for s in sites):
        parts.append(
            "`.item()` (aten::item) reads a device value on the host: keep it on the device "
            "(`torch.where`, device-side masks) or read it once at the end of the step"
        )
    if any("tolist" in s or "nonzero" in s or "masked" in s or "index" in s for s in sites):
        parts.append(
            "`.tolist()` / nonzero / boolean-mask indexing needs the host to see device data: "
            "use fixed-shape device ops in the hot path"
        )
    if any(s.startswith(("aten::to", "aten::copy_", "aten::_to_copy", "aten::cpu")) for s in sites):
        parts.append(
            "a blocking device-to-host copy (`.to('cpu')`/`.cpu()`): copy with "
            "`non_blocking=True` into pinned memory and use the result later"
        )
    if NO_SITE in sites or apis & {"aclrtSynchronizeDevice", "aclrtSynchronizeEvent"}:
        parts.append(
            "explicit `torch.npu.synchronize()` / stream or event synchronize calls: remove "
            "them from the step (keep one at its end if the result must be read)"
        )
    if not parts:
        parts.append("move the synchronisation out of the step or to its end")
    return "; ".join(parts) + "."


def _finding(
    ctx: RuleContext,
    rank: int,
    steps: pl.DataFrame,
    extra: pl.DataFrame,
    step_ns: int,
    cost: int,
) -> Finding:
    n = steps.height
    by_site = (
        extra.group_by("site")
        .agg(pl.col("cost_ns").sum(), pl.len().alias("stalls"))
        .sort("cost_ns", "site", descending=[True, False])
    )
    sites = by_site["site"].to_list()
    apis = {a for row in extra["apis"] for a in row}
    share = cost / max(step_ns, 1)
    per_step_count = round(extra.height / n, 2)
    title = (
        f"{text.number(per_step_count)} extra host-device sync{'' if per_step_count == 1 else 's'} "
        "per step at "
        f"{text.join(sites, 3)}: the device idles {text.duration(cost / n)} per step "
        f"({share:.0%} of the steady step time) after them"
    )
    message = (
        f"On rank {rank}, {n} steady step(s) hold {extra.height} sync stalls besides the last one "
        "of each step (the result fetch). Each drains the device queue; the device then idles "
        "until the host launches again. Per call site: "
        + "; ".join(
            f"{r['site']}: {r['stalls']} stalls, {text.duration(r['cost_ns'])}"
            for r in by_site.iter_rows(named=True)
        )
        + f". APIs: {text.join(sorted(apis))}."
    )
    evidence = []
    for s in extra.sort("cost_ns", descending=True).head(WORST_SHOWN).iter_rows(named=True):
        site = s["site"] if s["site_op"] in (None, s["site"]) else f"{s['site']} ({s['site_op']})"
        evidence.append(
            Evidence(
                rank=rank,
                session=s["session"],
                name=" + ".join(s["apis"]),
                process=CANN_PROCESS,
                thread=s["thread"],
                start_ns=s["sync_start_ns"],
                dur_ns=s["sync_end_ns"] - s["sync_start_ns"],
                detail=f"step {s['step']}, call site {site}; host blocked {text.duration(s['blocked_ns'])}",
            )
        )
        evidence.append(
            Evidence(
                rank=rank,
                session=s["session"],
                name="device idle after sync",
                process=HARDWARE_PROCESS,
                start_ns=s["idle_start_ns"],
                dur_ns=s["idle_ns"],
                detail=f"costs {text.duration(s['cost_ns'])} (idle capped by the time the host was blocked)",
            )
        )
    per_step = (
        steps.select("step")
        .join(
            extra.group_by("step").agg(pl.len().alias("stalls"), pl.col("cost_ns").sum()),
            on="step",
            how="left",
        )
        .fill_null(0)
        .sort("step")
    )
    return ctx.finding(
        rank=rank,
        sessions=sorted(set(steps["session"])),
        title=title,
        message=message,
        location={"site": sites[0]},
        cost=cost_over(cost, analysed_window_ns(ctx).get(rank)),
        metrics={
            "steady_share": round(share, 4),
            "extra_stalls": extra.height,
            "extra_per_step": round(extra.height / n, 3),
            "steady_steps": n,
            "step_ns": step_ns,
        },
        evidence=evidence,
        fix="Remove the extra synchronisations from the step: " + _fix(sites, apis),
        # the phases of the steps that stall
        phases=phases_in(
            steps.join(extra.select("session", "step").unique(), on=["session", "step"])
        ),
        series={
            "step": per_step["step"].to_list(),
            "extra_stalls": per_step["stalls"].to_list(),
            "idle_us": [v / 1e3 for v in per_step["cost_ns"]],
        },
        score=float(cost),
    )


@sync_in_step.figure(caption="Device idle after extra synchronisations, per steady step.")
def _figure(fig: FigureContext) -> Any:
    (ranks, series), *_ = fig.series_by_rank()
    if not series.get("step"):
        return None
    figure, (ax,) = fig.new(6.0, 2.4)
    # steps as categories, as per_step_figure draws them: integer labels, one per bar
    ax.bar([str(s) for s in series["step"]], series["idle_us"], color="#dc2626", width=0.7)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("idle after syncs (µs)", fontsize=8)
    ax.set_title(f"rank {', '.join(map(str, ranks))}", fontsize=9)
    return figure


@sync_in_step.key_figures(
    KeyFigure("extra_syncs_per_step", "extra sync stalls per steady step", "lower", "count"),
    KeyFigure("sync_idle_ns_per_step", "device idle after extra syncs per step", "lower", "ns"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame | list[dict[str, Any]]:
    steady = ctx.once(step_windows).filter(pl.col("steady"))
    if steady.is_empty():
        return []
    extra = ctx.once(_step_stalls).filter(pl.col("steady") & pl.col("extra"))
    counts = steady.group_by("rank").agg(pl.len().alias("steps"))
    return counts.join(
        extra.group_by("rank").agg(pl.len().alias("n"), pl.col("cost_ns").sum()),
        on="rank",
        how="left",
    ).select(
        "rank",
        (pl.col("n").fill_null(0) / pl.col("steps")).alias("extra_syncs_per_step"),
        (pl.col("cost_ns").fill_null(0) / pl.col("steps")).alias("sync_idle_ns_per_step"),
    )
