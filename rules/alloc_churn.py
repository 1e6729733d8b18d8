"""TA006 alloc-churn: device memory is allocated and freed through CANN in steady-state steps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    ALLOC_APIS,
    FREE_APIS,
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
    session_metadata,
    steady_key_figures,
    text,
)


@rule(
    id="TA006",
    name="alloc-churn",
    severity="warning",
    summary="Device memory is allocated and freed (aclrtMalloc/aclrtFree) in steady-state steps.",
    params={
        "alloc_apis": Param(
            (*ALLOC_APIS, *FREE_APIS),
            "AscendCL calls that allocate or free device memory.",
        ),  # fmt: skip
        "min_step_share": Param(
            0.5, "Fire when at least this fraction of the steady steps allocates (not warm-up)."
        ),
        "min_share": Param(
            0.002,
            "...and the calls take at least this share of the steady step time (a steady "
            "state should make no driver allocation at all).",
        ),
    },
    requires=[
        host_api("aclrtMalloc", "aclrtFree"),
    ],
    uses=[recurring_calls],
)
def alloc_churn(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    `aclrtMalloc` / `aclrtFree` / `aclrtMallocPhysical` calls (CANN, Level1+) inside
    steady-state steps (the `steps` table's, not warm-up, dummy or idle), where a caching
    allocator should serve every tensor from memory it already holds. It fires when at least `min_step_share` of
    the steady steps allocate and the calls take at least `min_share` of their time, and names
    the torch ops that triggered them.

    ## Why it matters
    Each `aclrtMalloc`/`aclrtFree` is a driver call of tens to hundreds of µs on the host, and
    the device waits while the host is stuck in it. In steady state it means the caching
    allocator keeps missing (fragmentation, a changing shape) or its blocks are handed back
    every step (`torch.npu.empty_cache()` in the loop).

    ## How to fix
    - `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`, so segments grow instead of new
      blocks being allocated for shapes that do not fit.
    - Remove `torch.npu.empty_cache()` (and `gc.collect()` + `empty_cache` pairs) from the loop.
    - Keep shapes stable across steps (padding, bucketing) so cached blocks are reused.
    The finding says whether `expandable_segments` was set and whether blocks are freed every step.

    ## Example
    ```
    TA006 alloc-churn [warning] rank 0
    aclrtMalloc/aclrtFree in 5 of 5 steady steps: 4 calls per step, 0.64 ms per step (9% of the
    steady step time), at aten::empty_strided, empty_cache
    ```
    Silent when only warm-up steps allocate (the allocator filling its cache), on a few stray
    steps, and below `min_share`. Without steps: not evaluated.

    ## References
    - msprof-analyze advisor memory checker (`aclMallocMemInner`/`aclrtFree` over 10 ms).
    - torch_npu `PYTORCH_NPU_ALLOC_CONF` (`expandable_segments`), `torch.npu.empty_cache`.
    """
    calls = host_calls(ctx, ctx.params.alloc_apis)
    for use in recurring_calls(ctx, calls, "alloc/free calls"):
        yield _finding(ctx, use)


def _fix(ctx: RuleContext, rank: int, frees: int, steps: int) -> str:
    """The fix that fits: expandable segments set or not, blocks freed every step or not."""
    sessions = ctx.sessions().filter(pl.col("rank") == rank)
    conf = {
        str(session_metadata(m).get("ENV_VARIABLES", {}).get("PYTORCH_NPU_ALLOC_CONF") or "")
        for m in sessions["metadata"]
    }
    parts = []
    if not any("expandable_segments:True" in c for c in conf):
        shown = ", ".join(sorted(c for c in conf if c)) or "unset"
        parts.append(
            f"Set `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True` (it was {shown}) so the "
            "allocator grows segments instead of allocating new blocks."
        )
    if frees >= steps:
        parts.append(
            "Blocks are freed back to the driver every step: remove `torch.npu.empty_cache()` "
            "(and forced `gc.collect()`) from the loop."
        )
    parts.append("Keep shapes stable across steps (pad or bucket) so cached blocks are reused.")
    return " ".join(parts)


def _finding(ctx: RuleContext, use: SteadyUse) -> Finding:
    t, n, sites = use.totals, use.steps, use.sites
    apis = sorted(set(use.calls["api_name"]))
    frees = use.calls.filter(pl.col("api_name").is_in(FREE_APIS)).height
    title = (
        f"{'/'.join(apis)} in {t['steps_with']} of {n} steady steps: "
        f"{text.number(round(t['calls'] / n, 2))} calls per step, "
        f"{text.duration(t['cost_ns'] / n)} per step ({t['cost_share']:.0%} of the steady "
        f"step time), at {text.join(sites, 3)}"
    )
    message = (
        f"On rank {use.rank}, the host called {text.join(apis)} {t['calls']} times in {n} steady "
        f"step(s) (after the warm-up steps, which made "
        f"{t['warmup_calls']} more), for {text.duration(t['cost_ns'])}: the caching "
        "allocator went to the driver instead of reusing its blocks, and the device waited."
    )
    return use.finding(
        ctx,
        title=title,
        message=message,
        location={"apis": "/".join(apis)},
        fix=_fix(ctx, use.rank, frees, n),
    )


@alloc_churn.figure(caption="Time in aclrtMalloc/aclrtFree per step; warm-up steps in grey.")
def _figure(fig: FigureContext) -> Any:
    return per_step_figure(fig, "alloc/free time (µs)")


@alloc_churn.key_figures(
    KeyFigure("alloc_ns_per_step", "alloc/free time per steady step", "lower", "ns"),
    KeyFigure("alloc_calls_per_step", "alloc/free calls per steady step", "lower", "count"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    calls = host_calls(ctx, ctx.params.alloc_apis)
    return steady_key_figures(ctx, calls, "alloc_calls_per_step", "alloc_ns_per_step")
