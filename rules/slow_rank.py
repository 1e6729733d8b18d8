"""TA003 slow-rank: a rank whose step or transfer time is an outlier against its peers, with why."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from traceanalyzer.kit import (
    COMMUNICATION_PROCESSES,
    NS,
    OUTLIER_EXCESS,
    OUTLIER_Z,
    STEADY_PHASES,
    STEP_SPAN_PREFIX,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
    AnyOf,
    Cost,
    Evidence,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    Requirement,
    RuleContext,
    communication_ops,
    moe_imbalance,
    phase_windows,
    robust_z,
    rule,
    total_length,
)
from traceanalyzer.kit import text as fmt

CAUSES = {
    "compute": (
        "device compute",
        "the NPU computes longer on this rank: look for different shapes or batch sizes, a "
        "throttled or faulty device (AI Core frequency counters), or operators that fall back to "
        "AICPU only here",
    ),
    "host": (
        "host-bound gaps",
        "the device idles between tasks: the host feeds it slowly (CPU contention, NUMA binding, "
        "Python overhead, GC, data loading, logging) on this rank",
    ),
    "communication": (
        "waiting in communication",
        "the rank sits in collectives/transfers longer than its peers: a slow link or NIC, a "
        "congested switch port, or its communication peers arrive late",
    ),
}
# the cause when the excess is a hot expert rank's compute (not one of the step's parts)
MOE_CAUSE = (
    "expert load imbalance",
    "it is a hot expert rank: its experts get more routed tokens than its peers'; "
    "moe-load-imbalance reports it and counts its cost (balance the expert load: EPLB)",
)
FIX = (
    "Fix the cause named in the finding on the slow rank itself: compare its device (frequency, "
    "health), its host (CPU binding, load, logging) and its links against a healthy peer. One "
    "slow rank makes every synchronous collective wait for it, so the whole job runs at its pace."
)


@dataclass
class RankTimes:
    """Per-rank medians (ns per step) of the total and of each cause."""

    rank: int
    total: float
    parts: dict[str, float]
    steps: int
    sessions: list[str]


@rule(
    id="TA003",
    name="slow-rank",
    severity="warning",
    scope="global",
    summary="A rank's step or transfer time is an outlier against its peers; the cause is named.",
    fix=FIX,
    params={
        "z_threshold": Param(
            OUTLIER_Z, "Robust z-score (median/MAD) a rank must exceed (Iglewicz-Hoaglin: 3.5)."
        ),
        "min_excess": Param(
            OUTLIER_EXCESS,
            "The rank must also be this much slower than the peers' median (0.10 = 10%).",
        ),
        "min_ranks": Param(4, "Fewer ranks than this is too few peers to call an outlier."),
        "metric": Param(
            "auto",
            "`step`: step time; `transfer`: communication transit time per step; `auto`: both.",
            choices=("auto", "step", "transfer"),
        ),
        "step_source": Param(
            "auto",
            "`step_times` (step_trace_time.csv), `slices` (ProfilerStep#N spans and device tasks) "
            "or `auto` (step_times when every rank has it).",
            choices=("auto", "step_times", "slices"),
        ),
        "wait_task_types": Param(
            (*WAIT_TASK_TYPES, *WAIT_TASK_NAMES),
            "Device task types counted as waiting in communication (slices source).",
        ),
        "comm_processes": Param(
            COMMUNICATION_PROCESSES, "Processes whose tasks are communication (slices source)."
        ),
    },
    # a hot expert rank's longer compute is moe-load-imbalance's: asked who owns it
    uses=[moe_imbalance],
    requires=[
        AnyOf(
            Requirement(
                "step_times",
                ("computing_ns", "free_ns"),
                what="step time breakdown (step_trace_time.csv)",
                collect_with="a profiler schedule (steps)",
            ),
            Requirement(
                "slices",
                ("name",),
                what="ProfilerStep#N spans",
                collect_with="a profiler schedule and prof.step() in the loop",
                where=pl.col("name").str.starts_with(STEP_SPAN_PREFIX),
            ),
            communication_ops(
                columns=("transit_ns",), collect_with="a multi-rank job with collectives"
            ),
        )
    ],
    units={
        "median_ns": NS,
        "peers_median_ns": NS,
        "moe_owned_ns": NS,
        **{f"{cause}_ns": NS for cause in CAUSES},
        **{f"{cause}_excess_ns": NS for cause in CAUSES},
    },
)
def slow_rank(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    A rank that is slow compared with its peers: its median **step time** (from
    `step_trace_time.csv`, or from `ProfilerStep#N` spans) or its median **transfer time** (the
    communication transit time per step, from `communication.json`) has a robust z-score above
    `z_threshold` -- z = 0.6745 (x - median) / MAD over all ranks -- and exceeds the median by at
    least `min_excess`. The cause is attributed from the rank's own tables: for each part of the
    step -- **device compute** (Computing), **host-bound gaps** (the rest of the step's wall
    time, Stage: Free, Preparing and the tail, where the device idles waiting for the host) and
    **waiting in communication** (Communication not overlapped) -- the excess
    over the peers' median is computed, and the part with the largest excess is the cause.
    Ranks with the same metric and cause are grouped into one finding. A rank whose excess is
    device compute and that `moe-load-imbalance` names a hot expert rank gets the cause
    "expert load imbalance" and no cost of its own (`moe_owned_ns`): that finding counts it.
    It compares medians, which a few much slower iterations do not move: those are
    `tail-iteration`'s, which follows each to the rank the others waited on.

    ## Why it matters
    Synchronous collectives make every rank wait for the slowest one: one slow rank out of 64
    sets the pace of the job, and on the other 63 its slowness shows up as *communication wait*,
    which points at the wrong place. Comparing each rank against the robust centre of its peers
    finds the straggler; the breakdown says whether to look at the device, the host or the link.

    ## How to fix
    - **device compute**: compare the device's AI Core frequency and health with a peer's; look
      for different shapes/batch on this rank and for AICPU fallbacks.
    - **host-bound gaps**: check CPU binding/NUMA, other processes on the host, Python-side work
      (logging, GC, data loading) that only this rank does.
    - **waiting in communication**: check the rank's links (HCCS/RDMA bandwidth in
      `communication_matrix.json`), its NIC and switch port, and which peers it waits for.

    ## Example
    ```
    TA003 slow-rank [warning] rank 5 (1/8)
    rank 5 is slow: step time 1.42 ms vs peers' median 0.98 ms (+45%, robust z=12.3); cause:
    host-bound gaps (+0.41 ms per step)
    ```
    Silent when all ranks are within `min_excess` of the median, and on a single rank (no peers);
    not evaluated with 2 to `min_ranks - 1` ranks (too few peers for a robust centre).

    ## References
    - B. Iglewicz and D. Hoaglin, *How to Detect and Handle Outliers* (1993): the modified
      z-score and its 3.5 cut-off.
    - msprof-analyze advisor "slow rank" (step_trace_time.csv computing/communication/free) and
      Nsight Systems `nccl_straggler`: the same question, answered with a fixed max/min ratio.
    """
    p = ctx.params
    sessions = ctx.sessions()
    ranks = sorted(int(r) for r in sessions["rank"].unique().to_list())
    needed = max(2, p.min_ranks)  # one rank has no peers, whatever min_ranks says
    if len(ranks) < needed:
        # the data is there, there is not enough of it: inconclusive, never "clean"
        ctx.inconclusive(
            f"needs at least {needed} ranks to compare (found {len(ranks)}; min_ranks)",
            ranks=len(ranks),
        )
        return
    names = {
        int(r): s for r, s in sessions.group_by("rank").agg(pl.col("session").sort()).iter_rows()
    }
    evaluated = False
    if p.metric in ("auto", "step"):
        times = _step_times(ctx, ranks, names)
        if times:
            evaluated = True
            yield from _judge(ctx, "step", times)
    if p.metric in ("auto", "transfer"):
        times = _transfer_times(ctx, names)
        if times:
            evaluated = True
            yield from _judge(ctx, "transfer", times)
    if not evaluated and not any(n.inconclusive for n in ctx.notes):  # said why already
        raise NotEvaluated(
            f"fewer than {p.min_ranks} ranks have step times (step_trace_time.csv or "
            "ProfilerStep#N spans) or communication ops"
        )


