"""TA015 memory-growth: allocated device memory grows across steady iterations (a leak)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.kit import (
    APP,
    GE,
    MB_BYTES,
    NO_CAPACITY,
    P_VALUE,
    PTA,
    SERIES,
    Evidence,
    FigureContext,
    Finding,
    Growth,
    KeyFigure,
    Param,
    RankMemory,
    RuleContext,
    baseline_growth,
    capacity_mb,
    device_memory,
    memory_records,
    phases_in,
    rule,
    steady_steps,
    step_seconds,
    step_series,
    text,
)

WHAT = {
    PTA: "torch's caching allocator (PTA)",
    GE: "GE's allocator (GE)",
    APP: "the process's device memory outside torch and GE (APP - PTA reserved - GE reserved)",
}
SHORT = {
    PTA: "PTA allocated memory",
    GE: "GE allocated memory",
    APP: "APP memory outside torch",
}
FIX = {
    PTA: (
        "Find what keeps a reference every iteration: the operators never freed below allocate "
        "it (a tensor appended to a list, a per-request cache without eviction, outputs kept "
        "for logging or metrics). `torch.npu.memory._record_memory_history()` and a snapshot, "
        "or msLeaks, give the allocation stacks. Until it is fixed, restart the server before "
        "the time to out-of-memory."
    ),
    GE: (
        "GE keeps more graph memory every iteration: a graph compiled again for every new shape "
        "keeps its workspace. Keep shapes static (pad or bucket the batch), or cap the graph "
        "cache."
    ),
    APP: (
        "Device memory outside torch grows: HCCL buffers (a communicator or process group "
        "created per iteration and never destroyed; `HCCL_BUFFSIZE`), the runtime's and aclnn's "
        "workspaces (one per new shape). npu_module_mem.csv says which module grows; destroy "
        "the groups you create, keep shapes static, and use msLeaks for allocations torch does "
        "not see."
    ),
}
NEVER_FREED_SHOWN = 5


@rule(
    id="TA015",
    name="memory-growth",
    severity="warning",
    escalates_to="error",
    escalation="when the device runs out within error_within_h hours at the observed rate",
    summary="Allocated device memory grows across steady iterations: a leak, its rate and the "
    "time to out-of-memory.",
    params={
        "min_iterations": Param(8, "Steady iterations with memory records a trend needs."),
        "alpha": Param(
            0.01, "Fire when the baseline's upward trend has a Mann-Kendall p below this ..."
        ),
        "min_growth_mb": Param(
            4.0, "... and it grew at least this much (MB) over the steady iterations ..."
        ),
        "late_share": Param(
            0.5,
            "... and the later half keeps growing, its Theil-Sen slope at least this share of "
            "the whole's (warm-up growth that plateaus is silent) ...",
        ),
        "min_kept": Param(
            0.5,
            "... and the later half keeps it: its lowest tenth at least this share of the "
            "growth the slope gives it by then (a sawtooth that returns to its baseline is "
            "silent).",
        ),
        "error_within_h": Param(
            24.0, "Severity error when the device runs out within this many hours at the rate."
        ),
    },
    requires=[memory_records()],
    uses=[device_memory],
    units={"mann_kendall_p": P_VALUE},
)
def memory_growth(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    A component's device memory that grows from one steady iteration to the next and never
    comes back: per iteration (the `steps` table's windows of a steady phase: not warm-up,
    dummy or idle), its **baseline**, the lowest value it held during the iteration (what stays
    allocated from one iteration to the next, not the peaks, which follow the batch), for
    torch's caching allocator (`PTA` allocated), GE's (`GE` allocated) and the process's memory
    outside both (`APP`: APP - PTA reserved - GE reserved, the HCCL buffers and workspaces torch
    does not see). It fires when the baselines trend up (Mann-Kendall p < `alpha`, Theil-Sen
    growth at least `min_growth_mb`), the later half of the iterations keeps growing
    (its slope at least `late_share` of the whole's) and keeps what it grew (the later half's
    lowest tenth at least `min_kept` of the growth the slope gives it by then: a leak under a
    sawtooth still fires). It reports the rate (`rate_bytes_per_s`,
    `bytes_per_iteration`), the time until the device's capacity is reached at that rate
    (`time_to_oom_s`, from the process's memory in use; null when the capacity is unknown: no
    export records it, set `capacity_gb` or `memory.capacity_gb`), and, for PTA, the operators
    whose allocations in the window were never freed (operator_memory.csv).

    ## Why it matters
    A leak of a few MB per iteration is invisible in any one profile and fatal after two days
    of serving: 62 GB became 64 GB and the server died (vllm-ascend #6478). Which allocator
    grows says where to look: torch's (a reference kept per request), GE's (a graph per shape)
    or neither (HCCL buffers, workspaces: "is the leaked memory device memory or host memory?",
    vllm-ascend #12345).

    ## How to fix
    - PTA: find the reference kept per iteration; the operators never freed name the allocation
      site. `torch.npu.memory._record_memory_history()` or msLeaks give the stacks.
    - GE: keep shapes static (pad, bucket) so graphs and their workspaces are reused.
    - APP: destroy the process groups and communicators you create; check which module grows in
      npu_module_mem.csv.
    - Until then, restart before the time to out-of-memory.

    ## Example
    ```
    TA015 memory-growth [warning] rank 0
    PTA allocated memory grows 4 MB per iteration (194 MB/s) across 40 steady iterations;
    never freed: aten::empty_strided x40 (160 MB); time to out-of-memory unknown
    ```
    Silent on warm-up growth that plateaus (the KV-cache pool, graph capture, buffers grown once
    per batch size), on a sawtooth that returns to its baseline, on peaks that follow the batch.
    Without memory records: not evaluated. With fewer than `min_iterations` steady iterations:
    inconclusive.

    ## References
    - torch_npu `profile_memory=True`: memory_record.csv, operator_memory.csv (Db MEMORY_RECORD,
      OP_MEMORY, NPU_MEM); MindStudio Insight's memory view, msLeaks.
    - Mann-Kendall trend test and Theil-Sen slope (as capture-memcpy-growth).
    """
    memory = device_memory(ctx)
    p = ctx.params
    for (rank, session), _ in memory.levels.group_by("rank", "session", maintain_order=True):
        judged = False
        for component in SERIES:
            steps = _steady(memory, int(rank), str(session), component)
            if steps.height < p.min_iterations:
                continue
            judged = True
            growth = baseline_growth(steps)
            if growth is None:
                continue
            why = growth.verdict(p)
            if why is None:
                yield _finding(ctx, memory, int(rank), str(session), component, growth, steps)
            else:
                ctx.note(f"rank {rank}: {component} baseline: {why}", rank=int(rank))
        if not judged:
            most = max(
                (_steady(memory, int(rank), str(session), c).height for c in SERIES),
                default=0,
            )
            ctx.inconclusive(
                f"rank {rank}: {text.count(most, 'steady iteration')} with memory records; a "
                f"trend needs at least {p.min_iterations} (min_iterations)",
                rank=int(rank),
                steady_iterations=most,
            )


