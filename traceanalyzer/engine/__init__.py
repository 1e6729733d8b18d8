"""The rule engine: rule API, runner and findings.

Rule authors import from :mod:`traceanalyzer.kit`, which re-exports this API with the domain
vocabulary and the shared analyses.
"""

from __future__ import annotations

from traceanalyzer.engine.findings import Evidence, Finding, Note, fingerprint, group_findings
from traceanalyzer.engine.params import Param
from traceanalyzer.engine.presentation import FigureContext, KeyFigure, Mark
from traceanalyzer.engine.rule import (
    AnyOf,
    NotEvaluated,
    Requirement,
    Rule,
    RuleContext,
    rule,
    sql_rule,
)
from traceanalyzer.engine.runner import (
    RuleStatus,
    RunResult,
    evaluate,
    evaluate_rule,
    reduce_outcomes,
    write_findings_json,
)

__all__ = [
    "AnyOf",
    "Evidence",
    "FigureContext",
    "Finding",
    "KeyFigure",
    "Mark",
    "Note",
    "NotEvaluated",
    "Param",
    "Requirement",
    "Rule",
    "RuleContext",
    "RuleStatus",
    "RunResult",
    "evaluate",
    "evaluate_rule",
    "fingerprint",
    "group_findings",
    "reduce_outcomes",
    "rule",
    "sql_rule",
    "write_findings_json",
]
