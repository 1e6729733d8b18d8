"""trace_view.json → slices, counters, flows and threads through the native scanner and polars.

The fast path of :func:`traceanalyzer.parse.trace_view.parse_trace_view`. ``_trace_scan`` (C,
built at install when a compiler is present) reads the file once, in blocks, a byte range per
core, and hands over typed Arrow columns per table (text as string views, which polars adopts
without a copy). polars then resolves names and sorts; each table is written a row group at a
time from the sorted order, so only the scanned columns and one row group are ever held.

The tables are the ones the DuckDB path writes, row for row (tests/test_ingest_native.py holds
the two to it). Anything the scanner does not read (a truncated or malformed file, invalid
UTF-8, a pid that is not an integer) raises :class:`NativeUnreadable`, and the caller falls back
to the DuckDB path, which owns the salvage of damaged files.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.json_array import array_body, boundary_near
from traceanalyzer.parse.sink import TableSink
from traceanalyzer.parse.trace_shared import (
    ARG_COLUMNS,
    MAX_NAME,
    TraceResult,
    cut_name,
    cut_names_note,
)

try:
    from traceanalyzer.parse._trace_scan import Scanner
except ImportError:  # built without a C compiler: the DuckDB path does everything
    Scanner = None

_BLOCK_BYTES = 8 << 20  # read per step: the memory a scan holds besides its columns
# Rows per Parquet row group, gathered from the sorted order: what is held at a time besides
# the scanned columns. Slices carry their args (16k rows peaked 30 MB lower than 32k, at the
# same speed); counter rows are narrow, and fewer groups cost less per-call overhead.
_SLICE_GROUP = 16 << 10
_COUNTER_GROUP = 64 << 10
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
            "at install), so DuckDB reads traces, about 1.8x slower; reinstall with one to speed "
            "up the ingest"
        )
    if not available():
        return "trace_view.json: the native scanner is turned off (TRACEANALYZER_NATIVE=0)"
    return None


# --------------------------------------------------------------------------- scanning


@dataclass
class Scan:
    """What the scanner read, in file order (the tables of _trace_scan.c)."""

    slices: pl.DataFrame  # X/i/I events: ph, name, pid, tid, cat, ts, dur_ns, args
    flat: pl.DataFrame  # row (in slices), then ARG_COLUMNS, for the slices that have any
    counters: pl.DataFrame  # C events: pid, tid, name, ts
    samples: pl.DataFrame  # per member of a counter's args: event (row in counters), series, value
    others: pl.DataFrame  # the rest: ph, name, pid, tid, cat, id, ts, args (metadata events only)
    # The interned columns (slices ph, name, cat; counters name; samples series) hold int32 codes
    # into these strings, keyed by (table, column).
    words: dict[tuple[str, str], pl.Series]

    def decode(self, table: str, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` (rows of ``table``) with its interned columns as text."""
        return frame.with_columns(
            words.gather(frame[column]).alias(column)
            for (name, column), words in self.words.items()
            if name == table and column in frame.columns
        )

    def by_text(self, table: str, column: str) -> pl.Expr:
        """The interned ``column`` as a sort key: its text's rank among the column's strings
        (sorts as the text does, as integers)."""
        ranks = self.words[table, column].rank("dense").cast(pl.Int64)
        return pl.col(column).map_batches(lambda codes: ranks.gather(codes), pl.Int64)


_ARROW_TYPES = {"int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64(),
                "text": pa.string_view(), "dict": pa.int32()}  # fmt: skip


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
            words[name] = pl.Series(name, pa.Array.from_buffers(pa.string_view(), count, strings))
        arrays[name] = pa.Array.from_buffers(_ARROW_TYPES[kind], rows, buffers, nulls)
    return pl.from_arrow(pa.RecordBatch.from_pydict(arrays)), words


def _blocks(path: Path, begin: int, end: int, wrap: bool) -> Iterator[bytes]:
    """Bytes [begin, end) of ``path`` in blocks; with ``wrap``, as an array of their events."""
    if wrap:
        yield b"["
    with open(path, "rb") as fh:
        fh.seek(begin)
        left = end - begin
        while left > 0 and (block := fh.read(min(_BLOCK_BYTES, left))):
            left -= len(block)
            yield block
    if wrap:
        yield b"]"


def _scan(
    path: Path, begin: int, end: int, wrap: bool
) -> dict[str, tuple[pl.DataFrame, dict[str, pl.Series]]]:
    """The tables of a byte range. The scanner runs without the GIL, so
    ranges scan side by side; its columns grow in place and are handed over once."""
    scanner = Scanner(ARG_COLUMNS)
    pending = b""
    for block in itertools.chain(_blocks(path, begin, end, wrap), [b""]):
        data = pending + block if pending else block
        try:
            consumed = scanner.feed(data, not block)
        except ValueError as exc:
            raise NativeUnreadable(f"{path}: {exc} (of the range from byte {begin})") from exc
        pending = data[consumed:]
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


