"""TA016 memory-fragmentation: torch's allocator holds much more than it uses, and still misses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.kit import (
    APP,
    NO_CAPACITY,
    PTA,
    SHARE,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Param,
    RankMemory,
    RuleContext,
    capacity_mb,
    device_memory,
    memory_records,
    phases_in,
    rule,
    session_metadata,
    spearman,
    steady_steps,
    step_seconds,
    step_series,
    text,
    trend,
)

EXPANDABLE = "expandable_segments:True"
WORST_SHOWN = 5


@dataclass(frozen=True)
class Waste:
    """Reserved memory PTA does not use, over one session's steady iterations (MB)."""

    steps: int
    allocated_mb: float  # the highest allocated of the steady iterations
    reserved_mb: float  # reserved at that moment
    gap_mb: float  # reserved - allocated at that moment
    miss_steps: int  # iterations in which the allocator took a new segment from the driver
    segment_allocs: int
    segment_frees: int
    gap_growth_mb: float  # the iterations' gap at their peak: Theil-Sen growth over the window
    gap_growth_p: float  # ... and its Mann-Kendall p

    @property
    def gap_share(self) -> float:
        return self.gap_mb / self.reserved_mb if self.reserved_mb else 0.0


def waste(steps: pl.DataFrame) -> Waste | None:
    """:class:`Waste` of one session's steady PTA windows (in time order); None without any
    with a reserved total."""
    steps = steps.drop_nulls("gap_at_peak_mb")
    if steps.is_empty():
        return None
    top = steps.sort("peak_mb", "start_ns", descending=[True, False]).row(0, named=True)
    gaps = trend(steps["gap_at_peak_mb"].to_numpy().astype(float))
    return Waste(
        steps=steps.height,
        allocated_mb=float(top["peak_mb"]),
        reserved_mb=float(top["gap_at_peak_mb"] + top["peak_mb"]),
        gap_mb=float(top["gap_at_peak_mb"]),
        miss_steps=int((steps["segment_allocs"] > 0).sum()),
        segment_allocs=int(steps["segment_allocs"].sum()),
        segment_frees=int(steps["segment_frees"].sum()),
        gap_growth_mb=gaps.slope * (steps.height - 1),
        gap_growth_p=gaps.mk.p_increasing,
    )