def _steady(memory: RankMemory, rank: int, session: str, component: str) -> pl.DataFrame:
    return steady_steps(memory, component).filter(
        (pl.col("rank") == rank) & (pl.col("session") == session)
    )


def _in_use_mb(memory: RankMemory, rank: int, session: str) -> float | None:
    """The process's device memory at the end of the session: its last APP sample, else what
    the allocators reserved last."""
    levels = memory.levels.filter((pl.col("rank") == rank) & (pl.col("session") == session))
    last = dict(zip(levels["component"], levels["last_reserved_mb"], strict=True))
    if last.get(APP) is not None:
        return float(last[APP])
    held = [last[c] for c in (PTA, GE) if last.get(c) is not None]
    return float(sum(held)) if held else None


def _never_freed(memory: RankMemory, rank: int, session: str, growth: Growth) -> pl.DataFrame:
    """The operators whose allocations in the window were never freed: name, count, total MB,
    first allocation; the most allocations first (a leak allocates in every iteration)."""
    return (
        memory.unfreed.filter(
            (pl.col("rank") == rank)
            & (pl.col("session") == session)
            & (pl.col("source") == "operator_memory")
            & pl.col("alloc_ns").is_between(growth.first_ns, growth.last_ns)
        )
        .group_by("name")
        .agg(
            pl.len().alias("count"),
            pl.col("size_mb").sum().alias("total_mb"),
            pl.col("alloc_ns").min().alias("first_ns"),
        )
        .sort("count", "total_mb", "name", descending=[True, True, False])
    )


