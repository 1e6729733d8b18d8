"""Where parsers put their tables: a small interface so parsers never know about the store layout.

A parser hands over an Arrow table or a stream of them; the sink conforms it to the
canonical schema (``traceanalyzer.schema``) and writes it. ``rank`` and ``session`` are not part of
what parsers produce: they are the partition keys, added by the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import polars as pl
import pyarrow as pa

from traceanalyzer.schema import TABLES

PARTITION_KEYS = ("rank", "session")


class TableSink(Protocol):
    def arrow(self, table: str, data: pa.Table) -> int:
        """Store ``data`` (any subset of the canonical columns) as ``table``; return its row count."""

    def batches(self, table: str, tables: Iterable[pa.Table]) -> int:
        """Store ``table`` from a stream of Arrow tables (constant memory); return its row count."""


def body_columns(table: str) -> list[tuple[str, pa.DataType]]:
    return [(c.name, c.type) for c in TABLES[table].columns if c.name not in PARTITION_KEYS]


# A dictionary-encoded string column (process and thread names) is written as it is: as plain
# strings, a long name would be copied into every row. Written with these options, the file
# reads back as plain strings.
WRITE_OPTIONS = {"compression": "zstd", "store_schema": False}


# The text columns a table's rows are grouped by (the slices by process, then in time order;
# the counters by process and counter): their min/max let a scan of one process or counter
# skip the others' row groups. Where a table's rows are not grouped by them, their min/max
# cost little (a dictionary's) and prune nothing.
GROUPED_TEXT = {"counters": ("process", "name")}
DEFAULT_GROUPED_TEXT = ("process",)


def write_options(table: str, schema: pa.Schema) -> dict[str, object]:
    """The Parquet writer's options for ``table`` of ``schema``: statistics for its numbers and
    its :data:`GROUPED_TEXT` columns only, dictionaries for its texts only.

    Within a process, rows are written in time order, so a row group spans its threads and
    names: min/max of another text column would prune nothing, at a cost in writing time.
    Times and ids keep theirs (a time window skips row groups). A dictionary pays for texts,
    which repeat; times and ids are mostly distinct, so a row group's dictionary of them would
    be as large as its values, and zstd finds the repeats of the other numbers: the store is
    smaller without them, its ingest as fast."""
    grouped = GROUPED_TEXT.get(table, DEFAULT_GROUPED_TEXT)
    kept = [
        f.name
        for f in schema
        if (not _is_text(f.type) or f.name in grouped) and not pa.types.is_null(f.type)
    ]
    texts = [f.name for f in schema if _is_text(f.type)]
    return {**WRITE_OPTIONS, "write_statistics": kept, "use_dictionary": texts}


def arrow_table(frame: pl.DataFrame) -> pa.Table:
    """``frame`` as Arrow for a sink, without a copy of its text: polars holds strings as views,
    which the Parquet writer encodes as they are (as ``large_string`` they would be copied into
    one buffer first, a fifth of a large trace's derivation). Dictionary-encoded (Categorical)
    columns keep ``large_string`` names: the writer cannot decode a dictionary of views, which
    it does when a row group's dictionary differs from the one before."""
    data = frame.to_arrow(compat_level=pl.CompatLevel.newest())
    names = [name for name, dtype in frame.schema.items() if isinstance(dtype, pl.Categorical)]
    for name, column in zip(names, frame.select(names).to_arrow(), strict=True):
        data = data.set_column(data.column_names.index(name), name, column)
    return data


def _is_text(typ: pa.DataType) -> bool:
    """Strings the Parquet writer writes as ``string``: views, large strings, dictionaries."""
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return typ in (pa.string(), pa.string_view(), pa.large_string())


def _conform_column(col: pa.ChunkedArray, typ: pa.DataType) -> pa.ChunkedArray:
    """``col`` as ``typ``. The usual columns need no cast, so a run does not import
    pyarrow.compute (50 ms, with numpy.ma) for them; an odd column is cast."""
    if col.type == typ or (typ == pa.string() and _is_text(col.type)):
        return col
    if pa.types.is_null(col.type):  # a column of nulls only: polars could not type it
        return pa.chunked_array([pa.nulls(len(col), typ)])
    return col.cast(typ)


def conform_body(table: str, data: pa.Table) -> pa.Table:
    """Cast/reorder an Arrow table to the canonical body columns; missing ones become nulls."""
    columns = body_columns(table)
    arrays = [
        _conform_column(data.column(name), typ)
        if name in data.column_names
        else pa.chunked_array([pa.nulls(data.num_rows, typ)])
        for name, typ in columns
    ]
    return pa.Table.from_arrays(arrays, names=[name for name, _ in columns])


def table_from_rows(table: str, rows: list[dict[str, object]]) -> pa.Table:
    """Rows of ``table`` (the small JSON-derived tables) as Arrow, typed as its columns.

    Built through polars because pyarrow's own constructors import pandas on first use, which
    costs a worker about 0.3 s per process for tables of a few rows.
    """
    types = TABLES[table].polars_schema
    present = {name for row in rows for name in row}
    schema = {name: dtype for name, dtype in types.items() if name in present}
    return arrow_table(pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None))
