"""Robust statistics shared by rules and the overview: who is an outlier among peers.

Iglewicz & Hoaglin's modified z-score: 0.6745 = Phi^-1(0.75) makes the median absolute deviation
(MAD) a consistent estimator of sigma; when MAD is 0 (most peers identical), 1.2533 times the
mean absolute deviation stands in for it.
"""

from __future__ import annotations

from collections.abc import Sequence

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
