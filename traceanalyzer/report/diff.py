"""Run-to-run comparison: findings new / resolved / changed (matched by fingerprint) and key
figures per rank, between two output directories of ``traceanalyzer run``.

Fingerprints hash a rule and the *place* of a problem (never times or numbers), so the same
problem in two runs matches even when every number moved; that is what makes "resolved" and
"new" trustworthy for CI regression gates.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from traceanalyzer.report.figures import FIGURES, LOWER_IS_BETTER, RULE_FIGURES, key_figures
from traceanalyzer.report.overview_diff import ComponentDelta, overview_deltas
from traceanalyzer.store import Store, StoreError

Status = Literal["new", "resolved", "changed", "unchanged"]
REL_TOLERANCE = 0.01  # metric changes below 1% are noise, not "changed"


@dataclass
class Delta:
    """One number before and after; ``rel`` is the relative change (None when base is 0/None)."""

    key: str
    base: float | None
    target: float | None
    ranks: list[int] = field(default_factory=list)
    scope: str = ""  # for figures: which ranks the numbers cover

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
        key = self.key
        if self.change is None or self.change == 0 or key not in LOWER_IS_BETTER:
            return None
        return self.change < 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": FIGURES.get(self.key, self.key),
            "base": self.base,
            "target": self.target,
            "change": self.change,
            "rel": self.rel,
            "ranks": self.ranks,
            "scope": self.scope,
        }


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

    def to_dict(self) -> dict[str, Any]:
        side = self.current
        return {
            "status": self.status,
            "fingerprint": self.fingerprint,
            "rule": self.rule,
            "name": self.name,
            "severity": {
                "base": (self.base or {}).get("severity"),
                "target": (self.target or {}).get("severity"),
            },
            "ranks": {
                "base": (self.base or {}).get("ranks"),
                "target": (self.target or {}).get("ranks"),
            },
            "title": side.get("title"),
            "base_title": (self.base or {}).get("title"),
            "target_title": (self.target or {}).get("title"),
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

    def by_status(self, status: Status) -> list[FindingChange]:
        return [c for c in self.changes if c.status == status]

    @property
    def has_new(self) -> bool:
        return bool(self.by_status("new"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "base": str(self.base),
            "target": str(self.target),
            "summary": {
                s: len(self.by_status(s)) for s in ("new", "resolved", "changed", "unchanged")
            },
            "ranks": {"base": self.base_ranks, "target": self.target_ranks},
            "findings": [c.to_dict() for c in self.changes],
            "figures": [d.to_dict() for d in self.figures],
            "overview": [d.to_dict() for d in self.overview],
        }


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric_deltas(base: dict[str, Any], target: dict[str, Any]) -> list[Delta]:
    """Numeric metrics present on both sides that moved by more than :data:`REL_TOLERANCE`."""
    out = []
    for key, b in (base.get("metrics") or {}).items():
        t = (target.get("metrics") or {}).get(key)
        bn, tn = _num(b), _num(t)
        if bn is None or tn is None or "start" in key:  # timestamps always differ
            continue
        if bn == tn or (bn and abs(tn - bn) / abs(bn) < REL_TOLERANCE):
            continue
        out.append(Delta(key, bn, tn))
    return out


def _figure_value(frame: pl.DataFrame, key: str, ranks: list[int] | None) -> float | None:
    rows = frame if ranks is None else frame.filter(pl.col("rank").is_in(ranks))
    if rows.is_empty() or key not in rows.columns:
        return None
    values = rows[key].drop_nulls()
    if values.is_empty():
        return None
    # totals are per rank, so compare their mean per rank when rank counts differ
    return float(values.mean())  # type: ignore[arg-type]


def figure_deltas_for(
    rule_name: str, ranks: list[int], base: pl.DataFrame, target: pl.DataFrame
) -> list[Delta]:
    """The rule's key figures on the finding's ranks, before and after.

    When the other run lacks those ranks (fewer ranks profiled), its value is the mean over all
    its ranks, and ``scope`` says so.
    """
    out = []
    for key in RULE_FIGURES.get(rule_name, ()):
        b_ranks = ranks if base.filter(pl.col("rank").is_in(ranks)).height else None
        t_ranks = ranks if target.filter(pl.col("rank").is_in(ranks)).height else None
        label = "rank" + ("s " if len(ranks) > 1 else " ") + ", ".join(map(str, ranks))
        scope = label
        if not (b_ranks and t_ranks):
            missing = "base" if not b_ranks else "target"
            scope = f"{label}; {missing}: mean of all its ranks ({label} not profiled there)"
        out.append(
            Delta(
                key,
                _figure_value(base, key, b_ranks),
                _figure_value(target, key, t_ranks),
                ranks,
                scope,
            )
        )
    return out


def _figures_frame(out_dir: Path) -> pl.DataFrame:
    try:
        return key_figures(Store.open(out_dir))
    except StoreError:
        return pl.DataFrame(schema={"rank": pl.Int32, **{k: pl.Float64 for k in FIGURES}})


def diff_outputs(base: str | os.PathLike[str], target: str | os.PathLike[str]) -> DiffResult:
    """Compare two ``run`` output directories (each with findings.json and a store)."""
    base, target = Path(base), Path(target)
    base_doc = json.loads((base / "findings.json").read_text("utf-8"))
    target_doc = json.loads((target / "findings.json").read_text("utf-8"))
    base_fig, target_fig = _figures_frame(base), _figures_frame(target)
    b = {f["fingerprint"]: f for f in base_doc.get("findings", [])}
    t = {f["fingerprint"]: f for f in target_doc.get("findings", [])}
    changes = []
    for fp in list(b) + [fp for fp in t if fp not in b]:
        bf, tf = b.get(fp), t.get(fp)
        side = tf or bf
        assert side is not None
        ranks = sorted(set((bf or {}).get("ranks") or []) | set((tf or {}).get("ranks") or []))
        figs = figure_deltas_for(side["name"], ranks, base_fig, target_fig)
        if bf is None:
            changes.append(
                FindingChange("new", fp, side["rule"], side["name"], None, tf, figures=figs)
            )
        elif tf is None:
            changes.append(
                FindingChange("resolved", fp, side["rule"], side["name"], bf, None, figures=figs)
            )
        else:
            deltas = metric_deltas(bf, tf)
            moved = (
                deltas
                or bf.get("severity") != tf.get("severity")
                or bf.get("ranks") != tf.get("ranks")
            )
            status: Status = "changed" if moved else "unchanged"
            changes.append(
                FindingChange(status, fp, side["rule"], side["name"], bf, tf, deltas, figs)
            )
    order = {"new": 0, "changed": 1, "resolved": 2, "unchanged": 3}
    changes.sort(key=lambda c: (order[c.status], c.rule))
    return DiffResult(
        base=base,
        target=target,
        changes=changes,
        figures=_per_rank(base_fig, target_fig),
        base_ranks=sorted(base_fig["rank"].to_list()),
        target_ranks=sorted(target_fig["rank"].to_list()),
        overview=overview_deltas(base_doc, target_doc),
    )


def _per_rank(base: pl.DataFrame, target: pl.DataFrame) -> list[Delta]:
    """Every figure of every rank present in either run (rows with no data on both sides dropped)."""
    out = []
    for rank in sorted(set(base["rank"].to_list()) | set(target["rank"].to_list())):
        for key in FIGURES:
            bv, tv = _figure_value(base, key, [rank]), _figure_value(target, key, [rank])
            if bv is None and tv is None:
                continue
            out.append(Delta(key, bv, tv, [rank], "rank"))
    return out
