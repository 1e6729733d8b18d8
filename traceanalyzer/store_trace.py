"""One rank session of the store as a Chrome JSON trace: what Perfetto and MindStudio Insight
open, whichever export (Text or Db) the session was read from.

The trace is rebuilt from the tables every export fills: ``threads`` give the processes'
and threads' metadata (``M``) events, ``slices`` the ``X`` and instant events with their args,
``counters`` the ``C`` samples and ``flows`` their ``s``/``f`` pairs (``bp: "e"``), each on the
trace's own clock and pids. Times are written as torch_npu writes them (µs strings with 3
decimals from int64 ns, integer arithmetic), durations as exact decimal numbers. Events are
made a row group at a time by polars expressions and written as they are made: the trace is
never held whole. The annotated timelines (:mod:`traceanalyzer.report.annotated`) are handed
each session's events as a :class:`SessionTimeline`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import polars as pl

from traceanalyzer.store import Store

BATCH_ROWS = 1 << 16


def _json(value: pl.Expr) -> pl.Expr:
    """A text column as JSON string literals (null: JSON null)."""
    return pl.struct(value.alias("v")).struct.json_encode().str.slice(5).str.head(-1)


def _us(ns: pl.Expr) -> pl.Expr:
    """int64 ns as torch_npu's µs with 3 decimals (exact; ``quoted`` as a string)."""
    return pl.format("{}.{}", ns // 1000, (ns % 1000).cast(pl.String).str.zfill(3))


def _event(*fields: tuple[str, pl.Expr]) -> pl.Expr:
    """One event's JSON object from (key, JSON value) pairs; a null value drops its pair."""
    pairs = [pl.lit(f'"{key}":') + value for key, value in fields]
    return pl.lit("{") + pl.concat_str(pairs, separator=",", ignore_nulls=True) + pl.lit("}")


# the metadata events of a process and of a thread: (event, its arg, the column it is read from);
# the name is written always, the others only when the column is set
PROCESS_METADATA = (
    ("process_name", "name", "process"),
    ("process_labels", "labels", "process_label"),
    ("process_sort_index", "sort_index", "process_sort_index"),
)
THREAD_METADATA = (
    ("thread_name", "name", "thread"),
    ("thread_sort_index", "sort_index", "thread_sort_index"),
)


def _metadata(threads: pl.DataFrame) -> list[dict[str, Any]]:
    processes = threads.unique("pid", keep="first", maintain_order=True)
    owners = [(p, 0, PROCESS_METADATA) for p in processes.iter_rows(named=True)]
    owners += [(t, t["tid"], THREAD_METADATA) for t in threads.iter_rows(named=True)]
    return [
        {"ph": "M", "pid": row["pid"], "tid": tid, "name": name, "args": {arg: row[column]}}
        for row, tid, fields in owners
        for i, (name, arg, column) in enumerate(fields)
        if i == 0 or row[column] is not None
    ]


def _slice_events(frame: pl.DataFrame) -> pl.Series:
    instant = pl.col("ph").is_in(["i", "I"])
    return frame.select(
        _event(
            ("ph", _json(pl.col("ph").cast(pl.String))),
            ("name", _json(pl.col("name").cast(pl.String))),
            ("pid", pl.col("pid").cast(pl.String)),
            ("tid", pl.col("tid").cast(pl.String)),
            ("ts", pl.lit('"') + _us(pl.col("start_ns")) + pl.lit('"')),
            ("dur", pl.when(~instant).then(_us(pl.col("dur_ns").fill_null(0).clip(0)))),
            ("s", pl.when(instant).then(pl.lit('"t"'))),
            ("cat", _json(pl.col("cat").cast(pl.String))),
            ("args", _args(pl.col("args"))),
        ).alias("e")
    )["e"]


def _args(args: pl.Expr) -> pl.Expr:
    """The slice's args object (a source that held another JSON value keeps it as ``value``)."""
    return (
        pl.when(args.str.starts_with("{"))
        .then(args)
        .otherwise(pl.lit('{"value":') + args + pl.lit("}"))
    )


def _counter_events(frame: pl.DataFrame) -> pl.Series:
    value = pl.col("value").cast(pl.String)
    return frame.select(
        _event(
            ("ph", pl.lit('"C"')),
            ("name", _json(pl.col("name").cast(pl.String))),
            ("pid", pl.col("pid").cast(pl.String)),
            ("tid", pl.col("tid").cast(pl.String)),
            ("ts", pl.lit('"') + _us(pl.col("ts_ns")) + pl.lit('"')),
            (
                "args",
                pl.lit("{")
                + _json(pl.col("series").cast(pl.String))
                + pl.lit(":")
                + value
                + pl.lit("}"),
            ),
        ).alias("e")
    )["e"].filter(frame["value"].is_not_null() & frame["value"].is_finite())


def _flow_events(frame: pl.DataFrame) -> pl.Series:
    def end(ph: str, side: str, ts: str) -> pl.Expr:
        return _event(
            ("ph", pl.lit(f'"{ph}"')),
            ("id", _json(pl.col("flow_id"))),
            ("pid", pl.col(f"{side}_pid").cast(pl.String)),
            ("tid", pl.col(f"{side}_tid").cast(pl.String)),
            ("ts", pl.lit('"') + _us(pl.col(ts)) + pl.lit('"')),
            ("cat", _json(pl.col("cat").cast(pl.String))),
            ("name", _json(pl.col("name").cast(pl.String))),
            ("bp", pl.lit('"e"')),
        )

    starts = frame.filter(pl.col("start_ns").is_not_null() & pl.col("src_pid").is_not_null())
    ends = frame.filter(pl.col("end_ns").is_not_null() & pl.col("dst_pid").is_not_null())
    return pl.concat(
        [
            starts.select(end("s", "src", "start_ns").alias("e"))["e"],
            ends.select(end("f", "dst", "end_ns").alias("e"))["e"],
        ]
    )


_TABLES = (("slices", _slice_events), ("counters", _counter_events), ("flows", _flow_events))


def session_events(store: Store, rank: int, session: str) -> Iterator[bytes]:
    """The session's trace events as JSON objects, metadata first, a row group at a time."""
    where = (pl.col("rank") == rank) & (pl.col("session") == session)
    threads = store.table("threads").filter(where).collect()
    for event in _metadata(threads):
        yield json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    for table, events in _TABLES:
        for batch in store.table(table).filter(where).collect_batches(chunk_size=BATCH_ROWS):
            if batch.height:
                yield ",".join(events(batch).to_list()).encode("utf-8")


@dataclass(frozen=True)
class SessionTimeline:
    """A rank session's trace events (:func:`session_events`), read from the store a row group
    at a time each time they are iterated: what an annotated timeline is handed."""

    store: Store
    rank: int
    session: str

    def __iter__(self) -> Iterator[bytes]:
        return session_events(self.store, self.rank, self.session)


def write_trace(fh: BinaryIO, extra: Iterable[dict[str, Any]], events: Iterable[bytes]) -> None:
    """A Chrome JSON trace: ``extra`` (our overlay) first, then the session's ``events``."""
    fh.write(b'{"traceEvents":[')
    first = True
    for event in extra:
        fh.write(b"" if first else b",")
        fh.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        first = False
    for chunk in events:
        fh.write(b"" if first else b",")
        fh.write(chunk)
        first = False
    fh.write(b'],"displayTimeUnit":"ms"}')
