"""TA007 online-compile: operators are compiled online in steady-state steps (dynamic shapes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.engine.cost import analysed_window_ns, share
from traceanalyzer.engine.steps import (
    NO_STEPS,
    STEP_PARAMS,
    call_sites,
    host_calls,
    in_steps,
    per_step_figure,
    steady_state_usage,
    step_windows,
)
from traceanalyzer.kit import (
    CANN_PROCESS,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    Requirement,
    RuleContext,
    rule,
    text,
)

WORST_SHOWN = 5


@rule(
    id="TA007",
    name="online-compile",
    severity="warning",
    summary="Operators are compiled online (aclopCompile*) in steady-state steps: shapes keep changing.",
    params={
        **STEP_PARAMS,
        "compile_pattern": Param(
            r"^(?:aclopCompile\w*|opCompile\w*)$",
            "Regex on CANN api_name of compile calls (an `aclopCompileAndExecute` with an "
            "`opCompile` inside counts only the inner compile).",
        ),
        "min_compile_us": Param(
            100.0,
            "Shorter compile calls are compile-cache hits, not compilation (µs); building an "
            "operator takes milliseconds or more.",
        ),
        "min_step_share": Param(
            0.5, "Fire when at least this fraction of the steady steps compiles (not warm-up)."
        ),
        "min_share": Param(0.002, "...and compiling takes at least this share of their time."),
    },
    requires=[
        Requirement(
            "slices",
            ("api_name",),
            what="CANN API events (`aclopCompile*`, `opCompile`)",
            collect_with="profiler_level=Level1",
            where=pl.col("process") == CANN_PROCESS,
        ),
    ],
)
def online_compile(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Operator compilation on the host (`aclopCompile*`, `AscendCL@aclopCompileAndExecute*` with
    its `opCompile`) inside steady-state steps: steps numbered above `warmup_steps`. Only the
    compile itself is timed: an `aclopCompileAndExecute` that shows an `opCompile` inside
    counts that inner call, not the execute around it, and a compile call shorter than
    `min_compile_us` is a compile-cache hit, not a compilation. It fires when at least `min_step_share`
    of the steady steps compile and the compiles take at least `min_share` of their time, and
    names the torch ops that compiled.

    ## Why it matters
    With online compilation (`jit_compile=True`), every new input shape builds the operator
    again, for milliseconds to seconds, while the device waits. Warm-up steps compile once and
    then hit the cache; a steady state that keeps compiling means shapes change step after step
    (dynamic shapes), so the cost is paid forever.

    ## How to fix
    - `torch_npu.npu.set_compile_mode(jit_compile=False)` (the default in recent torch_npu):
      use the precompiled binary kernels instead of compiling online.
    - Bucket or pad the dynamic dimensions so a few shapes repeat.
    - Where a fused or `aclnn` operator exists for the op, use it.

    ## Example
    ```
    TA007 online-compile [warning] rank 0
    Operators compiled online in 5 of 5 steady steps: 2 compiles per step, 4 ms per step (61% of
    the steady step time), at aclnnRmsNorm
    ```
    Silent when only warm-up steps compile, on short cache lookups below `min_share`, and on
    a few stray steps. Without steps: not evaluated.

    ## References
    - msprof-analyze advisor: dynamic shape checker and op dispatch checker (`aclopCompile`
      count; `set_compile_mode(jit_compile=False)`).
    """
    p = ctx.params
    steps = step_windows(ctx)
    if steps.is_empty():
        raise NotEvaluated(NO_STEPS)
    every = in_steps(_compiles(ctx), steps)
    long_enough = pl.col("dur_ns") >= p.min_compile_us * 1000
    calls = every.filter(long_enough)
    hits = every.filter(~long_enough & pl.col("steady")).group_by("rank").len()
    hits_of = dict(hits.iter_rows())
    per_step, per_rank = steady_state_usage(steps, calls)
    windows = analysed_window_ns(ctx)
    for row in per_rank.iter_rows(named=True):
        rank = int(row["rank"])
        if not row["steady_steps"]:
            ctx.note(f"rank {rank}: only warm-up steps profiled", rank=rank)
            continue
        if row["step_share"] < p.min_step_share or row["cost_share"] < p.min_share:
            ctx.note(
                f"rank {rank}: {row['calls']} compile calls in {row['steps_with']} of "
                f"{row['steady_steps']} steady steps, {text.duration(row['cost_ns'])} "
                f"({row['cost_share']:.1%} of their time; thresholds {p.min_step_share:.0%} of "
                f"steps, {p.min_share:.0%}); {row['warmup_calls']} in warm-up steps; "
                f"{hits_of.get(rank, 0)} compile-cache hits under {p.min_compile_us:g} µs",
                rank=rank,
                cost_share=row["cost_share"],
            )
            continue
        mine = calls.filter((pl.col("rank") == rank) & pl.col("steady"))
        yield _finding(ctx, row, call_sites(ctx, mine), per_step, windows.get(rank))


