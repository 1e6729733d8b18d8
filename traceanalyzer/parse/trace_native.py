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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from traceanalyzer.parse.json_array import array_body, boundary_near
from traceanalyzer.parse.trace_events import TraceEvents
from traceanalyzer.parse.trace_shared import ARG_COLUMNS

try:
    from traceanalyzer.parse._trace_scan import Scanner, args_text
except ImportError:  # built without a C compiler: the DuckDB path does everything
    Scanner = args_text = None

_BLOCK_BYTES = 8 << 20  # read per step: the memory a scan holds besides its columns
_PARALLEL_MIN_BYTES = 32 << 20  # below this one scanner is as fast as several
_NEAR = 1 << 20  # how far from an equal share a range may be cut


class NativeUnreadable(Exception):
    """The scanner does not read this file (damaged, or not the shape torch_npu writes)."""


def available() -> bool:
    """True when the scanner is built and not turned off (TRACEANALYZER_NATIVE=0)."""
    return Scanner is not None and os.environ.get("TRACEANALYZER_NATIVE", "1") != "0"


def unavailable_note() -> str | None:
    """Why traces are read by the slower DuckDB reader in this install, or None."""
    if Scanner is None:
        return (
            "trace_view.json: the native scanner is not built (no C compiler or Python headers "
            "at install), so DuckDB reads traces, about 1.9x slower; reinstall with one to speed "
            "up the ingest"
        )
    if not available():
        return "trace_view.json: the native scanner is turned off (TRACEANALYZER_NATIVE=0)"
    return None


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


def _scan(
    path: Path, begin: int, end: int, wrap: bool
) -> dict[str, tuple[pl.DataFrame, dict[str, pl.Series]]]:
    """The tables of bytes [begin, end) of ``path``; with ``wrap``, read as an array of their
    events. The scanner runs without the GIL, so ranges scan side by side; its columns grow in
    place and are handed over once. The file is read block by block into one buffer, the event
    torn at a block's end moved to its start: no block is copied. The slices' args are
    located (:class:`FileArgs`), not copied."""
    scanner = Scanner(ARG_COLUMNS)
    buffer = bytearray(_BLOCK_BYTES)
    kept = 0  # bytes at the buffer's start not scanned yet: "[", or an event torn at its end
    at = begin  # the file offset of the buffer's first byte
    if wrap:
        buffer[0], kept, at = ord("["), 1, begin - 1
    with open(path, "rb") as fh:
        fh.seek(begin)
        left, final = end - begin, False
        while not final:
            if kept + 1 >= len(buffer):  # an event longer than the buffer (and room for "]")
                buffer.extend(bytes(len(buffer)))
            with memoryview(buffer) as view:
                room = min(len(buffer) - kept - 1, left)
                got = fh.readinto(view[kept : kept + room]) if room else 0
                left -= got
                filled, final = kept + got, not got
                if final and wrap:
                    view[filled], filled = ord("]"), filled + 1
                try:
                    consumed = scanner.feed(view[:filled], final, at)
                except ValueError as exc:
                    raise NativeUnreadable(
                        f"{path}: {exc} (of the range from byte {begin})"
                    ) from exc
            kept = filled - consumed
            buffer[:kept] = buffer[consumed:filled]
            at += consumed
    return {name: _frame(table) for name, table in scanner.take().items()}


def _ranges(path: Path, parts: int) -> list[tuple[int, int, bool]]:
    """Byte ranges scanned side by side: cut at event boundaries near equal shares."""
    size = path.stat().st_size
    body = array_body(path) if parts > 1 and size >= _PARALLEL_MIN_BYTES else None
    if body is None or not body[2]:
        return [(0, size, False)]
    cuts = [body[0]]
    for i in range(1, parts):
        # shares of the array's body, not of the file: NUL padding after it (a crash) is no share
        middle = body[0] + (body[1] - body[0]) * i // parts
        begin, end = max(cuts[-1], middle - _NEAR), min(body[1], middle + _NEAR)
        cut = boundary_near(path, begin, end) if begin < end else None
        if cut is None or cut <= cuts[-1]:
            return [(0, size, False)]
        cuts.append(cut)
    cuts.append(body[1])
    ranges = []
    with open(path, "rb") as fh:
        for begin, end in zip(cuts, cuts[1:], strict=False):
            fh.seek(begin)
            lead = fh.read(64)  # the separator before the range's first event
            ranges.append((begin + len(lead) - len(lead.lstrip(b", \t\r\n")), end, True))
    return ranges


def scan_trace(path: Path, threads: int) -> TraceEvents:
    """Scan ``path`` on up to ``threads`` cores.

    A cut that falls inside a string (the boundary pattern can occur there) fails one range;
    the file is then scanned whole before giving up.
    """
    ranges = _ranges(path, threads)
    args = FileArgs(path)
    try:
        with ThreadPoolExecutor(len(ranges)) as pool:
            parts = list(pool.map(lambda r: _scan(path, *r), ranges))
    except NativeUnreadable:
        if len(ranges) == 1:
            raise
        parts = [_scan(path, 0, path.stat().st_size, False)]
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

    def __init__(self, path: Path):
        self.path = path
        self._identity = _identity(os.stat(path))
        self._fd: int | None = None

    def text(self, at: pl.Series, length: pl.Series) -> pl.Series:
        """The args of the slices at ``at`` (-1: none), ``length`` bytes each."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            if _identity(os.fstat(self._fd)) != self._identity:
                raise NativeUnreadable(f"{self.path}: changed while it was being read")
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


def _identity(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
