"""The `traceanalyzer` command: a thin shell over the Python API.

Exit codes: 0 success; 1 a finding at or above ``--fail-on``; 2 usage or input error (including
an unusable ``--out``); 4 the output could not be written during the run (disk full...);
3 partial run (a rank or file could not be analysed, lost data, or a rule failed; the rest was);
130 interrupted.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from traceanalyzer import interrupts, process_env
from traceanalyzer.clitypes import ExistingPath
from traceanalyzer.exitcodes import (
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OUTPUT,
    EXIT_PARTIAL,
    EXIT_USAGE,
    UsageFailure,
)
from traceanalyzer.outdir import LOCK_WAIT_SECONDS
from traceanalyzer.printable import printable
from traceanalyzer.version import __version__

if TYPE_CHECKING:
    from traceanalyzer.engine.runner import RunResult
    from traceanalyzer.ingest import IngestResult, SessionOutcome

# Before anything imports polars or numpy (every command imports them lazily, below).
for _note in process_env.configure():
    click.echo(f"warning: {printable(_note)}", err=True)


def _say(text: str, err: bool = False, width: int | None = None) -> None:
    """A line (or lines) with text from the input in it, without its control characters, each
    wrapped to ``width`` (None: as is) under a hanging indent."""
    text = printable(text, lines=True)
    if width is not None:
        from traceanalyzer.report.width import wrap

        text = "\n".join(part for line in text.split("\n") for part in wrap(line, width, 4))
    click.echo(text, err=err)


class _Progress:
    """Live progress on stderr: a redrawn line on a TTY, plain lines otherwise (CI logs).

    On a TTY the line also counts the seconds since the last finished session, so a single large
    rank (a 2 GB trace parses for half a minute) never looks hung.
    """

    TICK_SECONDS = 1.0

    def __init__(self, quiet: bool, width: int | None = None):
        self.quiet = quiet
        self.width = width  # the terminal's (None: no limit): notes wrap, a redrawn line fits
        self.tty = sys.stderr.isatty()
        self._line = ""
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __call__(self, event: str, done: int, total: int, outcome: SessionOutcome | None) -> None:
        if self.quiet:
            return
        if event == "start":
            click.echo(f"ingesting {total} rank session(s) ({done} cached)", err=True)
            if self.tty and done < total:
                self._line = f"[{done}/{total}] parsing"
                self._since = time.monotonic()
                threading.Thread(target=self._tick, daemon=True).start()
        elif event == "session" and outcome is not None:
            # a failure's reason is said once, in the summary under the table
            what = "FAILED (the reason is below)" if outcome.status == "failed" else outcome.status
            head = f"[{done}/{total}] rank {outcome.rank} "
            tail = f": {what} ({outcome.seconds:.1f} s)"
            session = printable(outcome.session)
            if self.width is not None:  # one line, redrawn in place: the session's name gives
                from traceanalyzer.report.width import shorten_middle

                room = self.width - len(head) - len(tail) - len(" · parsing on … 999 s")
                session = shorten_middle(session, max(room, SESSION_NAME))
            line = head + session + tail
            with self._lock:
                self._since = time.monotonic()
                if not self.tty:
                    click.echo(line, err=True)
                elif outcome.status == "failed":  # keep failures on screen
                    click.echo("\r\033[K" + line, err=True)
                    self._line = f"[{done}/{total}] parsing"
                else:
                    click.echo("\r\033[K" + line, err=True, nl=False)
                    self._line = line
        elif event == "done":
            self.close()
        elif event not in ("start", "session"):  # a note from the ingest
            with self._lock:
                if self.tty:  # over the redrawn line
                    click.echo("\r\033[K", err=True, nl=False)
                _say(event, err=True, width=self.width)

    def close(self) -> None:
        """Stop the ticker and end its line (also when the ingest ends with an error or Ctrl-C)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.tty and self._line:
            with self._lock:
                click.echo("\r\033[K" + self._line, err=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_SECONDS):
            with self._lock:
                if self._stop.is_set():  # stopped while this tick waited for the lock
                    return
                waited = time.monotonic() - self._since
                more = "" if self._line.endswith("parsing") else " · parsing on"
                click.echo(f"\r\033[K{self._line}{more} … {waited:.0f} s", err=True, nl=False)


