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


def robust_z(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Modified z-scores: 0.6745 (x - median) / MAD, with the mean-AD fallback when MAD is 0."""
    values = np.asarray(values, dtype=float)
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median)))
    if mad > 0:
        return MAD_SCALE * (values - median) / mad
    mean_ad = float(np.mean(np.abs(values - median)))
    if mean_ad > 0:
        return (values - median) / (MEANAD_SCALE * mean_ad)
    return np.zeros_like(values)
