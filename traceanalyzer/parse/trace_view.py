"""trace_view.json → slices, counters, flows and threads.

:func:`parse_trace_view` gives a trace to the native scanner (``trace_native.py``) when it is
built; this module is the other reader, for installs without a C compiler and for every file
the scanner refuses (a damaged one, which this reader salvages). Both write the same tables.

Why DuckDB here: on a 200 MB trace it decodes every event into typed columns in about a second,
on every core (chunks, ``json_array.py``), at a fraction of the memory of Python decoders
(benchmarks/bench_ingest.py), and it writes Parquet straight from its own columns, so no Python
object per event is ever built.

Exactness: ``ts`` is read as text (a JSON string as is, an integer's exact digits) and converted
from its decimal digits, never through float64. ``dur`` is a float µs in every generation;
``round(dur * 1000)`` is exact to the ns for any duration below ~100 days.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from traceanalyzer.parse import trace_native
from traceanalyzer.parse.json_array import (
    EVENT_BOUNDARY,
    array_body,
    boundary_near,
    copy_as_utf8,
    copy_events,
    copy_prefix,
    split,
)
from traceanalyzer.parse.sink import TableSink, connect_duckdb, duckdb_select_list
from traceanalyzer.parse.trace_shared import (
    ARG_COLUMNS,
    FLATTENED_KEYS,
    MAX_NAME,
    SENTINELS,
    TraceResult,
    cut_name_sql,
    cut_names_note,
)
from traceanalyzer.timeutil import duckdb_us_to_ns

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


def _slice_columns(process: str, thread: str) -> dict[str, str]:
    """SQL for each slices column over the raw scan; names are resolved by map lookups."""
    ns, dur = "ts_ns", "dur_ns"  # computed once per row, at load and by the inner query
    is_cann = f"({process} = 'CANN' AND regexp_matches(name, '^[A-Za-z]+@'))"
    flattened = {column: _flat_sql(kind, keys) for column, kind, keys in ARG_COLUMNS}
    return {
        "ph": "ph",
        "process": process,
        "thread": thread,
        "pid": "TRY_CAST(pid AS BIGINT)",
        "tid": "TRY_CAST(tid AS BIGINT)",
        "name": "name",
        "cat": "cat",
        "start_ns": ns,
        "dur_ns": dur,
        "end_ns": f"{ns} + {dur}",
        **flattened,
        "stream_id": f"coalesce({flattened['stream_id']},"
        f" CASE WHEN {process} = 'Ascend Hardware' THEN TRY_CAST(tid AS BIGINT) END)",
        "api_layer": f"CASE WHEN {is_cann} THEN split_part(name, '@', 1) END",
        "api_name": f"CASE WHEN {is_cann} THEN substr(name, strpos(name, '@') + 1) END",
        "args": "nullif(args, '{}')",
    }


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
    if append:
        return
    # A view, not a copy: scanning `ph` to find these rows is cheaper than holding them twice.
    con.execute(
        """CREATE OR REPLACE TEMP VIEW small AS
        SELECT ph, name, pid, tid, ts_ns, cat, id, args
        FROM raw WHERE ph IN ('M', 'C', 's', 'f', 't')"""
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


@dataclass(frozen=True)
class ParseMemory:
    """DuckDB's buffer budget for parsing one trace: a multiple of its size, or a fixed size.
    (The native reader needs none: its columns take about 0.9x the file.)

    The default, 1.2x the file (at least 128 MB), keeps a worker's peak RSS within about 1.45x
    the file above the imported libraries; without a limit DuckDB keeps up to 80% of RAM per
    worker, so memory would grow with the machine instead of with the rank. More memory spills
    less and is faster: the ingest of a 200 MB trace takes about a quarter less time with 1 GB
    (docs/scale.md).
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
    all busy (the native reader, once its slices are written): the caller may start other work
    then. The DuckDB reader holds its budget to the end and never calls it.

    The native scanner (trace_native.py) reads a well-formed file when it is built. Otherwise,
    and for any file it does not read (a damaged one), one DuckDB JSON scan fills a spillable
    table (buffers capped by ``memory``, so memory follows the file, not the machine); every
    table is then written from it. A trace that does not fit the budget (events far larger than
    usual, say) is parsed again with twice the budget, with a warning, rather than failing.
    """
    refused = None
    if trace_native.available():
        try:
            return trace_native.parse_native(path, sink, threads, on_read)
        except trace_native.NativeUnreadable as exc:
            refused = str(exc)  # damaged or unusual: the DuckDB reader salvages it
    budget = (memory or DEFAULT_PARSE_MEMORY).limit_mb(path)
    try:
        result = _parse(path, sink, scratch, threads, budget)
    except duckdb.OutOfMemoryException as exc:
        result = _parse(path, sink, scratch, threads, budget * 2)
        result.warnings.append(
            f"{path}: out of its {budget} MB parse budget ({str(exc).splitlines()[0][:120]}); "
            f"parsed again with {budget * 2} MB"
        )
    if refused and not result.incomplete and not result.warnings:
        # Not damaged, yet not the shape the scanner reads: say why this rank was slower.
        result.warnings.append(
            f"read by the slower DuckDB reader: the native scanner refused {refused}"
        )
    return result


def _parse(path: Path, sink: TableSink, scratch: Path, threads: int, budget_mb: int) -> TraceResult:
    result = TraceResult()
    scratch.mkdir(parents=True, exist_ok=True)
    con = connect_duckdb(
        {
            "threads": threads,
            # Every output has an explicit ORDER BY (slices: by time, parents before children),
            # so DuckDB may parallelise freely and the files are still deterministic.
            "preserve_insertion_order": False,
            "temp_directory": str(scratch / "duckdb"),
            "memory_limit": f"{budget_mb}MB",
        }
    )
    try:
        _load_trace(con, path, scratch, threads, result)
        _derive(con, result)
        _emit(con, sink, result)
    finally:
        con.close()
    return result


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


def _derive(con: duckdb.DuckDBPyConnection, result: TraceResult) -> None:
    """Name every (pid, tid) from the metadata events (absurdly long names cut)."""
    name, label = (
        cut_name_sql(f"json_extract_string(args, '$.{key}')") for key in ("name", "labels")
    )
    cut = con.execute(
        f"""SELECT count(*) FROM small WHERE ph = 'M' AND name IN ('process_name', 'thread_name')
        AND length(json_extract_string(args, '$.name')) > {MAX_NAME}"""
    ).fetchone()[0]
    if cut:
        result.warnings.append(cut_names_note(cut))
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE procs AS
        SELECT pid,
               max(CASE WHEN name = 'process_name' THEN {name} END) AS process_name,
               max(CASE WHEN name = 'process_labels' THEN {label} END) AS process_label,
               max(CASE WHEN name = 'process_sort_index' THEN TRY_CAST(json_extract_string(args, '$.sort_index') AS BIGINT) END) AS process_sort_index
        FROM small WHERE ph = 'M' GROUP BY pid"""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE thread_meta AS
        SELECT pid, tid,
               max(CASE WHEN name = 'thread_name' THEN {name} END) AS thread_name,
               max(CASE WHEN name = 'thread_sort_index' THEN TRY_CAST(json_extract_string(args, '$.sort_index') AS BIGINT) END) AS thread_sort_index
        FROM small WHERE ph = 'M' AND name IN ('thread_name', 'thread_sort_index') GROUP BY pid, tid"""
    )
    con.execute(
        """CREATE OR REPLACE TEMP TABLE thr AS
        WITH used AS (SELECT DISTINCT pid, tid FROM small WHERE ph <> 'M' OR name LIKE 'thread%'
                      UNION SELECT pid, tid FROM thread_meta)
        SELECT u.pid, u.tid,
               coalesce(p.process_name, 'pid ' || u.pid) AS process,
               p.process_label, p.process_sort_index,
               coalesce(t.thread_name,
                        CASE WHEN p.process_name = 'Ascend Hardware' THEN 'Stream ' || u.tid ELSE 'Thread ' || u.tid END) AS thread,
               t.thread_sort_index
        FROM used u LEFT JOIN procs p USING (pid) LEFT JOIN thread_meta t USING (pid, tid)"""
    )
    unnamed = con.execute("SELECT count(*) FROM procs WHERE process_name IS NULL").fetchone()[0]
    if unnamed:
        result.warnings.append(f"{unnamed} pids have no process_name metadata; named 'pid <n>'")
    result.processes = [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT process_name FROM procs WHERE process_name IS NOT NULL ORDER BY 1"
        ).fetchall()
    ]


def _name_maps(con: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """MAP literals pid -> process and 'pid:tid' -> thread, for order-preserving streaming lookups."""
    procs = con.execute(
        "SELECT pid, process_name FROM procs WHERE process_name IS NOT NULL"
    ).fetchall()
    threads = con.execute(
        "SELECT pid || ':' || tid, thread_name FROM thread_meta WHERE thread_name IS NOT NULL"
    ).fetchall()

    def literal(pairs: list[tuple[str, str]]) -> str:
        if not pairs:
            return "(MAP {}::MAP(VARCHAR, VARCHAR))"
        return "(MAP {" + ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in pairs) + "})"

    return literal(procs), literal(threads)


def _emit(con: duckdb.DuckDBPyConnection, sink: TableSink, result: TraceResult) -> None:
    proc_map, thread_map = _name_maps(con)
    process = f"coalesce({proc_map}[pid], 'pid ' || pid)"
    thread = (
        f"coalesce({thread_map}[pid || ':' || tid], CASE WHEN {process} = 'Ascend Hardware' "
        "THEN 'Stream ' || tid ELSE 'Thread ' || tid END)"
    )
    cols = _slice_columns("process", "thread")
    inner = (
        "SELECT *, CAST(round(coalesce(dur, 0) * 1000) AS BIGINT) AS dur_ns "
        "FROM raw WHERE ph IN ('X', 'i', 'I')"
    )
    # Framework (Python) events carry none of the flattened keys, and most of the args bytes.
    named = (
        f"SELECT *, CASE WHEN flat.\"Task Type\" IS NULL AND process <> 'Python' "
        f"THEN json_transform(args, '{_struct(_SECONDARY)}') END AS flat2 FROM ("
        f"SELECT *, CASE WHEN process <> 'Python' THEN json_transform(args, '{_struct(_PRIMARY)}') END AS flat "
        f"FROM (SELECT *, {process} AS process, {thread} AS thread FROM ({inner})))"
    )
    result.rows["slices"] = sink.duckdb(
        "slices",
        con,
        f"SELECT {duckdb_select_list('slices', cols)} FROM ({named}) ORDER BY start_ns, dur_ns DESC, pid, tid, name",
    )
    written = sink.written("slices")
    if result.rows["slices"] and written is not None:
        result.start_ns, result.end_ns = con.execute(
            f"SELECT min(start_ns), max(end_ns) FROM read_parquet({_sql_str(str(written))})"
        ).fetchone()
        g1_rows = con.execute(
            f"SELECT count(*) FROM read_parquet({_sql_str(str(written))}) "
            "WHERE process = 'Ascend Hardware' AND contains(args, '\"Stream Id\"')"
        ).fetchone()[0]
        result.hw_stream_arg = "Stream Id" if g1_rows else "Physic Stream Id"

    ev = "(SELECT s.*, t.process, t.thread FROM small s LEFT JOIN thr t USING (pid, tid))"
    counter_cols = {
        "process": "process",
        "pid": "TRY_CAST(pid AS BIGINT)",
        "tid": "TRY_CAST(tid AS BIGINT)",
        "name": "name",
        "series": "series.key",
        "ts_ns": "ts_ns",
        # One row per key of the args object: the key is the series, its value the sample.
        "value": "TRY_CAST(json_extract_string(series.value, '$') AS DOUBLE)",
    }
    result.rows["counters"] = sink.duckdb(
        "counters",
        con,
        f"SELECT {duckdb_select_list('counters', counter_cols)} "
        f"FROM (SELECT * FROM {ev} WHERE ph = 'C') c, json_each(c.args) AS series "
        "ORDER BY ts_ns, name, series.key, TRY_CAST(pid AS BIGINT)",
    )

    flow_cols = {
        "cat": "coalesce(s.cat, f.cat)",
        "name": "coalesce(s.name, f.name)",
        "flow_id": "coalesce(s.id, f.id)",
        "start_ns": "s.ts_ns",
        "end_ns": "f.ts_ns",
        "src_process": "s.process",
        "src_thread": "s.thread",
        "src_pid": "TRY_CAST(s.pid AS BIGINT)",
        "src_tid": "TRY_CAST(s.tid AS BIGINT)",
        "dst_process": "f.process",
        "dst_thread": "f.thread",
        "dst_pid": "TRY_CAST(f.pid AS BIGINT)",
        "dst_tid": "TRY_CAST(f.tid AS BIGINT)",
    }
    # One start per (cat, id); every finish pairs with it. Duplicate starts keep the earliest.
    result.rows["flows"] = sink.duckdb(
        "flows",
        con,
        f"""WITH s AS (
                SELECT * EXCLUDE (rn) FROM (
                    SELECT cat, name, id, pid, tid, process, thread, ts_ns,
                           row_number() OVER (PARTITION BY cat, id ORDER BY ts_ns) AS rn
                    FROM {ev} WHERE ph = 's') WHERE rn = 1),
            f AS (SELECT cat, name, id, pid, tid, process, thread, ts_ns FROM {ev} WHERE ph IN ('f', 't'))
            SELECT {duckdb_select_list("flows", flow_cols)}
            FROM s FULL OUTER JOIN f ON s.cat IS NOT DISTINCT FROM f.cat AND s.id = f.id
            ORDER BY coalesce(s.ts_ns, f.ts_ns), f.ts_ns, cat, flow_id""",
    )
    thread_cols = {
        c: c
        for c in ("process", "process_label", "process_sort_index", "thread", "thread_sort_index")
    }
    thread_cols["pid"], thread_cols["tid"] = "TRY_CAST(pid AS BIGINT)", "TRY_CAST(tid AS BIGINT)"
    result.rows["threads"] = sink.duckdb(
        "threads",
        con,
        f"SELECT {duckdb_select_list('threads', thread_cols)} FROM thr "
        "ORDER BY process_sort_index, process, thread_sort_index, TRY_CAST(tid AS BIGINT)",
    )
