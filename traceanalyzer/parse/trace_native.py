"""trace_view.json → slices, counters, flows and threads through the native scanner and polars.

The fast path of :func:`traceanalyzer.parse.trace_view.parse_trace_view`. ``_trace_scan`` (C,
built at install when a compiler is present) reads the file once, in blocks, on every core, and
hands over Arrow columns: the JSON is never held whole, and no Python object per event is built.
polars then resolves names, flattens the well-known args and sorts; each table is written in
row groups straight from the sorted order.

The tables are the ones the DuckDB path writes, row for row (tests/test_ingest_native.py holds
the two to it). Anything the scanner does not read (a truncated or malformed file, invalid
UTF-8) raises :class:`NativeUnreadable`, and the caller falls back to the DuckDB path, which owns
the salvage of damaged files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.json_array import array_body, boundary_near
from traceanalyzer.parse.sink import TableSink
from traceanalyzer.parse.trace_shared import FLATTENED_KEYS, SENTINELS, TraceResult

try:
    from traceanalyzer.parse._trace_scan import Scanner
except ImportError:  # built without a C compiler: the DuckDB path does everything
    Scanner = None

_BLOCK_BYTES = 16 << 20  # read per step: the memory the scan holds besides its columns
_ROW_GROUP = 64 << 10  # rows per Parquet row group, written from the sorted order
_PARALLEL_MIN_BYTES = 32 << 20  # below this one scanner is as fast as two


class NativeUnreadable(Exception):
    """The scanner does not read this file (damaged, or not an array of objects)."""


def available() -> bool:
    """True when the scanner is built and not turned off (TRACEANALYZER_NATIVE=0)."""
    return Scanner is not None and os.environ.get("TRACEANALYZER_NATIVE", "1") != "0"


# --------------------------------------------------------------------------- scanning


@dataclass
class Scan:
    """What the scanner read: every event in file order, and two sparse side tables."""

    events: list[pa.RecordBatch]  # one per range: ph, name, pid, tid, cat, id, ts (ns), dur (µs),
    # args (minified JSON)
    keyed: pl.DataFrame  # event row, key (index into FLATTENED_KEYS), value: the flattened args
    samples: pl.DataFrame  # event row, series, value: one per member of a counter's args


# Column types of the scanner's three tables (events, keyed args, counter samples); text
# columns are not listed.
_TYPES = (
    {"ts": pa.int64(), "dur": pa.float64(), "pid": pa.int64(), "tid": pa.int64()},
    {"event": pa.int64(), "key": pa.int32()},
    {"event": pa.int64(), "value": pa.float64()},
)


def _batch(columns: dict[str, tuple], types: dict[str, pa.DataType]) -> pa.RecordBatch:
    arrays = {}
    for name, (rows, nulls, valid, offsets, data) in columns.items():
        buffers = [pa.py_buffer(valid) if nulls else None]
        buffers += [pa.py_buffer(offsets)] if offsets is not None else []
        typ = types.get(name, pa.string())
        arrays[name] = pa.Array.from_buffers(typ, rows, [*buffers, pa.py_buffer(data)], nulls)
    return pa.RecordBatch.from_pydict(arrays)


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


def _scan(path: Path, begin: int, end: int, wrap: bool) -> list[pa.RecordBatch]:
    """Every event in a byte range: [events, keyed args, counter samples]. Runs without the
    GIL, so ranges scan side by side."""
    scanner = Scanner(FLATTENED_KEYS)
    pending = b""
    for block in (*_blocks(path, begin, end, wrap), b""):
        final = not block
        data = pending + block if pending else block
        try:
            consumed = scanner.feed(data, final)
        except ValueError as exc:
            raise NativeUnreadable(f"{path}: {exc} (of the range from byte {begin})") from exc
        pending = data[consumed:]
    # One batch per range: its columns grew in place (realloc), and a take on a batch is fast
    # where one on many chunks concatenates them first.
    return [_batch(columns, types) for columns, types in zip(scanner.take(), _TYPES, strict=True)]


def _ranges(path: Path, parts: int) -> list[tuple[int, int, bool]]:
    """Byte ranges scanned side by side: cut at event boundaries near equal shares."""
    size = path.stat().st_size
    body = array_body(path) if parts > 1 and size >= _PARALLEL_MIN_BYTES else None
    if body is None or not body[2]:
        return [(0, size, False)]
    cuts = [body[0]]
    for i in range(1, parts):
        cut = boundary_near(path, size * i // parts - (1 << 20), size * i // parts + (1 << 20))
        if cut is None or cut <= cuts[-1]:
            return [(0, size, False)]
        cuts.append(cut)
    cuts.append(body[1])
    ranges = []
    with open(path, "rb") as fh:
        for begin, end in zip(cuts, cuts[1:], strict=False):
            fh.seek(begin)
            lead = fh.read(64)
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
    shift, keyed, samples = 0, [], []
    for events, keys, counters in parts:  # side rows point at their event's row in the file
        keyed.append(pl.from_arrow(keys).with_columns(pl.col("event") + shift))
        samples.append(pl.from_arrow(counters).with_columns(pl.col("event") + shift))
        shift += events.num_rows
    return Scan([p[0] for p in parts], pl.concat(keyed), pl.concat(samples))


# --------------------------------------------------------------------------- tables


def _int(col: str) -> pl.Expr:
    return pl.col(col).cast(pl.Int64, strict=False)


_INT64_SENTINELS = [v for v in SENTINELS if v < 1 << 63]  # larger ones do not cast to Int64


def _no_sentinel(expr: pl.Expr) -> pl.Expr:
    return pl.when(expr.is_in(_INT64_SENTINELS)).then(None).otherwise(expr)


def _rows(events: list[pa.RecordBatch], rows: pl.Series, columns: list[str] | None = None) -> pl.DataFrame:
    """The events at ``rows`` (in that order), with their row numbers as ``row``."""
    rows = rows.cast(pl.Int64)
    parts, first = [], 0
    batch_of = pl.repeat(0, len(rows), dtype=pl.Int32, eager=True)
    for i, batch in enumerate(events):
        mine = (rows >= first) & (rows < first + batch.num_rows)
        batch_of = batch_of.zip_with(~mine, pl.repeat(i, len(rows), dtype=pl.Int32, eager=True))
        local = (rows.filter(mine) - first).to_arrow()
        parts.append(pl.from_arrow((batch.select(columns) if columns else batch).take(local)))
        first += batch.num_rows
    picked = pl.concat(parts) if len(parts) > 1 else parts[0]
    if len(parts) > 1:  # back from batch order to the order asked for
        taken = pl.DataFrame({"batch": batch_of}).with_row_index("asked").sort("batch", "asked")
        picked = picked[taken["asked"].arg_sort()]
    return picked.with_columns(rows.alias("row"))


class _Names:
    """Process and thread names from the metadata (M) events, as the DuckDB path derives them."""

    def __init__(self, events: pa.Table, index: pl.DataFrame):
        meta = _rows(events, index.filter(pl.col("ph") == "M")["row"], ["pid", "tid", "name", "args"])
        values = []
        for name, args in meta.select("name", "args").iter_rows():
            field = {"process_labels": "labels", "process_sort_index": "sort_index",
                     "thread_sort_index": "sort_index"}.get(name, "name")  # fmt: skip
            try:
                item = json.loads(args).get(field) if args else None
            except (ValueError, AttributeError):
                item = None
            values.append(item if isinstance(item, str) or item is None else json.dumps(item))
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

    def attach(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` (with ``pid`` and ``tid``) plus its ``process`` and ``thread`` names."""
        named = frame.join(
            self.procs.select("pid", "process_name"), on="pid", how="left", maintain_order="left"
        ).join(
            self.thread_meta.select("pid", "tid", "thread_name"),
            on=["pid", "tid"],
            how="left",
            maintain_order="left",
        )
        process = pl.coalesce("process_name", pl.lit("pid ") + pl.col("pid").cast(pl.String))
        return named.with_columns(process.alias("process")).with_columns(
            pl.coalesce("thread_name", _default_thread()).alias("thread")
        ).drop("process_name", "thread_name")