def scan_trace(path: Path, threads: int) -> Scan:
    """Scan ``path`` on up to ``threads`` cores.

    A cut that falls inside a string (the boundary pattern can occur there) fails one range;
    the file is then scanned whole before giving up.
    """
    ranges = _ranges(path, threads)
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
    return Scan(
        **{table: pl.concat(frames, rechunk=False) for table, frames in tables.items()},
        words={key: pl.concat(strings) for key, strings in words.items()},
    )


# --------------------------------------------------------------------------- tables


class _Names:
    """Process and thread names from the metadata (M) events, as the DuckDB path derives them."""

    _FIELDS = {"process_labels": "labels", "process_sort_index": "sort_index",
               "thread_sort_index": "sort_index"}  # fmt: skip

    def __init__(self, others: pl.DataFrame):
        meta = others.filter(pl.col("ph") == "M").select("pid", "tid", "name", "args")
        values = []
        for name, args in meta.select("name", "args").iter_rows():
            try:
                item = json.loads(args).get(self._FIELDS.get(name, "name")) if args else None
            except (ValueError, AttributeError):
                item = None
            values.append(item if isinstance(item, str) or item is None else json.dumps(item))
        long_names = meta["name"].is_in(["process_name", "thread_name"]).to_list()
        self.cut = sum(
            1 for v, n in zip(values, long_names, strict=True) if n and v and len(v) > MAX_NAME
        )
        values = [cut_name(v) if v else v for v in values]
        m = meta.with_columns(pl.Series("value", values, dtype=pl.String))

        def pick(name: str, as_int: bool = False) -> pl.Expr:
            value = pl.when(pl.col("name") == name).then(pl.col("value"))
            return (value.cast(pl.Int64, strict=False) if as_int else value).max()

        self.procs = m.group_by("pid").agg(
            pick("process_name").alias("process_name"),
            pick("process_labels").alias("process_label"),
            pick("process_sort_index", as_int=True).alias("process_sort_index"),
        )
        self.thread_meta = (
            m.filter(pl.col("name").is_in(["thread_name", "thread_sort_index"]))
            .group_by("pid", "tid")
            .agg(
                pick("thread_name").alias("thread_name"),
                pick("thread_sort_index", as_int=True).alias("thread_sort_index"),
            )
        )
        self._processes = self.procs.select("pid", "process_name").drop_nulls()
        self._threads = self.thread_meta.select("pid", "tid", "thread_name").drop_nulls()

    def attach(self, frame: pl.DataFrame, thread_names: bool = True) -> pl.DataFrame:
        """``frame`` (a row group, with ``pid`` and ``tid``) plus its ``process`` (and
        ``thread``) names: named once per distinct (pid, tid) of the group, then joined."""
        ids = frame.select("pid", "tid").unique()
        named = ids.join(self._processes, on="pid", how="left").with_columns(_process())
        columns = ["process"]
        if thread_names:
            named = named.join(self._threads, on=["pid", "tid"], how="left").with_columns(
                pl.coalesce("thread_name", _default_thread()).alias("thread")
            )
            columns.append("thread")
        # Dictionary-encoded (Categorical): each name is held once, not once per row, in the
        # Arrow tables handed to the sink and in the Parquet files.
        return frame.join(
            named.select("pid", "tid", *(pl.col(c).cast(pl.Categorical) for c in columns)),
            on=["pid", "tid"],
            how="left",
            maintain_order="left",
            nulls_equal=True,
        )


def _process() -> pl.Expr:
    """``process``: the pid's process_name, else "pid <pid>" (as the DuckDB path names it)."""
    named = pl.coalesce("process_name", pl.lit("pid ") + pl.col("pid").cast(pl.String))
    return named.alias("process")


def _default_thread() -> pl.Expr:
    prefix = pl.when(pl.col("process") == "Ascend Hardware").then(pl.lit("Stream "))
    return prefix.otherwise(pl.lit("Thread ")) + pl.col("tid").cast(pl.String)