# --------------------------------------------------------------------------- per-rank times


def _step_times(ctx: RuleContext, ranks: list[int], names: dict[int, list[str]]) -> list[RankTimes]:
    p = ctx.params
    cols = ("computing_ns", "communication_not_overlapped_ns", "free_ns")
    table = _steady(
        ctx,
        ctx.table("step_times")
        .select("rank", "session", "step", "stage_ns", *cols)
        .drop_nulls(list(cols))
        .collect(),  # a few rows per step and rank: small even for 1,024 ranks
        on=["rank", "session", "step"],
    )
    have = set(table["rank"].unique().to_list())
    use_table = p.step_source == "step_times" or (
        p.step_source == "auto" and have and have >= set(ranks)
    )
    if use_table:
        # Stage is the step's wall time; what compute and exposed communication do not cover is
        # the device idling (Free, Preparing, the tail): time the host did not feed it.
        compute, comm = pl.col("computing_ns"), pl.col("communication_not_overlapped_ns")
        total = (
            pl.when(pl.col("stage_ns") > 0)
            .then(pl.col("stage_ns"))
            .otherwise(pl.sum_horizontal(*cols))
        )
        per_rank = (
            table.with_columns(total.alias("total"))
            .with_columns((pl.col("total") - compute - comm).clip(0).alias("idle"))
            .group_by("rank")
            .agg(
                pl.col("total").median(),
                compute.median().alias("compute"),
                pl.col("idle").median().alias("host"),
                comm.median().alias("communication"),
                pl.len().alias("steps"),
            )
        )
        return [
            RankTimes(
                row["rank"],
                row["total"],
                {k: row[k] for k in CAUSES},
                row["steps"],
                names.get(row["rank"], []),
            )
            for row in per_rank.sort("rank").iter_rows(named=True)
        ]
    if p.step_source == "step_times":
        return []
    return _step_times_from_slices(ctx, ranks, names)