def _module_growth(memory: RankMemory, rank: int, session: str) -> list[str]:
    """The CANN modules whose memory grew during the session (npu_module_mem.csv)."""
    modules = memory.modules.filter(
        (pl.col("rank") == rank)
        & (pl.col("session") == session)
        & (pl.col("component") != APP)  # the module APP is torch's own
        & (pl.col("last_reserved_mb") > pl.col("first_reserved_mb"))
    ).sort("component")
    return [
        f"{m['component']} {text.megabytes(m['first_reserved_mb'])} -> "
        f"{text.megabytes(m['last_reserved_mb'])}"
        for m in modules.iter_rows(named=True)
    ]


def _finding(
    ctx: RuleContext,
    memory: RankMemory,
    rank: int,
    session: str,
    component: str,
    growth: Growth,
    steps: pl.DataFrame,
) -> Finding:
    p = ctx.params
    rate = growth.over_time.slope  # MB/s
    per_iteration = growth.per_iteration_mb
    capacity = capacity_mb(p.capacity_gb)
    in_use = _in_use_mb(memory, rank, session)
    oom_s = None
    if capacity is not None and in_use is not None and rate > 0:
        oom_s = max(capacity - in_use, 0.0) / rate
    span_ns = growth.last_ns - growth.first_ns
    if oom_s is not None:
        oom = (
            f"the device's {text.megabytes(capacity)} is reached in "
            f"{text.duration(oom_s * 1e9)} at this rate (from {text.megabytes(in_use)} in use)"
        )
    else:
        oom = f"time to out-of-memory unknown: {NO_CAPACITY}"
    never = _never_freed(memory, rank, session, growth) if component == PTA else None
    freed_text = (
        [
            f"{r['name']} x{r['count']} ({text.megabytes(r['total_mb'])})"
            for r in never.head(NEVER_FREED_SHOWN).iter_rows(named=True)
        ]
        if never is not None
        else []
    )
    modules = _module_growth(memory, rank, session) if component == APP else []
    where = f"; never freed: {text.join(freed_text, 3)}" if freed_text else ""
    title = (
        f"{SHORT[component]} grows "
        f"{text.megabytes(per_iteration)} per iteration ({text.megabytes(rate)}/s) across "
        f"{growth.iterations} steady iterations{where}; "
        + (
            f"out of memory in {text.duration(oom_s * 1e9)}"
            if oom_s is not None
            else "time to out-of-memory unknown"
        )
    )
    lines = [
        f"On rank {rank}, {WHAT[component]} keeps {text.megabytes(per_iteration)} more after "
        f"every steady iteration: its baseline (the lowest it held in each iteration) grew from "
        f"{text.megabytes(growth.start_mb)} to {text.megabytes(growth.end_mb)} over "
        f"{growth.iterations} iterations ({text.duration(span_ns)}; Mann-Kendall "
        f"{text.p_value(growth.over_time.mk.p_increasing)}), and its later half still grows "
        f"({text.megabytes(growth.late.slope)} per iteration) and keeps it: not warm-up that "
        "plateaus, not a sawtooth. Warm-up, dummy and idle windows are left out.",
        f"At {text.megabytes(rate)}/s, {oom}.",
    ]
    if freed_text:
        lines.append(
            f"Allocated in the window and never freed (operator_memory.csv): "
            f"{text.join(freed_text, NEVER_FREED_SHOWN)}."
        )
    if modules:
        lines.append(f"npu_module_mem.csv: {text.join(modules)}.")
    severity = None
    if oom_s is not None and oom_s < p.error_within_h * 3600:
        severity = "error"
    return ctx.finding(
        rank=rank,
        sessions=[session],
        title=title,
        message="\n".join(lines),
        location={"component": component},
        metrics={
            "component": component,  # type: ignore[dict-item]
            "rate_bytes_per_s": rate * MB_BYTES,
            "bytes_per_iteration": per_iteration * MB_BYTES,
            "time_to_oom_s": oom_s,
            "iterations": growth.iterations,
            "baseline_start_mb": growth.start_mb,
            "baseline_end_mb": growth.end_mb,
            "mann_kendall_p": growth.over_time.mk.p_increasing,
            "capacity_mb": capacity,
            "in_use_mb": in_use,
            "never_freed": freed_text,  # type: ignore[dict-item]
        },
        evidence=_evidence(rank, session, component, steps, never),
        fix=FIX[component],
        severity=severity,
        series=step_series(steps, baseline_mb=pl.col("baseline_mb"), peak_mb=pl.col("peak_mb")),
        phases=phases_in(steps),
        score=rate,
    )


