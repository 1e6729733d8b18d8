"""A run's store as DuckDB SQL: one view per table, named like it, over its Parquet partitions
with ``rank`` and ``session`` as columns, in an in-memory database.

Read-only and offline by construction: the database is in memory, the views only read the
partitions, and only a single query statement runs (``SELECT``, ``WITH``, ``FROM``,
``DESCRIBE``, ``SHOW``, ``SUMMARIZE``); anything else (``COPY``, ``CREATE``, ``ATTACH``,
``SET``, ``PRAGMA``, ``EXPLAIN ANALYZE``...) is refused before it runs. The connection has no
access outside the store's ``tables/`` (and the ``--output`` file): extensions are never
installed nor loaded, no file elsewhere or URL is read (``read_json('https://...')``,
``read_csv('/etc/passwd')``), and the settings are locked. The store is checked first as
``run`` checks its OUT (:func:`~traceanalyzer.outdir.check_own`): a FIFO among the partitions
is refused, never waited on. DuckDB spills to a temporary folder of its own, never beside the
store, made only when it spills and removed with the connection; a query killed while it
spilled leaves its folder to the next query, which removes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

from traceanalyzer.hints import did_you_mean
from traceanalyzer.outdir import OutputRefused, check_own
from traceanalyzer.parse.duckdb_connect import quiet
from traceanalyzer.schema import (
    BOOL,
    DERIVED_TABLES,
    F64,
    I32,
    I64,
    PART_FILE,
    STR,
    TABLES,
    TABLES_DIR,
    Column,
    Table,
)
from traceanalyzer.store import GROUP_PREFIX

STORE_TABLES: dict[str, Table] = {**TABLES, **DERIVED_TABLES}
SQL_TYPES = {I32: "INTEGER", I64: "BIGINT", F64: "DOUBLE", STR: "VARCHAR", BOOL: "BOOLEAN"}
_LIST_HINT = "`traceanalyzer query OUT --list` lists them"


class QueryError(Exception):
    """The SQL cannot run on this folder: not a run output, not one query, or DuckDB refused it."""


def partition_files(out: Path, table: str) -> list[Path]:
    """The Parquet partitions of ``table`` in the store at ``out``, in rank and session order,
    then the rank groups' files (``rank`` and ``session`` are their columns)."""
    base = out / TABLES_DIR / table
    return [
        *sorted(base.glob(f"rank=*/session=*/{PART_FILE}")),
        *sorted(base.glob(f"{GROUP_PREFIX}*/{PART_FILE}")),
    ]


def check_run_output(out: Path) -> None:
    """Refuse ``out`` unless it is a store as ``run`` leaves it: its ``tables/``, and no link,
    FIFO, socket or device anywhere in it (a FIFO among the partitions would hang the query)."""
    if not (out / TABLES_DIR).is_dir():
        raise QueryError(
            f"{out} is not a run output (no {TABLES_DIR}/ folder): "
            f"`traceanalyzer run PATH --out {out}` makes one"
        )
    try:
        check_own(out)
    except OutputRefused as exc:
        raise QueryError(str(exc)) from None


@dataclass
class StoreQuery:
    """One query over the store, bound and ready to fetch (``relation``); :meth:`close`, or
    the end of a ``with`` block, frees it."""

    connection: duckdb.DuckDBPyConnection
    relation: duckdb.DuckDBPyRelation
    spill: Path

    def close(self) -> None:
        # still busy: an interrupted query that did not stop in time (the process ends anyway)
        with contextlib.suppress(duckdb.Error):
            self.connection.close()
        shutil.rmtree(self.spill, ignore_errors=True)

    def __enter__(self) -> StoreQuery:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_SPILL_PREFIX = "traceanalyzer-query-"
_SPILL_NAME = re.compile(re.escape(_SPILL_PREFIX) + r"([0-9]+)-[0-9a-f]+")


