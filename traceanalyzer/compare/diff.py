"""Run-to-run comparison: findings new / resolved / changed (matched by fingerprint) and key
figures per rank, between two output directories of ``traceanalyzer run``.

Fingerprints hash a rule and the *place* of a problem (never times or numbers), so the same
problem in two runs matches even when every number moved; that is what makes "resolved" and
"new" trustworthy for CI regression gates.

Key figures are the rules' own (``Rule.key_figures``), computed by the run with its effective
parameters and kept in findings.json; a finding carries the deltas of its rule's figures. For an
output directory written before findings.json had them, the loaded rules compute them from its
store, with the parameters that run recorded.

Both findings.json files are checked before anything is compared
(:func:`~traceanalyzer.report.documents.read_findings`): a regular file, UTF-8, JSON without
NaN, and every field the comparison reads of the type it must have; a damaged one (an empty
file, which a full disk leaves, say) is refused with the reason
(:class:`~traceanalyzer.report.documents.DamagedDocument`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from traceanalyzer.compare.overview_diff import ComponentDelta, overview_deltas
from traceanalyzer.compare.phase_diff import PhaseDiff, phase_deltas
from traceanalyzer.compare.run_tables import UNREADABLE, read_run
from traceanalyzer.compare.settings_diff import run_settings, settings_changed
from traceanalyzer.engine.findings import rank_words
from traceanalyzer.engine.params import Params
from traceanalyzer.engine.presentation import Presentation, key_figure_document
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.rule import RuleContext
from traceanalyzer.engine.units import TRACE_NS
from traceanalyzer.interrupts import contained
from traceanalyzer.overview.model import Overview, overview_of
from traceanalyzer.report.documents import read_findings
from traceanalyzer.store import Store, StoreError

Status = Literal["new", "resolved", "changed", "unchanged"]
STATUSES: tuple[Status, ...] = get_args(Status)  # as reports list them
REL_TOLERANCE = 0.01  # metric changes below 1% are noise, not "changed"
NO_PRESENTATION = Presentation()  # a rule not loaded: its cost in its units, its own metrics plain


@dataclass(frozen=True)
class Figure:
    """A key figure as its rule declared it (see :class:`~traceanalyzer.engine.KeyFigure`)."""

    rule: str  # rule name
    key: str
    label: str
    better: str | None = None
    unit: str = ""


@dataclass
class Delta:
    """One number before and after; ``rel`` is the relative change (None when base is 0/None).

    ``figure`` is set for key figures (None for a finding's own metrics); ``unit``: the one its
    rule declared (a key figure's, or a metric's).
    """

    key: str
    base: float | None
    target: float | None
    ranks: list[int] = field(default_factory=list)
    scope: str = ""  # for figures: which ranks the numbers cover
    figure: Figure | None = None
    unit: str = ""

    def __post_init__(self) -> None:
        if self.figure is not None:
            self.unit = self.figure.unit

    @property
    def label(self) -> str:
        return self.figure.label if self.figure else self.key

    @property
    def change(self) -> float | None:
        if self.base is None or self.target is None:
            return None
        return self.target - self.base

    @property
    def rel(self) -> float | None:
        if self.change is None or not self.base:
            return None
        return self.change / abs(self.base)

    @property
    def better(self) -> bool | None:
        """True/False when the change is an improvement/regression; None when neutral."""
        direction = self.figure.better if self.figure else None
        if self.change is None or self.change == 0 or direction is None:
            return None
        return self.change < 0 if direction == "lower" else self.change > 0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "key": self.key,
            "label": self.label,
            "base": self.base,
            "target": self.target,
            "change": self.change,
            "rel": self.rel,
            "ranks": self.ranks,
            "scope": self.scope,
        }
        if self.figure is not None:
            out |= {"rule": self.figure.rule, "unit": self.figure.unit}
        return out


@dataclass
class FindingChange:
    status: Status
    fingerprint: str
    rule: str
    name: str
    base: dict[str, Any] | None
    target: dict[str, Any] | None
    metrics: list[Delta] = field(default_factory=list)
    figures: list[Delta] = field(default_factory=list)

    @property
    def current(self) -> dict[str, Any]:
        return self.target or self.base or {}

    def _sides(self, key: str) -> dict[str, Any]:
        """The finding's ``key`` in the base run and in the target run (None: not in it)."""
        return {"base": (self.base or {}).get(key), "target": (self.target or {}).get(key)}

    def to_dict(self) -> dict[str, Any]:
        side = self.current
        return {
            "status": self.status,
            "fingerprint": self.fingerprint,
            "rule": self.rule,
            "name": self.name,
            "severity": self._sides("severity"),
            "ranks": self._sides("ranks"),
            "title": side.get("title"),
            **{f"{which}_title": title for which, title in self._sides("title").items()},
            "metric_deltas": [d.to_dict() for d in self.metrics],
            "figure_deltas": [d.to_dict() for d in self.figures],
        }


@dataclass
class DiffResult:
    base: Path
    target: Path
    changes: list[FindingChange]
    figures: list[Delta]  # per rank and figure
    base_ranks: list[int] = field(default_factory=list)
    target_ranks: list[int] = field(default_factory=list)
    overview: list[ComponentDelta] = field(default_factory=list)  # where the time goes
    phases: PhaseDiff = field(default_factory=lambda: PhaseDiff([]))  # and per serving phase
    # the environment, profiler settings and versions that differ (compare/settings_diff.py);
    # None: not compared (a store that cannot be read)
    settings_changed: list[dict[str, Any]] | None = None
    workload_note: str | None = None  # the runs look like different workloads

    def by_status(self, status: Status) -> list[FindingChange]:
        return [c for c in self.changes if c.status == status]

    @property
    def counts(self) -> dict[str, int]:
        """The findings per status."""
        return {s: len(self.by_status(s)) for s in STATUSES}

    @property
    def has_new(self) -> bool:
        return bool(self.by_status("new"))

    @property
    def rank_notes(self) -> list[str]:
        """Ranks one run has and the other lacks: a finding there is "new" or "resolved" because
        the rank was (not) profiled, not because anything changed on it."""
        notes = []
        for ranks, here, there in (
            (sorted(set(self.base_ranks) - set(self.target_ranks)), "base", "target"),
            (sorted(set(self.target_ranks) - set(self.base_ranks)), "target", "base"),
        ):
            if ranks:
                notes.append(
                    f"{rank_words(ranks)} only in {here} (absent from {there}): its findings "
                    f"there are {'resolved' if here == 'base' else 'new'} by absence, not by a change"
                )
        return notes + ([self.workload_note] if self.workload_note else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "base": str(self.base),
            "target": str(self.target),
            "summary": self.counts,
            "ranks": {"base": self.base_ranks, "target": self.target_ranks},
            "notes": self.rank_notes,
            "findings": [c.to_dict() for c in self.changes],
            "figures": [d.to_dict() for d in self.figures],
            "overview": [d.to_dict() for d in self.overview],
            "phases": self.phases.to_dict(),
            "mix_changed": self.phases.mix_changed,
            "settings_changed": self.settings_changed,
        }


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric_deltas(
    base: dict[str, Any], target: dict[str, Any], shown: Presentation = NO_PRESENTATION
) -> list[Delta]:
    """Numeric metrics present on both sides that moved by more than :data:`REL_TOLERANCE`, in
    the units their rule (``shown``) declared; times on the trace's clock always differ."""
    out = []
    for key, b in (base.get("metrics") or {}).items():
        t = (target.get("metrics") or {}).get(key)
        bn, tn, unit = _num(b), _num(t), shown.unit(key)
        if bn is None or tn is None or unit == TRACE_NS:
            continue
        if bn == tn or (bn and abs(tn - bn) / abs(bn) < REL_TOLERANCE):
            continue
        out.append(Delta(key, bn, tn, unit=unit))
    return out


@dataclass
class KeyFigures:
    """The key figures of one run: what each rule declared, and its value per rank."""

    figures: list[Figure] = field(default_factory=list)
    values: dict[tuple[str, str], dict[int, float | None]] = field(default_factory=dict)

    @classmethod
    def from_document(cls, entries: list[dict[str, Any]]) -> KeyFigures:
        """From the ``key_figures`` list of findings.json."""
        out = cls()
        for e in entries:
            figure = Figure(e["name"], e["figure"], e["label"], e.get("better"), e.get("unit", ""))
            out.figures.append(figure)
            out.values[figure.rule, figure.key] = {
                int(v["rank"]): _num(v["value"]) for v in e.get("values") or []
            }
        return out

    def of_rule(self, rule_name: str) -> list[Figure]:
        return [f for f in self.figures if f.rule == rule_name]

    def ranks(self, figure: Figure) -> set[int]:
        return set(self.values.get((figure.rule, figure.key), {}))

    def value(self, figure: Figure, ranks: list[int] | None) -> float | None:
        """The mean over ``ranks`` (every rank when None) of the ranks that have a value."""
        per_rank = self.values.get((figure.rule, figure.key), {})
        found = [v for r, v in per_rank.items() if v is not None and (ranks is None or r in ranks)]
        # totals are per rank, so compare their mean per rank when rank counts differ
        return sum(found) / len(found) if found else None


def figure_deltas_for(
    rule_name: str,
    ranks: list[int],
    base: KeyFigures,
    target: KeyFigures,
    profiled: tuple[Collection[int], Collection[int]] = ((), ()),
) -> list[Delta]:
    """The rule's key figures on the finding's ranks, before and after.

    When the other run did not profile those ranks (``profiled``: each run's ranks; fewer
    ranks profiled), its value is the mean over all its ranks, and ``scope`` says so; a run that
    profiled them but has no figure there (the rule was not evaluated) has none (n/a).
    """
    out = []
    figures = {f: None for f in [*base.of_rule(rule_name), *target.of_rule(rule_name)]}
    for figure in figures:
        b_ranks, t_ranks = (
            ranks if side.ranks(figure) & set(ranks) or set(ranks) & set(seen) else None
            for side, seen in ((base, profiled[0]), (target, profiled[1]))
        )
        label = "rank" + ("s " if len(ranks) > 1 else " ") + ", ".join(map(str, ranks))
        scope = label
        if not (b_ranks and t_ranks):
            missing = "base" if not b_ranks else "target"
            scope = f"{label}; {missing}: mean of all its ranks ({label} not profiled there)"
        b, t = base.value(figure, b_ranks), target.value(figure, t_ranks)
        out.append(Delta(figure.key, b, t, ranks, scope, figure))
    return out


def key_figures_of(out_dir: Path, doc: dict[str, Any], rules: RuleSet | None) -> KeyFigures:
    """The run's key figures: from findings.json, else computed by ``rules`` from its store."""
    if "key_figures" in doc or rules is None:
        return KeyFigures.from_document(doc.get("key_figures") or [])
    try:
        store = Store.open(out_dir)
    except StoreError:
        return KeyFigures()
    ran_with = {r["rule"]: r.get("params") or {} for r in doc.get("rules", [])}
    entries = []
    for rule in rules:
        if not rule.presentation.key_figures:
            continue
        params = {n: p.default for n, p in rule.params.items()} | ran_with.get(rule.id, {})
        ctx = RuleContext(rule=rule, store=store, params=Params(params))
        try:
            rows = rule.key_figure_frame(ctx).to_dicts()
        except BaseException as exc:  # a rule that cannot compute them on an old store
            if not contained(exc):
                raise
            continue
        entries += key_figure_document(rule.id, rule.name, rule.presentation.key_figures, rows)
    return KeyFigures.from_document(entries)


def diff_outputs(
    base: str | os.PathLike[str],
    target: str | os.PathLike[str],
    rules: RuleSet | None = None,
) -> DiffResult:
    """Compare two ``run`` output directories (each with findings.json and a store).

    ``rules`` compute the key figures of an output directory whose findings.json predates them.
    """
    base, target = Path(base), Path(target)
    base_doc, target_doc = read_findings(base), read_findings(target)
    base_fig = key_figures_of(base, base_doc, rules)
    target_fig = key_figures_of(target, target_doc, rules)
    profiled = (_ranks_of(base_doc), _ranks_of(target_doc))
    presentations = {rule.id: rule.presentation for rule in rules or ()}
    b = {f["fingerprint"]: f for f in base_doc.get("findings", [])}
    t = {f["fingerprint"]: f for f in target_doc.get("findings", [])}
    changes = []
    for fp in list(b) + [fp for fp in t if fp not in b]:
        bf, tf = b.get(fp), t.get(fp)
        side = tf or bf
        assert side is not None
        ranks = sorted(set((bf or {}).get("ranks") or []) | set((tf or {}).get("ranks") or []))
        figs = figure_deltas_for(side["name"], ranks, base_fig, target_fig, profiled)
        status: Status = "new" if bf is None else "resolved" if tf is None else "unchanged"
        deltas = []
        if bf is not None and tf is not None:
            deltas = metric_deltas(bf, tf, presentations.get(side["rule"], NO_PRESENTATION))
            if deltas or any(bf.get(k) != tf.get(k) for k in ("severity", "ranks")):
                status = "changed"
        changes.append(FindingChange(status, fp, side["rule"], side["name"], bf, tf, deltas, figs))
    order = {"new": 0, "changed": 1, "resolved": 2, "unchanged": 3}
    changes.sort(key=lambda c: (order[c.status], c.rule))
    base_overview, target_overview = overview_of(base_doc), overview_of(target_doc)
    phases = phase_deltas(base_overview, target_overview)
    settings = None
    try:
        tables = read_run(base), read_run(target)
        settings = settings_changed(run_settings(base), run_settings(target))
        phases = phases.explained(*tables)
    except UNREADABLE as exc:
        phases = replace(phases, explain_error=f"not explained: a store could not be read: {exc}")
    return DiffResult(
        base=base,
        target=target,
        changes=changes,
        figures=_per_rank(base_fig, target_fig),
        base_ranks=profiled[0],
        target_ranks=profiled[1],
        overview=overview_deltas(base_overview, target_overview),
        phases=phases,
        settings_changed=settings,
        workload_note=workload_note(base_overview, target_overview),
    )


# Two runs whose compute has less than this share in common, kernel by kernel name (the
# smaller of the two shares of each kernel both ran), are different workloads.
SAME_WORKLOAD_OVERLAP = 0.2


def workload_note(base: Overview | None, target: Overview | None) -> str | None:
    """A warning when the two runs' compute has little in common by kernel name (the overview's
    top kernels): a diff of unrelated workloads reads every change as a regression or a fix."""
    shares = [
        {k.name: float(k.share or 0.0) for k in overview.top_kernels} if overview else {}
        for overview in (base, target)
    ]
    if not (shares[0] and shares[1]):
        return None
    common = sum(min(shares[0][k], shares[1][k]) for k in shares[0].keys() & shares[1].keys())
    if common >= SAME_WORKLOAD_OVERLAP:
        return None
    return (
        f"the two runs have {common:.0%} of their compute in common by kernel name: different "
        "workloads? Their findings and figures may not compare"
    )


def _ranks_of(doc: dict[str, Any]) -> list[int]:
    return list(doc.get("summary", {}).get("ranks") or [])


def _per_rank(base: KeyFigures, target: KeyFigures) -> list[Delta]:
    """Every figure of every rank present in either run (rows with no data on both sides, or 0
    on both, dropped)."""
    out = []
    figures = list({f: None for f in [*base.figures, *target.figures]})
    ranks = sorted({r for f in figures for r in base.ranks(f) | target.ranks(f)})
    for rank in ranks:
        for figure in figures:
            bv, tv = base.value(figure, [rank]), target.value(figure, [rank])
            if not bv and not tv:  # None or 0 on both sides: nothing to compare
                continue
            out.append(Delta(figure.key, bv, tv, [rank], "rank", figure))
    return out
