"""TA007 online-compile: operators are compiled online in steady-state steps (dynamic shapes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    COMPILE_API,
    FigureContext,
    Finding,
    KeyFigure,
    Param,
    RuleContext,
    SteadyUse,
    host_api,
    host_calls,
    per_step_figure,
    recurring_calls,
    rule,
    steady_key_figures,
    text,
)


@rule(
    id="TA007",
    name="online-compile",
    severity="warning",
    summary="Operators are compiled online (aclopCompile*) in steady-state steps: shapes keep changing.",
    params={
        "compile_pattern": Param(
            COMPILE_API,
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
        host_api("aclopCompile*", "opCompile"),
    ],
    uses=[recurring_calls],
)
def online_compile(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Operator compilation on the host (`aclopCompile*`, `AscendCL@aclopCompileAndExecute*` with
    its `opCompile`) inside steady-state steps (the `steps` table's, not warm-up, dummy or
    idle). Only the compile itself is timed: an `aclopCompileAndExecute` that shows an `opCompile` inside
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
    every = ctx.once(_compiles)
    long_enough = pl.col("dur_ns") >= p.min_compile_us * 1000
    hits = every.filter(~long_enough).group_by("rank").len()
    aside = {
        int(rank): f"{n} compile-cache hits under {p.min_compile_us:g} µs"
        for rank, n in hits.iter_rows()
    }
    for use in recurring_calls(ctx, every.filter(long_enough), "compile calls", aside):
        yield _finding(ctx, use)


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


def _finding(ctx: RuleContext, use: SteadyUse) -> Finding:
    t, n, sites = use.totals, use.steps, use.sites
    title = (
        f"Operators compiled online in {t['steps_with']} of {n} steady steps: "
        f"{text.number(round(t['calls'] / n, 2))} compiles per step, "
        f"{text.duration(t['cost_ns'] / n)} per step ({t['cost_share']:.0%} of the steady "
        f"step time), at {text.join(sites, 3)}"
    )
    message = (
        f"On rank {use.rank}, the host compiled operators {t['calls']} times in {n} steady "
        f"step(s) (after the warm-up steps, which compiled "
        f"{t['warmup_calls']} times), for {text.duration(t['cost_ns'])}: shapes that keep "
        "changing are compiled again and again. Calls: "
        f"{text.join(sorted(set(use.calls['name'])))}."
    )
    return use.finding(
        ctx,
        title=title,
        message=message,
        location={"compile": "online"},
        fix=(
            "Stop compiling in the loop: `torch_npu.npu.set_compile_mode(jit_compile=False)` "
            f"(binary kernels) for {text.join(sites, 3)}; if shapes must vary, bucket or pad them "
            "so a few shapes repeat."
        ),
    )


@online_compile.figure(caption="Time compiling operators per step; warm-up steps in grey.")
def _figure(fig: FigureContext) -> Any:
    return per_step_figure(fig, "compile time (µs)")


@online_compile.key_figures(
    KeyFigure("compile_calls_per_step", "online compiles per steady step", "lower", "count"),
    KeyFigure("compile_ns_per_step", "compile time per steady step", "lower", "ns"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    calls = ctx.once(_compiles).filter(pl.col("dur_ns") >= ctx.params.min_compile_us * 1000)
    return steady_key_figures(ctx, calls, "compile_calls_per_step", "compile_ns_per_step")
