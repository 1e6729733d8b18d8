"""trace_view.json → :class:`~traceanalyzer.parse.trace_events.TraceEvents` through DuckDB.

The reader for installs without the native scanner and for every file the scanner refuses: a
damaged one, which this reader salvages (every well-formed event is kept). It decodes events
and nothing more; the tables are derived from them by ``trace_events.py``, as they are from the
native scanner's events.

Why DuckDB here: it decodes every event into typed columns on every core (chunks,
``json_array.py``) under a memory budget, spilling to disk, and it reads the damaged files a
strict scanner refuses, a piece at a time.

Exactness: ``ts`` is read as text (a JSON string as is, an integer's exact digits) and converted
from its decimal digits, never through float64. ``dur`` is a float µs in every generation;
``round(dur * 1000)`` is exact to the ns for any duration below ~100 days.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from traceanalyzer.parse.json_array import (
    EVENT_BOUNDARY,
    array_body,
    boundary_near,
    copy_as_utf8,
    copy_events,
    copy_prefix,
    split,
)
from traceanalyzer.parse.sink import connect_duckdb
from traceanalyzer.parse.trace_events import TraceEvents
from traceanalyzer.parse.trace_shared import (
    ARG_COLUMNS,
    FLATTENED_KEYS,
    SENTINELS,
    TraceResult,
)
from traceanalyzer.timeutil import duckdb_float_us_to_ns, duckdb_us_to_ns

_SQL_SENTINELS = "(" + ", ".join(str(v) for v in SENTINELS) + ")"
_COLUMNS = (
    "{ph: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: 'VARCHAR', "
    "dur: 'DOUBLE', cat: 'VARCHAR', id: 'VARCHAR', args: 'JSON'}"
)


class TraceParseError(Exception):
    """trace_view.json could not be read at all."""


# One parse of `args` into a struct of the well-known keys (cheaper than one path per key).
# DuckDB struct fields are case-insensitive, so keys differing only in case ("Task Type" on
# hardware tasks, "task type" on HCCL plane tasks) go to a second struct, parsed only when needed.
_PRIMARY = tuple(
    k
    for i, k in enumerate(FLATTENED_KEYS)
    if k.lower() not in {x.lower() for x in FLATTENED_KEYS[:i]}
)
_SECONDARY = tuple(k for k in FLATTENED_KEYS if k not in _PRIMARY)


def _struct(keys: tuple[str, ...]) -> str:
    return json.dumps({k: "VARCHAR" for k in keys}).replace("'", "''")


def _flat(key: str) -> str:
    """Field of the once-per-row parsed struct of well-known args."""
    return f'flat."{key}"' if key in _PRIMARY else f'flat2."{key}"'


def _flat_int(*keys: str) -> str:
    values = [f"TRY_CAST({_flat(k)} AS BIGINT)" for k in keys]
    return f"coalesce({', '.join(values)})" if len(values) > 1 else values[0]


def _flat_str(*keys: str) -> str:
    return f"coalesce({', '.join(_flat(k) for k in keys)})" if len(keys) > 1 else _flat(keys[0])


def _flat_sql(kind: str, keys: tuple[str, ...]) -> str:
    """A flattened args column (trace_shared.ARG_COLUMNS): the first of ``keys`` present."""
    if kind == "text":
        return _flat_str(*keys)
    return _no_sentinel(_flat_int(*keys)) if kind == "id" else _flat_int(*keys)


def _no_sentinel(expr: str) -> str:
    return f"(CASE WHEN {expr} IN {_SQL_SENTINELS} THEN NULL ELSE {expr} END)"


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _load(con: duckdb.DuckDBPyConnection, paths: list[Path], append: bool = False) -> None:
    """The one JSON scan: every event into a temporary table that DuckDB may spill to disk.

    Everything after reads this table, so the JSON text is parsed once. ``ts`` becomes exact ns
    from its text; ``args`` keeps its JSON object text. Several paths (chunks of one array)
    are read in parallel. ``append`` adds to the table instead of replacing it.
    """
    files = "[" + ", ".join(_sql_str(str(p)) for p in paths) + "]"
    con.execute(
        ("INSERT INTO raw " if append else "CREATE OR REPLACE TEMP TABLE raw AS ")
        + f"SELECT ph, name, pid, tid, {duckdb_us_to_ns('ts')} AS ts_ns, dur, cat, id, "
        + "CAST(args AS VARCHAR) AS args "
        # The default maximum_object_size (16 MB per event) also bounds the reader's buffers;
        # raising it multiplies peak memory.
        + f"FROM read_json({files}, format = 'array', columns = {_COLUMNS})"
    )


_TAIL_BYTES = 64 << 20  # where the cut is searched: a torn event is far smaller than this
# Loads tried while isolating malformed events (each halves a failing range); past this, what
# still fails is dropped whole, so a file of garbage cannot take hours.
_MAX_SALVAGE_LOADS = 200


@dataclass
class _Salvage:
    """What a damaged trace lost: the reason for the outcome, and warnings with the details."""

    incomplete: str | None = None
    warnings: list[str] = field(default_factory=list)


def _salvage(path: Path, scratch: Path, con: duckdb.DuckDBPyConnection, error: str) -> _Salvage:
    """Load every well-formed event of a trace DuckDB rejected whole, from copies in ``scratch``.

    In order of cost: invalid UTF-8 is replaced (U+FFFD) and the copy read whole; a truncated
    file (a profiler killed mid-write) is read up to its last complete event; anything else is
    cut at event boundaries and halved until each malformed stretch is isolated and dropped.
    The input is never modified.
    """
    if array_body(path) is None:
        with open(path, "rb") as fh:
            head = fh.read(16)
        raise TraceParseError(f"{path}: not a JSON array of trace events (starts with {head!r})")
    scratch.mkdir(parents=True, exist_ok=True)
    utf8 = scratch / "trace_view.utf8.json"
    try:
        return _salvage_from(path, utf8, scratch, con, error)
    finally:
        utf8.unlink(missing_ok=True)


def _salvage_from(
    path: Path, utf8: Path, scratch: Path, con: duckdb.DuckDBPyConnection, error: str
) -> _Salvage:
    out = _Salvage()
    source = path
    # The wording varies by DuckDB release; a copy with nothing replaced is not used.
    replaced = (
        copy_as_utf8(path, utf8)
        if re.search(r"utf-?8|unicode|encoding", error, re.IGNORECASE)
        else 0
    )
    if replaced:
        source = utf8
        note = f"{path}: {replaced} invalid UTF-8 sequence(s) replaced with U+FFFD"
        try:
            _load(con, [source])
            out.warnings.append(note)
            return out
        except duckdb.OutOfMemoryException:
            raise
        except duckdb.Error as exc:
            out.warnings.append(f"{note} (byte offsets below are in the replaced copy)")
            error = str(exc)
    reason = str(error).splitlines()[0][:160]
    size = source.stat().st_size
    body = array_body(source)
    assert body is not None  # the input starts with `[`, and so does its UTF-8 copy
    closed = body[2]
    cut = None if closed else _complete_prefix(source, scratch, con)
    if cut is None:
        dropped = _isolate_malformed(source, body[0], body[1], scratch, con)
        if len(dropped) == 1 and dropped[0][1] == size:  # only a torn tail: a truncated file
            cut, dropped = dropped[0][0], []
    else:
        dropped = []
    if cut is not None:
        # one wording of the byte range for the summary line and the warning alike
        kept = f"kept bytes 0..{cut} of {size}, dropped bytes {cut}..{size}"
        out.incomplete = f"truncated: {kept}"
        out.warnings.append(f"{path}: truncated or malformed JSON ({reason}); {kept}")
    if closed and body[1] + 1 < size:
        out.warnings.append(
            f"{path}: {size - body[1] - 1} byte(s) after the closing bracket ignored (NUL padding "
            "or whitespace, as a crash can leave)"
        )
    if dropped:
        lost = sum(end - begin for begin, end in dropped)
        ranges = ", ".join(f"{begin}..{end}" for begin, end in dropped[:5])
        more = f" and {len(dropped) - 5} more" if len(dropped) > 5 else ""
        out.incomplete = f"malformed: {len(dropped)} byte range(s), {lost} bytes, dropped"
        out.warnings.append(
            f"{path}: malformed JSON ({reason}); kept every well-formed event and dropped bytes "
            f"{ranges}{more} of {size}"
        )
    return out


def _complete_prefix(path: Path, scratch: Path, con: duckdb.DuckDBPyConnection) -> int | None:
    """Load ``path`` up to one of its last event boundaries, if that reads: the usual damage is a
    file cut mid-write, and this costs one read of the file. Returns where the kept bytes end,
    or None."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        tail_start = max(0, size - _TAIL_BYTES)
        fh.seek(tail_start)
        tail = fh.read()
    candidates = [tail_start + m.start() + 1 for m in EVENT_BOUNDARY.finditer(tail)]
    if tail.rstrip().endswith(b"}"):  # killed right before the closing bracket: keep the last event
        candidates.append(tail_start + len(tail.rstrip()))
    repaired = scratch / "trace_view.repaired.json"
    try:
        # A torn event can hold a false boundary (inside a string), so a few are tried; damage
        # elsewhere fails them all, and each try reads the whole prefix.
        for cut in reversed(candidates[-3:]):
            copy_prefix(path, cut, repaired)
            try:
                _load(con, [repaired])
                return cut
            except duckdb.OutOfMemoryException:
                raise
            except duckdb.Error:
                continue
        return None
    finally:
        repaired.unlink(missing_ok=True)


