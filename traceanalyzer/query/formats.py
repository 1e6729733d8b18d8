"""A query's result as a table (DuckDB's box, as its CLI prints it), CSV, JSON or Parquet.

The store holds the input's text as it was: the table, and CSV written to a terminal, show it
without control characters (:func:`~traceanalyzer.printable.printable`); JSON escapes them, and
files get it as it is."""

from __future__ import annotations

import contextlib
import csv
import datetime
import decimal
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from traceanalyzer.printable import printable

if TYPE_CHECKING:  # `query --help` lists FORMATS without loading DuckDB
    import duckdb

FORMATS = ("table", "csv", "json", "parquet")
# Rows the table format shows, first and last halves, as DuckDB's CLI does; every row goes to
# csv, json and parquet
TABLE_ROWS = 40
_BATCH = 10_000


def write_result(
    relation: duckdb.DuckDBPyRelation,
    fmt: str,
    stream: TextIO,
    output: Path | None = None,
    width: int | None = None,
) -> None:
    """Write ``relation`` in ``fmt`` to ``output`` (a file), or to ``stream``; Parquet needs
    ``output``. ``width``: the table format's width in characters (None: as wide as it needs)."""
    if fmt == "parquet":
        if output is None:
            raise ValueError("parquet needs an output file")
        relation.write_parquet(str(output))
    elif fmt == "csv" and output is not None:
        relation.write_csv(str(output), header=True)
    elif output is not None:
        with open(output, "w", encoding="utf-8", newline="") as file:
            _write_text(relation, fmt, file, width)
    else:
        _write_text(relation, fmt, stream, width)


def _write_text(
    relation: duckdb.DuckDBPyRelation, fmt: str, stream: TextIO, width: int | None
) -> None:
    if fmt == "table":
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):  # show() prints
            relation.show(max_width=width or 1 << 20, max_rows=TABLE_ROWS)
        stream.write(printable(shown.getvalue(), lines=True))
    elif fmt == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        rows = relation.iter_rows(_BATCH)
        if stream.isatty():
            rows = ([printable(v) if isinstance(v, str) else v for v in row] for row in rows)
        writer.writerow(relation.columns)
        writer.writerows(rows)
    else:  # json: an array of objects, one per row, as DuckDB's CLI writes it (.mode json)
        columns, first = relation.columns, True
        stream.write("[")
        for row in relation.iter_rows(_BATCH):
            record = {name: _json_value(value) for name, value in zip(columns, row, strict=True)}
            stream.write(("\n" if first else ",\n") + json.dumps(record, default=str))
            first = False
        stream.write("\n]\n" if not first else "]\n")


def _json_value(value: Any) -> Any:
    """A value JSON can hold: NaN and infinities are null, decimals numbers, times ISO text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return value