def _finish_slices(part: pl.DataFrame) -> pl.DataFrame:
    """The slices columns the scanner leaves to the names (trace_view._slice_columns)."""
    # Framework (Python) events carry none of the flattened keys (the DuckDB path skips them).
    device = pl.col("process") != "Python"
    flattened = [pl.when(device).then(pl.col(column)).alias(column) for column, _, _ in ARG_COLUMNS]
    hardware_stream = pl.when(pl.col("process") == "Ascend Hardware").then(pl.col("tid"))
    is_cann = (pl.col("process") == "CANN") & pl.col("name").str.contains(r"^[A-Za-z]+@")
    layer_and_name = pl.col("name").str.splitn("@", 2)
    return part.with_columns(*flattened).with_columns(
        pl.coalesce("stream_id", hardware_stream).alias("stream_id"),
        pl.col("ts").alias("start_ns"),
        (pl.col("ts") + pl.col("dur_ns")).alias("end_ns"),
        pl.when(is_cann).then(layer_and_name.struct.field("field_0")).alias("api_layer"),
        pl.when(is_cann).then(layer_and_name.struct.field("field_1")).alias("api_name"),
        pl.when(pl.col("args") != "{}").then(pl.col("args")).alias("args"),
    )


@dataclass
class _Span:
    """What the slices tell the session: their time span, and the stream key's generation."""

    start_ns: int | None = None
    end_ns: int | None = None
    g1: bool = False

    def add(self, part: pl.DataFrame) -> None:
        low, high = part["start_ns"].min(), part["end_ns"].max()
        if low is not None:
            self.start_ns = low if self.start_ns is None else min(self.start_ns, low)
        if high is not None:
            self.end_ns = high if self.end_ns is None else max(self.end_ns, high)
        hardware = part.filter(pl.col("process") == "Ascend Hardware")["args"]
        self.g1 = self.g1 or bool(hardware.str.contains('"Stream Id"', literal=True).any())


def _order(frame: pl.DataFrame, by: list[pl.Expr], descending: list[bool]) -> pl.Series:
    """Row numbers of ``frame`` in the order of ``by`` (nulls last, ties in frame order).

    One stable sort per key, the last key first: sorting on all keys at once builds a row
    encoding of every key (70 MB for 412k slices, a string among them).
    """
    order = pl.int_range(frame.height, eager=True, dtype=pl.Int64).alias("row")
    for key, desc in reversed(list(zip(by, descending, strict=True))):
        keys = frame.select(key.alias("key")).to_series().gather(order).to_frame()
        step = keys.select(
            pl.arg_sort_by("key", descending=desc, nulls_last=True, maintain_order=True)
        )
        order = order.gather(step.to_series())
    return order


def _sorted_groups(
    frame: pl.DataFrame, by: list[pl.Expr], descending: list[bool], group: int
) -> Iterator[tuple[pl.Series, pl.DataFrame]]:
    """``frame`` in the order of ``by``, ``group`` rows at a time, with each group's row
    numbers: only the order is held besides ``frame``."""
    order = _order(frame, by, descending)
    for start in range(0, max(len(order), 1), group):
        rows = order.slice(start, group)
        yield rows, frame[rows]


def _with_flat(part: pl.DataFrame, flat: pl.DataFrame) -> pl.DataFrame:
    """``part`` (with slice row numbers ``row``) plus its flattened args columns.

    ``flat`` is in slice order, so each row is found by a binary search: no hash table of it is
    built for every row group.
    """
    columns = [c for c in flat.columns if c != "row"]
    if not flat.height:
        return part.with_columns(pl.lit(None, flat[c].dtype).alias(c) for c in columns)
    rows = part["row"].cast(flat["row"].dtype)
    at = flat["row"].search_sorted(rows).clip(0, flat.height - 1)
    found = flat["row"].gather(at) == rows
    values = flat.select(columns)[at]
    return part.with_columns(pl.when(found).then(values[c]).alias(c) for c in columns)


def _slice_groups(scan: Scan, names: _Names, span: _Span) -> Iterator[pa.Table]:
    """The slices table a row group at a time, in time order (parents before children); each
    group gets its text, names and flattened args after the gather."""
    by = [
        pl.col("ts"),
        pl.col("dur_ns"),
        pl.col("pid"),
        pl.col("tid"),
        scan.by_text("slices", "name"),
    ]
    descending = [False, True, False, False, False]  # parents before their children
    for rows, part in _sorted_groups(scan.slices, by, descending, _SLICE_GROUP):
        part = names.attach(scan.decode("slices", part).with_columns(rows))
        part = _with_flat(part, scan.flat)
        part = _finish_slices(part)
        if part.height:
            span.add(part)
        yield part.to_arrow()


def _counter_groups(scan: Scan, names: _Names) -> Iterator[pa.Table]:
    """The counters table a row group at a time: one row per sample, in time order."""
    samples = scan.samples.with_columns(
        scan.counters.select("pid", "tid", "name", pl.col("ts").alias("ts_ns"))[
            scan.samples["event"]
        ]
    )
    by = [pl.col("ts_ns"), scan.by_text("counters", "name"), scan.by_text("samples", "series"),
          pl.col("pid")]  # fmt: skip
    for _, part in _sorted_groups(samples, by, [False] * 4, _COUNTER_GROUP):
        part = scan.decode("samples", scan.decode("counters", part))
        yield names.attach(part, thread_names=False).to_arrow()


