"""trace_view.json → :class:`~traceanalyzer.parse.trace_events.TraceEvents` through DuckDB.

The reader for installs without the native scanner and for every file the scanner refuses: a
damaged one, which this reader salvages (every well-formed event is kept). It decodes events
and nothing more; the tables are derived from them by ``trace_events.py``, as they are from the
native scanner's events.

Why DuckDB here: it decodes every event into typed columns on every core (chunks,
``json_array.py``) under a memory budget, spilling to disk, and it reads the damaged files a
strict scanner refuses, a piece at a time.

Exactness: ``ts`` is read as text (a JSON string as is, an integer's exact digits) and converted
from its decimal digits, never through float64. ``dur`` is a float µs in every generation, read
as text too and converted through a double (exact to the ns below ~100 days); one that is no
number is null, as in the C scanner, and the derivation drops its event with a note.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from traceanalyzer.parse.duckdb_connect import connect_duckdb, duckdb_name, duckdb_reason
from traceanalyzer.parse.json_array import (
    EVENT_BOUNDARY,
    array_body,
    boundary_near,
    copy_as_utf8,
    copy_events,
    copy_prefix,
    padding_note,
    split,
)
from traceanalyzer.parse.trace_events import TraceEvents
from traceanalyzer.parse.trace_shared import (
    ARG_COLUMNS,
    FLATTENED_KEYS,
    SENTINELS,
    TraceResult,
)
from traceanalyzer.timeutil import duckdb_duration_us_to_ns, duckdb_us_to_ns
from traceanalyzer.vocabulary import PYTHON_PROCESS

_SQL_SENTINELS = "(" + ", ".join(str(v) for v in SENTINELS) + ")"
_COLUMNS = (
    "{ph: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: 'VARCHAR', "
    "dur: 'VARCHAR', cat: 'VARCHAR', id: 'VARCHAR', args: 'JSON'}"
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


def _int(text: str) -> str:
    """An integer's text (or a string of one) as BIGINT, null for anything else, as the C
    scanner's ``to_int``: DuckDB's own cast also reads ``-0.0``, ``2.5`` (as 3) or ``1e3``."""
    return (
        f"(CASE WHEN length({text}) <= 20 AND regexp_full_match({text}, '-?[0-9]+') "
        f"THEN TRY_CAST({text} AS BIGINT) END)"
    )


def _flat_sql(kind: str, keys: tuple[str, ...]) -> str:
    """A flattened args column (trace_shared.ARG_COLUMNS): the first of ``keys`` present."""
    values = [_flat(k) if kind == "text" else _int(_flat(k)) for k in keys]
    first = f"coalesce({', '.join(values)})" if len(values) > 1 else values[0]
    if kind == "id":
        return f"(CASE WHEN {first} IN {_SQL_SENTINELS} THEN NULL ELSE {first} END)"
    return first


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _scan(paths: list[Path]) -> str:
    """The one JSON scan: ``ts`` becomes exact ns from its text; ``args`` keeps its JSON object
    text. Several paths (chunks of one array) are read in parallel."""
    files = "[" + ", ".join(_sql_str(str(p)) for p in paths) + "]"
    return (
        "SELECT ph, name, TRY_CAST(pid AS BIGINT) AS pid, TRY_CAST(tid AS BIGINT) AS tid, cat, "
        f"id, {duckdb_us_to_ns('ts')} AS ts, "
        f"{duckdb_duration_us_to_ns('dur')} AS dur_ns, CAST(args AS VARCHAR) AS args "
        # The default maximum_object_size (16 MB per event) also bounds the reader's buffers;
        # raising it multiplies peak memory.
        f"FROM read_json({files}, format = 'array', columns = {_COLUMNS})"
    )


@dataclass
class _Decoded:
    """The events as three frames (columns of :class:`TraceEvents`; counters keep their args)."""

    slices: pl.DataFrame
    counters: pl.DataFrame
    others: pl.DataFrame


_SLICE_PHASES = ("X", "i", "I")


def _decode(con: duckdb.DuckDBPyConnection, query: str) -> _Decoded:
    """The events ``query`` selects, split by kind a batch at a time as DuckDB hands them over,
    so no copy of every event is held besides the frames."""
    parts: dict[str, list[pl.DataFrame]] = {"slices": [], "counters": [], "others": []}
    for batch in _batches(con, query):
        events = pl.from_arrow(batch)
        ph = pl.col("ph")
        parts["slices"].append(
            events.filter(ph.is_in(_SLICE_PHASES)).select(
                "ph", "name", "pid", "tid", "cat", "ts", "dur_ns", "args"
            )
        )
        parts["counters"].append(
            events.filter(ph == "C").select("pid", "tid", "name", "ts", "args")
        )
        meta_args = pl.when(ph == "M").then(pl.col("args")).alias("args")
        parts["others"].append(
            events.filter(~ph.is_in((*_SLICE_PHASES, "C")) | ph.is_null()).select(
                "ph", "name", "pid", "tid", "cat", "id", "ts", meta_args
            )
        )
    return _Decoded(**{kind: pl.concat(frames) for kind, frames in parts.items()})


def _load(con: duckdb.DuckDBPyConnection, paths: list[Path], append: bool = False) -> None:
    """Every event into a temporary table ``raw`` that DuckDB may spill to disk: how a damaged
    file is read, in pieces. ``append`` adds to the table instead of replacing it."""
    con.execute(
        ("INSERT INTO raw " if append else "CREATE OR REPLACE TEMP TABLE raw AS ") + _scan(paths)
    )


def _load_failure(
    con: duckdb.DuckDBPyConnection, paths: list[Path], append: bool = False
) -> duckdb.Error | None:
    """:func:`_load`, and why the events did not read (None: they did). A spent budget is
    raised: the caller retries with a larger one."""
    try:
        _load(con, paths, append)
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as exc:
        return exc
    return None


_BATCH_ROWS = 64 << 10  # rows per Arrow batch handed over by DuckDB


def _batches(con: duckdb.DuckDBPyConnection, query: str) -> Iterator[pa.RecordBatch]:
    """The result of ``query`` a batch at a time (at least one). An error met while streaming reaches Arrow's
    reader as an OSError carrying DuckDB's message: it is raised again as the DuckDB error it
    was, so a malformed file still goes to the salvage and a spent budget to a larger one."""
    reader = con.sql(query).to_arrow_reader(_BATCH_ROWS)
    empty = True
    while True:
        try:
            yield reader.read_next_batch()
            empty = False
        except StopIteration:
            if empty:  # one batch, of no rows: the columns and their types
                columns = [pa.array([], type=column.type) for column in reader.schema]
                yield pa.record_batch(columns, schema=reader.schema)
            return
        except OSError as exc:
            message = str(exc)
            if message.startswith("Out of Memory Error"):
                raise duckdb.OutOfMemoryException(message) from exc
            raise duckdb.InvalidInputException(message) from exc


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
        failure = _load_failure(con, [source])
        if failure is None:
            out.warnings.append(note)
            return out
        out.warnings.append(f"{note} (byte offsets below are in the replaced copy)")
        error = str(failure)
    reason = duckdb_reason(error, 160)
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
    if closed and (padded := padding_note(path)):
        out.warnings.append(padded)
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
            if _load_failure(con, [repaired]) is None:
                return cut
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
                if _load_failure(con, [piece], append=True) is None:
                    continue
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
) -> _Decoded:
    """Decode the events: from chunk copies read in parallel when that pays, else from the file
    itself, and from the well-formed events of a damaged file as a last resort (with a warning;
    a spillable table then, built a piece at a time)."""
    if threads > 1 and path.stat().st_size >= _CHUNKED_MIN_BYTES:
        chunks = split(path, scratch, threads * _CHUNKS_PER_THREAD)
        try:
            if chunks:
                return _decode(con, _scan(chunks))
        except duckdb.OutOfMemoryException:
            raise
        except duckdb.Error:
            pass  # a false boundary or a torn tail: the whole file decides below
        finally:
            for chunk in chunks or ():
                chunk.unlink(missing_ok=True)
    try:
        with duckdb_name(path) as name:
            decoded = _decode(con, _scan([Path(name)]))
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as exc:
        salvage = _salvage(path, scratch, con, str(exc))
        result.incomplete = salvage.incomplete
        result.warnings += salvage.warnings
        return _decode(con, "SELECT * FROM raw")
    if _blank(path):  # DuckDB reads an empty file as an empty array, without a word
        result.incomplete = f"empty: {path.stat().st_size} bytes, no events"
        result.warnings.append(
            f"{path}: empty file ({path.stat().st_size} bytes): no events; the export was "
            "probably interrupted before it wrote the trace"
        )
    return decoded


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
        decoded = _load_trace(con, path, scratch, threads, result)
        return TraceEvents(
            slices=decoded.slices,
            flat=_flattened(con, decoded),
            counters=decoded.counters.drop("args"),
            samples=_samples(con, decoded.counters),
            others=decoded.others,
        )
    finally:
        con.close()


def _flattened(con: duckdb.DuckDBPyConnection, decoded: _Decoded) -> pl.DataFrame:
    """The flattened args (ARG_COLUMNS) of the slices that have any, by row."""
    # Framework (Python) events carry none of the flattened keys, and most of the args bytes:
    # their args are not parsed again.
    meta = decoded.others.filter(pl.col("ph") == "M", pl.col("name") == "process_name")
    named = meta.select("pid", pl.col("args").str.json_path_match("$.name").alias("process"))
    python = named.filter(pl.col("process") == PYTHON_PROCESS)["pid"].drop_nulls().unique()
    args = (
        decoded.slices.select("pid", "args")
        .with_row_index("row")
        .filter(~pl.col("pid").is_in(python.implode()) | pl.col("pid").is_null())
        .select("row", "args")
    )
    con.register("slice_args", args.to_arrow())
    flattened = {column: _flat_sql(kind, keys) for column, kind, keys in ARG_COLUMNS}
    primary = f"SELECT *, json_transform(args, '{_struct(_PRIMARY)}') AS flat FROM slice_args"
    secondary = (
        'SELECT *, CASE WHEN flat."Task Type" IS NULL '
        f"THEN json_transform(args, '{_struct(_SECONDARY)}') END AS flat2 FROM ({primary})"
    )
    listed = ", ".join(f'{expr} AS "{column}"' for column, expr in flattened.items())
    columns = list(flattened)
    flat = _frame(con, f"SELECT row, {listed} FROM ({secondary})")
    return flat.filter(pl.any_horizontal(pl.col(columns).is_not_null())).sort("row")


def _samples(con: duckdb.DuckDBPyConnection, counters: pl.DataFrame) -> pl.DataFrame:
    """One row per member of a counter's args: the key is the series, its value the sample."""
    con.register("counter_args", counters.select("args").with_row_index("event").to_arrow())
    return _frame(
        con,
        """SELECT event, series.key AS series,
                  TRY_CAST(json_extract_string(series.value, '$') AS DOUBLE) AS value
        FROM counter_args c, json_each(c.args) AS series ORDER BY event, series.id""",
    )


def _frame(con: duckdb.DuckDBPyConnection, query: str) -> pl.DataFrame:
    return pl.concat(pl.from_arrow(batch) for batch in _batches(con, query))