def _remove_dead_spills(parent: Path) -> None:
    """Remove the spill folders of queries that were killed (their process is gone)."""
    if os.name != "posix":  # elsewhere os.kill(pid, 0) would end that process, not probe it
        return
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        match = _SPILL_NAME.fullmatch(entry.name)
        if not match or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue  # another user's query
            os.kill(int(match[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # alive (another user's process), or not ours to look at
            continue


def _offline(connection: duckdb.DuckDBPyConnection, out: Path, output: Path | None) -> None:
    """No access but to the store's tables (and the ``output`` file), settings locked."""
    connection.execute("SET allowed_directories = [$1]", [f"{out / TABLES_DIR}{os.sep}"])
    if output is not None:
        connection.execute("SET allowed_paths = [$1]", [str(output)])
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def open_query(out: Path, sql: str, output: Path | None = None) -> StoreQuery:
    """Bind ``sql`` over the store at ``out``; raises :class:`QueryError` with DuckDB's reason.
    ``output``: the one file the result may be written to (DuckDB writes Parquet and CSV
    itself)."""
    check_run_output(out)
    out = out.resolve()  # the files' paths and the allowed directory alike
    parent = Path(tempfile.gettempdir())
    _remove_dead_spills(parent)
    spill = parent / f"{_SPILL_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    config = {
        "temp_directory": str(spill),  # made by DuckDB when it spills, removed on close
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    connection = quiet(duckdb.connect(":memory:", config=config))
    try:
        _offline(connection, out, output)
        _check_one_query(connection, sql)
        named = _tables_named(connection, sql)
        for name in sorted(named & STORE_TABLES.keys()):
            try:
                view = _view_sql(connection, out, STORE_TABLES[name])
            except duckdb.Error as exc:  # a damaged partition
                raise QueryError(f"table {name}: unreadable partitions: {exc}") from None
            connection.execute(f'CREATE VIEW "{name}" AS {view}')
        try:
            relation = connection.sql(sql)
        except duckdb.Error as exc:
            unknown = sorted(named - STORE_TABLES.keys())
            if isinstance(exc, duckdb.CatalogException) and unknown:
                hint = did_you_mean(unknown[0], STORE_TABLES)
                raise QueryError(
                    f"no table {unknown[0]!r} in the store{hint} ({_LIST_HINT})"
                ) from None
            raise QueryError(str(exc)) from None
    except BaseException:
        connection.close()
        shutil.rmtree(spill, ignore_errors=True)
        raise
    return StoreQuery(connection, relation, spill)


def _check_one_query(connection: duckdb.DuckDBPyConnection, sql: str) -> None:
    try:
        statements = connection.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    if len(statements) != 1:
        raise QueryError(f"one query at a time: found {len(statements)} statements")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryError(
            f"only a query runs here (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE), not "
            f"{kind.name}: the store is read-only"
        )


def _tables_named(connection: duckdb.DuckDBPyConnection, sql: str) -> set[str]:
    """The tables ``sql`` reads; every store table when DuckDB cannot tell, or when it names
    none (``SHOW TABLES``). Only those get a view: a view reads its partitions' footers."""
    try:
        named = set(connection.get_table_names(sql))
    except duckdb.Error:  # it binds a little, and a few valid queries trip it (JOIN ... USING)
        return set(STORE_TABLES)
    return named if named & STORE_TABLES.keys() else named | set(STORE_TABLES)


def _view_sql(connection: duckdb.DuckDBPyConnection, out: Path, table: Table) -> str:
    """The table's columns, in the schema's order and types, over its partitions (a column a
    partition lacks reads as NULL, as ``Store.table`` does); no rows without partitions."""
    files = partition_files(out, table.name)
    if not files:
        return f"SELECT {', '.join(_column(c, 'NULL') for c in table.columns)} LIMIT 0"
    alone = [f for f in files if not f.parent.name.startswith(GROUP_PREFIX)]
    grouped = [f for f in files if f.parent.name.startswith(GROUP_PREFIX)]
    selects = []
    for paths, hive in ((alone, "true"), (grouped, "false")):
        if not paths:
            continue
        listed = ", ".join(_literal(str(f)) for f in paths)
        source = f"read_parquet([{listed}], hive_partitioning = {hive}, union_by_name = true"
        source += ", hive_types = {'rank': INTEGER, 'session': VARCHAR})" if hive == "true" else ")"
        present = set(connection.sql(f"SELECT * FROM {source}").columns)
        columns = [
            _column(c, f'"{c.name}"' if c.name in present else "NULL") for c in table.columns
        ]
        selects.append(f"SELECT {', '.join(columns)} FROM {source}")
    return " UNION ALL ".join(selects)


def _column(column: Column, value: str) -> str:
    return f'CAST({value} AS {SQL_TYPES[column.type]}) AS "{column.name}"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