def _isolate_malformed(
    path: Path, begin: int, end: int, scratch: Path, con: duckdb.DuckDBPyConnection
) -> list[tuple[int, int]]:
    """Append every range of the events in bytes [begin, end) that reads to ``raw``; halve those
    that do not, at event boundaries, down to single events. Returns the dropped byte ranges,
    in file order."""
    piece = scratch / "trace_view.piece.json"
    piece.write_bytes(b"[]")
    _load(con, [piece])  # an empty `raw`, with its columns
    dropped: list[tuple[int, int]] = []
    pending, loads = [(begin, end)], 0
    try:
        while pending:
            begin, end = pending.pop()
            if loads < _MAX_SALVAGE_LOADS:
                loads += 1
                copy_events(path, begin, end, piece)
                try:
                    _load(con, [piece], append=True)
                    continue
                except duckdb.OutOfMemoryException:
                    raise
                except duckdb.Error:
                    pass
            middle = boundary_near(path, begin, end) if loads < _MAX_SALVAGE_LOADS else None
            if middle is None:
                dropped.append((begin, end))
            else:
                pending += [(middle, end), (begin, middle)]  # the first half is tried first
    finally:
        piece.unlink(missing_ok=True)
    return sorted(dropped)


# Below this size one file reads fast enough that copying it into chunks does not pay.
_CHUNKED_MIN_BYTES = 64 << 20
_CHUNKS_PER_THREAD = 4  # uneven chunks (the trace mixes event kinds) still keep every thread busy


