"""``traceanalyzer annotate OUT``: each rank session's timeline with the run's findings merged in."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceanalyzer.clitypes import ExistingPath
from traceanalyzer.exitcodes import EXIT_PARTIAL, UsageFailure
from traceanalyzer.printable import printable


@click.command("annotate")
@click.argument("out", type=ExistingPath(file_okay=False, path_type=Path))
@click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=ExistingPath(file_okay=False, path_type=Path),
    help="The run's extra rule folders (repeatable), so their findings are marked as they mark them.",
)
def annotate_command(out: Path, rule_dirs: tuple[Path, ...]) -> None:
    """Write each rank session's timeline (Text or Db) into OUT/annotated/ with the findings' marks on their own tracks."""
    from traceanalyzer.engine.config import load_run_rules
    from traceanalyzer.engine.loader import RulesNotLoaded
    from traceanalyzer.outdir import OutputRefused, check_own
    from traceanalyzer.report.annotated import annotated_text, write_annotated
    from traceanalyzer.report.documents import DamagedDocument
    from traceanalyzer.report.inputs import ReportInputs

    try:
        check_own(out)  # it writes OUT/annotated/: never through a link planted there
    except OutputRefused as exc:
        raise UsageFailure(str(exc)) from None
    if not (out / "findings.json").is_file():
        raise UsageFailure(
            f"{out} is not a run output (no findings.json); run `traceanalyzer run` first"
        )
    rules = load_run_rules(rule_dirs)
    if rules.errors:  # a finding of that rule would be marked as a rule that declares nothing
        raise UsageFailure(str(RulesNotLoaded(rules.errors)))
    try:  # an OUT someone sent is data: its documents and session ids are checked first
        report = ReportInputs.load(out, rules=rules.rules).prepare(figures=False)
    except DamagedDocument as exc:
        raise UsageFailure(str(exc)) from None
    results = write_annotated(report)
    click.echo(printable(annotated_text(results, out), lines=True))
    if any(r.skipped for r in results):
        sys.exit(EXIT_PARTIAL)
