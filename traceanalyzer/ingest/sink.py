"""Where a session's parsers hand their tables: each table conformed to its schema, checked for
times no profile can hold, and written straight into the session's store partition
(:class:`PartitionSink`), or held for its rank group to write together (:class:`BufferedSink`);
within the session's deadline."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from traceanalyzer.ingest.outcome import RankFailed, too_long
from traceanalyzer.parse.sink import body_columns, conform_body, write_options
from traceanalyzer.parse.times import Tally, checked_arrow
from traceanalyzer.schema import TABLES
from traceanalyzer.store import commit_partition

# Side tables whose rows carry times, and the column that holds them.
_TIMED_TABLES = {
    "kernels": "start_ns", "task_times": "start_ns", "memory_records": "ts_ns",
    "op_memory": "alloc_ns", "module_memory": "ts_ns", "comm_ops": "start_ns",
}  # fmt: skip


class PartitionSink:
    """Writes each table of one session straight into its store partition, for ``seconds`` at
    most: a session past them stores nothing more, and fails."""

    def __init__(self, out: Path, rank: int, session: str, seconds: float | None = None):
        self.out, self.rank, self.session = out, rank, session
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds if seconds is not None else None
        self.rows: dict[str, int] = {}
        # what no table stores: impossible times (parse/times.py), said in the rank's warnings
        self.impossible = Tally()
        # the first and last time of each table of _TIMED_TABLES written (its rows' times)
        self.spans: dict[str, tuple[int, int]] = {}

    def _note_span(self, table: str, body: pa.Table) -> None:
        column = _TIMED_TABLES.get(table)
        if column is None or column not in body.column_names or not body.num_rows:
            return
        import polars as pl  # loaded by the parsers already

        # as a table: a column alone goes through pyarrow.compute (50 ms no healthy run needs)
        frame = pl.from_arrow(body.select([column]))
        assert isinstance(frame, pl.DataFrame)
        times = frame.to_series().drop_nulls()
        if times.is_empty():
            return
        lo, hi = int(times.min()), int(times.max())  # type: ignore[arg-type]
        seen = self.spans.get(table)
        self.spans[table] = (min(lo, seen[0]), max(hi, seen[1])) if seen else (lo, hi)

    def _in_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise RankFailed(too_long(self.seconds or 0))

    def _body(self, table: str, data: pa.Table) -> pa.Table:
        """``data`` in the table's columns, without impossible times."""
        return checked_arrow(table, conform_body(table, data), self.impossible)

    def arrow(self, table: str, data: pa.Table) -> int:
        return self.batches(table, [data])

    def batches(self, table: str, tables: Iterable[pa.Table]) -> int:
        self._in_time()
        count = 0

        self.spans.pop(table, None)

        def write(path: Path) -> None:
            nonlocal count
            writer = None
            try:
                for part in tables:
                    body = self._body(table, part)
                    self._note_span(table, body)
                    if writer is None:  # the first part's schema: names may be dictionaries
                        writer = pq.ParquetWriter(
                            path, body.schema, **write_options(table, body.schema)
                        )
                    if body.schema != writer.schema:  # a part typed otherwise than the first
                        body = body.cast(writer.schema)
                    writer.write_table(body)
                    count += body.num_rows
                if writer is None:
                    empty = pa.schema([pa.field(name, typ) for name, typ in body_columns(table)])
                    writer = pq.ParquetWriter(path, empty, **write_options(table, empty))
            finally:
                if writer is not None:
                    writer.close()

        commit_partition(self.out, table, self.rank, self.session, write)
        self.rows[table] = count
        return count

    def empty(self, table: str) -> None:
        self.arrow(table, pa.table({name: pa.nulls(0, typ) for name, typ in body_columns(table)}))


class BufferedSink(PartitionSink):
    """Holds each table of one small session in memory, for its rank group to write with the
    group's other sessions (:func:`ingest_group`): a small session's tables are a few hundred
    KB, and its own files would be mostly Parquet footers."""

    def __init__(self, out: Path, rank: int, session: str, seconds: float | None = None):
        super().__init__(out, rank, session, seconds)
        self.parts: dict[str, list[pa.Table]] = {}

    def batches(self, table: str, tables: Iterable[pa.Table]) -> int:
        self._in_time()
        self.parts[table] = [self._body(table, part) for part in tables]
        self.rows[table] = sum(part.num_rows for part in self.parts[table])
        self.spans.pop(table, None)
        for part in self.parts[table]:
            self._note_span(table, part)
        return self.rows[table]

    def keyed(self, table: str) -> list[pa.Table]:
        """The session's parts of ``table`` with its rank and session as columns, typed as the
        table's canonical columns (every session of a group then has one schema)."""
        schema = TABLES[table].arrow_schema
        keyed = []
        for part in self.parts.get(table, []):
            rows = part.num_rows
            rank = pa.repeat(pa.scalar(self.rank, pa.int32()), rows)
            session = pa.repeat(pa.scalar(self.session, pa.string()), rows)
            part = part.add_column(0, "rank", rank).add_column(1, "session", session)
            keyed.append(part.select(schema.names).cast(schema))
        return keyed
