"""trace_view.json → :class:`~traceanalyzer.parse.trace_events.TraceEvents` through the native scanner.

The fast reader of :func:`traceanalyzer.parse.trace_view.parse_trace_view`. ``_trace_scan`` (C,
built at install when a compiler is present) reads the file once, in blocks, a byte range per
core, and hands over typed Arrow columns per table (text as string views, which polars adopts
without a copy; names, categories and series interned; the slices' args located in the file,
not copied, and read again a row group at a time by :class:`FileArgs`). The tables are derived
from them by ``trace_events.py``, as they are from the DuckDB reader's events.

Anything the scanner does not read (a truncated or malformed file, invalid UTF-8, a pid that is
not an integer) raises :class:`NativeUnreadable`, and the caller falls back to the DuckDB reader,
which owns the salvage of damaged files.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from traceanalyzer.parse.native_scan import (
    Identity,
    NativeUnreadable,
    args_text,
    available,
    identity,
    scan_raw,
    stat_identity,
    take_ahead,
    unavailable_note,
)
from traceanalyzer.parse.trace_events import TraceEvents

__all__ = ["FileArgs", "NativeUnreadable", "available", "scan_trace", "unavailable_note"]


_ARROW_TYPES = {"int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64(),
                "text": pa.string_view(), "dict": pa.int32()}  # fmt: skip


def _series(name: str, array: pa.Array) -> pl.Series:
    """``array`` as a polars Series, through a record batch: ``pl.Series(name, array)`` imports
    pyarrow.compute (50 ms of a run that otherwise never needs it)."""
    return pl.from_arrow(pa.RecordBatch.from_arrays([array], [name])).to_series()


def _frame(columns: dict[str, tuple]) -> tuple[pl.DataFrame, dict[str, pl.Series]]:
    """A scanner table as a frame, and the strings of its interned columns."""
    arrays, words = {}, {}
    for name, (kind, rows, nulls, valid, values, extra) in columns.items():
        buffers = [pa.py_buffer(valid) if nulls else None, pa.py_buffer(values)]
        if kind == "text":
            buffers.append(pa.py_buffer(extra))
        elif kind == "dict":
            count, views, data = extra
            strings = [None, pa.py_buffer(views), pa.py_buffer(data)]
            words[name] = _series(name, pa.Array.from_buffers(pa.string_view(), count, strings))
        arrays[name] = pa.Array.from_buffers(_ARROW_TYPES[kind], rows, buffers, nulls)
    return pl.from_arrow(pa.RecordBatch.from_pydict(arrays)), words


def scan_trace(path: Path, threads: int) -> TraceEvents:
    """Scan ``path`` on up to ``threads`` cores (:func:`~native_scan.scan_raw`), or take the
    scan started ahead of the run (:func:`~native_scan.scan_ahead`)."""
    ahead = take_ahead(path)
    if ahead is None:
        scanned_at = identity(path)
        raw = scan_raw(path, threads)
    else:
        raw, scanned_at = ahead
    args = FileArgs(path, scanned_at)
    parts = [{name: _frame(columns) for name, columns in tables.items()} for tables in raw]
    # Row numbers (flat, samples) and codes point into their own range's rows and strings.
    rows_before = {table: 0 for table in parts[0]}
    words_before: dict[tuple[str, str], int] = {}
    tables: dict[str, list[pl.DataFrame]] = {table: [] for table in parts[0]}
    words: dict[tuple[str, str], list[pl.Series]] = {}
    for part in parts:
        for table, (frame, table_words) in part.items():
            shift = [
                pl.col(column) + words_before.get((table, column), 0) for column in table_words
            ]
            if table in ("flat", "samples"):
                points_at = "slices" if table == "flat" else "counters"
                shift.append(pl.col(frame.columns[0]) + rows_before[points_at])
            tables[table].append(frame.with_columns(shift))
            for column, strings in table_words.items():
                words.setdefault((table, column), []).append(strings)
                words_before[table, column] = words_before.get((table, column), 0) + len(strings)
        for table, (frame, _) in part.items():
            rows_before[table] += frame.height
    return TraceEvents(
        **{table: pl.concat(frames, rechunk=False) for table, frames in tables.items()},
        words={key: pl.concat(strings) for key, strings in words.items()},
        located_args=args,
    )


class FileArgs:
    """The slices' args, read from the trace a row group at a time.

    The scanner locates each slice's args (``args_at``, ``args_len``: where its text lies in
    the file) instead of copying them: they are half of what a scan would hold (70 MB of the
    200 MB benchmark trace). A row group's args are read again from the file, ranges that lie
    close together in one read, and copied as the scan would have copied them: the group's
    text is all they cost. A file changed since the scan is :class:`NativeUnreadable` (the
    DuckDB reader then reads it).
    """

    def __init__(self, path: Path, scanned_at: Identity):
        self.path = path
        self._identity = scanned_at
        self._fd: int | None = None
        self._opening = threading.Lock()  # row groups are made side by side

    def text(self, at: pl.Series, length: pl.Series) -> pl.Series:
        """The args of the slices at ``at`` (-1: none), ``length`` bytes each."""
        with self._opening:
            if self._fd is None:
                fd = os.open(self.path, os.O_RDONLY)
                if stat_identity(os.fstat(fd)) != self._identity:
                    os.close(fd)
                    raise NativeUnreadable(f"{self.path}: changed while it was being read")
                self._fd = fd
        offsets, lengths = at.to_numpy(), length.to_numpy()  # int64 and int32, no nulls
        order = np.argsort(offsets, kind="stable").astype(np.int64, copy=False)
        try:
            rows, nulls, valid, views, data = args_text(self._fd, offsets, lengths, order)
        except ValueError as exc:
            raise NativeUnreadable(f"{self.path}: {exc}") from exc
        buffers = [pa.py_buffer(valid) if nulls else None, pa.py_buffer(views), pa.py_buffer(data)]
        texts = pa.Array.from_buffers(pa.string_view(), rows, buffers, nulls)
        return _series("args", texts)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
