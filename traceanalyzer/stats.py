"""The statistics rules and the overview share: who is an outlier among peers, and whether a
series grows.

Iglewicz & Hoaglin's modified z-score: 0.6745 = Phi^-1(0.75) makes the median absolute deviation
(MAD) a consistent estimator of sigma; when MAD is 0 (most peers identical), 1.2533 times the
mean absolute deviation stands in for it.

Trend tests use numpy only (no scipy at runtime); p-values come from the normal approximations
that the hydrology/climate literature uses for Mann-Kendall, and Fisher's z for Spearman.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAD_SCALE, MEANAD_SCALE = 0.6745, 1.253314
# An outlier: robust z above Iglewicz & Hoaglin's 3.5 cut-off, and this much above the median
# (a tight cluster makes tiny differences look extreme). Rules take these as their defaults.
OUTLIER_Z, OUTLIER_EXCESS = 3.5, 0.10


def robust_z(values: Sequence[float] | np.ndarray, min_sigma: float = 0.0) -> np.ndarray:
    """Modified z-scores: 0.6745 (x - median) / MAD, with the mean-AD fallback when MAD is 0.

    ``min_sigma``: the least spread the scores are taken against (the estimated sigma is
    raised to it), so that differences too small to matter never score high."""
    values = np.asarray(values, dtype=float)
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median)))
    mean_ad = float(np.mean(np.abs(values - median)))
    sigma = mad / MAD_SCALE if mad > 0 else MEANAD_SCALE * mean_ad
    sigma = max(sigma, min_sigma)
    return (values - median) / sigma if sigma > 0 else np.zeros_like(values)


def outlier_z(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """:func:`robust_z` against a spread of at least ``OUTLIER_EXCESS / OUTLIER_Z`` of the
    median: a score above ``OUTLIER_Z`` is then also ``OUTLIER_EXCESS`` above the median, so
    a tight cluster's tiny differences never look extreme."""
    values = np.asarray(values, dtype=float)
    floor = abs(float(np.median(values))) * OUTLIER_EXCESS / OUTLIER_Z if values.size else 0.0
    return robust_z(values, min_sigma=floor)


# --------------------------------------------------------------------------------------------
# Trend tests
# --------------------------------------------------------------------------------------------


def theil_sen_slope(y: Sequence[float], x: Sequence[float] | None = None) -> float:
    """Median of the pairwise slopes: a trend estimate that a few outliers cannot move.

    ``x`` defaults to 0..n-1 (e.g. capture index). Returns 0.0 for fewer than two distinct x.
    """
    ys = np.asarray(y, dtype=float)
    xs = np.arange(len(ys), dtype=float) if x is None else np.asarray(x, dtype=float)
    i, j = np.triu_indices(len(ys), k=1)
    dx = xs[j] - xs[i]
    keep = dx != 0
    if not keep.any():
        return 0.0
    return float(np.median((ys[j] - ys[i])[keep] / dx[keep]))


@dataclass(frozen=True)
class MannKendall:
    """Mann-Kendall monotonic trend test. ``p_increasing`` is the one-sided p for an upward trend."""

    s: int
    z: float
    tau: float
    p_increasing: float


def mann_kendall(y: Sequence[float]) -> MannKendall:
    """Mann-Kendall test with the tie-corrected variance and a continuity correction.

    Distribution-free: it only asks whether later values tend to be larger than earlier ones, so
    it is not fooled by a single spike. With n < 3 there is no evidence: p = 1.
    """
    ys = np.asarray(y, dtype=float)
    n = len(ys)
    if n < 3:
        return MannKendall(0, 0.0, 0.0, 1.0)
    i, j = np.triu_indices(n, k=1)
    s = int(np.sign(ys[j] - ys[i]).sum())
    _, tie_counts = np.unique(ys, return_counts=True)
    ties = sum(t * (t - 1) * (2 * t + 5) for t in tie_counts if t > 1)
    var_s = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var_s <= 0:  # every value equal
        return MannKendall(s, 0.0, 0.0, 1.0)
    z = (s - math.copysign(1, s)) / math.sqrt(var_s) if s != 0 else 0.0
    tau = s / (n * (n - 1) / 2)
    return MannKendall(s=s, z=z, tau=tau, p_increasing=0.5 * math.erfc(z / math.sqrt(2)))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), 1-based."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman rank correlation and its two-sided p-value (Fisher z approximation).

    Returns ``(nan, 1.0)`` when either side is constant or n < 3, and p = 1.0 for n = 3.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    if n < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return float("nan"), 1.0
    rho = float(np.corrcoef(_ranks(xs), _ranks(ys))[0, 1])
    if n <= 3:  # Fisher's z needs n > 3
        return rho, 1.0
    if abs(rho) >= 1.0:
        return rho, 0.0
    z = math.atanh(rho) * math.sqrt((n - 3) / 1.06)
    return rho, math.erfc(abs(z) / math.sqrt(2))


def growth_ratio(y: Sequence[float], edge: int = 1) -> float:
    """Mean of the last ``edge`` values over the mean of the first ``edge`` values.

    ``edge`` > 1 smooths noise at both ends. A zero start gives ``inf`` when the end is positive
    (growth from nothing), 1.0 when both are zero.
    """
    ys = np.asarray(y, dtype=float)
    if len(ys) == 0:
        return float("nan")
    k = max(1, min(edge, len(ys) // 2 or 1))
    first, last = float(ys[:k].mean()), float(ys[-k:].mean())
    if first == 0:
        return 1.0 if last == 0 else float("inf")
    return last / first


@dataclass(frozen=True)
class Trend:
    """Everything a growth rule reports about one series (ordered by x)."""

    n: int
    slope: float  # Theil-Sen slope per unit of x
    mk: MannKendall
    ratio: float  # growth_ratio
    first: float
    last: float

    def grows(self, *, min_slope: float, alpha: float, min_ratio: float) -> bool:
        """The three-part verdict: robust slope, significant test, and a material growth."""
        return self.slope > min_slope and self.mk.p_increasing < alpha and self.ratio > min_ratio


def trend(y: Sequence[float], x: Sequence[float] | None = None, *, edge: int = 1) -> Trend:
    """Theil-Sen slope, Mann-Kendall test and growth ratio of one series in one call."""
    ys = np.asarray(y, dtype=float)
    return Trend(
        n=len(ys),
        slope=theil_sen_slope(ys, x),
        mk=mann_kendall(ys),
        ratio=growth_ratio(ys, edge),
        first=float(ys[0]) if len(ys) else float("nan"),
        last=float(ys[-1]) if len(ys) else float("nan"),
    )
