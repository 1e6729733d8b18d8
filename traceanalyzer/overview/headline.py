"""The headline that weighs the components of a step (:mod:`traceanalyzer.step_components`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from traceanalyzer import text
from traceanalyzer.overview.model import PhaseRow
from traceanalyzer.step_components import COMPONENT_NAMES, PARTS

# a second part is named when it takes at least this share of the step
SECOND_PART = 0.05
# the phases of served iterations: a profile with two or more of them leads with each one,
# since one mean over 12 ms prefills and 0.4 ms decodes describes neither
SERVED_PHASES = ("prefill", "decode", "mixed", "spec_decode")


def _largest(mean: Mapping[str, float]) -> list[tuple[float, str]]:
    """The two largest parts of the mean step (share, name), the second only when it counts."""
    parts = sorted(
        ((sum(mean.get(k, 0.0) for k in keys) / mean["step_ns"], name) for name, keys in PARTS),
        reverse=True,
    )
    return [parts[0], *([parts[1]] if parts[1][0] >= SECOND_PART else [])]


def headline(mean: Mapping[str, float] | None) -> str | None:
    """ "Most of the step is exposed communication (64%), then ... (17%)": the two largest parts."""
    if not mean or not mean.get("step_ns"):
        return None
    (first, first_name), *second = _largest(mean)
    lead = "Most of the step is" if first >= 0.5 else "The largest part of the step is"
    text = f"{lead} {first_name} ({first:.0%})"
    return text + (f", then {second[0][1]} ({second[0][0]:.0%})." if second else ".")


def phase_headline(rows: Sequence[PhaseRow]) -> str | None:
    """With two or more served phases, each one's largest parts and median iteration, the
    phases by their share of the time: "Per phase: mixed (5 iterations, p50 12.2 ms): compute
    98%; decode (18, p50 419 µs): the device drained by host synchronisations 66%, then compute
    29%." None with fewer (the whole profile's headline says it)."""
    served = [r for r in rows if r.phase in SERVED_PHASES and r.mean.get("step_ns")]
    if len(served) < 2:
        return None
    said = []
    for i, row in enumerate(sorted(served, key=lambda r: -r.total_ns)):
        count = f"{row.steps} iteration{'s' if row.steps != 1 else ''}" if not i else row.steps
        parts = ", then ".join(f"{name} {share:.0%}" for share, name in _largest(row.mean))
        said.append(f"{row.phase} ({count}, p50 {text.duration(row.p50_ns)}): {parts}")
    return "Per phase: " + "; ".join(said) + "."


def mean_components(frame: pl.DataFrame) -> dict[str, float]:
    return {k: float(frame[k].mean() or 0.0) for k in ("step_ns", *COMPONENT_NAMES)}
