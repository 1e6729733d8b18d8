"""Evaluate rules against a store: preconditions, isolation, parameters, map then reduce.

The work is split so a later executor (process pool, Ray) can distribute it:

- **map** — :func:`evaluate_rule` runs one rule on one shard (all ranks, or a set of ranks for
  ``scope="rank"`` rules) and returns a :class:`RuleOutcome`: findings per rank, notes, the
  rule's key figures per rank, or why it was not evaluated, or the error. It never raises for a
  rule's own failure. :mod:`traceanalyzer.engine.shards` runs this map on an executor.
- **reduce** — :func:`reduce_outcomes` merges the outcomes of every shard: it groups the same
  finding across ranks, and turns per-shard statuses into one status per rule.

:func:`evaluate` does both in-process and is what ``traceanalyzer run`` calls after ingest.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from traceanalyzer.engine.advice import collect_hint, store_facts
from traceanalyzer.engine.config import configured_rule_dirs, resolve, run_settings
from traceanalyzer.engine.findings import (
    SCHEMA_VERSION,
    SEVERITY_RANK,
    Finding,
    Note,
    compress_ranks,
    group_findings,
    rank_words,
)
from traceanalyzer.engine.loader import LoadedRules, LoadError, load_rules
from traceanalyzer.engine.presentation import KeyFigure, key_figure_document
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.rule import (
    AnyOf,
    NotEvaluated,
    Params,
    Requirement,
    Rule,
    RuleContext,
)
from traceanalyzer.interrupts import contained
from traceanalyzer.store import Store, store_ranks, write_atomic_text

FINDINGS_FILE = "findings.json"
KEY_FIGURES_FAILED = "key figures failed"  # the note that says so (rules test fails on it)
# Evaluates rank-scoped rules on every rank shard somewhere else (a process pool, Ray) and
# returns their outcomes: (rules, resolved params by rule id, ranks) -> outcomes.
RankMap = Callable[[Sequence[Rule], Mapping[str, Mapping[str, Any]], Sequence[int]], Iterable[Any]]
# (rule, store, params) -> the rule's outcome on every rank at once
GlobalRun = Callable[[Rule, Store, Mapping[str, Any]], "RuleOutcome"]
ShardStatus = Literal["evaluated", "not_evaluated", "error"]
RuleStatusName = Literal["fired", "clean", "inconclusive", "not_evaluated", "error", "disabled"]


# --------------------------------------------------------------------------------------------
# Map: one rule on one shard
# --------------------------------------------------------------------------------------------


@dataclass
class RuleOutcome:
    """The result of one rule on one shard (``ranks`` None = every rank)."""

    rule: str
    ranks: frozenset[int] | None
    status: ShardStatus
    findings: list[Finding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    reason: str | None = None
    error: str | None = None
    traceback: str | None = None
    # one row per rank of the shard: "rank" + one value per declared KeyFigure (null if absent)
    key_figures: list[dict[str, Any]] = field(default_factory=list)


def _requirement_gap(store: Store, req: Requirement, ranks: frozenset[int] | None) -> str | None:
    """Why ``req`` is not met on this shard, or None when it is (rules that need the same data
    share one probe of it)."""
    where = None if req.where is None else req.where.meta.serialize(format="json")
    key = ("requirement", req.table, req.columns, where, ranks)
    probe = store.memo(key, lambda: _probe(store, req, ranks))
    empty = [c for c in req.columns if not probe[c][0]]
    if probe["_rows"][0] and not empty:
        return None
    facts = store.memo(("export facts", ranks), lambda: store_facts(store, ranks))
    hint = collect_hint(req.collect_with, facts, req.table)
    return req.missing_message([] if probe["_rows"][0] == 0 else empty, hint)


def _probe(store: Store, req: Requirement, ranks: frozenset[int] | None) -> pl.DataFrame:
    """One row: whether the shard has ``req``'s data (``_rows``: 0 when not), and which columns
    have values. Each scan stops at the row it looks for, where counting read every row: the
    first row of the data (none: not met, in one scan, the commonest way to miss), then, when
    that one lacks a column, the first complete row; only data with no complete row is counted,
    to say which column is missing."""
    frame = store.derived(req.table, ranks)
    if req.where is not None:
        frame = frame.filter(req.where)
    shown = list(req.columns) or ["session"]  # every table has it
    first = frame.select(shown).head(1).collect()
    if first.is_empty():
        return pl.DataFrame({"_rows": [0], **{c: [False] for c in req.columns}})
    complete = pl.all_horizontal(pl.lit(True), *(pl.col(c).is_not_null() for c in req.columns))
    if (
        first.select(complete).item()
        or frame.filter(complete).select(shown).head(1).collect().height
    ):
        return pl.DataFrame({"_rows": [1], **{c: [True] for c in req.columns}})
    return frame.select(
        pl.len().alias("_rows"), *[pl.col(c).is_not_null().any().alias(c) for c in req.columns]
    ).collect()


def precondition_gaps(rule: Rule, store: Store, ranks: frozenset[int] | None = None) -> list[str]:
    """The "missing X (collect with Y)" reasons of every unmet precondition."""
    gaps = []
    for pre in rule.requires:
        alternatives: Sequence[Requirement] = pre.alternatives if isinstance(pre, AnyOf) else (pre,)
        reasons = [_requirement_gap(store, req, ranks) for req in alternatives]
        if all(reasons):
            gaps.append(" or ".join(r for r in reasons if r))
    return gaps


def evaluate_rule(
    rule: Rule,
    store: Store,
    params: Mapping[str, Any] | None = None,
    ranks: frozenset[int] | None = None,
) -> RuleOutcome:
    """Run one rule on one shard. Precondition gaps and exceptions become outcomes, not raises.

    The rule's key figures are computed too, with the same parameters, whether or not it fired
    (not where its data is missing: they would all be null).
    """
    values = {name: p.default for name, p in rule.params.items()} | dict(params or {})
    # One context for detection and key figures: what both derive is computed once (ctx.once).
    ctx = RuleContext(rule=rule, store=store, params=Params(values), ranks=ranks)
    outcome = _detect(ctx)
    if rule.presentation.key_figures and outcome.status != "not_evaluated":
        try:
            outcome.key_figures = rule.key_figure_frame(ctx).to_dicts()
        except BaseException as exc:  # a figure is a nicety: the findings stand without it
            if not contained(exc):
                raise
            text = f"{KEY_FIGURES_FAILED}: {type(exc).__name__}: {exc}"
            outcome.notes.append(Note(rule=rule.id, text=text))
    return outcome


def _detect(ctx: RuleContext) -> RuleOutcome:
    rule, ranks = ctx.rule, ctx.ranks
    try:
        gaps = precondition_gaps(rule, ctx.store, ranks)
        if gaps:
            return RuleOutcome(rule.id, ranks, "not_evaluated", reason="; ".join(gaps))
        findings = rule.run(ctx)
    except NotEvaluated as exc:
        return RuleOutcome(rule.id, ranks, "not_evaluated", reason=str(exc))
    except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the rule's, not the run's
        if not contained(exc):
            raise
        return RuleOutcome(
            rule.id,
            ranks,
            "error",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
    return RuleOutcome(rule.id, ranks, "evaluated", findings=findings, notes=ctx.notes)


# --------------------------------------------------------------------------------------------
# Reduce: every shard of every rule -> one RunResult
# --------------------------------------------------------------------------------------------


@dataclass
class RuleStatus:
    """What happened to one rule in a run."""

    id: str
    name: str
    severity: str
    status: RuleStatusName
    findings: int = 0
    reason: str | None = None  # why not evaluated (or on which ranks it was not)
    error: str | None = None
    traceback: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    key_figures: tuple[KeyFigure, ...] = ()  # what the rule declares
    key_figure_rows: list[dict[str, Any]] = field(default_factory=list)  # per rank, all shards

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.id,
            "name": self.name,
            "severity": self.severity,
            "status": self.status,
            "findings": self.findings,
            "reason": self.reason,
            "params": {k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()},
            "notes": [n.to_dict() for n in self.notes],
        }


@dataclass
class RunResult:
    """Everything reports need: grouped findings, per-rule status, and the exit verdict."""

    findings: list[Finding]
    rules: list[RuleStatus]
    ranks: list[int]
    fail_on: str | None = None
    load_errors: list[LoadError] = field(default_factory=list)
    # findings.json summary.overview: where the time goes (set by the pipeline; see
    # traceanalyzer.overview), shown whether or not a rule fired
    overview: dict[str, Any] | None = None
    config_files: list[str] = field(default_factory=list)  # the config files the run applied

    @property
    def not_evaluated(self) -> list[RuleStatus]:
        return [r for r in self.rules if r.status == "not_evaluated"]

    @property
    def inconclusive(self) -> list[RuleStatus]:
        """Rules that ran but could not decide (on every rank they found nothing on)."""
        return [r for r in self.rules if r.status == "inconclusive"]

    @property
    def errors(self) -> list[dict[str, Any]]:
        rule_errors = [
            {"rule": r.id, "name": r.name, "error": r.error, "traceback": r.traceback}
            for r in self.rules
            if r.status == "error"
        ]
        load_errors = [
            {"rule": e.source, "name": None, "error": e.error, "traceback": e.traceback}
            for e in self.load_errors
        ]
        return rule_errors + load_errors

    @property
    def max_severity(self) -> str | None:
        return max((f.severity for f in self.findings), key=SEVERITY_RANK.get, default=None)

    @property
    def failed(self) -> bool:
        """True when ``fail_on`` is set and a finding is at or above it."""
        if self.fail_on is None:
            return False
        return any(SEVERITY_RANK[f.severity] >= SEVERITY_RANK[self.fail_on] for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        """The findings.json document."""
        by_severity = {s: 0 for s in SEVERITY_RANK}
        for finding in self.findings:
            by_severity[finding.severity] += 1
        return {
            "schema_version": SCHEMA_VERSION,
            "summary": {
                "ranks": self.ranks,
                "findings": len(self.findings),
                "by_severity": by_severity,
                "max_severity": self.max_severity,
                "rules": len(self.rules),
                "not_evaluated": len(self.not_evaluated),
                "inconclusive": len(self.inconclusive),
                "errors": len(self.errors),
                "fail_on": self.fail_on,
                "failed": self.failed,
                "config_files": self.config_files,
                **({"overview": self.overview} if self.overview is not None else {}),
            },
            "findings": [f.to_dict() for f in self.findings],
            "not_evaluated": [
                {"rule": r.id, "name": r.name, "reason": r.reason} for r in self.not_evaluated
            ],
            "inconclusive": [
                {"rule": r.id, "name": r.name, "reason": r.reason} for r in self.inconclusive
            ],
            "errors": self.errors,
            "rules": [r.to_dict() for r in self.rules],
            "key_figures": [
                figure
                for r in self.rules
                for figure in key_figure_document(r.id, r.name, r.key_figures, r.key_figure_rows)
            ],
        }


def _reduce_rule(
    rule: Rule, outcomes: Sequence[RuleOutcome], params: Mapping[str, Any]
) -> tuple[RuleStatus, list[Finding]]:
    findings = [f for o in outcomes for f in o.findings]
    notes = [n for o in outcomes for n in o.notes]
    status = RuleStatus(
        rule.id,
        rule.name,
        rule.severity,
        "clean",
        params=dict(params),
        notes=notes,
        key_figures=rule.presentation.key_figures,
        key_figure_rows=sorted(
            (row for o in outcomes for row in o.key_figures), key=lambda row: row["rank"]
        ),
    )
    errored = [o for o in outcomes if o.status == "error"]
    skipped = [o for o in outcomes if o.status == "not_evaluated"]
    if errored:
        status.status = "error"
        status.error = errored[0].error + _on_ranks(errored, len(outcomes))
        status.traceback = errored[0].traceback
    elif skipped and len(skipped) == len(outcomes):
        status.status = "not_evaluated"
        status.reason = "; ".join(dict.fromkeys(o.reason or "" for o in skipped))
    else:
        undecided = [n for n in notes if n.inconclusive]
        status.status = "fired" if findings else ("inconclusive" if undecided else "clean")
        reasons = []
        if undecided:  # ran, but could not decide: never shown as healthy
            reasons.append(_undecided_reason(undecided))
        if skipped:  # some ranks lacked the data: say so rather than imply they are healthy
            reasons.append(
                "not evaluated"
                + _on_ranks(skipped, len(outcomes))
                + ": "
                + "; ".join(dict.fromkeys(o.reason or "" for o in skipped))
            )
        status.reason = "; ".join(reasons) or None
    return status, findings


INCONCLUSIVE = "inconclusive"  # a rule that ran but could not decide: its status everywhere


def _undecided_reason(notes: Sequence[Note]) -> str:
    """``inconclusive on rank 0: only 22 captures ...`` (identical texts grouped over ranks):
    the status's own name, as the terminal and the reports say it.

    A text that starts with its own rank (``rank 3: ...``, ``rank 3 stream 2: ...``) is grouped
    without it: ``inconclusive on ranks 0-39: stream 2: ...`` names the ranks already. The notes
    themselves (findings.json) keep their full text.
    """
    by_text: dict[str, list[int]] = {}
    for note in notes:
        text = note.text if note.rank is None else _without_own_rank(note.text, note.rank)
        by_text.setdefault(text, []).extend([] if note.rank is None else [note.rank])
    parts = []
    for text, ranks in by_text.items():
        on = f" on {rank_words(sorted(set(ranks)))}" if ranks else ""
        parts.append(f"{INCONCLUSIVE}{on}: {text}")
    return "; ".join(parts)


def _without_own_rank(text: str, rank: int) -> str:
    """``text`` without a leading ``rank N: `` or ``rank N `` naming ``rank`` itself."""
    for prefix in (f"rank {rank}: ", f"rank {rank} "):
        if text.startswith(prefix) and text[len(prefix) :].strip():
            return text[len(prefix) :]
    return text


def _on_ranks(outcomes: Sequence[RuleOutcome], shards: int) -> str:
    ranks = sorted(r for o in outcomes if o.ranks is not None for r in o.ranks)
    if shards <= 1 or not ranks:
        return ""
    return f" (on ranks {compress_ranks(ranks)})"


def reduce_outcomes(
    rules: RuleSet,
    outcomes: Iterable[RuleOutcome],
    *,
    params: Mapping[str, Mapping[str, Any]],
    ranks: Sequence[int],
    fail_on: str | None = None,
    disabled: Iterable[str] = (),
    load_errors: Sequence[LoadError] = (),
) -> RunResult:
    by_rule: dict[str, list[RuleOutcome]] = {}
    for outcome in outcomes:
        by_rule.setdefault(outcome.rule, []).append(outcome)
    statuses, findings = [], []
    off = set(disabled)
    for rule in rules:
        if rule.id in off:
            statuses.append(RuleStatus(rule.id, rule.name, rule.severity, "disabled"))
            continue
        status, rule_findings = _reduce_rule(rule, by_rule.get(rule.id, []), params[rule.id])
        statuses.append(status)
        findings += rule_findings
    grouped = group_findings(findings, total_ranks=len(ranks) or None)
    for status in statuses:  # counted as listed (grouped across ranks), like the summary
        status.findings = sum(f.rule == status.id for f in grouped)
    return RunResult(
        findings=grouped,
        rules=statuses,
        ranks=list(ranks),
        fail_on=fail_on,
        load_errors=list(load_errors),
    )


# --------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------


def evaluate(
    store: Store,
    rule_dirs: Iterable[str | Path] = (),
    overrides: Mapping[str, Mapping[str, Any]] | Iterable[str] = (),
    config_path: str | Path | None | Literal[False] = None,
    fail_on: str | None = None,
    *,
    select: Iterable[str] | None = None,
    rules: RuleSet | LoadedRules | None = None,
    shard_by_rank: bool = False,
    builtin: bool = True,
    rank_map: RankMap | None = None,
    run_global: GlobalRun | None = None,
) -> RunResult:
    """Evaluate rules on ``store`` and return the grouped result.

    - ``rule_dirs``: extra rule folders (``--rules DIR``), after the built-in ones (and before
      the config file's ``rule_dirs``).
    - ``overrides``: ``{"TA001": {"min_ratio": 2}}`` or ``--set`` strings ``["TA001.min_ratio=2"]``.
    - ``config_path``: a ``traceanalyzer.toml``/``pyproject.toml``; None searches the working
      directory; False ignores config files.
    - ``fail_on``: ``info|warning|error``; sets ``RunResult.failed``/``exit_code``.
    - ``select``: only these rules (ids or names). ``rules``: use these rules (a RuleSet, or
      what :func:`~traceanalyzer.engine.loader.load_rules` returned, with its load errors)
      instead of loading them here.
    - ``shard_by_rank``: evaluate ``scope="rank"`` rules once per rank (what a distributed
      executor does); the grouped result is the same as evaluating all ranks at once.
    - ``rank_map``: hand the ``scope="rank"`` rules to this function, which evaluates them on
      every rank shard (e.g. in worker processes, see :mod:`traceanalyzer.engine.shards`) and returns
      the :class:`RuleOutcome` objects; global rules still run here, in the driver.
    - ``run_global``: evaluate each rule that reads every rank at once through this function
      (e.g. one that looks its outcome up in a cache first) instead of :func:`evaluate_rule`.

    Raises :class:`~traceanalyzer.engine.config.ConfigError` for unknown rules/parameters and bad
    values, before any rule runs.
    """
    if fail_on is not None and fail_on not in SEVERITY_RANK:
        raise ValueError(f"fail_on must be one of {', '.join(SEVERITY_RANK)}, got {fail_on!r}")
    load_errors: list[LoadError] = []
    if rules is None:
        rules = load_rules([*rule_dirs, *configured_rule_dirs(config_path)], builtin=builtin)
    if isinstance(rules, LoadedRules):
        rules, load_errors = rules.rules, rules.errors
    resolved = resolve(rules, run_settings(overrides, config_path))
    chosen = rules.select(select)
    ranks = store_ranks(store)
    outcomes = []
    mapped = [r for r in chosen if r.id not in resolved.disabled and r.scope == "rank"]
    if rank_map is not None and mapped and ranks:
        outcomes += list(rank_map(mapped, resolved.params, ranks))
    else:
        mapped = []
    mapped_ids = {r.id for r in mapped}
    for rule in chosen:
        if rule.id in resolved.disabled or rule.id in mapped_ids:
            continue
        params = resolved.params[rule.id]
        if shard_by_rank and rule.scope == "rank" and ranks:
            outcomes += [evaluate_rule(rule, store, params, frozenset({r})) for r in ranks]
        elif run_global is not None and rule.scope != "rank":
            outcomes.append(run_global(rule, store, params))
        else:
            outcomes.append(evaluate_rule(rule, store, params))
    return reduce_outcomes(
        chosen,
        outcomes,
        params=resolved.params,
        ranks=ranks,
        fail_on=fail_on,
        disabled=resolved.disabled,
        load_errors=load_errors,
    )


def findings_document(result: RunResult) -> str:
    """findings.json: JSON without NaN or infinities (null instead), which ``diff`` refuses."""
    doc = _finite(result.to_dict())
    return json.dumps(doc, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, however deep."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_findings_json(result: RunResult, out_dir: str | Path) -> Path:
    """Write ``OUT/findings.json`` atomically (temporary file, then rename)."""
    path = Path(out_dir) / FINDINGS_FILE
    write_atomic_text(path, findings_document(result))
    return path
