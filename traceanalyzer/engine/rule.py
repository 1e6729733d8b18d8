"""The rule API: what a rule file declares and what its body receives.

A rule file defines one rule with the :func:`rule` decorator::

    @rule(
        id="TA900",
        name="slow-thing",
        severity="warning",
        summary="Thing takes too long.",
        params={"min_ms": Param(5.0, "Report things longer than this (ms).")},
        requires=[Requirement("slices", ("name",), what="trace events", collect_with="any level")],
    )
    def slow_thing(ctx: RuleContext) -> Iterator[Finding]:
        '''## What it detects ... ## Why it matters ... ## How to fix ... ## Example ... ## References ...'''
        slow = ctx.table("slices").filter(pl.col("dur_ns") > ctx.params.min_ms * 1e6).collect()
        for row in slow.iter_rows(named=True):
            yield ctx.finding(rank=row["rank"], title=..., message=..., location={"name": row["name"]})

The docstring *is* the published documentation (``rules explain``, ``docs/rules.md``); it must
have the five headings in :data:`DOC_HEADINGS`. Preconditions are data (:class:`Requirement`):
the runner checks them before the body runs and reports "not evaluated: missing X (collect with
Y)" instead of running a rule on data that cannot answer it. A body that finds out late that it
cannot answer raises :class:`NotEvaluated` with the reason.

For simple rules there is a declarative form, :func:`sql_rule`: a polars-SQL query whose rows
become findings, plus the same metadata.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import polars as pl

from traceanalyzer.engine.findings import COST_UNITS, Cost, Evidence, Finding, Note
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.engine.presentation import (
    FigureFn,
    KeyFigure,
    KeyFiguresFn,
    MarksFn,
    Presentation,
)
from traceanalyzer.schema import DERIVED_TABLES, TABLES

_T = TypeVar("_T")

if TYPE_CHECKING:
    from traceanalyzer.store import Store

Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")
Scope = Literal["rank", "global"]

DOC_HEADINGS = ("What it detects", "Why it matters", "How to fix", "Example", "References")
RULE_ID = re.compile(r"^[A-Z]{2,4}\d{3,4}$")
RULE_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class RuleDefinitionError(Exception):
    """A rule declares itself incorrectly (bad id, missing doc heading, unknown table...)."""


class NotEvaluated(Exception):  # noqa: N818 - it is a result, not an error
    """Raised by a rule body that cannot answer on this data; the message is the reason shown."""


# --------------------------------------------------------------------------------------------
# Helpers with parameters of their own
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Helper:
    """A kit helper that reads parameters of its own (``capture_windows`` reads the capture
    API names). A rule that calls it declares it, ``uses=[capture_windows]``, and gets those
    parameters, with the helper's defaults (a rule may declare one itself to change its default
    or meaning), overridable per run like its own. Calling it from a rule that did not declare
    it is a definition error naming both, and so is importing it into a rule file that does
    not (the loader checks)."""

    fn: Callable[..., Any]
    params: Mapping[str, Param]
    units: Mapping[str, str] = field(default_factory=dict)  # of the metrics it makes

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self.fn.__doc__

    def __call__(self, ctx: RuleContext, *args: Any, **kwargs: Any) -> Any:
        if self.name not in ctx.rule.uses:
            raise RuleDefinitionError(
                f"rule {ctx.rule.id} {ctx.rule.name} calls the helper {self.name} without "
                f"declaring it: add uses=[{self.name}] to @rule (it reads "
                f"{', '.join(self.params)})"
            )
        return self.fn(ctx, *args, **kwargs)


def helper(
    params: Mapping[str, Param], units: Mapping[str, str] | None = None
) -> Callable[[Callable[..., _T]], Helper]:
    """Declare a kit helper that reads ``params`` (see :class:`Helper`); ``units``: those of
    the findings' metrics it makes, which the rule that declares it gets too."""

    def wrap(fn: Callable[..., _T]) -> Helper:
        return Helper(fn, dict(params), dict(units or {}))

    return wrap


