"""The times a table may hold, and what becomes of the others: one check, for every table.

A timestamp is an epoch time from 2000 to 2100, a duration lasts 0 to 7 days
(``timeutil.EARLIEST_NS``, ``LATEST_NS``, ``LONGEST_NS``). Any other value is damage, never a
measurement: a Db ``TASK.startNs`` of 1e300 (which SQLite hands over as int64's largest), a
task that ends before it starts, a trace ``ts`` of 1e20 (past int64: no time at all) or
``NaN``. Kept, one made a 1.7e18 ns span negative and a rule say a stream was idle for
62,133,300% of it. So an event (a slice, a counter sample, a kernel, a flow, ...) with such a
time is dropped, and a summary's value (a step's or an operator's time) is cleared, and the
rank's warnings say how many of each table and why (:func:`note`).

Every table is checked on its way into the store (``ingest``'s sink); the readers check the
tables they derive others from before they do (the slices, whose span is the session's).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.sink import body_columns
from traceanalyzer.timeutil import EARLIEST_NS, LATEST_NS, LONGEST_NS


@dataclass(frozen=True)
class TimeColumns:
    """A table's time columns: ``stamps`` (epoch ns), ``durations`` (ns), the columns a row is
    nothing without (``required``: null there is damage too), and whether its rows are events
    (a bad time drops the row) or summaries (a bad time is cleared)."""

    stamps: tuple[str, ...] = ()
    durations: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    events: bool = True


def _durations(table: str) -> tuple[str, ...]:
    """Every ns column of ``table``, a summary whose times are all durations."""
    return tuple(name for name, _ in body_columns(table) if name.endswith("_ns"))


TIME_COLUMNS: dict[str, TimeColumns] = {
    "sessions": TimeColumns(("start_ns", "end_ns"), events=False),
    # (a slice's end is its start plus its duration)
    "slices": TimeColumns(("start_ns",), ("dur_ns",), required=("start_ns", "dur_ns")),
    "counters": TimeColumns(("ts_ns",), required=("ts_ns",)),
    "flows": TimeColumns(("start_ns", "end_ns")),
    "kernels": TimeColumns(("start_ns",), ("dur_ns", "wait_ns")),
    "task_times": TimeColumns(("start_ns", "end_ns"), ("dur_ns",)),
    "memory_records": TimeColumns(("ts_ns",)),
    "module_memory": TimeColumns(("ts_ns",)),
    "op_memory": TimeColumns(
        ("alloc_ns", "release_ns", "active_release_ns"), ("dur_ns", "active_dur_ns")
    ),
    "comm_ops": TimeColumns(
        ("start_ns",), ("elapse_ns", "transit_ns", "wait_ns", "synchronization_ns", "idle_ns")
    ),
    "comm_links": TimeColumns(durations=("transit_ns",), events=False),
    "step_times": TimeColumns(durations=_durations("step_times"), events=False),
    "operators": TimeColumns(durations=_durations("operators"), events=False),
}


def _year(ns: int) -> int:
    return datetime.fromtimestamp(ns // 10**9, UTC).year


_NOT_A_STAMP = f"not a time in {_year(EARLIEST_NS)}-{_year(LATEST_NS)}"
_NOT_A_DURATION = f"not a duration of 0 to {LONGEST_NS // (86_400 * 10**9)} days"


def _impossible(columns: TimeColumns, present: list[str]) -> dict[str, pl.Expr]:
    """Per column of ``columns`` in ``present``: true where its value is impossible."""
    bad = {}
    for name in (*columns.stamps, *columns.durations):
        if name not in present:
            continue
        value = pl.col(name)
        if name in columns.stamps:
            wrong = (value < EARLIEST_NS) | (value >= LATEST_NS)
        else:
            wrong = (value < 0) | (value > LONGEST_NS)
        bad[name] = (value.is_null() | wrong) if name in columns.required else wrong
    return {name: expr.fill_null(False) for name, expr in bad.items()}


@dataclass
class Tally:
    """What was dropped or cleared, by table and reason; several threads add to it."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, table: str, found: Counter[str]) -> None:
        if found:
            with self._lock:
                self.counts.setdefault(table, Counter()).update(found)

    def notes(self, source: str | dict[str, str]) -> list[str]:
        """One note per table: ``source`` names the file (or a file per table)."""
        return [
            note(source if isinstance(source, str) else source.get(table, table), table, found)
            for table, found in sorted(self.counts.items())
        ]


