"""What every report is built from, loaded once: findings document, ingest summary, store, rules.

Reports read the *findings.json document* (a plain dict), not live engine objects, so a report
can be regenerated from an output directory alone and ``diff`` can compare two directories with
the same code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer import __version__
from traceanalyzer.store import Store, StoreError

if TYPE_CHECKING:
    from traceanalyzer.engine import Rule, RunResult
    from traceanalyzer.recipes.bench import BenchResult

TRACE_FILE = Path("ASCEND_PROFILER_OUTPUT") / "trace_view.json"


@dataclass(frozen=True)
class RuleDoc:
    """The documentation of one rule, as reports show it (a :class:`Rule` without its body)."""

    id: str
    name: str
    severity: str
    summary: str = ""
    doc: str = ""
    fix: str = ""
    source: str | None = None

    @classmethod
    def from_rule(cls, rule: Rule) -> RuleDoc:
        return cls(
            id=rule.id,
            name=rule.name,
            severity=rule.severity,
            summary=rule.summary,
            doc=rule.doc,
            fix=rule.fix,
            source=str(rule.source) if rule.source else None,
        )


@dataclass
class ReportInputs:
    """Everything the report writers need; see :meth:`load`."""

    out: Path
    findings: dict[str, Any]
    ingest: dict[str, Any] | None = None
    store: Store | None = None
    rules: dict[str, RuleDoc] = field(default_factory=dict)
    bench: list[BenchResult] = field(default_factory=list)
    input_root: Path | None = None
    _sessions: pl.DataFrame | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls,
        out: str | os.PathLike[str],
        *,
        result: RunResult | None = None,
        rules: Iterable[Rule] | None = None,
        input_root: str | os.PathLike[str] | None = None,
    ) -> ReportInputs:
        """Read ``OUT/findings.json`` (or use ``result``), ``OUT/ingest.json`` and the store.

        ``rules`` supplies documentation for SARIF and the HTML; without it the built-in rules
        are loaded. ``input_root`` is where ``vllm bench`` result JSON is looked for; it defaults
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
        inputs.rules = _rule_docs(rules)
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
        """The rank session's ``trace_view.json`` (what annotations and SARIF point at)."""
        path = self.session_paths().get((rank, session))
        return path / TRACE_FILE if path else None

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


def _rule_docs(rules: Iterable[Rule] | None) -> dict[str, RuleDoc]:
    if rules is None:
        try:
            from traceanalyzer.engine.loader import load_rules

            rules = load_rules().rules
        except Exception:  # documentation is optional: a broken rule pack must not stop reports
            rules = []
    return {rule.id: RuleDoc.from_rule(rule) for rule in rules}
