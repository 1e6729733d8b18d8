"""What every report is built from, loaded once, and the plain values the renderers are handed.

Two steps, in one direction:

1. :meth:`ReportInputs.load` reads ``OUT/findings.json`` (a plain dict, not live engine
   objects, so a report can be regenerated from an output directory alone), ``OUT/ingest.json``,
   the store and the run's rules.
2. :meth:`ReportInputs.prepare` gathers, once, all that the renderers read into a
   :class:`ReportData` of plain values: the findings document and its ``summary.overview`` as
   typed values (:mod:`traceanalyzer.overview.model`: the whole overview, the representative
   step's timeline included), the run summary, the file each rank session was read from, and
   per finding what its own rule presents
   (:class:`FindingView`: its figure's caption, its timeline marks, the session start of each
   point in time among its metrics), with each finding's figure drawn by its rule
   (:meth:`ReportInputs.figure`: a figure may read the store, through its ``FigureContext``) as
   a file's bytes. A finding whose rule is not loaded gets the defaults (no figure, its evidence
   as marks).

The renderers (``html_report``, ``markdown``, ``sarif``, ``annotations``, ``annotated``, the
``overview_*`` modules) take a :class:`ReportData` or the findings document: none calls back
into :class:`ReportInputs` or opens the store. The annotated timelines are the one stream:
:attr:`ReportData.timelines` hands them each rank session's events as an iterable that reads
the store a row group at a time as they write it (a trace is never held whole).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.discover import is_session_id
from traceanalyzer.engine.units import TRACE_NS
from traceanalyzer.interrupts import contained
from traceanalyzer.overview.model import FindingCost, Overview, overview_of
from traceanalyzer.report.documents import DamagedDocument, read_findings, read_ingest
from traceanalyzer.report.plots import render
from traceanalyzer.report.summary import RunSummary, run_summary
from traceanalyzer.schema import TABLES_DIR
from traceanalyzer.store import Store, StoreError
from traceanalyzer.store_trace import SessionTimeline
from traceanalyzer.version import __version__

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from traceanalyzer.chart import Chart
    from traceanalyzer.engine import Mark, Rule, RunResult
    from traceanalyzer.engine.registry import RuleSet
    from traceanalyzer.recipes.bench import BenchResult

TRACE_FILE = Path("ASCEND_PROFILER_OUTPUT") / "trace_view.json"
DB_FILE_GLOB = "ascend_pytorch_profiler*.db"  # a Db export's profiler database


@dataclass(frozen=True)
class FindingView:
    """One finding as its rule presents it, gathered before any report is rendered."""

    caption: str = ""  # what the finding's figure shows ("" without a rule or a figure)
    marks: tuple[Mark, ...] = ()  # its timeline marks (annotations.json, annotated traces)
    # why there are no marks: the rule's marks function failed (it costs only the overlays)
    marks_failed: BaseException | None = None
    # each point in time among its metrics -> the start of the session it falls in
    session_starts: Mapping[str, int] = field(default_factory=dict)
    # each of its metrics -> the unit its rule declared ("": a plain number)
    units: Mapping[str, str] = field(default_factory=dict)


NO_VIEW = FindingView()


@dataclass(frozen=True)
class ReportData:
    """Everything the renderers read, as values: see :meth:`ReportInputs.prepare`."""

    out: Path
    title: str
    version: str
    findings: dict[str, Any]  # the findings.json document
    overview: Overview | None  # its summary.overview, typed (None: an older run, or off)
    summary: RunSummary
    bench: list[BenchResult]
    input_root: Path | None
    rules: Mapping[str, Rule]  # by id: the run's rules, documented in SARIF
    views: Mapping[str, FindingView]  # by finding fingerprint
    # finding fingerprint -> its figure's file (SVG or PNG); figure name -> why it failed
    figures: Mapping[str, bytes] = field(default_factory=dict)
    figure_errors: Mapping[str, str] = field(default_factory=dict)
    # (rank, session) -> the file its events came from (trace_view.json, else its Db or dir)
    trace_files: Mapping[tuple[int, str], Path] = field(default_factory=dict)
    # (rank, session) -> its trace events, streamed from the store when iterated
    timelines: Mapping[tuple[int, str], Iterable[bytes]] = field(default_factory=dict)

    def view(self, finding: Mapping[str, Any]) -> FindingView:
        return self.views.get(str(finding.get("fingerprint", "")), NO_VIEW)

    @property
    def costs(self) -> Mapping[str, FindingCost]:
        """Each finding's cost in the overview's picture, by fingerprint."""
        return self.overview.costs if self.overview is not None else {}


@dataclass
class ReportInputs:
    """Everything the reports are built from; see :meth:`load`, then :meth:`prepare`."""

    out: Path
    findings: dict[str, Any]
    ingest: dict[str, Any] | None = None
    store: Store | None = None
    rules: dict[str, Rule] = field(default_factory=dict)  # by id
    bench: list[BenchResult] = field(default_factory=list)
    input_root: Path | None = None
    _sessions: pl.DataFrame | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls,
        out: str | os.PathLike[str],
        *,
        result: RunResult | None = None,
        rules: RuleSet | Iterable[Rule] | None = None,
        input_root: str | os.PathLike[str] | None = None,
    ) -> ReportInputs:
        """Read ``OUT/findings.json`` (or use ``result``), ``OUT/ingest.json`` and the store.

        ``rules`` are the run's rules: they present their findings (figures, marks) and document
        themselves in SARIF and the HTML; without them the built-in rules and installed rule
        packs are loaded. ``input_root`` is the input, where ``vllm bench`` result JSON is looked
        for; without it, the common parent of the rank directories names the report, and
        nothing is walked (the store's paths are data: ``/x_ascend_pt`` would walk the machine).
        A findings.json, ingest.json or sessions table that does not fit what a run writes is
        :class:`~traceanalyzer.report.documents.DamagedDocument`.
        """
        out = Path(out)
        if result is not None:
            from traceanalyzer.engine.runner import findings_document

            doc = json.loads(findings_document(result))
        else:  # an output folder, perhaps one someone sent: checked before it is used
            doc = read_findings(out)
        ingest = read_ingest(out)
        try:
            store: Store | None = Store.open(out)
        except StoreError:
            store = None
        inputs = cls(out=out, findings=doc, ingest=ingest, store=store)
        inputs.sessions()  # checked now: its ids name the folders annotate writes
        inputs.rules = {rule.id: rule for rule in (_default_rules() if rules is None else rules)}
        if input_root is None:  # the rank directories' parent, for the title: never walked
            inputs.input_root = inputs.common_root()
            return inputs
        inputs.input_root = root = Path(input_root)
        if root.is_dir():
            from traceanalyzer.recipes.bench import find_bench_results

            try:
                inputs.bench = find_bench_results(root)
            except OSError:  # an unreadable input tree must not cost the report
                inputs.bench = []
        return inputs

    # ---- the one step before rendering --------------------------------------------------
    def prepare(self, *, figures: bool = True) -> ReportData:
        """Gather what the renderers read, once (``figures``: draw each finding's figure too;
        the annotated timelines do not show them)."""
        findings = self.findings.get("findings", [])
        drawn, figure_errors = self._figures(findings) if figures else ({}, {})
        paths = self.session_paths()
        store = self.store
        return ReportData(
            out=self.out,
            title=self.title,
            version=__version__,
            findings=self.findings,
            overview=overview_of(self.findings),
            summary=run_summary(self.sessions(), self.ingest, self.findings),
            bench=self.bench,
            input_root=self.input_root,
            rules=self.rules,
            views={str(f.get("fingerprint", "")): self._view(f) for f in findings},
            figures=drawn,
            figure_errors=figure_errors,
            trace_files={key: self._trace_file(path) for key, path in paths.items()},
            timelines={}
            if store is None
            else {key: SessionTimeline(store, *key) for key in sorted(paths)},
        )

    def _figures(self, findings: list[dict[str, Any]]) -> tuple[dict[str, bytes], dict[str, str]]:
        """The figure file (SVG, or PNG from matplotlib) per finding fingerprint; a failing
        figure is reported and the finding shown without it."""
        drawn: dict[str, bytes] = {}
        errors: dict[str, str] = {}
        for f in findings:
            try:
                fig = self.figure(f)
                if fig is not None:
                    drawn[f["fingerprint"]] = render(fig)
            except BaseException as exc:  # a plot is a nicety; the finding text stands without it
                if not contained(exc):  # the figure is rule code: SystemExit is its failure too
                    raise
                errors[f"plot {f.get('name')}"] = f"{type(exc).__name__}: {exc}"
        return drawn, errors

    def _view(self, finding: Mapping[str, Any]) -> FindingView:
        from traceanalyzer.engine.presentation import Presentation

        rule = self.rules.get(str(finding.get("rule", "")))
        presentation = rule.presentation if rule is not None else Presentation()
        marks: tuple[Mark, ...] = ()
        failed = None
        try:
            marks = tuple(presentation.marks_for(finding))
        except BaseException as exc:  # rule code: it costs the overlays, not the reports
            if not contained(exc):
                raise
            failed = exc
        metrics = finding.get("metrics") or {}
        units = {key: presentation.unit(key) for key in metrics}
        starts = {
            key: start
            for key, value in metrics.items()
            if units[key] == TRACE_NS and isinstance(value, int)
            if (start := self._session_start(finding, value)) is not None
        }
        return FindingView(presentation.caption, marks, failed, starts, units)

    # ---- derived views ------------------------------------------------------------------
    def sessions(self) -> pl.DataFrame:
        """The store's ``sessions`` table (empty frame without a store); raises
        :class:`DamagedDocument` when it cannot be read, or holds a session id that is not
        one (a path: ``../../x``, ``/x``)."""
        if self._sessions is None:
            if self.store is None:
                self._sessions = pl.DataFrame(
                    schema={"rank": pl.Int32, "session": pl.String, "path": pl.String}
                )
                return self._sessions
            where = self.out / TABLES_DIR / "sessions"
            try:
                sessions = self.store.sessions()
            except (OSError, pl.exceptions.PolarsError) as exc:
                raise DamagedDocument(f"{where}: unreadable ({exc})") from None
            for session in sessions["session"]:
                if not is_session_id(session):
                    raise DamagedDocument(
                        f"{where}: damaged: {str(session)[:80]!r} is not a session id (a "
                        "name, never a path): not a store as traceanalyzer writes it"
                    )
            self._sessions = sessions
        return self._sessions

    def session_paths(self) -> dict[tuple[int, str], Path]:
        """(rank, session) -> the rank directory it was read from."""
        frame = self.sessions()
        return {
            (int(r), str(s)): Path(p)
            for r, s, p in frame.select("rank", "session", "path").iter_rows()
            if p
        }

    def common_root(self) -> Path | None:
        """The deepest directory holding every rank directory (the ``run`` input, normally)."""
        paths = [str(p.parent) for p in self.session_paths().values()]
        if not paths:
            return None
        try:
            return Path(os.path.commonpath(paths))
        except ValueError:  # paths on different drives
            return None

    @staticmethod
    def _trace_file(path: Path) -> Path:
        """The file a rank session's events came from (what SARIF points at): its
        ``trace_view.json``, else its Db (a Db export has no trace), else its directory."""
        if (path / TRACE_FILE).is_file():
            return path / TRACE_FILE
        return next(iter(sorted((path / TRACE_FILE.parent).glob(DB_FILE_GLOB))), path)

    def _session_start(self, finding: Mapping[str, Any], ns: int) -> int | None:
        """The start of the session a time of ``finding``'s metrics falls in (the latest start
        at or before ``ns`` among the sessions of the ranks that gave the metrics)."""
        frame = self.sessions()
        if "start_ns" not in frame.columns:
            return None
        # the ranks of the occurrence whose metrics the finding shows, else the finding's
        metrics = finding.get("metrics")
        same = [o for o in finding.get("occurrences") or [] if o.get("metrics") == metrics]
        ranks = set((same[0] if same else finding).get("ranks") or [])
        starts = [
            start
            for rank, start in frame.select("rank", "start_ns").iter_rows()
            if rank in ranks and start is not None and start <= ns
        ]
        return max(starts, default=None)

    def figure(self, finding: Mapping[str, Any]) -> Chart | Figure | None:
        """The finding's figure, drawn by its rule with the parameters it ran with (None when
        its rule draws none or is not loaded)."""
        rule = self.rules.get(str(finding.get("rule", "")))
        draw = rule.presentation.figure if rule is not None else None
        if draw is None:
            return None
        from traceanalyzer.engine.params import Params
        from traceanalyzer.engine.presentation import FigureContext

        params = self.rule_params(rule.id)
        context = FigureContext({**finding, "params": params}, Params(params), self.store)
        return draw(context)

    def rule_params(self, rule_id: str) -> dict[str, Any]:
        """The parameters the rule ran with (from findings.json), so plots match the rule."""
        for status in self.findings.get("rules", []):
            if status.get("rule") == rule_id:
                return dict(status.get("params") or {})
        return {}

    @property
    def title(self) -> str:
        root = self.input_root or self.out
        return root.name or str(root)


def _default_rules() -> list[Rule]:
    try:
        from traceanalyzer.engine.loader import load_rules

        return list(load_rules().rules)
    except Exception:  # presentation is optional: a broken rule pack must not stop reports
        return []
