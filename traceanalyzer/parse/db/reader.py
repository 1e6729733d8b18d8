"""parse_db: a Db export's databases → every canonical table they hold, into a sink."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.db.analysis import ANALYSIS_TABLES, analysis_tables
from traceanalyzer.parse.db.counters import counter_order, counter_table
from traceanalyzer.parse.db.database import STR, Db, DbUnreadable, Repairs, readable_source
from traceanalyzer.parse.db.device import api_stats, kernel_table, op_stats, task_time_table
from traceanalyzer.parse.db.flows import (
    connection_cats_table,
    connection_id_table,
    flow_table,
    link_table,
    python_links,
    thread_table,
)
from traceanalyzer.parse.db.layout import (
    Layout,
    check_schema,
    generation_of,
    layout_of,
    schema_version,
    session_facts,
)
from traceanalyzer.parse.db.memory import memory_records, module_memory, op_memory
from traceanalyzer.parse.db.operators import operator_ops, operator_table, with_operator_stacks
from traceanalyzer.parse.db.result import DbResult
from traceanalyzer.parse.db.slices import (
    all_slices,
    cann_slices,
    comm_op_slices,
    overlap_slices,
    plane_slices,
    python_slices,
    slice_order,
    task_slices,
    with_call_stacks,
)
from traceanalyzer.parse.db.text_only import KERNEL_COLUMNS, text_only
from traceanalyzer.parse.rows import ROW_GROUP_ROWS, made_ahead
from traceanalyzer.parse.sink import TableSink, arrow_table, body_columns
from traceanalyzer.parse.times import Tally, checked
from traceanalyzer.vocabulary import COPY_TASK_NAMES, HARDWARE_PROCESS


def parse_db(
    profiler_db: Path | None,
    analysis_db: Path | None,
    sink: TableSink,
    threads: int = 1,
    scratch: Path | None = None,
) -> DbResult:
    """Fill every canonical table a Db export has data for (except ``sessions``) into ``sink``,
    reading on up to ``threads`` connections at once; ``scratch`` (a private folder, else a
    temporary one) takes a copy of a database that other SQLite clients left a side file beside.

    Raises DbUnreadable when the profiler database cannot be read at all; a damaged
    ``analysis.db`` only leaves its tables empty, with a warning.
    """
    result = DbResult()
    with tempfile.TemporaryDirectory(prefix="traceanalyzer-db.") as temporary:
        private = scratch or Path(temporary)
        if profiler_db is not None:
            source = _source(profiler_db, private, result)
            repairs = Repairs()
            db = Db(profiler_db, source, repairs)
            try:
                result.schema_version = schema_version(db)
                check_schema(db, result.schema_version)
                result.generation = generation_of(db)
                layout = layout_of(db, result.generation)
                result.device_id, result.os_pid = layout.device, layout.os_pid or None
                session_facts(db, result)
            finally:
                db.close()
            _profiler_tables(profiler_db, source, repairs, layout, sink, result, threads)
            result.not_collected.sort()  # the readers ran side by side
            result.warnings += repairs.warnings(profiler_db)
            result.sources |= dict.fromkeys(result.rows, profiler_db.name)
        if analysis_db is not None:
            try:
                adb = Db(analysis_db, _source(analysis_db, private, result))
                try:
                    analysis_tables(adb, sink, result)
                finally:
                    adb.close()
                result.sources |= {table: analysis_db.name for table in ANALYSIS_TABLES}
                result.warnings += adb.repairs.warnings(analysis_db)
            except DbUnreadable as exc:
                result.warnings.append(f"{exc}; its step and communication tables are empty")
                result.incomplete.append(f"{analysis_db.name} (unreadable)")
    return result


def _source(path: Path, scratch: Path, result: DbResult) -> Path:
    """The file to read ``path`` from (:func:`readable_source`), its note kept."""
    source, note = readable_source(path, scratch)
    if note:
        result.notes.append(note)
    return source


def _profiler_tables(
    path: Path,
    source: Path,
    repairs: Repairs,
    layout: Layout,
    sink: TableSink,
    result: DbResult,
    threads: int,
) -> None:
    # Readers side by side, each on its own connection: the driver steps SQLite and polars
    # computes without the GIL. The device reader keeps TASK for all its tables. A table
    # nothing else needs is written where it is made, so that it is not held until the end.
    absent_kernel_columns: list[str] = []

    def device(db: Db) -> list[pl.DataFrame | None]:
        kernels = kernel_table(db, layout, result)
        if kernels is not None:
            if kernels.height:
                absent = [c for c in KERNEL_COLUMNS if not db.has_column("COMPUTE_TASK_INFO", c)]
                absent_kernel_columns.extend(absent)
            made = {"kernels": kernels}
            if kernels["type"].is_not_null().any():  # Level0 records no op types: no statistic
                made["op_stats"] = op_stats(kernels, layout)
            _store(sink, result, made)
        _store(sink, result, {"task_times": task_time_table(db, layout)})
        return [
            cann_slices(db, layout, result),
            task_slices(db, layout, result),
            comm_op_slices(db, layout),
            plane_slices(db, layout),
            overlap_slices(db, layout, result),
        ]

    def rest(db: Db) -> pl.DataFrame:
        counters = counter_table(db, layout, result)
        memory = {
            "memory_records": memory_records(db, result),
            "op_memory": op_memory(db, result),
            "module_memory": module_memory(db, result),
        }
        result.rows["counters"] = _write(sink, "counters", counters, counter_order(counters))
        _store(sink, result, memory)
        counter_threads = counters.select("process", "pid", "tid").unique()
        return counter_threads.with_columns(pl.col("process").cast(STR))

    def python(db: Db) -> tuple[Any, pl.DataFrame | None, pl.DataFrame]:
        return python_slices(db, layout, result), connection_cats_table(db), connection_id_table(db)

    with _Readers(path, source, repairs, threads) as readers:
        slices_read = readers.submit(python), readers.submit(device)
        ((python_part, op_texts), cats, connection_ids), device_parts = (
            done.result() for done in slices_read
        )
        # Without impossible times before anything is derived from them (the links, the API
        # statistics, the session's span)
        impossible = Tally()
        slices = checked("slices", all_slices([python_part, *device_parts]), impossible)
        result.warnings += impossible.notes(path.name)
        del python_part, device_parts  # the parts, now chunks of the slices
        links = link_table(layout, slices, python_links(slices, connection_ids), cats)
        if slices.height:
            result.start_ns = slices["start_ns"].min()
            result.end_ns = slices["end_ns"].max()
        tables: dict[str, pl.DataFrame | None] = {"flows": flow_table(layout, links)}
        if (slices["process"] == "CANN").any():
            tables["api_stats"] = api_stats(slices, layout)
        # What the operators and threads read of the slices and links, taken before the slices
        # are written and let go (the links' ends are slices columns).
        ops = launched = None
        if op_texts is not None:
            ops, launched = operator_ops(slices), links.launched()
        slice_threads = slices.select("process", "pid", "tid", "thread", "cat").unique()
        copy_tasks = (pl.col("process") == HARDWARE_PROCESS) & pl.col("name").is_in(COPY_TASK_NAMES)
        copies = bool(slices.select(copy_tasks.any()).item())
        _store(sink, result, tables)
        del tables, links
        # The slices' row groups are gathered once the joins above are let go (beside them
        # they raise the peak). The counters and memory are read and written beside the
        # slices' writing, which needs nothing of them (beside the joins and the slices' sort
        # they raise the peak; after it they add time). The torch ops' call stacks are added to
        # their args a row group at a time (with_call_stacks), and to the operators after the
        # slices, once those are let go.
        order = slice_order(slices)
        counters_read = readers.submit(rest)
        spliced = (
            partial(with_call_stacks, stacks=op_texts.stacks) if op_texts is not None else None
        )
        result.rows["slices"] = _write(sink, "slices", slices, order, spliced, ("callchain",))
        del slices, order
        if ops is not None and launched is not None and op_texts is not None:
            operators = operator_table(ops, launched, op_texts)
            del ops, launched
            stacks = partial(with_operator_stacks, stacks=op_texts.stacks)
            result.rows["operators"] = _write(
                sink, "operators", operators, None, stacks, ("callchain",)
            )
        counter_threads = counters_read.result()
    threads_table = thread_table(layout, slice_threads, counter_threads)
    _store(sink, result, {"threads": threads_table})
    processes = pl.concat([slice_threads["process"].cast(STR), counter_threads["process"]])
    result.processes = sorted(processes.unique().to_list())
    result.text_only = text_only(result.processes, copies, absent_kernel_columns)


def _store(sink: TableSink, result: DbResult, tables: dict[str, pl.DataFrame | None]) -> None:
    """Write each of ``tables`` (in file order) that was read, and count its rows."""
    for name, frame in tables.items():
        if frame is not None:
            result.rows[name] = _write(sink, name, frame, None)


def _write(
    sink: TableSink,
    table: str,
    frame: pl.DataFrame,
    order: pl.Series | None,
    finish: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    working: tuple[str, ...] = (),
) -> int:
    """Store ``frame`` (in ``order``, a permutation of its rows, when given), gathered and
    converted to Arrow a row group at a time: a sorted copy of a large table, or its Arrow
    copy (text columns are converted), would double its memory. ``finish`` completes each
    row group (the columns made only as they are written, from the ``working`` ones); the
    reader's other working columns (not in the table's schema) are not gathered."""
    canonical = {name for name, _ in body_columns(table)}
    kept = canonical | set(working if finish else ())
    frame = frame.select(c for c in frame.columns if c in kept)

    def done(rows: pl.DataFrame) -> pa.Table:
        if finish is not None:
            rows = finish(rows)
            rows = rows.select(c for c in rows.columns if c in canonical)
        return arrow_table(rows)

    if order is None and frame.height <= ROW_GROUP_ROWS:
        return sink.arrow(table, done(frame))

    def part(start: int) -> pa.Table:
        if order is None:
            return done(frame.slice(start, ROW_GROUP_ROWS))
        return done(frame[order.slice(start, ROW_GROUP_ROWS)])

    makers = (partial(part, start) for start in range(0, frame.height, ROW_GROUP_ROWS))
    return sink.batches(table, made_ahead(makers))


class _Readers:
    """Jobs each run on its own connection to ``path`` (read from ``source``): on up to
    ``threads`` threads side by side, in the order submitted, else each where it is submitted."""

    def __init__(self, path: Path, source: Path, repairs: Repairs, threads: int):
        self._connect = partial(Db, path, source, repairs)
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def _run(self, job: Callable[[Db], Any]) -> Any:
        db = self._connect()
        try:
            return job(db)
        finally:
            db.close()

    def submit(self, job: Callable[[Db], Any]) -> Future[Any]:
        if self._pool is not None:
            return self._pool.submit(self._run, job)
        done: Future[Any] = Future()
        try:
            done.set_result(self._run(job))
        except BaseException as exc:  # noqa: BLE001 - raised where its result is asked for
            done.set_exception(exc)
        return done

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