_SUMMARY_TABLES = ("slices", "counters", "flows", "kernels")  # the rest is summed as "other"


def _summary(result: IngestResult, verbose: bool = False, width: int | None = None) -> str:
    """A table of the sessions, then their notes (identical notes of several ranks grouped),
    within ``width`` columns (the terminal's; None: no limit).

    What holds for every export of a generation (G2 never writes task_time.csv) and the store's
    upkeep are in ingest.json; ``verbose`` prints them too."""
    from traceanalyzer.engine.findings import rank_words
    from traceanalyzer.report.width import shorten_middle, table_lines, wrap

    header = ["rank", "session", "status", "format", "level", *_SUMMARY_TABLES, "other rows"]
    rows = []
    notes: dict[str, list[tuple[int, str]]] = {}
    uncollected: dict[str, list[tuple[int, str]]] = {}
    for o in result.outcomes:
        other = sum(n for t, n in o.rows.items() if t not in _SUMMARY_TABLES)
        counts = [f"{o.rows.get(t, 0):,}" for t in _SUMMARY_TABLES]
        session = o.session if width is None else shorten_middle(o.session, SESSION_NAME)
        rows.append(
            [str(o.rank), session, o.status, o.generation or "?", o.profiler_level or "?",
             *counts, f"{other:,}"]
        )  # fmt: skip
        listed = (
            ("missing (tables empty)", o.missing_files),
            ("incomplete (data lost)", o.incomplete_files),
        )
        for table in o.not_collected:  # each said once for the ranks it concerns, below
            uncollected.setdefault(table, []).append((o.rank, o.session))
        session_notes = [
            *(f"{what}: {', '.join(files)}" for what, files in listed if files),
            *(f"warning: {w}" for w in o.warnings),
            *(f"note: {n}" for n in o.notes),
            *([f"error: {o.error}"] if o.error else []),
        ]
        for note in session_notes:
            notes.setdefault(note, []).append((o.rank, o.session))
    by_where: dict[tuple[tuple[int, str], ...], list[str]] = {}
    for table, where in uncollected.items():
        by_where.setdefault(tuple(where), []).append(table)
    for where, tables in by_where.items():
        notes.setdefault(f"not collected (tables empty): {', '.join(tables)}", []).extend(where)
    # the rows' counts are said even when 0 (blank=()): a table not filled is news
    lines = [f"store: {result.out}"]
    lines += table_lines(header, rows, width, keep=5, blank=(), left=header[1:5])
    sessions_of_rank = Counter(o.rank for o in result.outcomes)
    for note, where in notes.items():
        ranks = [rank for rank, _ in where]
        if any(sessions_of_rank[rank] > 1 for rank in ranks):  # name the session too
            label = "; ".join(f"rank {rank} {session}" for rank, session in where)
        else:
            label = rank_words(ranks)
        lines.append(f"  {label}: {printable(note)}")
    if verbose:
        lines += [f"  {note}" for note in result.generation_notes]
        if result.removed_unlisted:
            lines.append(
                "  removed stored tables the manifest does not list: "
                + ", ".join(result.removed_unlisted)
            )
    for p in result.discovery.problems:
        where = f" {p.path}:" if p.path else ""
        lines.append(printable(f"  {p.severity}:{where} {p.message}"))
    ranks = sorted({o.rank for o in result.outcomes})
    lines.append(
        f"{len(ranks)} rank(s), {len(result.outcomes)} session(s), "
        f"{sum(o.status == 'cached' for o in result.outcomes)} cached, {len(result.failed)} failed"
        f" (rows of every table: {result.out / 'ingest.json'})"
    )
    return "\n".join(part for line in lines for part in wrap(line, width, 4))


def _partial_lines(result: IngestResult) -> list[str]:
    """What a partial run left out, a line each (text from the input made printable)."""
    lines = [f"FAILED   rank {o.rank} {o.session}: {o.error}" for o in result.failed]
    lines += [
        f"INCOMPLETE rank {o.rank} {o.session}: {', '.join(o.incomplete_files)}"
        for o in result.outcomes
        if o.incomplete_files
    ]
    # warnings too: duplicate sessions and missing ranks lose data even when every file parsed
    lines += [
        f"{'skipped' if p.severity == 'error' else 'warning'}  "
        + (f"{p.path}: " if p.path else "")  # a problem of the whole collection has no path
        + p.message
        for p in result.discovery.problems
        if p.severity in ("error", "warning")
    ]
    return [printable(line) for line in lines]