def _compiles(ctx: RuleContext) -> pl.DataFrame:
    """The innermost compile calls: a call with another compile call inside it is dropped."""
    calls = host_calls(ctx, pattern=ctx.params.compile_pattern).sort("start_ns")
    thread = ["rank", "session", "process", "thread"]
    parents = (
        calls.with_row_index("_child")
        .join_asof(
            calls.with_row_index("_parent").select(
                *thread,
                "_parent",
                pl.col("start_ns").alias("p_start"),
                pl.col("end_ns").alias("p_end"),
            ),
            left_on="start_ns",
            right_on="p_start",
            by=thread,
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .filter(pl.col("p_end") >= pl.col("end_ns"))["_parent"]
    )
    return calls.with_row_index("_i").filter(~pl.col("_i").is_in(parents.implode())).drop("_i")


def _finding(
    ctx: RuleContext,
    row: dict[str, Any],
    calls: pl.DataFrame,
    per_step: pl.DataFrame,
    window_ns: int | None,
) -> Finding:
    rank, n = int(row["rank"]), int(row["steady_steps"])
    sites = (
        calls.group_by(pl.col("site").fill_null(pl.col("name")))
        .agg(pl.col("dur_ns").sum())
        .sort("dur_ns", "site", descending=[True, False])["site"]
        .to_list()
    )
    title = (
        f"Operators compiled online in {row['steps_with']} of {n} steady steps: "
        f"{text.number(round(row['calls'] / n, 2))} compiles per step, "
        f"{text.duration(row['cost_ns'] / n)} per step ({row['cost_share']:.0%} of the steady "
        f"step time), at {text.join(sites, 3)}"
    )
    message = (
        f"On rank {rank}, the host compiled operators {row['calls']} times in {n} steady step(s) "
        f"(after warm-up step(s) <= {ctx.params.warmup_steps}, which compiled "
        f"{row['warmup_calls']} times), for {text.duration(row['cost_ns'])}: shapes that keep "
        f"changing are compiled again and again. Calls: {text.join(sorted(set(calls['name'])))}."
    )
    evidence = [
        Evidence(
            rank,
            c["session"],
            c["name"],
            CANN_PROCESS,
            c["thread"],
            None,
            c["start_ns"],
            c["dur_ns"],
            f"step {c['step']}, call site {c['site'] or 'no torch op'}",
        )  # fmt: skip
        for c in calls.sort("dur_ns", descending=True).head(WORST_SHOWN).iter_rows(named=True)
    ]
    mine = per_step.filter(pl.col("rank") == rank)
    return ctx.finding(
        rank=rank,
        sessions=sorted(set(mine["session"])),
        title=title,
        message=message,
        location={"compile": "online"},
        metrics={
            "cost_ns": int(row["cost_ns"]),
            "cost_share": share(row["cost_ns"], window_ns),
            "steady_share": round(row["cost_share"], 4),
            "calls": int(row["calls"]),
            "calls_per_step": round(row["calls"] / n, 3),
            "steady_steps": n,
            "steps_with": int(row["steps_with"]),
            "warmup_calls": int(row["warmup_calls"]),
        },
        evidence=evidence,
        fix=(
            "Stop compiling in the loop: `torch_npu.npu.set_compile_mode(jit_compile=False)` "
            f"(binary kernels) for {text.join(sites, 3)}; if shapes must vary, bucket or pad them "
            "so a few shapes repeat."
        ),
        series={
            "step": mine["step"].to_list(),
            "value": [v / 1e3 for v in mine["call_ns"]],
            "steady": mine["steady"].to_list(),
        },
        score=float(row["cost_ns"]),
    )


@online_compile.figure(caption="Time compiling operators per step; warm-up steps in grey.")
def _figure(fig: FigureContext) -> Any:
    return per_step_figure(fig, "compile time (µs)")


@online_compile.key_figures(
    KeyFigure("compile_calls_per_step", "online compiles per steady step", "lower", "count"),
    KeyFigure("compile_ns_per_step", "compile time per steady step", "lower", "ns"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    steps = step_windows(ctx)
    calls = in_steps(_compiles(ctx), steps).filter(
        pl.col("dur_ns") >= ctx.params.min_compile_us * 1000
    )
    _, per_rank = steady_state_usage(steps, calls)
    n = pl.col("steady_steps")
    return per_rank.filter(n > 0).select(
        "rank",
        (pl.col("calls") / n).alias("compile_calls_per_step"),
        (pl.col("cost_ns") / n).alias("compile_ns_per_step"),
    )
