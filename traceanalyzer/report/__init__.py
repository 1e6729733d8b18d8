"""Reports: findings + store -> terminal, ``report.html``, ``report.md``, ``findings.sarif``,
``annotations.json``, and the run-to-run ``diff``.

Every writer reads the same inputs (:class:`ReportInputs`: the findings.json document, ingest.json,
the store, rule docs), so reports can be regenerated from an output directory alone.
"""

from __future__ import annotations

from traceanalyzer.report.inputs import ReportInputs, RuleDoc
from traceanalyzer.report.writer import ReportFiles, write_reports

__all__ = ["ReportFiles", "ReportInputs", "RuleDoc", "write_reports"]