# a session's directory name in the terminal (its table, the progress), shortened in the
# middle beyond this when the width is known: its ends tell it (host, pid; the time)
SESSION_NAME = 28


# Subcommands live in their subsystems and load on first use, so `--help` and `run` do not pay
# for polars, duckdb or matplotlib they never touch. The one-line help is repeated here so that
# listing the commands imports nothing (tests/test_cli_startup.py keeps it equal to the real one).
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "annotate": (
        "traceanalyzer.report.cli",
        "annotate_command",
        "Write each rank session's timeline (Text or Db) into OUT/annotated/ with the findings' marks on their own tracks.",
    ),
    "diff": (
        "traceanalyzer.compare.cli",
        "diff_command",
        "Compare two runs: findings new / resolved / changed, and key figures per rank.",
    ),
    "query": (
        "traceanalyzer.query.cli",
        "query_command",
        "Run DuckDB SQL over a run's store: each table is a view (slices, kernels, summary_steps).",
    ),
    "recipe": (
        "traceanalyzer.recipes.cli",
        "recipe_group",
        "Bundled vLLM launch recipes that reproduce known Ascend problems and profile them.",
    ),
    "rules": (
        "traceanalyzer.authoring.cli",
        "rules_group",
        "List, explain, scaffold and test rules.",
    ),
    "synth": (
        "traceanalyzer.synth.cli",
        "synth_command",
        "Write SCENARIO as complete *_ascend_pt rank directories under --out.",
    ),
}