def _default_thread() -> pl.Expr:
    prefix = pl.when(pl.col("process") == "Ascend Hardware").then(pl.lit("Stream "))
    return prefix.otherwise(pl.lit("Thread ")) + pl.col("tid").cast(pl.String)


def _with_args(part: pl.DataFrame, keyed: pl.DataFrame) -> pl.DataFrame:
    """``part`` plus one ``args.<key>`` column per flattened key (null where absent)."""
    mine = keyed.filter(pl.col("event").is_in(part["row"].implode()))
    wide = mine.pivot(on="key", index="event", values="value", aggregate_function="first")
    missing = [f"args.{k}" for k in FLATTENED_KEYS if f"args.{k}" not in wide.columns]
    wide = wide.with_columns(pl.lit(None, dtype=pl.String).alias(name) for name in missing)
    return part.join(wide, left_on="row", right_on="event", how="left", maintain_order="left")


def _slice_columns(part: pl.DataFrame) -> pl.DataFrame:
    """The slices columns of a row group, as the DuckDB path computes them
    (trace_view._slice_columns)."""
    # Framework (Python) events carry none of the flattened keys; lower-case spellings are
    # read only when "Task Type" is absent (the DuckDB path's second struct).
    device = pl.col("process") != "Python"
    secondary = device & pl.col("args.Task Type").is_null()

    def arg(key: str, lower: str | None = None, as_int: bool = False) -> pl.Expr:
        def read(k: str) -> pl.Expr:
            return _int(f"args.{k}") if as_int else pl.col(f"args.{k}")

        value = pl.when(device).then(read(key))
        return value if lower is None else pl.coalesce(value, pl.when(secondary).then(read(lower)))

    dur_ns = pl.col("dur").fill_null(0) * 1000
    is_cann = (pl.col("process") == "CANN") & pl.col("name").str.contains(r"^[A-Za-z]+@")
    stream = pl.coalesce(
        _no_sentinel(
            pl.coalesce(arg("Physic Stream Id", as_int=True), arg("Stream Id", "stream id", True))
        ),
        pl.when(pl.col("process") == "Ascend Hardware").then(pl.col("tid")),
    )
    layer_and_name = pl.col("name").str.splitn("@", 2)
    return part.select(
        "ph", "process", "thread", "pid", "tid", "name", "cat",
        pl.col("ts").alias("start_ns"),
        ((dur_ns.abs() + 0.5).floor() * dur_ns.sign()).cast(pl.Int64).alias("dur_ns"),
        stream.alias("stream_id"),
        arg("Task Type", "task type").alias("task_type"),
        _no_sentinel(arg("Task Id", "task id", True)).alias("task_id"),
        _no_sentinel(arg("Model Id", "model id", True)).alias("model_id"),
        _no_sentinel(arg("connection_id", as_int=True)).alias("connection_id"),
        pl.when(is_cann).then(layer_and_name.struct.field("field_0")).alias("api_layer"),
        pl.when(is_cann).then(layer_and_name.struct.field("field_1")).alias("api_name"),
        arg("level").alias("api_level"),
        arg("Mode").alias("api_mode"),
        arg("id").alias("api_id"),
        pl.coalesce(arg("memcpy direction"), arg("operation")).alias("memcpy_direction"),
        pl.coalesce(arg("data size(Byte)", as_int=True), arg("size(B)", as_int=True)).alias(
            "memcpy_size"
        ),
        pl.when(pl.col("args") != "{}").then(pl.col("args")).alias("args"),
    ).with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))  # fmt: skip