def _load_trace(
    con: duckdb.DuckDBPyConnection, path: Path, scratch: Path, threads: int, result: TraceResult
) -> None:
    """Fill ``raw``: from chunk copies read in parallel when that pays, else from the file itself,
    and from the well-formed events of a damaged file as a last resort (with a warning)."""
    if threads > 1 and path.stat().st_size >= _CHUNKED_MIN_BYTES:
        chunks = split(path, scratch, threads * _CHUNKS_PER_THREAD)
        try:
            if chunks:
                _load(con, chunks)
                return
        except duckdb.OutOfMemoryException:
            raise
        except duckdb.Error:
            pass  # a false boundary or a torn tail: the whole file decides below
        finally:
            for chunk in chunks or ():
                chunk.unlink(missing_ok=True)
    try:
        _load(con, [path])
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as exc:
        salvage = _salvage(path, scratch, con, str(exc))
        result.incomplete = salvage.incomplete
        result.warnings += salvage.warnings
        return
    if _blank(path):  # DuckDB reads an empty file as an empty array, without a word
        result.incomplete = f"empty: {path.stat().st_size} bytes, no events"
        result.warnings.append(
            f"{path}: empty file ({path.stat().st_size} bytes): no events; the export was "
            "probably interrupted before it wrote the trace"
        )


def _blank(path: Path) -> bool:
    """True for a file of nothing but whitespace (checked only when it is small)."""
    if path.stat().st_size > 4096:
        return False
    return not path.read_bytes().strip()