def _steady(ctx: RuleContext, steps: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """``steps`` less the warm-up, dummy and idle ones (the steps table's phases): a rank is
    judged on the steps that served its workload; a step the table does not know stays."""
    windows = phase_windows(ctx)
    phases = windows.filter(pl.col("step_source") == "profiler_step").select(*on, "phase")
    placed = steps.join(phases.unique(on, keep="first"), on=on, how="left", nulls_equal=True)
    # a row for a whole session (no ProfilerStep) covers what its iterations served
    start_up = (
        windows.group_by("rank", "session")
        .agg(pl.col("phase").is_in(list(STEADY_PHASES)).any().alias("_served"))
        .filter(~pl.col("_served"))
        .select("rank", "session", pl.lit("warmup").alias("_session_phase"))
    )
    placed = placed.join(start_up, on=["rank", "session"], how="left").with_columns(
        pl.coalesce("phase", "_session_phase").alias("phase")
    )
    steady = pl.col("phase").is_null() | pl.col("phase").is_in(list(STEADY_PHASES))
    kept = placed.filter(steady).drop("phase", "_session_phase")
    if kept.is_empty() and not steps.is_empty():
        ctx.inconclusive(
            f"step: all {steps.height} profiled steps are warm-up, dummy or idle (the steps "
            "table's phases; steps.warmup_steps): no steady step to compare; profile steps "
            "past the start-up",
            steps=steps.height,
        )
    return kept


def _step_times_from_slices(
    ctx: RuleContext, ranks: list[int], names: dict[int, list[str]]
) -> list[RankTimes]:
    """ProfilerStep#N windows and the device tasks inside them, one rank at a time.

    Reading rank by rank (only five columns, pushed down into the Parquet scan) keeps the
    driver's memory at one rank's device tasks, however many ranks there are.
    """
    p = ctx.params
    steps_all = _steady(
        ctx,
        ctx.table("slices")
        .filter(pl.col("name").str.starts_with(STEP_SPAN_PREFIX))
        .select("rank", "session", "start_ns", "end_ns")
        .collect(),
        on=["rank", "session", "start_ns"],
    )
    out = []
    for rank in ranks:
        steps = steps_all.filter(pl.col("rank") == rank)
        if steps.is_empty():
            continue
        tasks = (
            ctx.table("slices")
            .filter(
                (pl.col("rank") == rank)
                & pl.col("process").is_in(["Ascend Hardware", *p.comm_processes])
                & (pl.col("end_ns") > pl.col("start_ns"))
            )
            .select("session", "process", "task_type", "start_ns", "end_ns")
            .collect()
        )
        waiting = pl.col("process").is_in(list(p.comm_processes)) | pl.col("task_type").is_in(
            list(p.wait_task_types)
        )
        windows = steps.with_row_index("step")
        clipped = (
            tasks.join_where(
                windows.select("session", "step", "start_ns", "end_ns").rename(
                    {"session": "s", "start_ns": "ws", "end_ns": "we"}
                ),
                pl.col("session") == pl.col("s"),
                pl.col("start_ns") < pl.col("we"),
                pl.col("end_ns") > pl.col("ws"),
            )
            .with_columns(
                pl.max_horizontal("start_ns", "ws").alias("start_ns"),
                pl.min_horizontal("end_ns", "we").alias("end_ns"),
            )
            .with_columns(waiting.alias("waiting"))
        )
        busy = _per_step(clipped, "busy")
        compute = _per_step(clipped.filter(~pl.col("waiting")), "compute")
        per_step = (
            windows.select("step", (pl.col("end_ns") - pl.col("start_ns")).alias("total"))
            .join(busy, on="step", how="left")
            .join(compute, on="step", how="left")
            .fill_null(0)
            .with_columns(
                (pl.col("total") - pl.col("busy")).clip(0).alias("host"),
                (pl.col("busy") - pl.col("compute")).clip(0).alias("communication"),
            )
        )
        out.append(
            RankTimes(
                rank,
                float(per_step["total"].median()),
                {k: float(per_step[k].median()) for k in CAUSES},
                per_step.height,
                names.get(rank, []),
            )
        )
    return out


def _per_step(tasks: pl.DataFrame, name: str) -> pl.DataFrame:
    covered = total_length(tasks.select("step", "start_ns", "end_ns"), by=["step"])
    return covered.rename({"covered_ns": name})


def _transfer_times(ctx: RuleContext, names: dict[int, list[str]]) -> list[RankTimes]:
    """Communication transit time per step (communication.json), and the wait beside it."""
    ops = (
        ctx.table("comm_ops")
        .select("rank", "step", "transit_ns", "wait_ns")
        .drop_nulls("transit_ns")
        .group_by("rank", "step")
        .agg(pl.col("transit_ns").sum(), pl.col("wait_ns").sum())
        .group_by("rank")
        .agg(pl.col("transit_ns").median(), pl.col("wait_ns").median(), pl.len().alias("steps"))
        .collect()
    )
    return [
        RankTimes(
            row["rank"],
            float(row["transit_ns"]),
            {"communication": float(row["transit_ns"])},
            row["steps"],
            names.get(row["rank"], []),
        )
        for row in ops.sort("rank").iter_rows(named=True)
    ]


# --------------------------------------------------------------------------- verdict


def _judge(ctx: RuleContext, metric: str, times: list[RankTimes]) -> Iterator[Finding]:
    p = ctx.params
    if len(times) < p.min_ranks:
        ctx.inconclusive(
            f"{metric}: only {len(times)} ranks have {metric} times (min_ranks {p.min_ranks})",
            ranks=len(times),
        )
        return
    totals = np.array([t.total for t in times], dtype=float)
    z = robust_z(totals)
    median = float(np.median(totals))
    label = "step time" if metric == "step" else "transfer time per step"
    fired = False
    for t, score in zip(times, z, strict=True):
        excess = (t.total - median) / median if median > 0 else 0.0
        if score <= p.z_threshold or excess < p.min_excess:
            continue
        fired = True
        peers = [o for o in times if o.rank != t.rank]
        deltas = {
            k: v - float(np.median([o.parts.get(k, 0.0) for o in peers]))
            for k, v in t.parts.items()
        }
        cause = max(deltas, key=lambda k: deltas[k])
        # its longer compute is its experts': moe-load-imbalance counts what it costs
        moe = metric == "step" and cause == "compute" and t.rank in moe_imbalance(ctx).hot_ranks
        cause_name, advice = MOE_CAUSE if moe else CAUSES[cause]
        part, cause = cause, "moe" if moe else cause  # part: the step's part that grew
        if metric == "transfer":
            cause_name, advice = "slow transfers", CAUSES["communication"][1]
        lost = max(t.total - median, 0.0) * t.steps
        breakdown = ", ".join(
            f"{CAUSES[k][0] if metric == 'step' else 'transit'} {fmt.duration(v)} "
            f"({deltas[k] / 1e6:+.3g} ms vs peers)"
            for k, v in t.parts.items()
        )
        title = (
            f"rank {t.rank} is slow: {label} {fmt.duration(t.total)} vs peers' median "
            f"{fmt.duration(median)} ({excess:+.0%}, robust z={score:.1f}); cause: {cause_name}"
            + (f" ({deltas[part] / 1e6:+.3g} ms per step)" if metric == "step" else "")
        )
        message = "\n".join(
            [
                f"Median {label} over {t.steps} step(s) on rank {t.rank}: {fmt.duration(t.total)}; "
                f"median over all {len(times)} ranks: {fmt.duration(median)}; robust z-score "
                f"{score:.1f} (threshold {p.z_threshold}).",
                f"Per step on rank {t.rank}: {breakdown}.",
                f"Cause: {cause_name} -- {advice}.",
                *([f"moe-load-imbalance counts its cost ({fmt.duration(lost)})."] if moe else []),
            ]
        )
        yield ctx.finding(
            rank=t.rank,
            sessions=t.sessions,
            title=title,
            message=message,
            location={"metric": metric, "cause": cause},
            # what the rank loses against its peers over its steps; none where the MoE owns it
            cost=Cost(0.0, 0.0)
            if moe
            else Cost(lost, lost / t.steps / t.total if t.total else None),
            metrics={
                "median_ns": t.total,
                "peers_median_ns": median,
                "moe_owned_ns": lost if moe else 0.0,
                "excess": excess,
                "robust_z": float(score),
                "steps": t.steps,
                **{f"{k}_ns": v for k, v in t.parts.items()},
                **{f"{k}_excess_ns": v for k, v in deltas.items()},
            },
            evidence=[
                Evidence(
                    rank=t.rank,
                    session=t.sessions[0] if t.sessions else "",
                    name=f"median {label}",
                    dur_ns=int(t.total),
                    detail=breakdown,
                )
            ],
            score=float(score),
        )
    if not fired:
        worst = int(np.argmax(z))
        ctx.note(
            f"{metric}: no outlier among {len(times)} ranks (max robust z {z[worst]:.1f} on rank "
            f"{times[worst].rank}; threshold {p.z_threshold})",
            ranks=len(times),
            max_robust_z=float(z[worst]),
        )


# --------------------------------------------------------------------------------------------
# Key figures: step time per rank
# --------------------------------------------------------------------------------------------


@slow_rank.key_figures(
    KeyFigure("steps", "steps", unit="count"),
    KeyFigure("step_ns_mean", "step time (mean)", better="lower", unit="ns"),
    KeyFigure("step_ns_median", "step time (median)", better="lower", unit="ns"),
    KeyFigure("decode_ns_median", "decode iteration (median)", better="lower", unit="ns"),
    KeyFigure("prefill_ns_median", "prefill iteration (median)", better="lower", unit="ns"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Per rank, its steady steps (the steps table's: iterations that served the workload, not
    warm-up, dummy or idle) and their time, and the median decode and prefill iteration: a
    run with more prefill traffic moves the mean step, not the decode median."""
    steps = (
        phase_windows(ctx)
        .filter(pl.col("phase").is_in(list(STEADY_PHASES)))
        .select("rank", "phase", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    )
    dur = pl.col("dur_ns")
    return steps.group_by("rank").agg(
        pl.len().alias("steps"),
        dur.mean().alias("step_ns_mean"),
        dur.median().alias("step_ns_median"),
        dur.filter(pl.col("phase") == "decode").median().alias("decode_ns_median"),
        dur.filter(pl.col("phase") == "prefill").median().alias("prefill_ns_median"),
    )