def parse_native(path: Path, sink: TableSink, threads: int) -> TraceResult:
    """Parse one trace_view.json into the slices, counters, flows and threads tables."""
    scan = scan_trace(path, threads)
    events, result = scan.events, TraceResult()
    index = pl.concat([pl.from_arrow(batch.select(["ph"])) for batch in events])
    index = index.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
    names = _Names(events, index)

    # slices: the sort order from the key columns alone, then a row group at a time from it
    keys = _rows(events, index.filter(pl.col("ph").is_in(["X", "i", "I"]))["row"],
                 ["ts", "dur", "pid", "tid", "name"])  # fmt: skip
    dur_ns = pl.col("dur").fill_null(0) * 1000
    order = keys.sort(
        [pl.col("ts"), (dur_ns.abs() + 0.5).floor() * dur_ns.sign(), "pid", "tid", "name"],
        descending=[False, True, False, False, False],
        nulls_last=True,
        maintain_order=True,
    )["row"]
    del keys
    keyed = scan.keyed.with_columns(
        pl.col("key").replace_strict(
            list(range(len(FLATTENED_KEYS))), [f"args.{k}" for k in FLATTENED_KEYS],
            return_dtype=pl.String,
        )
    )
    span = {"start_ns": None, "end_ns": None, "g1": False}

    def slice_groups() -> Iterator[pa.Table]:
        for start in range(0, max(len(order), 1), _ROW_GROUP):
            part = _slice_columns(_with_args(names.attach(_rows(events, order[start : start + _ROW_GROUP])), keyed))
            if part.height:
                low, high = part["start_ns"].min(), part["end_ns"].max()
                span["start_ns"] = low if span["start_ns"] is None else min(span["start_ns"], low)
                span["end_ns"] = high if span["end_ns"] is None else max(span["end_ns"], high)
                span["g1"] = span["g1"] or part.filter(
                    (pl.col("process") == "Ascend Hardware")
                    & pl.col("args").str.contains('"Stream Id"', literal=True)
                ).height > 0
            yield part.to_arrow()

    result.rows["slices"] = sink.batches("slices", slice_groups())
    if result.rows["slices"]:
        result.start_ns, result.end_ns = span["start_ns"], span["end_ns"]
        result.hw_stream_arg = "Stream Id" if span["g1"] else "Physic Stream Id"

    samples = scan.samples
    counters = names.attach(_rows(events, samples["event"], ["pid", "tid", "name", "ts"]))
    counters = counters.with_columns(samples["series"], samples["value"]).select(
        "process", "pid", "tid", "name", "series", pl.col("ts").alias("ts_ns"), "value"
    ).sort(["ts_ns", "name", "series", "pid"], nulls_last=True, maintain_order=True)
    result.rows["counters"] = sink.arrow("counters", counters.to_arrow())
    del counters

    small = names.attach(
        _rows(events, index.filter(pl.col("ph").is_in(["M", "C", "s", "f", "t"]))["row"],
              ["ph", "name", "pid", "tid", "ts", "cat", "id"])
    )  # fmt: skip
    result.rows["flows"] = sink.arrow("flows", _flows(small).to_arrow())
    result.rows["threads"] = sink.arrow("threads", _threads(small, names).to_arrow())
    unnamed = names.procs.filter(pl.col("process_name").is_null()).height
    if unnamed:
        result.warnings.append(f"{unnamed} pids have no process_name metadata; named 'pid <n>'")
    result.processes = sorted(names.procs["process_name"].drop_nulls().unique().to_list())
    return result


