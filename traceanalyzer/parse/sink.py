"""Where parsers put their tables: a small interface so parsers never know about the store layout.

A parser hands over either an Arrow table or a DuckDB query; the sink conforms it to the
canonical schema (``traceanalyzer.schema``) and writes it. ``rank`` and ``session`` are not part of
what parsers produce: they are the partition keys, added by the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import duckdb
import polars as pl
import pyarrow as pa

from traceanalyzer.schema import TABLES

PARTITION_KEYS = ("rank", "session")

_DUCKDB_TYPES = {
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
}


def connect_duckdb(config: dict[str, object]) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection for parsing, with ``config`` and without a progress bar."""
    return quiet(duckdb.connect(config=config))


def quiet(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Turn off the progress bar of ``con`` (a setting of each connection and cursor).

    DuckDB draws one on stdout for any query over two seconds, even without a terminal, which
    would corrupt `run --format json` and the progress lines on a large trace.
    """
    # In a Jupyter kernel without ipywidgets DuckDB refuses to touch the setting (its bar would
    # be a widget there, not text on stdout): nothing to turn off.
    with contextlib.suppress(duckdb.Error):
        con.execute("SET enable_progress_bar = false")
    return con


class TableSink(Protocol):
    def arrow(self, table: str, data: pa.Table) -> int:
        """Store ``data`` (any subset of the canonical columns) as ``table``; return its row count."""

    def duckdb(self, table: str, con: duckdb.DuckDBPyConnection, query: str) -> int:
        """Store the result of ``query`` (selecting canonical columns) as ``table``; return its row count."""

    def batches(self, table: str, tables: Iterable[pa.Table]) -> int:
        """Store ``table`` from a stream of Arrow tables (constant memory); return its row count."""

    def written(self, table: str) -> Path | None:
        """The Parquet file holding ``table`` once stored (for cheap follow-up aggregates)."""


def body_columns(table: str) -> list[tuple[str, pa.DataType]]:
    return [(c.name, c.type) for c in TABLES[table].columns if c.name not in PARTITION_KEYS]


def duckdb_select_list(table: str, exprs: dict[str, str]) -> str:
    """A SELECT list producing exactly the canonical body columns of ``table``, cast to their types.

    Columns missing from ``exprs`` become typed NULLs, so a query can never drift from the schema.
    """
    unknown = set(exprs) - {name for name, _ in body_columns(table)}
    if unknown:
        raise KeyError(f"{table}: not in the schema: {sorted(unknown)}")
    parts = []
    for name, typ in body_columns(table):
        expr = exprs.get(name, "NULL")
        parts.append(f'CAST({expr} AS {_DUCKDB_TYPES[typ]}) AS "{name}"')
    return ", ".join(parts)


# A dictionary-encoded string column (process and thread names) stays dictionary-encoded: cast
# to plain strings, a long name would be copied into every row. Written with the sink's
# WRITE_OPTIONS, the file reads back as plain strings.
_NAMES = pa.dictionary(pa.int32(), pa.string())
WRITE_OPTIONS = {"compression": "zstd", "store_schema": False}


def _conform_column(col: pa.ChunkedArray, typ: pa.DataType) -> pa.ChunkedArray:
    if col.type == typ:
        return col
    if pa.types.is_dictionary(col.type) and typ == pa.string():
        return col.cast(_NAMES)
    return col.cast(typ)


def conform_body(table: str, data: pa.Table) -> pa.Table:
    """Cast/reorder an Arrow table to the canonical body columns; missing ones become nulls."""
    arrays = []
    for name, typ in body_columns(table):
        if name in data.column_names:
            arrays.append(_conform_column(data.column(name), typ))
        else:
            arrays.append(pa.chunked_array([pa.nulls(data.num_rows, typ)]))
    fields = [
        pa.field(name, col.type) for (name, _), col in zip(body_columns(table), arrays, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def table_from_rows(rows: list[dict[str, object]]) -> pa.Table:
    """An Arrow table from a few Python rows (the small JSON-derived tables).

    Built through polars because pyarrow's own constructors import pandas on first use, which
    costs a worker about 0.3 s per process for tables of a few rows.
    """
    return pl.DataFrame(rows, infer_schema_length=None).to_arrow()


def made_ahead(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``parts``, each made on a second thread while the sink writes the one before: polars and
    the Parquet encoder both release the GIL, so the two overlap on two cores."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, parts, None)
        while (part := pending.result()) is not None:
            pending = pool.submit(next, parts, None)
            yield part