def _ahead(groups: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``groups``, each made on a second thread while the sink writes the one before: polars
    and the Parquet encoder both release the GIL, so the two overlap on two cores."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, groups, None)
        while (group := pending.result()) is not None:
            pending = pool.submit(next, groups, None)
            yield group


def parse_native(
    path: Path, sink: TableSink, threads: int, on_read: Callable[[], None] | None = None
) -> TraceResult:
    """Parse one trace_view.json into the slices, counters, flows and threads tables;
    ``on_read`` is called once the slices, the bulk of the memory, are written and freed."""
    scan = scan_trace(path, threads)
    result, span = TraceResult(reader="native"), _Span()
    names = _Names(scan.others)
    result.rows["slices"] = sink.batches("slices", _ahead(_slice_groups(scan, names, span)))
    if result.rows["slices"]:
        result.start_ns, result.end_ns = span.start_ns, span.end_ns
        result.hw_stream_arg = "Stream Id" if span.g1 else "Physic Stream Id"
    scan.slices = scan.flat = pl.DataFrame()  # the largest part: gone before the counters
    if on_read:
        on_read()

    result.rows["counters"] = sink.batches("counters", _ahead(_counter_groups(scan, names)))
    used_by_counters = scan.counters.select("pid", "tid").unique()
    scan.counters = scan.samples = pl.DataFrame()

    others = names.attach(scan.others)
    result.rows["flows"] = sink.arrow("flows", _flows(others).to_arrow())
    used = pl.concat(
        [
            others.filter(
                pl.col("ph").is_in(["s", "f", "t"])
                | ((pl.col("ph") == "M") & pl.col("name").str.starts_with("thread"))
            ).select("pid", "tid"),
            used_by_counters,
            names.thread_meta.select("pid", "tid"),
        ]
    ).unique()
    result.rows["threads"] = sink.arrow("threads", _threads(used, names).to_arrow())
    if names.cut:
        result.warnings.append(cut_names_note(names.cut))
    unnamed = names.procs.filter(pl.col("process_name").is_null()).height
    if unnamed:
        result.warnings.append(f"{unnamed} pids have no process_name metadata; named 'pid <n>'")
    result.processes = sorted(names.procs["process_name"].drop_nulls().unique().to_list())
    return result


def _flows(others: pl.DataFrame) -> pl.DataFrame:
    """One start per (cat, id), the earliest; every finish pairs with it."""
    columns = ["cat", "name", "id", "pid", "tid", "process", "thread", "ts"]
    starts = (
        others.filter(pl.col("ph") == "s")
        .sort("ts", nulls_last=True, maintain_order=True)
        .unique(["cat", "id"], keep="first", maintain_order=True)
        .select(columns)
    )
    finishes = others.filter(pl.col("ph").is_in(["f", "t"])).select(columns)
    joined = starts.join(
        finishes, on=["cat", "id"], how="full", nulls_equal=True, suffix="_f", coalesce=False
    )
    return (
        joined.select(
            pl.coalesce("cat", "cat_f").alias("cat"),
            pl.coalesce("name", "name_f").alias("name"),
            pl.coalesce("id", "id_f").alias("flow_id"),
            pl.col("ts").alias("start_ns"),
            pl.col("ts_f").alias("end_ns"),
            pl.col("process").alias("src_process"),
            pl.col("thread").alias("src_thread"),
            pl.col("pid").alias("src_pid"),
            pl.col("tid").alias("src_tid"),
            pl.col("process_f").alias("dst_process"),
            pl.col("thread_f").alias("dst_thread"),
            pl.col("pid_f").alias("dst_pid"),
            pl.col("tid_f").alias("dst_tid"),
            pl.coalesce("ts", "ts_f").alias("_order"),
        )
        .sort(["_order", "end_ns", "cat", "flow_id"], nulls_last=True)
        .drop("_order")
    )


def _threads(used: pl.DataFrame, names: _Names) -> pl.DataFrame:
    """Every (pid, tid) in ``used`` with its names, labels and sort indexes."""
    labels = names.procs.select("pid", "process_label", "process_sort_index")
    sort_indexes = names.thread_meta.select("pid", "tid", "thread_sort_index")
    return (
        names.attach(used)
        .join(labels, on="pid", how="left")
        .join(sort_indexes, on=["pid", "tid"], how="left")
        .select(
            "process",
            "process_label",
            "process_sort_index",
            "thread",
            "thread_sort_index",
            "pid",
            "tid",
        )
        .sort(["process_sort_index", "process", "thread_sort_index", "tid"], nulls_last=True)
    )
