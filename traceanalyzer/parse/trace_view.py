"""trace_view.json → slices, counters, flows and threads: which reader decodes a trace.

Two readers decode a trace into one raw-events shape (``trace_events.TraceEvents``): the native
scanner (``trace_native.py``, built at install when a C compiler is present) and DuckDB
(``trace_duckdb.py``, for installs without it and for every file the scanner refuses, which it
salvages). ``trace_events.derive_tables`` then writes every table from those events, whichever
reader decoded them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traceanalyzer.parse import trace_native
from traceanalyzer.parse.json_array import padding_note
from traceanalyzer.parse.sink import TableSink
from traceanalyzer.parse.trace_events import derive_tables
from traceanalyzer.parse.trace_shared import TraceResult


@dataclass(frozen=True)
class ParseMemory:
    """DuckDB's buffer budget for parsing one trace: a multiple of its size, or a fixed size.
    (The native reader needs none: its columns take about 0.9x the file.)

    The default is 1.2x the file (at least 128 MB): without a limit DuckDB keeps up to 80% of
    RAM per worker, so memory would grow with the machine instead of with the rank. DuckDB
    decodes a well-formed trace a batch at a time and needs little of it (the decoded events,
    about the file's size, are held outside it: a 200 MB trace peaked at 2.6x the file above the
    imported libraries); the salvage of a damaged trace builds a spillable table in it.
    """

    times_file: float = 1.2
    fixed_mb: int | None = None  # when set, the budget whatever the trace's size

    MIN_MB = 128

    @classmethod
    def parse(cls, text: str) -> ParseMemory:
        """``1.2x`` (times the trace's size), ``800MB`` or ``2GB``."""
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(x|mb|gb)\s*", text.lower())
        if match is None or float(match[1]) <= 0:
            raise ValueError(
                f"{text!r}: expected a multiple of the trace size (1.2x) or a size (800MB, 2GB)"
            )
        value, unit = float(match[1]), match[2]
        if unit == "x":
            return cls(times_file=value)
        return cls(fixed_mb=round(value * (1024 if unit == "gb" else 1)))

    def limit_mb(self, path: Path) -> int:
        if self.fixed_mb is not None:
            return max(self.MIN_MB, self.fixed_mb)
        size_mb = path.stat().st_size / (1 << 20)
        return max(self.MIN_MB, round(size_mb * self.times_file))

    def __str__(self) -> str:
        return f"{self.fixed_mb}MB" if self.fixed_mb is not None else f"{self.times_file:g}x"


DEFAULT_PARSE_MEMORY = ParseMemory()


def parse_trace_view(
    path: Path,
    sink: TableSink,
    scratch: Path,
    threads: int = 1,
    memory: ParseMemory | None = None,
    on_read: Callable[[], None] | None = None,
) -> TraceResult:
    """Parse one trace_view.json into the slices, counters, flows and threads tables.

    ``on_read`` is called when the parse's memory peak is behind it and the cores are no longer
    all busy (once the slices and counters are written): the caller may start other work then.

    The native scanner (trace_native.py) decodes a well-formed file when it is built.
    Otherwise, and for any file it does not read (a damaged one), DuckDB decodes it
    (trace_duckdb.py), its buffers capped by ``memory`` so memory follows the file, not the
    machine; a trace that does not fit the budget (events far larger than usual, say) is read
    again with twice the budget, with a warning, rather than failing. Either way the tables
    are derived from the decoded events by trace_events.py.
    """
    refused = None
    if trace_native.available():
        try:
            events = trace_native.scan_trace(path, threads)
            result = TraceResult(reader="native")
            if padded := padding_note(path):  # (DuckDB salvages such a file, and says so)
                result.warnings.append(padded)
            return derive_tables(events, sink, result, on_read)
        except trace_native.NativeUnreadable as exc:
            refused = str(exc)  # damaged or unusual: the DuckDB reader salvages it
    import duckdb  # only for the traces the scanner does not read

    from traceanalyzer.parse import trace_duckdb
    from traceanalyzer.parse.duckdb_connect import duckdb_reason

    budget = (memory or DEFAULT_PARSE_MEMORY).limit_mb(path)
    result = TraceResult(reader="duckdb")
    try:
        events = trace_duckdb.read_events(path, scratch, threads, budget, result)
    except duckdb.OutOfMemoryException as exc:
        result = TraceResult(reader="duckdb")
        events = trace_duckdb.read_events(path, scratch, threads, budget * 2, result)
        result.warnings.append(
            f"{path}: out of its {budget} MB parse budget ({duckdb_reason(exc, 120)}); "
            f"parsed again with {budget * 2} MB"
        )
    if refused and not result.incomplete and not result.warnings:
        # Not damaged, yet not the shape the scanner reads: say why this rank was slower.
        result.warnings.append(
            f"read by the slower DuckDB reader: the native scanner refused {refused}"
        )
    return derive_tables(events, sink, result, on_read)
