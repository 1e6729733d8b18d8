"""The one raw-events shape of a trace_view.json, and the one derivation of the trace tables.

Every trace reader decodes the file into :class:`TraceEvents` and stops there: the native
scanner (``trace_native.py``) and DuckDB (``trace_duckdb.py``, which also salvages damaged
files). :func:`derive_tables` makes the slices, counters, flows and threads tables, and the
session's span, from it. So a table is derived once, and the two readers can differ only in how
they decode JSON, which tests/test_ingest_native.py holds equal.

Each table is written a row group at a time from its sorted order, so only the decoded columns
and one row group are ever held.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from traceanalyzer.discover import TRACE_FILE
from traceanalyzer.parse.rows import ROW_GROUP_ROWS, made_ahead, stable_order
from traceanalyzer.parse.sink import TableSink, arrow_table
from traceanalyzer.parse.times import Tally, TimeColumns, checked
from traceanalyzer.parse.trace_shared import (
    MAX_NAME,
    TraceResult,
    cut_name,
    cut_names_note,
)
from traceanalyzer.vocabulary import CANN_PROCESS, HARDWARE_PROCESS, PYTHON_PROCESS

# Counter rows are narrow: fewer, larger groups cost less per-call overhead.
_COUNTER_GROUP = 64 << 10


class LocatedArgs(Protocol):
    def text(self, at: pl.Series, length: pl.Series) -> pl.Series:
        """The args text of the slices whose args are at ``at`` (-1: none), ``length`` bytes
        each."""

    def close(self) -> None: ...


@dataclass
class TraceEvents:
    """A trace's events as decoded, in file order: what every reader hands to the derivation.

    - ``slices``: the X/i/I events: ph, name, pid, tid, cat, ts (exact ns), dur_ns (0 when
      absent), args (the object's minified JSON text), or args_at and args_len instead, to be
      read through ``located_args``;
    - ``flat``: row (in ``slices``), then one column per :data:`ARG_COLUMNS` entry, for the
      slices that have any of those keys (a reader may list every slice, or skip Python ones);
    - ``counters``: the C events: pid, tid, name, ts;
    - ``samples``: one row per member of a counter's args: event (row in ``counters``), series
      (the member's key), value (a double, null when not a number);
    - ``others``: every other event: ph, name, pid, tid, cat, id, ts, and args for metadata
      (M) events.

    pid and tid are integers (null when not one). A reader may intern a text column: it then
    holds int32 codes into ``words[(table, column)]``; an uninterned column holds its text.
    """

    slices: pl.DataFrame
    flat: pl.DataFrame
    counters: pl.DataFrame
    samples: pl.DataFrame
    others: pl.DataFrame
    words: dict[tuple[str, str], pl.Series] = field(default_factory=dict)
    # Where the slices' args are read from, when a reader located them (``args_at`` and
    # ``args_len`` in ``slices``, read a row group at a time) instead of decoding them.
    located_args: LocatedArgs | None = None

    def decode(self, table: str, column: str, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` (rows of ``table``) with ``column`` as text, if it is interned."""
        if (table, column) not in self.words:
            return frame
        return frame.with_columns(self.words[table, column].gather(frame[column]).alias(column))

    def to_arrow(self, frame: pl.DataFrame, *tables: str) -> pa.Table:
        """``frame`` (rows of ``tables``) as Arrow, its interned columns dictionary-encoded by
        their codes: no text is copied per row, and the Parquet writer takes the dictionary as
        it is instead of hashing every row's text into one of its own."""
        data = arrow_table(frame)
        for (table, column), words in self.words.items():
            present = table in tables and column in data.column_names
            # (a column decoded to text already is left as it is)
            if present and pa.types.is_integer(data.schema.field(column).type):
                index = data.column_names.index(column)
                dictionary = words.to_arrow()
                codes = data.column(index)
                if codes.type != pa.int32():  # (the scanner's codes are int32 already)
                    codes = codes.cast(pa.int32())
                texts = pa.chunked_array(
                    [pa.DictionaryArray.from_arrays(chunk, dictionary) for chunk in codes.chunks],
                    pa.dictionary(pa.int32(), dictionary.type),
                )
                data = data.set_column(index, column, texts)
        return data

    def by_text(self, table: str, column: str) -> pl.Expr:
        """``column`` as a sort key that sorts as its text does: an interned column's codes are
        mapped to their text's rank among the column's strings (integers sort faster)."""
        if (table, column) not in self.words:
            return pl.col(column)
        ranks = self.words[table, column].rank("dense")
        return pl.col(column).map_batches(lambda codes: ranks.gather(codes), ranks.dtype)


def derive_tables(
    events: TraceEvents,
    sink: TableSink,
    result: TraceResult,
    on_read: Callable[[], None] | None = None,
) -> TraceResult:
    """Write the slices, counters, flows and threads tables of ``events`` to ``sink``, and fill
    ``result`` with the rows, span, processes and notes; ``on_read`` is called once the slices
    and the counters, the bulk of the memory, are written and freed.

    The slices take both cores (row groups made by three threads while the one before is
    encoded), then the counters; the flows and threads are derived alongside what ``on_read``
    starts. The counters derived alongside the slices or the side files (what ``on_read``
    starts) are no faster, at a higher peak (docs/benchmarks/ingest.md).
    """
    names = _Names(events.others)
    # the pids with slices or counters, before those are freed: a pid with neither (a Level0
    # export's CANN layer, which only starts its HostToDevice flows) names nothing rules read
    with_events = pl.concat([events.slices.select("pid"), events.counters.select("pid")]).unique()
    impossible = Tally()  # events whose time is none a profile can hold (parse/times.py)
    _write_slices(events, names, sink, result, impossible)
    used_by_counters = _write_counters(events, names, sink, result, impossible)
    if on_read:
        on_read()
    _write_others(events, names, sink, result, used_by_counters, impossible)
    result.warnings += impossible.notes(TRACE_FILE)
    if names.cut:
        result.warnings.append(cut_names_note(names.cut))
    named = names.procs.filter(pl.col("process_name").is_not_null()).select("pid")
    unnamed = with_events.join(named, on="pid", how="anti").height
    if unnamed:
        result.warnings.append(
            f"{unnamed} pids with events have no process_name metadata; named 'pid <n>'"
        )
    result.processes = sorted(names.procs["process_name"].drop_nulls().unique().to_list())
    return result


def _write_slices(
    events: TraceEvents, names: _Names, sink: TableSink, result: TraceResult, impossible: Tally
) -> None:
    """The slices table, and the session's span (of the slices whose times are possible);
    the decoded slices are freed after."""
    span = _Span()
    groups = made_ahead(_slice_groups(events, names, span, impossible))
    try:
        result.rows["slices"] = sink.batches("slices", groups)
    finally:
        groups.close()  # its makers stop before the file they read from is closed
        if events.located_args is not None:
            events.located_args.close()
    if result.rows["slices"]:
        result.start_ns, result.end_ns = span.start_ns, span.end_ns
        result.hw_stream_arg = "Stream Id" if span.g1 else "Physic Stream Id"
    events.slices = events.flat = pl.DataFrame()  # the largest part: gone first


def _write_others(
    events: TraceEvents,
    names: _Names,
    sink: TableSink,
    result: TraceResult,
    used_by_counters: pl.DataFrame,
    impossible: Tally,
) -> None:
    """The flows and threads tables (``used_by_counters``: the threads with counters). A flow
    event without a possible time is dropped before the ends are paired."""
    others = names.attach(events.others)
    ends = checked("flows", others.filter(_FLOW_END), impossible, _FLOW_TIME)
    result.rows["flows"] = sink.arrow("flows", arrow_table(_flows(ends)))
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
    result.rows["threads"] = sink.arrow("threads", arrow_table(_threads(used, names)))


_FLOW_END = pl.col("ph").is_in(["s", "f", "t"])
_FLOW_TIME = TimeColumns(("ts",), required=("ts",))  # of a flow's start or finish event


def _write_counters(
    events: TraceEvents, names: _Names, sink: TableSink, result: TraceResult, impossible: Tally
) -> pl.DataFrame:
    """The counters table; returns the (pid, tid) that have counters (threads to list). The
    decoded counters are freed after."""
    groups = made_ahead(_counter_groups(events, names, impossible))
    result.rows["counters"] = sink.batches("counters", groups)
    used = events.counters.select("pid", "tid").unique()
    events.counters = events.samples = pl.DataFrame()
    return used


class _Names:
    """Process and thread names from the metadata (M) events."""

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

    def keyed(
        self, frame: pl.DataFrame, thread_names: bool = True
    ) -> tuple[pl.Series, pl.DataFrame]:
        """The names of ``frame``'s rows (with ``pid`` and ``tid``) as a table with one row per
        distinct (pid, tid), holding ``process`` (and ``thread``), and each row's key into it: a
        row group then gets its names by a gather, not a join of its own."""
        ids = frame.select("pid", "tid").unique(maintain_order=True)
        named = ids.join(self._processes, on="pid", how="left", maintain_order="left").with_columns(
            _process()
        )
        columns = ["process"]
        if thread_names:
            named = named.join(
                self._threads, on=["pid", "tid"], how="left", maintain_order="left"
            ).with_columns(pl.coalesce("thread_name", _default_thread()).alias("thread"))
            columns.append("thread")
        key = frame.select("pid", "tid").join(
            ids.with_row_index("key"),
            on=["pid", "tid"],
            how="left",
            maintain_order="left",
            nulls_equal=True,
        )["key"]
        # Dictionary-encoded (Categorical): each name is held once, not once per row, in the
        # Arrow tables handed to the sink and in the Parquet files.
        return key, named.select(pl.col(c).cast(pl.Categorical) for c in columns)

    def attach(self, frame: pl.DataFrame, thread_names: bool = True) -> pl.DataFrame:
        """``frame`` (with ``pid`` and ``tid``) plus its ``process`` (and ``thread``) names."""
        key, named = self.keyed(frame, thread_names)
        return frame.with_columns(named[key].get_columns())


def _process() -> pl.Expr:
    """``process``: the pid's process_name, else "pid <pid>"."""
    named = pl.coalesce("process_name", pl.lit("pid ") + pl.col("pid").cast(pl.String))
    return named.alias("process")


def _default_thread() -> pl.Expr:
    prefix = pl.when(pl.col("process") == HARDWARE_PROCESS).then(pl.lit("Stream "))
    return prefix.otherwise(pl.lit("Thread ")) + pl.col("tid").cast(pl.String)


def _finish_slices(part: pl.DataFrame) -> pl.DataFrame:
    """The slices columns that need the names: the hardware stream, the CANN layer and API
    name, the time span."""
    hardware_stream = pl.when(pl.col("process") == HARDWARE_PROCESS).then(pl.col("tid"))
    is_cann = (pl.col("process") == CANN_PROCESS) & pl.col("name").str.contains(r"^[A-Za-z]+@")
    layer_and_name = pl.col("name").str.splitn("@", 2)
    return part.with_columns(
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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, part: pl.DataFrame) -> None:
        """Count in a row group (the groups' makers call this side by side)."""
        low, high = part["start_ns"].min(), part["end_ns"].max()
        hardware = part.filter(pl.col("process") == HARDWARE_PROCESS)["args"]
        g1 = bool(hardware.str.contains('"Stream Id"', literal=True).any())
        with self._lock:
            if low is not None:
                self.start_ns = low if self.start_ns is None else min(self.start_ns, low)
            if high is not None:
                self.end_ns = high if self.end_ns is None else max(self.end_ns, high)
            self.g1 = self.g1 or g1


def _sorted_groups(
    frame: pl.DataFrame, by: list[pl.Expr], descending: list[bool], group: int
) -> Iterator[pl.Series]:
    """The row numbers of ``frame`` in the order of ``by``, ``group`` rows at a time: only the
    order is held besides ``frame``."""
    order = stable_order(frame, by, descending)
    for start in range(0, max(len(order), 1), group):
        yield order.slice(start, group)


def _flat_rows(flat: pl.DataFrame, rows: int, python: np.ndarray) -> np.ndarray:
    """For each of ``rows`` slices, its row in ``flat``, or ``flat.height`` (a row of nulls
    there) when it has none or is a framework (Python) event, which carries none of the
    flattened keys (a reader may skip them): a row group gets its flattened args by a gather."""
    at = np.full(rows, flat.height, dtype=np.uint32)
    at[flat["row"].to_numpy()] = np.arange(flat.height, dtype=np.uint32)
    at[python] = flat.height
    return at


def _by_process(key: pl.Series, named: pl.DataFrame) -> pl.Series:
    """Each row's process as a sort key that sorts as its name does (as the Db reader sorts):
    ``key`` and ``named`` from :meth:`_Names.keyed`, the names ranked once, not once a row."""
    return named["process"].cast(pl.String).rank("dense").gather(key)


def _slice_groups(
    events: TraceEvents, names: _Names, span: _Span, impossible: Tally
) -> Iterator[Callable[[], pa.Table]]:
    """The slices table a row group at a time, grouped by process (a scan of one process
    skips the others' row groups), in time order within it (parents before children): a
    maker per group, which gathers its rows, then its text, names and flattened args."""
    slices = events.slices
    key, named = names.keyed(slices)
    process = _by_process(key, named)
    by = [
        pl.lit(process),
        pl.col("ts"),
        pl.col("dur_ns"),
        pl.col("pid"),
        pl.col("tid"),
        events.by_text("slices", "name"),
    ]
    descending = [False, False, True, False, False, False]  # parents before their children
    python = (named["process"] == PYTHON_PROCESS).to_numpy()[key.to_numpy()]
    flat_at = pl.Series(_flat_rows(events.flat, slices.height, python))
    flat = pl.concat([events.flat.drop("row"), events.flat.drop("row").clear(1)])
    located = events.located_args

    def make(rows: pl.Series) -> pa.Table:
        part = slices[rows]
        if located is not None:  # read from the file now: only this group's args are held
            args = located.text(part["args_at"], part["args_len"])
            part = part.drop("args_at", "args_len").with_columns(args)
        part = events.decode("slices", "name", part).with_columns(
            *named[key.gather(rows)], *flat[flat_at.gather(rows)]
        )
        part = checked("slices", _finish_slices(part), impossible)
        if part.height:
            span.add(part)
        return events.to_arrow(part, "slices")

    for rows in _sorted_groups(slices, by, descending, ROW_GROUP_ROWS):
        yield functools.partial(make, rows)


def _counter_groups(
    events: TraceEvents, names: _Names, impossible: Tally
) -> Iterator[Callable[[], pa.Table]]:
    """The counters table a row group at a time: one row per sample, by process and counter,
    each in time order (a maker per group), so that a read of one counter decodes only its
    row groups (:data:`~traceanalyzer.parse.sink.GROUPED_TEXT`).

    A sample's counter columns are gathered per row group (and per sort key), never for every
    sample at once: that copy would be most of the counters' memory.
    """
    counters = events.counters.select("pid", "tid", "name", pl.col("ts").alias("ts_ns"))

    def of_counter(key: pl.Series) -> pl.Expr:
        """``key`` (a value per counter) for each sample."""
        return pl.col("event").map_batches(lambda rows: key.gather(rows), key.dtype)

    key, named = names.keyed(counters, thread_names=False)
    name_key = counters.select(events.by_text("counters", "name")).to_series()
    by = [of_counter(_by_process(key, named)), of_counter(name_key), of_counter(counters["ts_ns"]),
          events.by_text("samples", "series"), of_counter(counters["pid"])]  # fmt: skip

    def make(rows: pl.Series) -> pa.Table:
        part = events.samples[rows]
        counter = part["event"]
        part = part.with_columns(*counters[counter], *named[key.gather(counter)])
        return events.to_arrow(checked("counters", part, impossible), "counters", "samples")

    for rows in _sorted_groups(events.samples, by, [False] * len(by), _COUNTER_GROUP):
        yield functools.partial(make, rows)


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
            *(
                pl.col(f"{column}{suffix}").alias(f"{end}_{column}")
                for end, suffix in (("src", ""), ("dst", "_f"))
                for column in ("process", "thread", "pid", "tid")
            ),
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
        .sort(["process_sort_index", "process", "thread_sort_index", "tid"], nulls_last=True)
    )
