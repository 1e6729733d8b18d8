"""What every report is built from, loaded once: findings document, ingest summary, store, rules.

Reports read the *findings.json document* (a plain dict), not live engine objects, so a report
can be regenerated from an output directory alone. Each finding is presented by its own rule
(:meth:`ReportInputs.rule_for`): its figure, caption, marks and documentation; a finding whose
rule is not loaded gets the defaults (no figure, its evidence as marks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer import __version__
from traceanalyzer.store import Store, StoreError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from traceanalyzer.chart import Chart
    from traceanalyzer.engine import Mark, Rule, RunResult
    from traceanalyzer.engine.registry import RuleSet
    from traceanalyzer.recipes.bench import BenchResult

TRACE_FILE = Path("ASCEND_PROFILER_OUTPUT") / "trace_view.json"
DB_FILE_GLOB = "ascend_pytorch_profiler*.db"  # a Db export's profiler database


@dataclass
class ReportInputs:
    """Everything the report writers need; see :meth:`load`."""

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
        packs are loaded. ``input_root`` is where ``vllm bench`` result JSON is looked for; it defaults
        to the common parent of the rank directories.
        """
        out = Path(out)
        if result is not None:
            from traceanalyzer.engine.runner import findings_document

            doc = json.loads(findings_document(result))
        else:
            doc = json.loads((out / "findings.json").read_text("utf-8"))
        ingest_path = out / "ingest.json"
        ingest = json.loads(ingest_path.read_text("utf-8")) if ingest_path.is_file() else None
        try:
            store: Store | None = Store.open(out)
        except StoreError:
            store = None
        inputs = cls(out=out, findings=doc, ingest=ingest, store=store)
        inputs.rules = {rule.id: rule for rule in (_default_rules() if rules is None else rules)}
        root = Path(input_root) if input_root is not None else inputs.common_root()
        inputs.input_root = root
        if root is not None and root.is_dir():
            from traceanalyzer.recipes.bench import find_bench_results

            try:
                inputs.bench = find_bench_results(root)
            except OSError:  # an unreadable input tree must not cost the report
                inputs.bench = []
        return inputs

    # ---- derived views ------------------------------------------------------------------
    def sessions(self) -> pl.DataFrame:
        """The store's ``sessions`` table (empty frame without a store)."""
        if self._sessions is None:
            if self.store is None:
                self._sessions = pl.DataFrame(
                    schema={"rank": pl.Int32, "session": pl.String, "path": pl.String}
                )
            else:
                self._sessions = self.store.sessions()
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

    def trace_file(self, rank: int, session: str) -> Path | None:
        """The file the rank session's events came from (what SARIF points at): its
        ``trace_view.json``, else its Db (a Db export has no trace), else its directory."""
        path = self.session_paths().get((rank, session))
        if not path:
            return None
        if (path / TRACE_FILE).is_file():
            return path / TRACE_FILE
        return next(iter(sorted((path / TRACE_FILE.parent).glob(DB_FILE_GLOB))), path)

    def session_start(self, finding: Mapping[str, Any], ns: int) -> int | None:
        """The start of the session a time of ``finding``'s metrics falls in (the latest start
        at or before ``ns`` among the sessions of the ranks that gave the metrics)."""
        frame = self.sessions()
        if "start_ns" not in frame.columns:
            return None
        shown = next(
            (
                o
                for o in finding.get("occurrences") or []
                if o.get("metrics") == finding.get("metrics")
            ),
            finding,
        )
        ranks = set(shown.get("ranks") or [])
        starts = [
            start
            for rank, start in frame.select("rank", "start_ns").iter_rows()
            if rank in ranks and start is not None and start <= ns
        ]
        return max(starts, default=None)

    def rule_for(self, finding: Mapping[str, Any]) -> Rule | None:
        """The loaded rule that made ``finding`` (None when it is not loaded)."""
        return self.rules.get(str(finding.get("rule", "")))

    def figure(self, finding: Mapping[str, Any]) -> Chart | Figure | None:
        """The finding's figure, drawn by its rule with the parameters it ran with."""
        rule = self.rule_for(finding)
        draw = rule.presentation.figure if rule is not None else None
        if draw is None:
            return None
        from traceanalyzer.engine.params import Params
        from traceanalyzer.engine.presentation import FigureContext

        params = self.rule_params(rule.id)
        context = FigureContext({**finding, "params": params}, Params(params), self.store)
        return draw(context)

    def caption(self, finding: Mapping[str, Any]) -> str:
        """What the finding's figure shows, as its rule says ("" without a rule or figure)."""
        rule = self.rule_for(finding)
        return rule.presentation.caption if rule is not None else ""

    def marks(self, finding: Mapping[str, Any]) -> list[Mark]:
        """The finding's timeline marks: its rule's, or one per evidence row with a start."""
        from traceanalyzer.engine.presentation import Presentation

        rule = self.rule_for(finding)
        return (rule.presentation if rule is not None else Presentation()).marks_for(finding)

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

    @property
    def version(self) -> str:
        return __version__


def _default_rules() -> list[Rule]:
    try:
        from traceanalyzer.engine.loader import load_rules

        return list(load_rules().rules)
    except Exception:  # presentation is optional: a broken rule pack must not stop reports
        return []