# --------------------------------------------------------------------------------------------
# Preconditions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """Data a rule needs: rows of ``table`` (matching ``where``) with non-null ``columns``.

    ``what`` names the data for people ("CANN API events"); ``collect_with`` says how to get it
    ("profiler_level=Level1"). Together they make the "not evaluated" message.
    """

    table: str
    columns: tuple[str, ...] = ()
    what: str = ""
    collect_with: str = ""
    where: pl.Expr | None = None

    def describe(self) -> str:
        if self.what:
            return self.what
        cols = f" ({', '.join(self.columns)})" if self.columns else ""
        return f"table `{self.table}`{cols}"

    def missing_message(self, missing_columns: Sequence[str] = (), hint: str | None = None) -> str:
        """``missing WHAT (collect with HOW)``; ``hint``: what to say instead of the collect
        advice (the runner's, from what the export says it collected)."""
        what = self.describe()
        if missing_columns:
            what += f" [no values in column(s) {', '.join(missing_columns)}]"
        if hint is None:
            hint = f" (collect with {self.collect_with})" if self.collect_with else ""
        return f"missing {what}{hint}"


@dataclass(frozen=True)
class AnyOf:
    """Satisfied when at least one alternative is (e.g. per-event CANN data, or api_stats)."""

    alternatives: tuple[Requirement, ...]

    def __init__(self, *alternatives: Requirement):
        object.__setattr__(self, "alternatives", tuple(alternatives))


Precondition = Requirement | AnyOf


# --------------------------------------------------------------------------------------------
# Context handed to a rule body
# --------------------------------------------------------------------------------------------


@dataclass
class RuleContext:
    """What a rule body sees: the store (optionally restricted to some ranks) and its parameters.

    Use :meth:`table` rather than ``store.table`` so the runner can shard evaluation by rank.
    """

    rule: Rule
    store: Store
    params: Params
    ranks: frozenset[int] | None = None
    notes: list[Note] = field(default_factory=list)
    _computed: dict[Callable[..., Any], Any] = field(default_factory=dict, repr=False)

    def table(self, name: str) -> pl.LazyFrame:
        frame = self.store.table(name)
        if self.ranks is not None:
            frame = frame.filter(pl.col("rank").is_in(sorted(self.ranks)))
        return frame

    def once(self, compute: Callable[[RuleContext], _T]) -> _T:
        """``compute(self)``, computed once per evaluation of the rule: its detection and its key
        figures see the same context (parameters, ranks), so what both derive is shared."""
        if compute not in self._computed:
            self._computed[compute] = compute(self)
        return self._computed[compute]

    def shared(self, compute: Callable[[RuleContext], _T], params: Sequence[str] = ()) -> _T:
        """``compute(self)``, computed once per rank shard for all the rules that ask: a
        derivation several rules need (the steps, the capture windows) is not derived again
        for each of them. ``compute`` sees only the parameters named in ``params`` (reading
        another raises), and their values are part of the key, so two rules that set them
        differently each get their own result."""
        values = {name: self.params[name] for name in params}
        key = (compute.__module__, compute.__qualname__, self.ranks, repr(sorted(values.items())))
        narrowed = RuleContext(self.rule, self.store, Params(values), self.ranks)
        return self.store.memo(key, lambda: compute(narrowed))

    def scope_ranks(self) -> list[int]:
        """The ranks in scope, in order: ``ranks``, else every rank with a session."""
        if self.ranks is not None:
            return sorted(self.ranks)
        return self.sessions()["rank"].unique().sort().to_list()

    def sessions(self) -> pl.DataFrame:
        """Sessions in scope, ordered by rank then start time."""
        sessions = self.store.sessions()
        if self.ranks is not None:
            sessions = sessions.filter(pl.col("rank").is_in(sorted(self.ranks)))
        return sessions

    def finding(
        self,
        *,
        rank: int | Sequence[int],
        title: str,
        message: str,
        location: Mapping[str, Any],
        sessions: Sequence[str] = (),
        metrics: Mapping[str, float | int | None] | None = None,
        evidence: Iterable[Evidence] = (),
        fix: str | None = None,
        severity: Severity | None = None,
        series: Mapping[str, Sequence[Any]] | None = None,
        score: float = 0.0,
        phases: Sequence[str] = (),
        cost: Cost | None = None,
        cost_ranks: Sequence[int] = (),
    ) -> Finding:
        """A finding of this rule. ``location`` is where the problem is, independent of rank and
        of timestamps (e.g. ``{"span": "batch_get_into_multi_buffers"}``); it makes the fingerprint,
        so the same problem gets the same id on every run and groups across ranks. ``phases``:
        the serving phases it concerns (``kit.phases_in`` of its steps), when it is tied to
        some. ``cost``: the step time it costs (``kit.cost_over(ns, window_ns)``), which the
        reports place it by. ``cost_ranks``: the ranks whose time the cost was lost from, when
        they are not the ranks it names (a late rank's cost is the others' wait)."""
        stated = sorted(set(COST_UNITS) & set(metrics or {}))
        if stated:
            raise RuleDefinitionError(
                f"rule {self.rule.id} {self.rule.name}: give the cost as cost=Cost(ns, share) "
                f"(kit.cost_over), not as the metric(s) {', '.join(stated)}"
            )
        ranks = [rank] if isinstance(rank, int) else list(rank)
        return Finding(
            rule=self.rule.id,
            name=self.rule.name,
            severity=severity or self.rule.severity,
            ranks=sorted(int(r) for r in ranks),
            sessions=list(sessions),
            title=title,
            message=message,
            fix=fix if fix is not None else self.rule.fix,
            metrics=dict(metrics or {}),
            evidence=list(evidence),
            location=dict(location),
            series={k: list(v) for k, v in (series or {}).items()},
            score=score,
            phases=list(phases),
            cost_ranks=sorted(int(r) for r in cost_ranks),
            cost=cost,
        )

    def note(self, text: str, *, rank: int | None = None, **metrics: float | int | None) -> None:
        """Record something the user should know about a verdict (what was left out, and why),
        with numbers. A note does not change the verdict; see :meth:`inconclusive`."""
        self.notes.append(Note(rule=self.rule.id, rank=rank, text=text, metrics=dict(metrics)))

    def inconclusive(
        self, text: str, *, rank: int | None = None, **metrics: float | int | None
    ) -> None:
        """The rule ran but cannot decide on ``rank`` (e.g. "only 22 captures; a trend needs at
        least 30"). Without a finding, the rule's status is then ``inconclusive``, never
        ``clean``: "could not judge" is not "healthy". Unlike :class:`NotEvaluated`, the data
        was there; there was not enough of it."""
        self.notes.append(
            Note(rule=self.rule.id, rank=rank, text=text, metrics=dict(metrics), inconclusive=True)
        )


# --------------------------------------------------------------------------------------------
# The rule itself
# --------------------------------------------------------------------------------------------

RuleBody = Callable[[RuleContext], Iterable[Finding] | None]


@dataclass
class Rule:
    """A loaded rule: metadata, parameters, preconditions, documentation and its body."""

    id: str
    name: str
    severity: Severity
    summary: str
    body: RuleBody
    doc: str
    params: dict[str, Param] = field(default_factory=dict)
    requires: tuple[Precondition, ...] = ()
    fix: str = ""
    scope: Scope = "rank"
    # A rule whose findings can be more severe than ``severity`` declares how far, and when.
    escalates_to: Severity | None = None
    escalation: str = ""  # "when ...", for `rules list`, `rules explain` and docs/rules.md
    # the names of the kit helpers it declared (``uses``); their parameters are in ``params``
    uses: tuple[str, ...] = ()
    source: Path | None = None
    presentation: Presentation = field(default_factory=Presentation)
    digest: str = ""  # code digest, set by the loader (see engine.loader.rule_digest)

    def __post_init__(self) -> None:
        problems = []
        if not RULE_ID.match(self.id):
            problems.append(f"id {self.id!r} must look like TA123 (2-4 capitals, 3-4 digits)")
        if not RULE_NAME.match(self.name):
            problems.append(f"name {self.name!r} must be kebab-case")
        if self.severity not in SEVERITIES:
            problems.append(f"severity {self.severity!r} must be one of {', '.join(SEVERITIES)}")
        if self.escalates_to is not None and (
            self.escalates_to not in SEVERITIES
            or SEVERITIES.index(self.escalates_to) <= SEVERITIES.index(self.severity)
            or not self.escalation
        ):
            problems.append(
                f"escalates_to {self.escalates_to!r} must be more severe than {self.severity!r}, "
                "with the escalation saying when"
            )
        if not self.summary or "\n" in self.summary:
            problems.append("summary must be one non-empty line")
        missing = [h for h in DOC_HEADINGS if h not in self.sections]
        if missing:
            problems.append(f"docstring lacks heading(s): {', '.join('## ' + h for h in missing)}")
        for pre in self.requires:
            for req in pre.alternatives if isinstance(pre, AnyOf) else (pre,):
                table = TABLES.get(req.table) or DERIVED_TABLES.get(req.table)
                if table is None:
                    problems.append(f"requires unknown table {req.table!r}")
                    continue
                unknown = set(req.columns) - set(table.column_names)
                if unknown:
                    problems.append(f"requires unknown column(s) {sorted(unknown)} of {req.table}")
        if problems:
            raise RuleDefinitionError(f"rule {self.id} {self.name}: " + "; ".join(problems))

    @property
    def severities(self) -> str:
        """``warning`` or ``warning -> error``: the severities its findings can have."""
        return f"{self.severity} -> {self.escalates_to}" if self.escalates_to else self.severity

    def undeclared(self, severity: str) -> str | None:
        """Why a finding of ``severity`` breaks the declaration (None when it keeps it);
        ``rules test`` checks every fixture's findings with it."""
        highest = self.escalates_to or self.severity
        if severity in SEVERITIES and SEVERITIES.index(severity) <= SEVERITIES.index(highest):
            return None
        return (
            f"a finding is {severity!r} but the rule declares {self.severities!r}: declare "
            f"escalates_to={severity!r} and escalation='when ...'"
        )

    @property
    def severity_text(self) -> str:
        """``warning -> error (when ...)``: the severities and when it escalates."""
        return f"{self.severities} ({self.escalation})" if self.escalates_to else self.severity

    @property
    def sections(self) -> dict[str, str]:
        """The docstring split at its ``## Heading`` lines."""
        return split_sections(self.doc)

    def run(self, ctx: RuleContext) -> list[Finding]:
        return list(self.body(ctx) or ())

    # ---- presentation: registered like ``property.setter``, next to the body ---------------

    def figure(self, *, caption: str = "") -> Callable[[FigureFn], FigureFn]:
        """Register the figure drawn for each finding: ``fn(FigureContext) -> Figure | None``.

        ``caption`` is printed under the figure in report.html.
        """

        def register(fn: FigureFn) -> FigureFn:
            self.presentation.figure = fn
            self.presentation.caption = caption
            return fn

        return register

    def key_figures(self, *figures: KeyFigure) -> Callable[[KeyFiguresFn], KeyFiguresFn]:
        """Register the key figures per rank (``fn(RuleContext) -> DataFrame``) that ``diff``
        compares between runs; ``figures`` declares their columns, labels and direction."""
        names = [k.name for k in figures]
        if not figures or len(set(names)) != len(names):
            raise RuleDefinitionError(
                f"rule {self.id} {self.name}: declare one or more key figures with distinct names"
            )

        def register(fn: KeyFiguresFn) -> KeyFiguresFn:
            self.presentation.key_figures = tuple(figures)
            self.presentation.compute_key_figures = fn
            return fn

        return register

    def marks(self, fn: MarksFn) -> MarksFn:
        """Register the timeline marks of a finding: ``fn(finding) -> Iterable[Mark]``."""
        self.presentation.marks = fn
        return fn

    def key_figure_frame(self, ctx: RuleContext) -> pl.DataFrame:
        """The rule's key figures on ``ctx``'s ranks: ``rank`` + one Float64 column each.

        One row per rank in scope, in rank order; declared figures the function did not return
        are null, and anything else it returned is dropped. The function may return its rows
        as a list of dicts (no schema to spell out: this one is theirs). An empty frame when
        the rule declares none.
        """
        shown = self.presentation
        schema = {"rank": pl.Int32, **{k.name: pl.Float64 for k in shown.key_figures}}
        if shown.compute_key_figures is None or not shown.key_figures:
            return pl.DataFrame(schema=schema)
        frame = shown.compute_key_figures(ctx)
        if isinstance(frame, list):  # its rows, as dicts
            frame = pl.DataFrame(frame, schema=schema)
        if not isinstance(frame, pl.DataFrame) or "rank" not in frame.columns:
            raise TypeError(
                "a key-figures function must return a polars DataFrame with `rank`, or its rows"
            )
        missing = [pl.lit(None).alias(k) for k in schema if k not in frame.columns]
        values = frame.with_columns(missing).select(
            [pl.col(k).cast(t, strict=False) for k, t in schema.items()]
        )
        if ctx.ranks is not None:  # a shard's figures are its ranks' only
            values = values.filter(pl.col("rank").is_in(sorted(ctx.ranks)))
        # every rank in scope has a row: null, not absent, where the rank lacks the data
        ranks = ctx.sessions().select(pl.col("rank").cast(pl.Int32)).unique()
        return ranks.join(values, on="rank", how="full", coalesce=True).sort("rank")

    def __call__(self, ctx: RuleContext) -> list[Finding]:
        return self.run(ctx)


def split_sections(doc: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        heading = re.match(r"^\s*##\s+(.+?)\s*$", line)
        if heading:
            current = sections.setdefault(heading.group(1), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v).strip() for k, v in sections.items()}


def rule(
    *,
    id: str,  # noqa: A002 - the natural name for a rule id
    name: str,
    severity: Severity,
    summary: str,
    params: Mapping[str, Param] | None = None,
    requires: Sequence[Precondition] = (),
    fix: str = "",
    scope: Scope = "rank",
    escalates_to: Severity | None = None,
    escalation: str = "",
    uses: Sequence[Helper] = (),
    units: Mapping[str, str] | None = None,
) -> Callable[[RuleBody], Rule]:
    """Declare a rule. The decorated function's docstring is the rule's documentation.

    ``scope="rank"`` (default) promises that the body only relates data within a rank, so the
    runner may evaluate it per rank shard and group the findings afterwards; ``"global"`` rules
    (cross-rank comparisons) always see every rank at once. A rule whose findings can be more
    severe than ``severity`` says so: ``escalates_to="error", escalation="when ..."``. ``uses``
    declares the kit helpers it calls that read parameters of their own (:class:`Helper`).
    ``units``: the unit of each of its findings' metrics that is not a plain number
    (``{"wait_ns": NS, "hot_share": SHARE}``, :mod:`traceanalyzer.engine.units`), which the
    reports and ``diff`` print it in.
    """

    helpers = {h.name: h for h in uses}
    declared = {n: p for h in helpers.values() for n, p in h.params.items()} | dict(params or {})
    metric_units = {n: u for h in helpers.values() for n, u in h.units.items()} | dict(units or {})

    def decorate(body: RuleBody) -> Rule:
        return Rule(
            id=id,
            name=name,
            severity=severity,
            summary=summary,
            body=body,
            doc=inspect.cleandoc(body.__doc__ or ""),
            params=declared,
            uses=tuple(helpers),
            requires=tuple(requires),
            fix=fix,
            scope=scope,
            escalates_to=escalates_to,
            escalation=escalation,
            source=_source_of(body),
            presentation=Presentation(units=metric_units),
        )

    return decorate


def _source_of(obj: Any) -> Path | None:
    code = getattr(obj, "__code__", None)
    return Path(code.co_filename) if code else None


def sql_rule(
    *,
    id: str,  # noqa: A002
    name: str,
    severity: Severity,
    summary: str,
    doc: str,
    query: str,
    title: str,
    message: str,
    location: Sequence[str],
    fix: str = "",
    params: Mapping[str, Param] | None = None,
    requires: Sequence[Precondition] = (),
    metrics: Sequence[str] = (),
    units: Mapping[str, str] | None = None,
) -> Rule:
    """A declarative rule: every row of a polars-SQL ``query`` becomes one finding.

    Tables of the store are available under their names (already restricted to the ranks being
    evaluated). ``{param}`` placeholders in ``query`` are replaced by parameter values (quote
    strings yourself: ``'{pattern}'``). ``title``/``message`` are ``str.format`` templates over the
    row's columns and the parameters. The query must return a ``rank`` column (and may return
    ``session``); ``location`` names the columns that say where the problem is, ``metrics``
    the numeric columns to report and ``units`` their units, as :func:`rule`'s.
    """

    def body(ctx: RuleContext) -> Iterator[Finding]:
        sql = query.format(**ctx.params)
        tables = {t: ctx.table(t) for t in TABLES if re.search(rf"\b{t}\b", sql)}
        result = pl.SQLContext(tables, eager=True).execute(sql)
        for row in result.iter_rows(named=True):
            values = {**ctx.params, **row}
            yield ctx.finding(
                rank=int(row["rank"]),
                sessions=[row["session"]] if row.get("session") else [],
                title=title.format(**values),
                message=message.format(**values),
                location={col: row[col] for col in location},
                metrics={m: row[m] for m in metrics},
            )

    body.__doc__ = doc
    made = rule(
        id=id,
        name=name,
        severity=severity,
        summary=summary,
        params=params,
        requires=requires,
        fix=fix,
        units=units,
    )(body)
    made.source = None  # its body is this module's, not the caller's file
    return made