def _flows(small: pl.DataFrame) -> pl.DataFrame:
    """One start per (cat, id), the earliest; every finish pairs with it."""
    columns = ["cat", "name", "id", "pid", "tid", "process", "thread", "ts"]
    starts = (
        small.filter(pl.col("ph") == "s")
        .sort("ts", nulls_last=True, maintain_order=True)
        .unique(["cat", "id"], keep="first", maintain_order=True)
        .select(columns)
    )
    finishes = small.filter(pl.col("ph").is_in(["f", "t"])).select(columns)
    joined = starts.join(
        finishes, on=["cat", "id"], how="full", nulls_equal=True, suffix="_f", coalesce=False
    )
    return joined.select(
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
    ).sort(["_order", "end_ns", "cat", "flow_id"], nulls_last=True).drop("_order")


def _threads(small: pl.DataFrame, names: _Names) -> pl.DataFrame:
    """Every (pid, tid) the non-X events or thread metadata name, with its names."""
    used = pl.concat(
        [
            small.filter((pl.col("ph") != "M") | pl.col("name").str.starts_with("thread"))
            .select("pid", "tid"),
            names.thread_meta.select("pid", "tid"),
        ]
    ).unique()
    joined = used.join(names.procs, on="pid", how="left").join(
        names.thread_meta, on=["pid", "tid"], how="left"
    )
    process = pl.coalesce("process_name", pl.lit("pid ") + pl.col("pid").cast(pl.String))
    return (
        joined.with_columns(process.alias("process"))
        .select(
            "process",
            "process_label",
            "process_sort_index",
            pl.coalesce("thread_name", _default_thread()).alias("thread"),
            "thread_sort_index",
            "pid",
            "tid",
        )
        .sort(["process_sort_index", "process", "thread_sort_index", "tid"], nulls_last=True)
    )
