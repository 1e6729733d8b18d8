"""Device memory for rules: the memory stage's tables (:mod:`traceanalyzer.memory`), the
device's capacity as a parameter, and the trend of a baseline across steady iterations.

A rule that reads memory declares ``uses=[device_memory]`` (its ``capacity_gb`` parameter) and
``requires=[memory_records()]``; :func:`baseline_growth` is memory-growth's test, shared with
its key figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.engine.rule import Requirement, RuleContext, helper
from traceanalyzer.memory import COLLECT_WITH, MEMORY_PARAMS, MISSING, RankMemory, memory_of
from traceanalyzer.stats import Trend, trend
from traceanalyzer.text import p_value

MAX_POINTS = 1000  # a longer series is trended in this many bins (the tests are O(n^2))
FIGURE_POINTS = 400  # steps a finding's series keeps for its figure


@helper(params=MEMORY_PARAMS)
def device_memory(ctx: RuleContext) -> RankMemory:
    """The memory of the ranks in scope (:class:`~traceanalyzer.memory.RankMemory`), derived
    once per store; the rule's ``capacity_gb`` is the device's capacity (0: unknown)."""
    return memory_of(ctx.store, ctx.ranks)


def memory_records() -> Requirement:
    """The allocators' records (memory_record.csv, Db MEMORY_RECORD / NPU_MEM): not evaluated
    without them, "missing memory_record (collect with profile_memory=True)"."""
    return Requirement("memory_records", ("ts_ns",), what=MISSING, collect_with=COLLECT_WITH)


@dataclass(frozen=True)
class Growth:
    """How a baseline moved across steady iterations (MB, seconds from the first iteration)."""

    iterations: int
    first_ns: int
    last_ns: int
    start_mb: float
    end_mb: float
    over_time: Trend  # Theil-Sen slope in MB/s, Mann-Kendall over the whole window
    per_iteration_mb: float  # Theil-Sen slope per iteration
    late: Trend  # the later half alone, per iteration (its Theil-Sen slope)
    # the later half's lowest tenth above the start, as a share of what the slope had added by
    # the half: ~1 for a leak (a sawtooth on it too), ~0 for a sawtooth back to its baseline
    kept: float

    @property
    def grown_mb(self) -> float:
        """What the robust slope says the window grew by."""
        return self.per_iteration_mb * (self.iterations - 1)

    def verdict(self, p: Any) -> str | None:
        """None when the baseline grows as a leak does, else why not (in words): a significant
        upward trend (``alpha``) of at least ``min_growth_mb`` that the later half keeps up
        (``late_share`` of the slope: not warm-up growth that plateaus) and
        that keeps ``min_kept`` of it through the later half (not a sawtooth back to its
        baseline)."""
        mk = self.over_time.mk.p_increasing
        if mk >= p.alpha:
            return f"no upward trend (Mann-Kendall {p_value(mk)}, alpha {p.alpha:g})"
        if self.per_iteration_mb <= 0:
            return (
                f"most iterations keep it level (Theil-Sen slope 0; Mann-Kendall {p_value(mk)}): "
                "its growth is confined to a few iterations"
            )
        if self.grown_mb < p.min_growth_mb:
            return f"grew {self.grown_mb:.1f} MB, below min_growth_mb ({p.min_growth_mb:g})"
        if self.late.slope < p.late_share * self.per_iteration_mb:
            return (
                "the growth stops: the later half's slope is "
                f"{self.late.slope:.3g} MB/iteration against {self.per_iteration_mb:.3g} overall "
                f"(late_share {p.late_share:.0%}): warm-up that plateaus"
            )
        if self.kept < p.min_kept:
            return (
                f"it returns toward its baseline: the later half's lowest tenth keeps "
                f"{self.kept:.0%} of the growth the slope gives it (min_kept {p.min_kept:.0%})"
            )
        return None


def _binned(steps: pl.DataFrame) -> pl.DataFrame:
    """At most :data:`MAX_POINTS` rows: consecutive iterations binned, each bin its lowest
    baseline (still a baseline) at its first iteration's start and index."""
    steps = steps.with_row_index("_i")
    if steps.height <= MAX_POINTS:
        return steps
    size = -(-steps.height // MAX_POINTS)
    return (
        steps.group_by((pl.col("_i") // size).alias("_bin"), maintain_order=True)
        .agg(pl.col("_i").first(), pl.col("start_ns").first(), pl.col("baseline_mb").min())
        .drop("_bin")
    )


def _kept(values: np.ndarray, index: np.ndarray, slope: float) -> float:
    """What the later half keeps of the growth: its lowest tenth above the first value, over
    what ``slope`` had added by the half (robust to a few dips; 0 without growth)."""
    half = len(values) // 2
    expected = slope * (index[half] - index[0])
    if expected <= 0:
        return 0.0
    return float(np.quantile(values[half:], 0.1) - values[0]) / expected


def baseline_growth(steps: pl.DataFrame) -> Growth | None:
    """The trend of ``steps``' ``baseline_mb`` (one series of one session's steady windows, in
    time order; ``start_ns``); None without two iterations."""
    steps = steps.drop_nulls("baseline_mb")
    if steps.height < 2:
        return None
    points = _binned(steps)
    y = points["baseline_mb"].to_numpy().astype(float)
    t0 = int(steps["start_ns"][0])
    seconds = (points["start_ns"].to_numpy() - t0) / 1e9
    index = points["_i"].to_numpy().astype(float)
    half = len(y) // 2
    per_iteration = trend(y, index).slope
    return Growth(
        iterations=steps.height,
        first_ns=t0,
        last_ns=int(steps["end_ns"][-1]),
        start_mb=float(y[0]),
        end_mb=float(y[-1]),
        over_time=trend(y, seconds),
        per_iteration_mb=per_iteration,
        late=trend(y[half:], index[half:]),
        kept=_kept(y, index, per_iteration),
    )


def step_series(steps: pl.DataFrame, **columns: pl.Expr) -> dict[str, list[Any]]:
    """A finding's ``series`` of steps (``start_ns`` and each of ``columns``): at most
    :data:`FIGURE_POINTS` of them, evenly picked, the first and last included."""
    pick = np.unique(np.linspace(0, steps.height - 1, min(steps.height, FIGURE_POINTS)).astype(int))
    shown = steps[pick.tolist()].select("start_ns", **columns)
    return {name: shown[name].to_list() for name in shown.columns}


def step_seconds(series: Mapping[str, Any]) -> list[float]:
    """The seconds of each step of a :func:`step_series` from the first (none without steps):
    the x axis of the memory rules' figures."""
    starts = series.get("start_ns") or []
    return [(t - starts[0]) / 1e9 for t in starts]
