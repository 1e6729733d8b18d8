"""``diff`` per serving phase: a slower mean step can be more prefill traffic, not a slower server.

Each phase's iterations, median and p95 iteration time in both runs (``summary.overview.phases``
of each findings.json), and two verdicts: ``mix_changed`` (some phase's share of the iterations
moved by :data:`MIX_SHIFT` or more) and, per phase, ``regressed`` / ``improved`` (its median
iteration moved by :data:`PHASE_CHANGE` or more). A run with more prefill and no slower phase is
a mix change; a slower decode under the same mix is a decode regression.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from traceanalyzer.compare.explain import Explanation, explain_phases
from traceanalyzer.compare.run_tables import RunTables
from traceanalyzer.overview.model import STEP, Overview, PhaseRow
from traceanalyzer.report import fmt
from traceanalyzer.report.fmt import signed
from traceanalyzer.report.htmlkit import esc, table

MIX_SHIFT = 0.10  # share of the iterations (0..1) a phase must gain or lose: a change of mix
PHASE_CHANGE = 0.05  # relative move of a phase's median iteration: slower or faster
MIN_STEPS = 3  # iterations a phase needs in both runs to be compared
NOT_ITERATIONS = ("idle",)  # windows, not iterations: not in the mix


@dataclass(frozen=True)
class PhaseSide:
    """A phase in one run (no steps: the run has none of it)."""

    steps: int
    share: float | None  # of the run's iterations
    p50_ns: float | None
    p95_ns: float | None
    mean_ns: float | None


@dataclass(frozen=True)
class PhaseDelta:
    """One phase in the base and the target run."""

    phase: str
    base: PhaseSide
    target: PhaseSide

    @property
    def share_change(self) -> float | None:
        if self.phase in NOT_ITERATIONS:
            return None
        return (self.target.share or 0.0) - (self.base.share or 0.0)

    @property
    def p50_rel(self) -> float | None:
        b, t = self.base.p50_ns, self.target.p50_ns
        return (t - b) / b if b and t is not None else None

    @property
    def compared(self) -> bool:
        return min(self.base.steps, self.target.steps) >= MIN_STEPS and self.phase != "unknown"

    @property
    def verdict(self) -> str:
        """``regressed``, ``improved``, ``unchanged``; ``new`` / ``gone`` (in one run only);
        ``too few`` (under :data:`MIN_STEPS` iterations on a side, or no phase known)."""
        if not self.base.steps or not self.target.steps:
            return "new" if self.target.steps else "gone"
        if not self.compared or self.p50_rel is None or self.phase in NOT_ITERATIONS:
            return "too few" if self.phase not in NOT_ITERATIONS else "unchanged"
        if self.p50_rel >= PHASE_CHANGE:
            return "regressed"
        return "improved" if self.p50_rel <= -PHASE_CHANGE else "unchanged"

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "base": asdict(self.base),
            "target": asdict(self.target),
            "share_change": self.share_change,
            "p50_rel": self.p50_rel,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class PhaseDiff:
    rows: list[PhaseDelta]
    # per phase both runs have: its change split into contributions (compare/explain.py)
    explanations: Mapping[str, Explanation] = field(default_factory=dict)
    explain_error: str | None = None  # why there are none (a store that cannot be read)

    @property
    def mix_changed(self) -> bool:
        return any(abs(r.share_change or 0.0) >= MIX_SHIFT for r in self.rows)

    @property
    def regressed(self) -> list[str]:
        return [r.phase for r in self.rows if r.verdict == "regressed"]

    @property
    def improved(self) -> list[str]:
        return [r.phase for r in self.rows if r.verdict == "improved"]

    def explained(self, base: RunTables, target: RunTables) -> PhaseDiff:
        """This diff with each phase's change explained from the two runs' tables."""
        return replace(self, explanations=explain_phases(base, target))

    def mean_change(self) -> dict[str, float] | None:
        """The mean iteration's change split into the mix's part (phases weighing more or less,
        at the base's time of each) and the phases' own (each phase's change, at the target's
        weight): ``base_ns``, ``target_ns``, ``mix_ns``, ``phases_ns`` (None: no iterations)."""
        rows = [r for r in self.rows if r.phase not in NOT_ITERATIONS]
        if not any(r.base.share for r in rows) or not any(r.target.share for r in rows):
            return None
        mix = within = base = target = 0.0
        for r in rows:
            wb, wt = r.base.share or 0.0, r.target.share or 0.0
            mb, mt = r.base.mean_ns or 0.0, r.target.mean_ns or 0.0
            base, target = base + wb * mb, target + wt * mt
            if r.base.steps and r.target.steps:
                mix, within = mix + (wt - wb) * mb, within + wt * (mt - mb)
            else:  # a phase one run lacks weighs in or out whole
                mix += wt * mt - wb * mb
        return {"base_ns": base, "target_ns": target, "mix_ns": mix, "phases_ns": within}

    def summary(self) -> str | None:
        """One sentence: what changed, phase by phase (None: no phase on either side)."""
        if not self.rows:
            return None
        moved = [r for r in self.rows if abs(r.share_change or 0.0) >= MIX_SHIFT]
        mix = ", ".join(
            f"{r.phase} {fmt.percent(r.base.share or 0.0)} -> {fmt.percent(r.target.share or 0.0)}"
            for r in moved
        )
        slower = [r for r in self.rows if r.verdict == "regressed"]
        faster = [r for r in self.rows if r.verdict == "improved"]
        parts = []
        for rows, word in ((slower, "slower"), (faster, "faster")):
            if rows:
                parts.append(
                    ", ".join(
                        f"{r.phase} {word} (median {fmt.duration(r.base.p50_ns)} -> "
                        f"{fmt.duration(r.target.p50_ns)}, {fmt.change(r.p50_rel)})"
                        for r in rows
                    )
                )
        if mix and not parts:
            split = self.mean_change()
            why = (
                f" The mean iteration's {signed(split['target_ns'] - split['base_ns'])} is the "
                f"mix ({signed(split['mix_ns'])}), not the phases ({signed(split['phases_ns'])})."
                if split
                else ""
            )
            return f"The mix changed ({mix} of the iterations); no phase is slower or faster.{why}"
        if mix:
            return f"The mix changed ({mix} of the iterations), and " + "; ".join(parts) + "."
        if parts:
            what = "regression" if slower and not faster else "change"
            return f"Same mix; a {what} per phase: " + "; ".join(parts) + "."
        return "Same mix, and no phase is slower or faster."

    def row_dict(self, row: PhaseDelta) -> dict[str, Any]:
        """A row of ``phases.rows``, with ``explain`` (the contributions; [] for a phase one
        run lacks, or that did not change) and ``explanation`` (what they split)."""
        explained = self.explanations.get(row.phase)
        return row.to_dict() | {
            "explain": explained.items() if explained else [],
            "explanation": explained.to_dict() if explained else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [self.row_dict(r) for r in self.rows],
            "mean_change": self.mean_change(),
            "explain_error": self.explain_error,
            "mix_changed": self.mix_changed,
            "regressed": self.regressed,
            "improved": self.improved,
            "summary": self.summary(),
            "thresholds": {"mix_shift": MIX_SHIFT, "phase_change": PHASE_CHANGE,
                           "min_steps": MIN_STEPS},
        }  # fmt: skip


def _rows(overview: Overview | None) -> dict[str, PhaseRow]:
    return {r.phase: r for r in overview.phases.rows} if overview is not None else {}


def phase_deltas(base: Overview | None, target: Overview | None) -> PhaseDiff:
    """Every phase of either run, in the overview's order (the base's, then the target's new
    ones); nothing when neither run has phases (a run made before them)."""
    b, t = _rows(base), _rows(target)
    served = {
        side: sum(r.steps for p, r in rows.items() if p not in NOT_ITERATIONS)
        for side, rows in (("b", b), ("t", t))
    }

    def share(phase: str, row: PhaseRow | None, side: str) -> float | None:
        if phase in NOT_ITERATIONS or not served[side]:
            return None
        return (row.steps if row else 0) / served[side]

    def side(phase: str, row: PhaseRow | None, key: str) -> PhaseSide:
        if row is None:
            return PhaseSide(0, share(phase, row, key), None, None, None)
        return PhaseSide(
            row.steps, share(phase, row, key), row.p50_ns, row.p95_ns, row.mean.get(STEP)
        )

    rows = [
        PhaseDelta(phase, side(phase, b.get(phase), "b"), side(phase, t.get(phase), "t"))
        for phase in [*b, *(p for p in t if p not in b)]
    ]
    return PhaseDiff(rows)


def phase_diff_text(diff: PhaseDiff) -> list[str]:
    if not diff.rows:
        return []
    lines = ["by phase (iterations, share of them, median and p95 iteration; base -> target):"]
    for r in diff.rows:
        share = (
            ""
            if r.share_change is None
            else f"  {fmt.percent(r.base.share)} -> {fmt.percent(r.target.share)}"
        )
        lines.append(
            f"  {r.phase:<12} {r.base.steps:>5} -> {r.target.steps:<5}{share}  "
            f"p50 {fmt.duration(r.base.p50_ns)} -> {fmt.duration(r.target.p50_ns)}  "
            f"p95 {fmt.duration(r.base.p95_ns)} -> {fmt.duration(r.target.p95_ns)}  [{r.verdict}]"
        )
    summary = diff.summary()
    return [*lines, f"  {summary}"] if summary else lines


def phase_diff_html(diff: PhaseDiff) -> str:
    if not diff.rows:
        return ""
    verdict_class = {"regressed": "delta-bad", "improved": "delta-good"}
    rows = [
        (
            r.phase,
            f"{r.base.steps} -> {r.target.steps}",
            ""
            if r.share_change is None
            else f"{fmt.percent(r.base.share)} -> {fmt.percent(r.target.share)}",
            f"{fmt.duration(r.base.p50_ns)} -> {fmt.duration(r.target.p50_ns)}",
            f"{fmt.duration(r.base.p95_ns)} -> {fmt.duration(r.target.p95_ns)}",
            f'<span class="{verdict_class.get(r.verdict, "")}">{esc(r.verdict)}</span>',
        )
        for r in diff.rows
    ]
    summary = diff.summary()
    return (
        "<h2>By phase</h2>"
        + (f"<p><b>{esc(summary)}</b></p>" if summary else "")
        + table(
            ("phase", "iterations", "share", "median", "p95", "verdict"),
            rows,
            numeric=(1, 2, 3, 4),
            raw=(5,),
        )
    )
