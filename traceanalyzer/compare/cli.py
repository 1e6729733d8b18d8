"""``traceanalyzer diff BASE TARGET``: compare two runs (output dirs, or input dirs to analyse)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from traceanalyzer.clitypes import ExistingPath
from traceanalyzer.exitcodes import EXIT_FINDINGS, EXIT_OUTPUT, EXIT_USAGE
from traceanalyzer.printable import printable
from traceanalyzer.store import write_atomic_text

if TYPE_CHECKING:
    from traceanalyzer.engine.loader import LoadedRules


PLOTS = "plots"  # the waterfalls diff.md shows, beside it


def is_output_dir(path: Path) -> bool:
    return (path / "findings.json").is_file()


def analyse(path: Path, jobs: int, quiet: bool, rules: LoadedRules) -> Path:
    """Analyse a trace folder exactly as `run` does, into its default output dir (cached)."""
    from traceanalyzer.discover import default_out_dir
    from traceanalyzer.executor import make_executor
    from traceanalyzer.pipeline import analyse as analyse_input

    out = default_out_dir(path)
    if not quiet:
        click.echo(printable(f"analysing {path} -> {out}"), err=True)
    executor = make_executor("auto", jobs=jobs)
    try:
        analysis = analyse_input(path, out, executor=executor, jobs=jobs, rules=rules)
    finally:
        executor.close()
    if analysis.findings is None:
        raise click.UsageError(f"{path}: neither a run output (findings.json) nor a trace folder")
    return out


@click.command("diff")
@click.argument("base", type=ExistingPath(file_okay=False, path_type=Path))
@click.argument("target", type=ExistingPath(file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Where to write diff.html, diff.md and diff.json (default: a sibling of TARGET's output, `diff-<base>-vs-<target>`).",
)
@click.option(
    "--fail-on-new",
    is_flag=True,
    help="Exit 1 when TARGET has findings BASE does not (CI regression gate).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="`json` prints diff.json on stdout.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Parallel parsing when an input dir must be analysed first.",
)
@click.option("--quiet", "-q", is_flag=True, help="Only the summary.")
def diff_command(
    base: Path, target: Path, out: Path | None, fail_on_new: bool, fmt: str, jobs: int, quiet: bool
) -> None:
    """Compare two runs: findings new / resolved / changed, and key figures per rank.

    BASE and TARGET are output dirs of `traceanalyzer run`, or trace folders, which are then
    analysed first into their default output dirs.
    """
    from traceanalyzer.compare.diff import diff_outputs
    from traceanalyzer.compare.explain_render import waterfalls
    from traceanalyzer.compare.render import (
        render_diff_html,
        render_diff_markdown,
        render_diff_text,
    )
    from traceanalyzer.engine.config import ConfigError, load_run_rules
    from traceanalyzer.engine.loader import RulesNotLoaded
    from traceanalyzer.executor import ExecutorError
    from traceanalyzer.ingest import InputError
    from traceanalyzer.outdir import OutputError, OutputRefused, check_out, check_own, writes
    from traceanalyzer.report.documents import DamagedDocument

    quiet = quiet or fmt == "json"
    try:
        if out is not None:  # refused before any work: never into a trace folder it reads
            for side in (base, target):
                if not is_output_dir(side):
                    check_out(out, side)
            if out.exists() and not out.is_dir():
                raise OutputRefused(f"--out {out} exists and is not a directory")
        # once: both analyses, if any, and the key figures; a config inside either side
        # sets parameters, never loads its rule code
        rules = load_run_rules(inputs=(base, target))
        if rules.errors:  # key figures without a rule's would read as "unchanged"
            raise RulesNotLoaded(rules.errors)
        base_out = base if is_output_dir(base) else analyse(base, jobs, quiet, rules)
        target_out = target if is_output_dir(target) else analyse(target, jobs, quiet, rules)
        for side in (base_out, target_out):
            check_own(side)  # a run's output, as traceanalyzer left it: no link, no FIFO
        result = diff_outputs(base_out, target_out, rules.rules)
    except (
        InputError,
        OutputRefused,
        OutputError,
        ExecutorError,
        ConfigError,
        RulesNotLoaded,
        DamagedDocument,
    ) as exc:
        click.echo(printable(f"error: {exc}"), err=True)
        sys.exit(EXIT_USAGE)
    out = out or target_out.parent / f"diff-{base_out.name}-vs-{target_out.name}"
    doc = json.dumps(result.to_dict(), indent=1) + "\n"
    svgs = waterfalls(result.phases)
    plot_files = {phase: f"{PLOTS}/waterfall-{phase}.svg" for phase in svgs}
    try:
        with writes(out):
            write_atomic_text(out / "diff.json", doc)
            for phase, svg in svgs.items():
                write_atomic_text(out / plot_files[phase], svg)
            write_atomic_text(out / "diff.html", render_diff_html(result, out, svgs=svgs))
            write_atomic_text(out / "diff.md", render_diff_markdown(result, plot_files) + "\n")
    except OutputError as exc:
        click.echo(printable(f"error: {exc}"), err=True)
        sys.exit(EXIT_OUTPUT)
    if fmt == "json":
        click.echo(doc, nl=False)
    else:
        click.echo(printable(render_diff_text(result), lines=True))
        click.echo(printable(f"diff report: {out / 'diff.html'}"))
    if fail_on_new and result.has_new:
        sys.exit(EXIT_FINDINGS)
