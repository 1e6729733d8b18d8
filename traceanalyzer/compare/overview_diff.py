"""``diff`` of two runs' overviews: the mean step and each component, before -> after."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from traceanalyzer.overview.model import Overview
from traceanalyzer.report import fmt
from traceanalyzer.report.htmlkit import change_cell, table
from traceanalyzer.report.overview_text import unmeasured_everywhere
from traceanalyzer.step_components import COMPONENTS

STEP = ("step_ns", "step time")
# time the step loses: less of it is better (compute is neutral: less may mean less work done)
LOWER_IS_BETTER = (STEP[0], *(c.key for c in COMPONENTS if c.lost))


@dataclass(frozen=True)
class ComponentDelta:
    """One component of the mean step (ns), in the base and the target run."""

    key: str
    label: str
    base: float | None
    target: float | None

    @property
    def change(self) -> float | None:
        return None if self.base is None or self.target is None else self.target - self.base

    @property
    def rel(self) -> float | None:
        return self.change / self.base if self.change is not None and self.base else None

    @property
    def better(self) -> bool | None:
        if not self.change or self.key not in LOWER_IS_BETTER:
            return None
        return self.change < 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"change": self.change, "rel": self.rel}

    def text(self) -> str:
        rel = "" if self.rel is None else f" ({fmt.change(self.rel)})"
        change = "" if self.change is None else f", {fmt.signed(self.change)}"
        return f"{fmt.duration(self.base)} -> {fmt.duration(self.target)}{change}{rel}"


def overview_deltas(base: Overview | None, target: Overview | None) -> list[ComponentDelta]:
    """Mean step and every component, from two runs' overviews ([] when neither has a mean
    step; a side without one, or that measured a component on no rank, shows n/a: a Level0
    run's idle sync is not a zero to compare with)."""
    b, t = (side if side is not None and side.mean else None for side in (base, target))
    if not (b or t):
        return []
    components = (b or t).components
    keys = [STEP, *((c.key, c.label) for c in components)]

    def means(side: Overview | None) -> dict[str, float]:
        if side is None or side.mean is None:
            return {}
        missing = unmeasured_everywhere(side)
        return {k: v for k, v in side.mean.items() if k not in missing}

    bm, tm = means(b), means(t)
    return [ComponentDelta(k, label, bm.get(k), tm.get(k)) for k, label in keys]


def overview_diff_text(deltas: list[ComponentDelta]) -> list[str]:
    moved = [d for d in deltas if d.change or d.base is None or d.target is None]
    if not moved:
        return ["where the time goes: unchanged"] if deltas else []
    width = max(len(d.label) for d in moved)
    return ["where the time goes (mean per step, base -> target):"] + [
        f"  {d.label:<{width}}  {d.text()}" for d in moved
    ]


def overview_diff_html(deltas: list[ComponentDelta]) -> str:
    if not deltas:
        return ""
    rows = [
        (
            d.label,
            fmt.duration(d.base),
            fmt.duration(d.target),
            "" if d.change is None else fmt.duration(d.change),
            change_cell(d.rel, d.better),
        )
        for d in deltas
    ]
    return "<h2>Where the time goes (mean per step)</h2>" + table(
        ("component", "base", "target", "delta", "change"), rows, numeric=(1, 2, 3, 4), raw=(4,)
    )