def read_events(
    path: Path, scratch: Path, threads: int, budget_mb: int, result: TraceResult
) -> TraceEvents:
    """Decode ``path`` with DuckDB, its buffers within ``budget_mb`` (spilling to ``scratch``);
    what a damaged file lost goes to ``result`` (``incomplete`` and warnings)."""
    scratch.mkdir(parents=True, exist_ok=True)
    con = connect_duckdb(
        {
            "threads": threads,
            # The derivation sorts every table (ties in the order it is given), and the rows of
            # flat and samples are numbered here, so DuckDB may decode in any order.
            "preserve_insertion_order": False,
            "temp_directory": str(scratch / "duckdb"),
            "memory_limit": f"{budget_mb}MB",
        }
    )
    try:
        _load_trace(con, path, scratch, threads, result)
        return _events(con)
    finally:
        con.close()  # its buffers are freed before the derivation holds the tables


def _events(con: duckdb.DuckDBPyConnection) -> TraceEvents:
    """The decoded events of ``raw`` in the one raw-events shape."""
    # Framework (Python) events carry none of the flattened keys, and most of the args bytes:
    # their args are not parsed again.
    python = [
        row[0]
        for row in con.execute(
            "SELECT DISTINCT TRY_CAST(pid AS BIGINT) FROM raw WHERE ph = 'M' "
            "AND name = 'process_name' AND json_extract_string(args, '$.name') = 'Python'"
        ).fetchall()
        if row[0] is not None
    ]
    is_python = f"coalesce(pid IN ({', '.join(map(str, python))}), false)" if python else "false"
    flattened = {column: _flat_sql(kind, keys) for column, kind, keys in ARG_COLUMNS}
    decoded = (
        "SELECT ph, name, TRY_CAST(pid AS BIGINT) AS pid, TRY_CAST(tid AS BIGINT) AS tid, cat, "
        f"ts_ns AS ts, {duckdb_float_us_to_ns('coalesce(dur, 0)')} AS dur_ns, args "
        "FROM raw WHERE ph IN ('X', 'i', 'I')"
    )
    primary = (
        f"SELECT *, CASE WHEN NOT {is_python} THEN json_transform(args, '{_struct(_PRIMARY)}') "
        f"END AS flat FROM ({decoded})"
    )
    secondary = (
        f'SELECT *, CASE WHEN flat."Task Type" IS NULL AND NOT {is_python} '
        f"THEN json_transform(args, '{_struct(_SECONDARY)}') END AS flat2 FROM ({primary})"
    )
    listed = ", ".join(f'{expr} AS "{column}"' for column, expr in flattened.items())
    slices = _frame(
        con, f"SELECT ph, name, pid, tid, cat, ts, dur_ns, args, {listed} FROM ({secondary})"
    )
    columns = list(flattened)
    flat = (
        slices.select(columns)
        .with_row_index("row")
        .filter(pl.any_horizontal(pl.col(columns).is_not_null()))
    )
    con.execute(
        """CREATE OR REPLACE TEMP TABLE counter_events AS
        SELECT row_number() OVER () - 1 AS event, TRY_CAST(pid AS BIGINT) AS pid,
               TRY_CAST(tid AS BIGINT) AS tid, name, ts_ns AS ts, args
        FROM raw WHERE ph = 'C'"""
    )
    counters = _frame(con, "SELECT pid, tid, name, ts FROM counter_events ORDER BY event")
    # One row per member of the args object: the key is the series, its value the sample.
    samples = _frame(
        con,
        """SELECT event, series.key AS series,
                  TRY_CAST(json_extract_string(series.value, '$') AS DOUBLE) AS value
        FROM counter_events c, json_each(c.args) AS series ORDER BY event, series.id""",
    )
    others = _frame(
        con,
        """SELECT ph, name, TRY_CAST(pid AS BIGINT) AS pid, TRY_CAST(tid AS BIGINT) AS tid, cat,
                  id, ts_ns AS ts, CASE WHEN ph = 'M' THEN args END AS args
        FROM raw WHERE ph NOT IN ('X', 'i', 'I', 'C')""",
    )
    return TraceEvents(slices.drop(columns), flat, counters, samples, others)


def _frame(con: duckdb.DuckDBPyConnection, query: str) -> pl.DataFrame:
    return pl.from_arrow(con.sql(query).to_arrow_table())