def _unavailable(name: str, exc: Exception) -> click.Command:
    """Stands in for a subcommand whose module cannot be imported: says why instead of
    click's "no such command"."""

    def fail(**_: object) -> None:
        raise UsageFailure(
            f"'{name}' is unavailable in this installation ({type(exc).__name__}: {exc}); "
            "reinstall traceanalyzer with its dependencies (pip install traceanalyzer)"
        )

    return click.Command(
        name,
        callback=fail,
        help=LAZY_COMMANDS[name][2],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


def _show(exc: click.ClickException) -> None:
    """click's report of an error, spelled as every other error of this tool: ``error: ...``."""
    if type(exc).show not in (click.ClickException.show, click.UsageError.show):
        exc.show()  # its own report, not an error line (no arguments: the help)
        return
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:  # a usage error: the command's usage line first, as click does
        click.echo(f"{ctx.get_usage()}\nTry '{ctx.command_path} --help' for help.\n", err=True)
    click.echo(printable(f"error: {exc.format_message()}"), err=True)


class _LazyGroup(click.Group):
    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """click's standalone mode, with our spelling of errors and exit 130 on Ctrl-C."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            with interrupts.installed():  # rule code's KeyboardInterrupt is not the user's
                code = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as exc:
            _show(exc)
            sys.exit(exc.exit_code)
        except click.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS and name not in self.commands:
            module, attr, _ = LAZY_COMMANDS[name]
            try:
                self.add_command(getattr(importlib.import_module(module), attr), name)
            except (ImportError, AttributeError) as exc:  # a broken subsystem never breaks `run`
                return _unavailable(name, exc)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS and name not in self.commands:
                rows.append((name, LAZY_COMMANDS[name][2]))
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=120)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceanalyzer")
def main() -> None:
    """Analyse Ascend NPU (torch_npu) profiler exports: findings with evidence and fixes."""


_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}
# the indent of a wrapped line of the findings table: under its rule's name (past the label)
TEXT_COLUMN = 11


def _findings_table(  # noqa: ANN001 - engine RunResult
    result, out: Path, width: int | None = None, quiet: bool = False
) -> str:
    """The compact closing table: severity, rule, ranks, one-line message (and its cost),
    each line wrapped to ``width`` under its text; ``quiet``: the findings, and only a count
    of the rules that could not decide or were not evaluated (findings.json says why)."""
    from traceanalyzer.overview.model import read_overview
    from traceanalyzer.report.overview_text import cost_text
    from traceanalyzer.report.width import wrap

    color = sys.stdout.isatty()
    costs = read_overview(result.overview).costs if result.overview else {}
    lines = []
    for f in result.findings:
        severity = f"{f.severity:<9}"
        cost = cost_text(costs.get(f.fingerprint))
        caveat = "  [on incomplete input: see findings.json caveats]" if f.caveats else ""
        title = printable(f.title)
        line = f"{severity}  {printable(f.name):<24} {f.ranks_label:<16} {title}{caveat}"
        line += f" [{cost}]" if cost else ""
        wrapped = wrap(line, width, TEXT_COLUMN)
        if color:  # the severity styled after the wrap: its escapes take no column
            style = click.style(severity, fg=_SEVERITY_STYLE.get(f.severity), bold=True)
            wrapped[0] = style + wrapped[0][len(severity) :]
        lines += wrapped
    if not result.findings:
        lines.append("no findings")
    if quiet:
        undecided, skipped = len(result.inconclusive), len(result.not_evaluated)
        counted = [(undecided, "inconclusive"), (skipped, "not evaluated")]
        said = [f"{n} rule(s) {what}" for n, what in counted if n]
        if said:
            lines += wrap(
                f"{', '.join(said)}: findings.json says why (or run without -q)", width, 4
            )
    else:
        for status in result.inconclusive:  # the label says the status: the reason need not
            reason = (status.reason or "").removeprefix("inconclusive: ")
            reason = reason.removeprefix("inconclusive ")
            # the longer label takes from the name's column: the reasons stay aligned
            line = f"inconclusive  {status.name:<21} {reason}"
            lines += wrap(printable(line), width, TEXT_COLUMN)
        for status in result.not_evaluated:
            line = f"{'skipped':<9}  {status.name:<24} not evaluated: {status.reason}"
            lines += wrap(printable(line), width, TEXT_COLUMN)
    for error in result.errors:
        line = f"{'ERROR':<9}  {error['name'] or error['rule']:<24} rule failed: {error['error']}"
        lines += wrap(printable(line), width, TEXT_COLUMN)
    lines.append(printable(f"findings: {out / 'findings.json'}"))
    return "\n".join(lines)


def _top_option(name: str, rows: int, what: str, table: str) -> Callable[[Any], Any]:
    """``run``'s size of one of the overview's top tables (``table``: where the store keeps it)."""
    return click.option(
        name,
        type=click.IntRange(min=1),
        default=rows,
        show_default=True,
        help=f"{what} in the overview's top table ({table}).",
    )


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Output directory (default: ./traceanalyzer-out/<name>, never inside PATH).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=min(4, os.cpu_count() or 1),
    show_default=True,
    help="Rank sessions parsed in parallel.",
)
@click.option(
    "--executor",
    "executor_name",
    type=click.Choice(["auto", "local", "processes", "ray"]),
    default="auto",
    show_default=True,
    help="Where per-rank work runs: this process, a process pool, or Ray (traceanalyzer[ray]); "
    "auto: this process for small work, a pool otherwise (the run says which, and why).",
)
@click.option(
    "--ray-address",
    metavar="auto|HOST:PORT",
    help="Join this Ray cluster (with --executor ray); default: start Ray locally with --jobs CPUs.",
)
@click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=ExistingPath(file_okay=False, path_type=Path),
    help="Extra rule folder (repeatable; default: ./traceanalyzer-rules when it exists, as "
    "`rules list/test` read it).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="RULE.PARAM=VALUE",
    help="Override a rule parameter (repeatable).",
)
@click.option(
    "--config",
    "config_path",
    type=ExistingPath(dir_okay=False, path_type=Path),
    help="traceanalyzer.toml or pyproject.toml with rule settings.",
)
@click.option(
    "--fail-on",
    type=click.Choice(["info", "warning", "error"]),
    help="Exit 1 when a finding at or above this severity exists.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Re-ingest and re-evaluate every session even if the store is current.",
)
@click.option(
    "--parse-memory",
    metavar="1.2x|SIZE",
    default="1.2x",
    show_default=True,
    help="For traces the DuckDB reader parses (no C compiler at install, or a damaged file): "
    "its buffers per trace, a multiple of its size, or 800MB, 2GB. More is faster (less "
    "spilling to disk); peak memory per worker follows it.",
)
@_top_option("--top-kernels", 20, "Kernels", "store: summary_kernels")
@_top_option("--top-apis", 20, "Host APIs (CANN and Python ops)", "summary_host_apis")
@_top_option("--top-collectives", 10, "Collectives", "summary_collectives")
@click.option(
    "--annotate",
    is_flag=True,
    help="Also write each rank session's timeline with the findings' marks merged in (as `annotate OUT`).",
)
@click.option(
    "--lock-wait",
    type=click.FloatRange(min=0),
    default=LOCK_WAIT_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for another run that writes the same --out, then give up (exit 2).",
)
@click.option(
    "--rank-timeout",
    type=click.FloatRange(min=1),
    metavar="SECONDS",
    help="How long one rank session may take to read; past it the rank fails, said so, and the "
    "run goes on (default: 300 s plus 2 s per MB of its files).",
)
@click.option(
    "--follow-links",
    is_flag=True,
    help="Also follow the links in PATH that lead out of it (by default they are reported, "
    "not followed: a collection's link to / or to a sibling folder is not its data).",
)
@click.option("--quiet", "-q", is_flag=True, help="Only print the final summary.")
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also print what holds for whole export generations and the store's upkeep "
    "(ingest.json has them either way).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="`json` prints findings.json on stdout.",
)
def run(**options: Any) -> None:
    """Ingest PATH (a profiling_data folder or one *_ascend_pt dir), run the rules, report."""
    try:
        _run(**options)
    except KeyboardInterrupt:
        # Finished sessions are already in the store: the same command picks up where this stopped.
        click.echo(
            "\ninterrupted: finished rank sessions are kept; re-run the same command to resume",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)


def _run(
    path: Path,
    out: Path | None,
    jobs: int,
    executor_name: str,
    ray_address: str | None,
    rule_dirs: tuple[Path, ...],
    overrides: tuple[str, ...],
    config_path: Path | None,
    fail_on: str | None,
    force: bool,
    parse_memory: str,
    top_kernels: int,
    top_apis: int,
    top_collectives: int,
    annotate: bool,
    lock_wait: float,
    rank_timeout: float | None,
    follow_links: bool,
    quiet: bool,
    verbose: bool,
    fmt: str,
) -> None:
    from traceanalyzer import read_ahead
    from traceanalyzer.discover import default_out_dir

    out = out or default_out_dir(path)
    # before the libraries load: the trace's scan takes the core their imports leave idle
    read_ahead.start(path, out, executor=executor_name, force=force)

    # The imports make objects, not garbage: no collection walks them
    gc.disable()
    from traceanalyzer.engine.config import ConfigError
    from traceanalyzer.engine.loader import RulesNotLoaded
    from traceanalyzer.executor import ExecutorError, make_executor
    from traceanalyzer.ingest import InputError
    from traceanalyzer.outdir import OutputError, OutputRefused
    from traceanalyzer.overview import TopSizes
    from traceanalyzer.parse.trace_view import ParseMemory
    from traceanalyzer.pipeline import analyse

    # The libraries' objects live as long as this process: frozen, the collector's full passes
    # (the parse's cycles) do not walk them again.
    gc.freeze()
    gc.enable()
    try:
        memory = ParseMemory.parse(parse_memory)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--parse-memory") from exc
    if ray_address and executor_name != "ray":
        raise click.UsageError("--ray-address is only used with --executor ray")

    from traceanalyzer.discover import input_root
    from traceanalyzer.engine.config import default_rule_dirs

    # as `rules list/test` do: ./traceanalyzer-rules when no --rules is given (not the data's)
    rule_dirs, rules_note = default_rule_dirs(rule_dirs, [input_root(path)])
    from traceanalyzer.report.width import terminal_width

    width = terminal_width()
    show_progress = not (quiet or fmt == "json")
    try:
        # one executor for both maps (ingest, then rank rules): workers are started once
        executor = make_executor(executor_name, jobs=jobs, ray_address=ray_address)
        progress = _Progress(not show_progress, width)
        try:
            analysis = analyse(
                path,
                out,
                executor=executor,
                jobs=jobs,
                progress=progress,
                log=(lambda line: _say(line, err=True, width=width)) if show_progress else None,
                force=force,
                rule_dirs=rule_dirs,
                overrides=overrides,
                config_path=config_path,
                fail_on=fail_on,
                memory=memory,
                top=TopSizes(top_kernels, top_apis, top_collectives),
                lock_wait=lock_wait,
                follow_links=follow_links,
                rank_timeout=rank_timeout,
            )
        finally:
            progress.close()
            executor.close()
    except (InputError, OutputRefused, ExecutorError, ConfigError, RulesNotLoaded) as exc:
        _say(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except OutputError as exc:
        _say(f"error: {exc}; the input is fine: free space or fix --out, then re-run", err=True)
        sys.exit(EXIT_OUTPUT)
    result, findings, reports = analysis.ingest, analysis.findings, analysis.reports
    if findings is None or reports is None:
        for p in result.discovery.problems:
            _say(f"error: {p.path + ': ' if p.path else ''}{p.message}", err=True)
        _say(f"error: {path}: no analysable rank session found", err=True)
        sys.exit(EXIT_USAGE)
    if fmt == "json":
        click.echo(json.dumps(findings.to_dict(), indent=1, default=str))
    else:
        if not quiet:
            click.echo(_summary(result, verbose, width))
        else:  # even quiet, a partial run says what was left out
            for line in _partial_lines(result):
                _say(line, width=width)
        click.echo(_findings_table(findings, out, width, quiet))
        _say(analysis.config.describe() if analysis.config else "config: none", width=width)
        if rules_note:
            _say(rules_note, width=width)
        if findings.overview:
            from traceanalyzer.overview.model import read_overview
            from traceanalyzer.report.overview_text import overview_table

            overview = read_overview(findings.overview)
            if not quiet:
                _say(overview_table(overview, verbose, width))
            elif overview.headline:  # quiet: what the time goes to, in a line
                _say(f"where the time goes: {overview.headline}", width=width)
        click.echo(reports.closing_text(color=sys.stdout.isatty()))
    if annotate and reports.report is not None:
        from traceanalyzer.report.annotated import annotated_text, write_annotated

        # after the JSON document, on stderr: stdout stays parseable
        _say(annotated_text(write_annotated(reports.report), out), err=fmt == "json")
    if reports.files.unwritable:
        sys.exit(EXIT_OUTPUT)
    if findings.exit_code:
        # the last line says why a CI gate failed (stderr under --format json: stdout is JSON)
        _say(_gate_line(findings), err=fmt == "json", width=width)
        sys.exit(EXIT_FINDINGS)
    if result.partial or findings.errors:  # a rule that failed judged nothing: partial
        sys.exit(EXIT_PARTIAL)


def _gate_line(findings: RunResult) -> str:
    from traceanalyzer.engine.findings import SEVERITY_RANK

    threshold = SEVERITY_RANK[findings.fail_on or "info"]
    gating = [f for f in findings.findings if SEVERITY_RANK[f.severity] >= threshold]
    shown = "; ".join(f"{f.severity} {f.name} on {f.ranks_label}" for f in gating[:5])
    more = f"; and {len(gating) - 5} more" if len(gating) > 5 else ""
    return (
        f"failed: {len(gating)} finding(s) at or above --fail-on {findings.fail_on} "
        f"({shown}{more}): exit {EXIT_FINDINGS}"
    )


def entry() -> None:
    """The console script: :func:`main`, then an exit that skips the interpreter's teardown.

    Tearing down frees every object of polars, pyarrow and DuckDB one by one and joins their
    thread pools: 0.15-0.2 s of a run, after its last report is written. Every file is closed
    and every pool joined by then, so the process ends at once, with the command's exit code,
    unless something still needs its exit handlers: Ray's local cluster, child processes.
    """
    try:
        main()
        code: int | str | None = 0
    except SystemExit as done:
        code = done.code
    if "ray" in sys.modules or _children_alive():
        sys.exit(code)
    if isinstance(code, str):  # sys.exit("message"): the message goes to stderr, exit 1
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe (`| head`) or stream: nothing to flush to
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code or 0)


def _children_alive() -> bool:
    multiprocessing = sys.modules.get("multiprocessing")
    return bool(multiprocessing and multiprocessing.active_children())


if __name__ == "__main__":
    entry()
