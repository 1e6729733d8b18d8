"""The rule engine: rule API, runner and findings.

Rule authors import from :mod:`traceanalyzer.kit`, which re-exports this API with the domain
vocabulary and the shared analyses.
"""

from __future__ import annotations

from traceanalyzer.engine.findings import Evidence, Finding
from traceanalyzer.engine.params import Param
from traceanalyzer.engine.presentation import KeyFigure, Mark
from traceanalyzer.engine.rule import (
    AnyOf,
    NotEvaluated,
    Requirement,
    Rule,
    RuleContext,
    rule,
    sql_rule,
)
from traceanalyzer.engine.runner import RunResult, evaluate, write_findings_json

__all__ = [
    "AnyOf",
    "Evidence",
    "Finding",
    "KeyFigure",
    "Mark",
    "NotEvaluated",
    "Param",
    "Requirement",
    "Rule",
    "RuleContext",
    "RunResult",
    "evaluate",
    "rule",
    "sql_rule",
    "write_findings_json",
]