def note(source: str, table: str, found: Counter[str]) -> str:
    """``trace_view.json: slices: 3 row(s) with an impossible time dropped (start_ns not a
    time in 2000-2100: 2, dur_ns not a duration of 0 to 7 days: 1)``."""
    reasons = ", ".join(f"{reason}: {n:,}" for reason, n in sorted(found.items()) if reason)
    if TIME_COLUMNS.get(table, TimeColumns()).events:
        what = f"{found['']:,} row(s) with an impossible time dropped"
    else:
        what = f"{sum(n for reason, n in found.items() if reason):,} impossible time(s) cleared"
    return f"{source}: {table}: {what} ({reasons})"


_ROW = "_row"


def checked(
    table: str, frame: pl.DataFrame, tally: Tally, columns: TimeColumns | None = None
) -> pl.DataFrame:
    """``frame`` (rows of ``table``) without its impossible times, counted in ``tally`` (the
    rows dropped under the reason ``""``); ``frame`` itself when it has none. ``columns``:
    the time columns of a frame not in the table's shape (a reader's raw events)."""
    columns = columns or TIME_COLUMNS.get(table)
    bad = _impossible(columns, frame.columns) if columns else {}
    if not bad:
        return frame
    flags = frame.select(**bad)
    if not flags.select(pl.any_horizontal(pl.all()).any()).item():
        return frame  # (the usual case: one pass over the time columns)
    found = Counter(
        {
            f"{name} {_NOT_A_STAMP if name in columns.stamps else _NOT_A_DURATION}": count
            for name, count in flags.sum().row(0, named=True).items()
            if count
        }
    )
    if columns.events:
        keep = flags.select(~pl.any_horizontal(pl.all())).to_series()
        found[""] = len(keep) - int(keep.sum())
        frame = frame.filter(keep)
    else:
        frame = frame.with_columns(
            pl.when(~flags[name]).then(pl.col(name)).alias(name) for name in bad
        )
    tally.add(table, found)
    return frame


def checked_arrow(table: str, data: pa.Table, tally: Tally) -> pa.Table:
    """:func:`checked` of an Arrow table: only its time columns are looked at (as polars, no
    copy), and the table is rebuilt only when one holds an impossible time."""
    columns = TIME_COLUMNS.get(table) or TimeColumns()
    names = [n for n in (*columns.stamps, *columns.durations) if n in data.column_names]
    if not names:
        return data
    times = pl.from_arrow(data.select(names))
    assert isinstance(times, pl.DataFrame)
    times = times.with_row_index(_ROW)
    kept = checked(table, times, tally)
    if kept is times:
        return data
    if columns.events:  # (the one case that loads pyarrow.compute)
        return _take(data, pa.array(kept[_ROW].to_numpy()))
    for name in names:
        data = data.set_column(data.column_names.index(name), name, kept[name].to_arrow())
    return data


def _take(data: pa.Table, rows: pa.Array) -> pa.Table:
    """The ``rows`` of ``data``; Arrow takes no rows of a string view column (polars' text):
    those go through large strings."""
    columns = [
        column.cast(pa.large_string()).take(rows).cast(pa.string_view())
        if column.type == pa.string_view()
        else column.take(rows)
        for column in data.columns
    ]
    return pa.Table.from_arrays(columns, schema=data.schema)
