"""Finding records, grouping across ranks, and the findings.json document.

A :class:`Finding` says what is wrong (title, message), where (ranks, sessions, evidence rows
that point into the timeline), how bad (severity, metrics) and what to do (fix). Its
``fingerprint`` is a hash of the rule id and the finding's *location* (e.g. the transfer span's
name) and never of timestamps, session directory names or numbers that change between runs, so
the same problem in the same place keeps its id from run to run and can be diffed and triaged.
Its :class:`Cost` is the step time it costs, which the overview places in the breakdown.

Rules emit one finding per rank; :func:`group_findings` folds the findings with the same
fingerprint into one ("store-transfer-stall on ranks 2, 5, 9 (3/64)") that keeps every rank's
own figures under ``occurrences``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from traceanalyzer.engine.units import NS, SHARE

SCHEMA_VERSION = 1
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
MAX_EVIDENCE_PER_FINDING = 200


def fingerprint(rule_id: str, location: Mapping[str, Any]) -> str:
    """Stable 16-hex id of a problem: the rule and where it is (sorted, JSON-encoded)."""
    key = json.dumps({"rule": rule_id, "location": location}, sort_keys=True, default=str)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """One row that backs a finding, pointing at a place in the timeline."""

    rank: int
    session: str
    name: str
    process: str | None = None
    thread: str | None = None
    stream: int | None = None
    start_ns: int | None = None
    dur_ns: int | None = None
    detail: str | None = None  # e.g. "23 host memcpy calls" for a capture window

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Note:
    """Why a rule stayed silent, or what it could not look at, with the numbers behind it."""

    rule: str
    text: str
    rank: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # True when the rule ran but could not decide here ("only 22 captures; a trend needs 30"):
    # such a rank is "inconclusive", never "clean".
    inconclusive: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "rank": self.rank,
            "text": self.text,
            "metrics": _clean(self.metrics),
            "inconclusive": self.inconclusive,
        }


@dataclass(frozen=True)
class Cost:
    """The time a finding costs: ``ns`` lost from the analysed windows of its cost ranks (its
    ``cost_ranks``, else its ranks) and ``share``, that time's share of those windows (0-1,
    ``analyses.cost``). None where the rule cannot tell it on this rank: reports say "n/a", never 0.

    findings.json writes it after the finding's own metrics as ``cost_ns`` and ``cost_share``
    (:data:`COST_UNITS`), where readers of the file have always found it."""

    ns: float | None = None
    share: float | None = None

    def __post_init__(self) -> None:
        # as findings.json holds it: a number or None, the share within [0, 1]
        object.__setattr__(self, "ns", _clean_value(self.ns))
        object.__setattr__(self, "share", bounded_share(self.share))

    def metrics(self) -> dict[str, float | None]:
        return {"cost_ns": self.ns, "cost_share": self.share}


# the units of the metrics a cost is written as
COST_UNITS = {"cost_ns": NS, "cost_share": SHARE}


@dataclass(frozen=True)
class Occurrence:
    """One rank's own figures in a finding grouped over several ranks (see :func:`group_findings`)."""

    ranks: list[int]
    sessions: list[str]
    severity: str
    title: str
    metrics: dict[str, Any]
    phases: list[str]
    cost_ranks: list[int]
    series: dict[str, list[Any]]  # its own per-point data, so reports can plot all ranks
    cost: Cost | None = None

    @classmethod
    def of(cls, finding: Finding) -> Occurrence:
        """``finding``'s own figures (its fields of the same names)."""
        return cls(**{f.name: getattr(finding, f.name) for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        """Its fields in their order, the cost among the metrics (as the finding's)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cost"}
        return _clean(shown | {"metrics": _written_metrics(self.cost, self.metrics)})


@dataclass
class Finding:
    """A problem found by a rule. ``ranks`` holds more than one rank after grouping."""

    rule: str
    name: str
    severity: str
    ranks: list[int]
    sessions: list[str]
    title: str
    message: str
    fix: str
    metrics: dict[str, Any] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    location: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[Any]] = field(default_factory=dict)  # per-point data for plots
    score: float = 0.0  # impact used to pick the representative rank and to sort
    occurrences: list[Occurrence] = field(default_factory=list)
    total_ranks: int | None = None
    # what the finding stands on that is incomplete: a truncated trace, dropped rows (per rank)
    caveats: list[str] = field(default_factory=list)
    # the serving phases it concerns (the steps table's: "decode", ...), when only some: empty
    # means it is not tied to a phase (the profile has none known, or it concerns them all)
    phases: list[str] = field(default_factory=list)
    # whose time the cost is lost from, when not the ranks named (a straggler's cost is the
    # others' wait): empty means ``ranks``
    cost_ranks: list[int] = field(default_factory=list)
    cost: Cost | None = None  # None: the rule states no cost (capture-memcpy-growth: growth)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.rule, self.location)

    @property
    def ranks_label(self) -> str:
        """``rank 3``, ``ranks 0-3, 9 (5/64)``: which ranks, compressed, out of how many."""
        label = rank_words(self.ranks)
        if self.total_ranks and self.total_ranks > 1:
            label += f" ({len(self.ranks)}/{self.total_ranks})"
        return label

    @property
    def headline(self) -> str:
        """One line for tables: ``store-transfer-stall on ranks 2, 5, 9 (3/64): <title>``."""
        return f"{self.name} on {self.ranks_label}: {self.title}"

    def text(self) -> str:
        """The human rendering: headline, message, fix. Used for snapshots and the terminal."""
        scope = f" ({', '.join(self.phases)})" if self.phases else ""
        parts = [
            f"{self.rule} {self.name} [{self.severity}] {self.ranks_label}{scope}",
            self.title,
            "",
        ]
        parts += [self.message, ""]
        parts += [f"Caveat: {caveat}" for caveat in self.caveats]
        parts += [""] if self.caveats else []
        parts += [f"Fix: {self.fix}"]
        return "\n".join(parts).rstrip() + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "name": self.name,
            "severity": self.severity,
            "fingerprint": self.fingerprint,
            "ranks": self.ranks,
            "ranks_label": self.ranks_label,
            "total_ranks": self.total_ranks,
            "sessions": self.sessions,
            "title": self.title,
            "message": self.message,
            "fix": self.fix,
            "metrics": _clean(_written_metrics(self.cost, self.metrics)),
            "location": self.location,
            "evidence": [e.to_dict() for e in self.evidence],
            "series": {k: [_clean_value(v) for v in vs] for k, vs in self.series.items()},
            "occurrences": [o.to_dict() for o in self.occurrences],
            "caveats": list(self.caveats),
            "phases": list(self.phases),
            "cost_ranks": list(self.cost_ranks),
        }


def add_input_caveats(findings: Iterable[Finding], incomplete: Mapping[int, Sequence[str]]) -> None:
    """Say on every finding of a rank whose input was incomplete (``incomplete[rank]``: the
    files and what was lost) that its numbers stand on partial data: a truncated trace changes
    counts, shares and severities, and the reader must know it."""
    for finding in findings:
        for rank in finding.ranks:
            for what in incomplete.get(rank, ()):
                caveat = (
                    f"rank {rank}'s input was incomplete ({what}); figures may be low or partial"
                )
                if caveat not in finding.caveats:
                    finding.caveats.append(caveat)


def rank_words(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-3, 9``."""
    return ("rank " if len(ranks) == 1 else "ranks ") + compress_ranks(ranks)


def compress_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 9]`` -> ``0-3, 9``; runs of three or more become ranges."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(r) for r in ordered[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def group_findings(findings: Iterable[Finding], total_ranks: int | None = None) -> list[Finding]:
    """Fold findings with the same fingerprint into one, listing every rank.

    The representative (highest severity, then highest ``score``, then lowest rank) supplies
    title, message, metrics and series; every rank keeps its title, sessions, metrics and series in
    ``occurrences``. Evidence is the representative's first, then the others', capped at
    :data:`MAX_EVIDENCE_PER_FINDING`. The result is sorted by severity, rule id, then score.
    """
    groups: dict[str, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.fingerprint, []).append(finding)
    grouped = []
    for members in groups.values():
        members.sort(key=lambda f: (-SEVERITY_RANK[f.severity], -f.score, min(f.ranks, default=0)))
        head = members[0]
        evidence = [e for m in members for e in m.evidence][:MAX_EVIDENCE_PER_FINDING]
        grouped.append(
            replace(
                head,
                ranks=sorted({r for m in members for r in m.ranks}),
                # the representative's phases first, then any other rank's
                phases=list(dict.fromkeys(p for m in members for p in m.phases)),
                sessions=sorted({s for m in members for s in m.sessions}),
                evidence=evidence,
                occurrences=sorted(map(Occurrence.of, members), key=lambda o: o.ranks),
                total_ranks=total_ranks,
            )
        )
    grouped.sort(key=lambda f: (-SEVERITY_RANK[f.severity], f.rule, -f.score, f.ranks))
    return grouped


def _written_metrics(cost: Cost | None, metrics: Mapping[str, Any]) -> Mapping[str, Any]:
    """The metrics as findings.json writes them: the rule's own, in its order (the reports
    list them so), then the cost's (which the reports also say with the finding's title)."""
    return metrics if cost is None else {**metrics, **cost.metrics()}


def _clean_value(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null (finite numbers unchanged)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _clean_value(value.item())
    return value


def bounded_share(value: float | None) -> float | None:
    """A share (of a step, a span, a window) within [0, 1]; None when it is no number."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return None
    return min(max(float(value), 0.0), 1.0)


def _clean(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` as JSON can hold it, every share (a key ending in ``share``: ``cost_share``,
    ``stream_share``, ...) within [0, 1]: whatever times an input held, no finding states a
    share below 0 or above 100%."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out[key] = _clean(value)
        elif isinstance(value, (list, tuple)):
            out[key] = [_clean(v) if isinstance(v, Mapping) else _clean_value(v) for v in value]
        elif str(key).endswith("share") and isinstance(_clean_value(value), (int, float)):
            out[key] = bounded_share(_clean_value(value))
        else:
            out[key] = _clean_value(value)
    return out
