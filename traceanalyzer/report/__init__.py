"""Reports: findings + store -> terminal, ``report.html``, ``report.md``, ``findings.sarif``,
``annotations.json``. Each finding is presented by its own rule (figure, caption, marks).

Every writer renders the same values, prepared once (:class:`ReportInputs` loads the
findings.json document, ingest.json, the store and the rules; its ``prepare()`` gathers them
into a ``ReportData``), so reports can be regenerated from an output directory alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReportFiles", "ReportInputs", "write_reports"]

_HOMES = {
    "ReportFiles": "traceanalyzer.report.writer",
    "write_reports": "traceanalyzer.report.writer",
    "ReportInputs": "traceanalyzer.report.inputs",
}


def __getattr__(name: str) -> Any:
    """Lazy exports: `traceanalyzer --help` and `diff` must not pay for the report modules."""
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
