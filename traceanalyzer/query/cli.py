"""``traceanalyzer query OUT "SQL"``: the click command over :mod:`.store_sql` and :mod:`.formats`."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from traceanalyzer import interrupts
from traceanalyzer.clitypes import ExistingPath
from traceanalyzer.exitcodes import EXIT_OUTPUT, UsageFailure
from traceanalyzer.query.formats import FORMATS

if TYPE_CHECKING:
    import duckdb


@click.command("query")
@click.argument("out", type=ExistingPath(file_okay=False, path_type=Path))
@click.argument("sql", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="table: DuckDB's box, the first and last rows of a long result; csv, json (an array of "
    "objects) and parquet: every row.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the result to FILE instead of stdout (parquet needs it); never inside OUT.",
)
@click.option(
    "--list", "list_tables", is_flag=True, help="List the tables and their columns, then exit."
)
def query_command(
    out: Path, sql: str | None, fmt: str, output: Path | None, list_tables: bool
) -> None:
    """Run DuckDB SQL over a run's store: each table is a view (slices, kernels, summary_steps).

    The views carry the partition keys `rank` and `session` as columns, in the types of
    docs/schema.md. Read-only: only a query runs (SELECT, WITH, FROM, DESCRIBE, SHOW,
    SUMMARIZE). Example:

    traceanalyzer query OUT "SELECT rank, name, count(*) AS n FROM slices GROUP BY ALL
    ORDER BY n DESC LIMIT 5"
    """
    from traceanalyzer.query.store_sql import QueryError, check_run_output, open_query

    try:
        if list_tables:
            if sql is not None:
                raise UsageFailure("give SQL or --list, not both")
            check_run_output(out)
            click.echo(_table_list(out))
            return
        if sql is None:
            raise UsageFailure(
                'give the SQL to run (traceanalyzer query OUT "SELECT ..."), or --list'
            )
        if fmt == "parquet" and output is None:
            raise UsageFailure("--format parquet writes a file: add --output FILE")
        if output is not None:
            output = output.resolve()  # the one file the connection may write, by this name
            if output.is_relative_to(out.resolve()):
                raise UsageFailure(
                    f"--output {output} is inside the run output {out}, which query never writes"
                )
        query = open_query(out, sql, output)
    except QueryError as exc:
        raise UsageFailure(str(exc)) from None
    with query:
        _interruptible(query.connection, lambda: _write(query.relation, fmt, output))


def _interruptible(connection: duckdb.DuckDBPyConnection, work: Callable[[], None]) -> None:
    """``work()`` on a thread while this one waits for it, so Ctrl-C (or SIGTERM) stops the
    query at once (DuckDB looks at signals only now and then): the query is interrupted, its
    connection closed and its spill folder removed by the caller, exit 130, no Traceback."""
    failed: list[BaseException] = []
    done = threading.Event()  # waited on, not join()ed: an interrupted join() loses the thread

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the waiting thread
            failed.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=run, name="query", daemon=True)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupts.on_signal) if main else None
    try:
        worker.start()
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        connection.interrupt()
        done.wait(_STOP_SECONDS)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    if failed:
        raise failed[0]


_STOP_SECONDS = 10.0  # how long an interrupted query may take to stop before the process ends


def _write(relation: duckdb.DuckDBPyRelation, fmt: str, output: Path | None) -> None:
    import duckdb

    from traceanalyzer.query.formats import write_result

    stdout = sys.stdout
    width = shutil.get_terminal_size().columns if stdout.isatty() else None
    try:
        write_result(relation, fmt, stdout, output, width)
    except (OSError, duckdb.IOException) as exc:
        click.echo(f"error: cannot write {output or 'the result'}: {exc}", err=True)
        sys.exit(EXIT_OUTPUT)
    except duckdb.Error as exc:  # found while running it (a cast of a bad value, ...)
        raise UsageFailure(str(exc)) from None


def _table_list(out: Path) -> str:
    """Each table with its rows in this store, its meaning, and its columns' types and meanings
    (docs/schema.md's source)."""
    import pyarrow.parquet as pq

    from traceanalyzer.query.store_sql import SQL_TYPES, STORE_TABLES, partition_files

    lines = []
    for table in STORE_TABLES.values():
        try:
            rows = sum(pq.read_metadata(f).num_rows for f in partition_files(out, table.name))
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError: a damaged footer
            raise UsageFailure(f"table {table.name}: unreadable partitions: {exc}") from None
        lines.append(f"{table.name} ({rows:,} rows): {table.doc}")
        width = max(len(c.name) for c in table.columns)
        lines += [f"  {c.name:<{width}}  {SQL_TYPES[c.type]:<7}  {c.doc}" for c in table.columns]
    return "\n".join(lines)