def _evidence(
    rank: int,
    session: str,
    component: str,
    steps: pl.DataFrame,
    never: pl.DataFrame | None,
) -> list[Evidence]:
    """The first and last steady iterations with their baselines, then the operators never
    freed (PTA)."""
    rows = [steps.head(1), steps.tail(1)] if steps.height > 1 else [steps]
    out = [
        Evidence(
            rank=rank,
            session=session,
            name=f"{component} baseline {text.megabytes(s['baseline_mb'])}",
            start_ns=s["start_ns"],
            dur_ns=s["step_ns"],
            detail=f"iteration {s['step']} ({s['phase']}), peak {text.megabytes(s['peak_mb'])}",
        )
        for part in rows
        for s in part.iter_rows(named=True)
    ]
    for r in (never.head(NEVER_FREED_SHOWN) if never is not None else pl.DataFrame()).iter_rows(
        named=True
    ):
        out.append(
            Evidence(
                rank=rank,
                session=session,
                name=f"never freed: {r['name']}",
                start_ns=r["first_ns"],
                detail=f"{r['count']} allocations, {text.megabytes(r['total_mb'])} in all",
            )
        )
    return out


@memory_growth.figure(
    caption="Each steady iteration's lowest (baseline, dots) and highest memory of the growing "
    "component; dashed: the Theil-Sen trend of the baselines."
)
def _figure(fig: FigureContext) -> Any:
    series = fig.finding.get("series") or {}
    seconds = step_seconds(series)
    if not seconds:
        return None
    figure, (ax,) = fig.new(7.5, 2.8)
    ax.plot(seconds, series["peak_mb"], color="#9ca3af", linewidth=1, label="peak")
    ax.plot(seconds, series["baseline_mb"], marker="o", markersize=3, label="baseline")
    rate = (fig.finding["metrics"].get("rate_bytes_per_s") or 0.0) / MB_BYTES
    intercept = float(np.median(np.asarray(series["baseline_mb"]) - rate * np.asarray(seconds)))
    ax.plot(
        [seconds[0], seconds[-1]],
        [intercept + rate * seconds[0], intercept + rate * seconds[-1]],
        linestyle="--",
        color="#dc2626",
        label=f"{text.megabytes(rate)}/s",
    )
    ax.set_xlabel("seconds from the first steady iteration")
    ax.set_ylabel(f"{fig.finding['metrics'].get('component')} (MB)")
    ax.legend(fontsize=8, frameon=False)
    return figure


@memory_growth.key_figures(
    KeyFigure("pta_growth_mb_per_s", "PTA baseline growth (steady)", "lower", "MB/s"),
    KeyFigure("outside_growth_mb_per_s", "growth outside torch (steady)", "lower", "MB/s"),
    KeyFigure("peak_allocated_mb", "peak PTA allocated", "lower", "MB"),
    KeyFigure("peak_app_mb", "peak process device memory (APP)", "lower", "MB"),
)
def _key_figures(ctx: RuleContext) -> list[dict[str, Any]]:
    """Per rank: the Theil-Sen growth of the PTA and outside baselines over the steady
    iterations (the session with the most), whatever the verdict, and the peaks."""
    memory = device_memory(ctx)
    rows = []
    for (rank,), levels in memory.levels.group_by("rank", maintain_order=True):
        row: dict[str, Any] = {"rank": int(rank)}  # type: ignore[arg-type]
        for component, key in ((PTA, "pta_growth_mb_per_s"), (APP, "outside_growth_mb_per_s")):
            steps = steady_steps(memory, component).filter(pl.col("rank") == rank)
            longest = steps["session"].mode().sort().to_list()[:1] if steps.height else []
            growth = baseline_growth(steps.filter(pl.col("session").is_in(longest)))
            enough = growth is not None and growth.iterations >= ctx.params.min_iterations
            row[key] = growth.over_time.slope if enough and growth else None
        highest = levels.group_by("component").agg(
            pl.coalesce("peak_allocated_mb", "peak_reserved_mb").max().alias("peak")
        )
        peaks = dict(highest.iter_rows())
        row["peak_allocated_mb"] = peaks.get(PTA)
        row["peak_app_mb"] = peaks.get(APP)
        rows.append(row)
    return rows