@rule(
    id="TA016",
    name="memory-fragmentation",
    severity="warning",
    summary="Torch's allocator reserves far more device memory than it allocates, and still "
    "goes to the driver for new segments in steady iterations.",
    params={
        "min_steps": Param(4, "Steady iterations with PTA records needed."),
        "min_gap_share": Param(
            0.25,
            "Fire when reserved - allocated at the allocated peak is at least this share of "
            "reserved ...",
        ),
        "min_gap_mb": Param(1024.0, "... and at least this much (MB), or grows by it ..."),
        "gap_alpha": Param(0.01, "... (growing: Mann-Kendall p of the per-iteration gap) ..."),
        "min_miss_share": Param(
            0.5,
            "... while at least this share of the steady iterations take a new segment from "
            "the driver (the cached blocks fit no request).",
        ),
        "near_capacity": Param(
            0.8,
            "With a known capacity: only when the process's memory reaches this share of it "
            "(fragmentation far from the limit costs nothing yet).",
        ),
    },
    requires=[memory_records()],
    uses=[device_memory],
    units={"gap_share": SHARE},
)
def memory_fragmentation(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Torch's caching allocator (`PTA` in memory_record.csv) holding reserved segments it cannot
    use: at the highest allocated memory of the steady iterations (not warm-up, dummy or idle),
    reserved - allocated is at least `min_gap_share` of reserved and `min_gap_mb`, or that gap
    grows across the iterations (Mann-Kendall p < `gap_alpha`, by `min_gap_mb`), **while** the
    allocator keeps missing its cache: in at least `min_miss_share` of the steady iterations its
    reserved memory rises (a new segment from the driver; a fall is a segment handed back). With
    a known capacity (`capacity_gb`), only when the process's memory (APP) reaches
    `near_capacity` of it.

    ## Why it matters
    The cached blocks are free but fit no request (they are too small, or split), so a request
    near the limit fails although the memory is there ("reserved but unallocated", vLLM
    #37428), the allocator frees its cache and retries, and every such miss is a synchronising
    driver call. The KV cache sized at start-up from the free memory is smaller than it could
    be.

    ## How to fix
    - `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`: segments grow in place instead of new
      blocks of every size (the finding says what it was set to).
    - Where it cannot be set: a `torch.npu.empty_cache()` between phases (after a burst of long
      prefills), not every step: every step is what alloc-churn reports.
    - Keep shapes stable (pad or bucket the batch) so blocks are reused.
    One owner per symptom: this rule reports the memory held and unused; the host time of the
    driver calls (`aclrtMalloc`/`aclrtFree` in steady steps, Level1) is alloc-churn's.

    ## Example
    ```
    TA016 memory-fragmentation [warning] rank 0
    PTA reserves 26.5 GB at its allocated peak of 18.5 GB: 8 GB (30.8%) reserved and unused,
    while 40 of 40 steady iterations take a new segment from the driver
    ```
    Silent when the allocator reserves little beyond its peak (a healthy cache), when reserved
    memory is large but no iteration misses (a cache that fits), and on warm-up misses. Without
    memory records: not evaluated.

    ## References
    - torch_npu `PYTORCH_NPU_ALLOC_CONF` (`expandable_segments`), `torch.npu.memory_stats`,
      `torch.npu.empty_cache`.
    - vLLM #37428 (reserved minus allocated), alloc-churn (the driver calls' host time).
    """
    memory = device_memory(ctx)
    p = ctx.params
    capacity = capacity_mb(p.capacity_gb)
    pta = steady_steps(memory, PTA)
    if pta.is_empty():
        ctx.inconclusive("no steady iteration with PTA records (torch's allocator)")
        return
    for (rank, session), steps in pta.group_by("rank", "session", maintain_order=True):
        rank, session = int(rank), str(session)  # type: ignore[assignment]
        if steps.height < p.min_steps:
            ctx.inconclusive(
                f"rank {rank}: {text.count(steps.height, 'steady iteration')} with PTA records; "
                f"at least {p.min_steps} needed (min_steps)",
                rank=rank,
            )
            continue
        w = waste(steps)
        if w is None:
            continue
        why = _why_not(w, p, _app_peak(memory, rank, session), capacity)
        if why:
            ctx.note(f"rank {rank}: {why}", rank=rank, gap_mb=w.gap_mb, gap_share=w.gap_share)
            continue
        yield _finding(ctx, rank, session, w, steps, capacity, _app_peak(memory, rank, session))


def _app_peak(memory: RankMemory, rank: int, session: str) -> float | None:
    levels = memory.levels.filter(
        (pl.col("rank") == rank) & (pl.col("session") == session) & (pl.col("component") == APP)
    )
    return None if levels.is_empty() else levels["peak_reserved_mb"][0]


def _why_not(w: Waste, p: Any, app_peak: float | None, capacity: float | None) -> str | None:
    large = w.gap_share >= p.min_gap_share and w.gap_mb >= p.min_gap_mb
    growing = w.gap_growth_p < p.gap_alpha and w.gap_growth_mb >= p.min_gap_mb
    if not (large or growing):
        return (
            f"reserved - allocated at the peak is {text.megabytes(w.gap_mb)} "
            f"({w.gap_share:.1%} of reserved; min_gap_share {p.min_gap_share:.0%}, min_gap_mb "
            f"{p.min_gap_mb:g}) and does not grow"
        )
    if w.miss_steps < p.min_miss_share * w.steps:
        return (
            f"{text.megabytes(w.gap_mb)} reserved and unused at the peak, but only "
            f"{w.miss_steps} of {w.steps} steady iterations take a new segment (min_miss_share "
            f"{p.min_miss_share:.0%}): the cache serves them"
        )
    used = app_peak if app_peak is not None else w.reserved_mb
    if capacity is not None and used < p.near_capacity * capacity:
        return (
            f"fragmented ({text.megabytes(w.gap_mb)} unused) but far from the capacity: "
            f"{text.megabytes(used)} of {text.megabytes(capacity)} (near_capacity "
            f"{p.near_capacity:.0%})"
        )
    return None


def _alloc_conf(ctx: RuleContext, rank: int) -> str:
    sessions = ctx.sessions().filter(pl.col("rank") == rank)
    conf = {
        str(session_metadata(m).get("ENV_VARIABLES", {}).get("PYTORCH_NPU_ALLOC_CONF") or "")
        for m in sessions["metadata"]
    }
    return ", ".join(sorted(c for c in conf if c)) or "unset"


def _fix(conf: str) -> str:
    first = (
        f"`{EXPANDABLE}` is already set ({conf}): the requests' sizes vary too much for the "
        "segments; keep shapes stable (pad or bucket the batch)."
        if EXPANDABLE in conf
        else f"Set `PYTORCH_NPU_ALLOC_CONF={EXPANDABLE}` (it was {conf}): segments then grow "
        "in place instead of new blocks being reserved for sizes the cached ones do not fit."
    )
    return (
        f"{first} Where it cannot be set, a `torch.npu.empty_cache()` between phases (after a "
        "burst of long prefills, not every step) hands the unusable blocks back; every step "
        "is what alloc-churn reports. The host time of the driver calls themselves is "
        "alloc-churn's finding."
    )


def _finding(
    ctx: RuleContext,
    rank: int,
    session: str,
    w: Waste,
    steps: pl.DataFrame,
    capacity: float | None,
    app_peak: float | None,
) -> Finding:
    p = ctx.params
    headroom = capacity - app_peak if capacity is not None and app_peak is not None else None
    growing = w.gap_growth_p < p.gap_alpha and w.gap_growth_mb >= p.min_gap_mb
    title = (
        f"PTA reserves {text.megabytes(w.reserved_mb)} at its allocated peak of "
        f"{text.megabytes(w.allocated_mb)}: {text.megabytes(w.gap_mb)} ({w.gap_share:.1%}) "
        f"reserved and unused{', and growing' if growing else ''}, while {w.miss_steps} of "
        f"{w.steps} steady iterations take a new segment from the driver"
    )
    lines = [
        f"On rank {rank}, torch's caching allocator held {text.megabytes(w.reserved_mb)} of "
        f"segments when its allocated memory peaked at {text.megabytes(w.allocated_mb)} over "
        f"{w.steps} steady iterations: {text.megabytes(w.gap_mb)} cached in blocks that fit "
        "none of the requests, which still went to the driver: "
        f"{w.segment_allocs} new segments and {w.segment_frees} handed back "
        f"({w.segment_allocs / w.steps:.2g} and {w.segment_frees / w.steps:.2g} per iteration).",
    ]
    if growing:
        lines.append(
            f"The unused share grows: {text.megabytes(w.gap_growth_mb)} more over the window "
            f"(Mann-Kendall {text.p_value(w.gap_growth_p)})."
        )
    held = (
        f"The process holds {text.megabytes(app_peak)} at its peak"
        if app_peak is not None
        else "The process's memory (APP) was not sampled"
    )
    room = (
        f"the device's {text.megabytes(capacity)} leaves {text.megabytes(headroom)}"
        if headroom is not None
        else NO_CAPACITY
    )
    lines.append(f"{held}; {room}.")
    rho, _ = spearman(steps["tokens"].fill_null(0).to_list(), steps["peak_mb"].to_list())
    if np.isfinite(rho) and rho > 0.5:
        lines.append("The peaks follow the batch size: the variable shapes are what splits blocks.")
    return ctx.finding(
        rank=rank,
        sessions=[session],
        title=title,
        message="\n".join(lines),
        location={"component": PTA},
        metrics={
            "gap_mb": w.gap_mb,
            "gap_share": w.gap_share,
            "reserved_mb": w.reserved_mb,
            "allocated_mb": w.allocated_mb,
            "steady_steps": w.steps,
            "miss_steps": w.miss_steps,
            "segment_allocs_per_step": w.segment_allocs / w.steps,
            "segment_frees_per_step": w.segment_frees / w.steps,
            "gap_growth_mb": w.gap_growth_mb if growing else None,
            "capacity_mb": capacity,
            "headroom_mb": headroom,
        },
        evidence=_evidence(rank, session, steps),
        fix=_fix(_alloc_conf(ctx, rank)),
        series=step_series(
            steps,
            allocated_mb=pl.col("peak_mb"),
            reserved_mb=pl.col("peak_mb") + pl.col("gap_at_peak_mb"),
        ),
        phases=phases_in(steps),
        score=w.gap_mb,
    )


def _evidence(rank: int, session: str, steps: pl.DataFrame) -> list[Evidence]:
    """The steady iterations that took the most new segments."""
    worst = steps.filter(pl.col("segment_allocs") > 0).sort(
        "segment_allocs", "start_ns", descending=[True, False]
    )
    return [
        Evidence(
            rank=rank,
            session=session,
            name=f"{s['segment_allocs']} new segment(s)",
            start_ns=s["start_ns"],
            dur_ns=s["step_ns"],
            detail=(
                f"iteration {s['step']} ({s['phase']}): allocated peak "
                f"{text.megabytes(s['peak_mb'])}, reserved {text.megabytes(s['reserved_peak_mb'])}"
            ),
        )
        for s in worst.head(WORST_SHOWN).iter_rows(named=True)
    ]


@memory_fragmentation.figure(
    caption="Per steady iteration, PTA's allocated peak and the reserved memory at that moment; "
    "the band between them is reserved and unused."
)
def _figure(fig: FigureContext) -> Any:
    series = fig.finding.get("series") or {}
    seconds = step_seconds(series)
    if not seconds:
        return None
    figure, (ax,) = fig.new(7.5, 2.8)
    ax.fill_between(
        seconds, series["reserved_mb"], series["allocated_mb"], color="#f59e0b", alpha=0.3
    )
    ax.plot(seconds, series["reserved_mb"], color="#b45309", label="reserved")
    ax.plot(seconds, series["allocated_mb"], color="#1d4ed8", label="allocated (peak)")
    ax.set_xlabel("seconds from the first steady iteration")
    ax.set_ylabel("PTA (MB)")
    ax.legend(fontsize=8, frameon=False)
    return figure


@memory_fragmentation.key_figures(
    KeyFigure("unused_reserved_share", "PTA reserved and unused at peak", "lower", "ratio"),
    KeyFigure("segment_allocs_per_step", "new PTA segments per steady step", "lower", "count"),
)
def _key_figures(ctx: RuleContext) -> list[dict[str, Any]]:
    """Per rank (its session with the most steady iterations): the unused share of reserved at
    the allocated peak, and the new segments per steady iteration."""
    rows = []
    pta = steady_steps(device_memory(ctx), PTA)
    for (rank,), steps in pta.group_by("rank", maintain_order=True):
        longest = steps["session"].mode().sort()[0]
        w = waste(steps.filter(pl.col("session") == longest))
        rows.append(
            {
                "rank": int(rank),  # type: ignore[arg-type]
                "unused_reserved_share": w.gap_share if w else None,
                "segment_allocs_per_step": w.segment_allocs / w.steps if w else None,
            }
        )
    return rows
