"""Every report of a finished run, written in one call, and what ``run`` adds to the terminal
after the findings table.

Kept here so ``cli.py`` stays a thin shell: one call writes every report, one call renders the
closing lines (vllm bench TTFT/TPOT when the input has them, then where the report is).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from traceanalyzer.interrupts import contained
from traceanalyzer.printable import printable
from traceanalyzer.report.inputs import ReportData, ReportInputs
from traceanalyzer.report.writer import HTML, ReportFiles, write_reports

if TYPE_CHECKING:
    from traceanalyzer.engine import RunResult
    from traceanalyzer.engine.registry import RuleSet


@dataclass
class RunReports:
    files: ReportFiles
    report: ReportData | None  # what they were rendered from (None: it could not be prepared)

    def closing_text(self, color: bool = False) -> str:
        """Bench table (if any), report failures, and the line saying where report.html is."""
        lines = []
        if self.report is not None and self.report.bench:
            from traceanalyzer.recipes.bench import format_bench_table

            bench = printable(format_bench_table(self.report.bench), lines=True)
            lines += ["vllm bench (ms):", bench]
        for name, error in self.files.errors.items():
            lines.append(printable(f"report {name} failed: {error}"))
        html = self.files.html
        if html is not None:
            where = printable(f"report: {html}")
            lines.append(click.style(where, bold=True) if color else where)
        return "\n".join(lines)


def run_reports(
    out: str | os.PathLike[str],
    result: RunResult,
    rules: RuleSet,
    *,
    input_root: str | os.PathLike[str] | None = None,
) -> RunReports:
    """Write every report for a finished run (``rules``: the run's rules, which present their
    findings); never raises (reports must not fail a run)."""
    try:
        inputs = ReportInputs.load(out, result=result, rules=rules, input_root=input_root)
        report = inputs.prepare()
        return RunReports(write_reports(out, report=report), report)
    except BaseException as exc:  # rule code runs in the reports: its SystemExit too
        if not contained(exc):
            raise
        files = ReportFiles(errors={HTML: f"{type(exc).__name__}: {exc}"})
        return RunReports(files, None)
