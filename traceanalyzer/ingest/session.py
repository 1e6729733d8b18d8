"""One rank session into the store, the worker's task: every file of it parsed (the trace, or
the Db, and the side files), its generation named, its ``sessions`` row written, into its own
partitions, or with the other small sessions of its rank group into the group's files.

What "corrupt" means: a ``trace_view.json`` that is not a JSON array at all (binary garbage, an
HTML error page) or that the parser cannot read for any other reason (including running out of
memory) fails the rank: it is reported with its error and left out of the analysis. A damaged
array (truncated, empty, a malformed event, invalid UTF-8) keeps every well-formed event, and an
unreadable secondary file (a CSV, ``communication.json``) only empties its table; both come with
a warning, and a file that lost data is listed in ``incomplete_files`` (the run is partial).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from traceanalyzer import outdir
from traceanalyzer.discover import TRACE_FILE, RankSession
from traceanalyzer.ingest.budget import (
    RELEASE_AFTER_BYTES,
    input_bytes,
    peak_rss_mb,
    release_memory,
)
from traceanalyzer.ingest.outcome import RankFailed, SessionOutcome, failed
from traceanalyzer.ingest.side_files import (
    COMM_FILES,
    SIDE_FILES_ALONGSIDE_BYTES,
    SideFiles,
    leave_out_foreign_files,
)
from traceanalyzer.ingest.sink import BufferedSink, PartitionSink
from traceanalyzer.ingest.source import TEXT_ONLY_TABLES, read_db, source_of
from traceanalyzer.parse.csv_tables import SPECS
from traceanalyzer.parse.sink import table_from_rows, write_options
from traceanalyzer.parse.trace_view import DEFAULT_PARSE_MEMORY, ParseMemory, parse_trace_view
from traceanalyzer.printable import path_text
from traceanalyzer.schema import TABLES
from traceanalyzer.store import commit_group

if TYPE_CHECKING:
    from traceanalyzer.parse.db import DbResult


SCRATCH = ".scratch."  # a session's private folder in OUT while it is ingested


def ingest_session(
    session: RankSession,
    out: Path,
    threads: int = 1,
    memory: ParseMemory = DEFAULT_PARSE_MEMORY,
    seconds: float | None = None,
    sink: PartitionSink | None = None,
) -> SessionOutcome:
    """Parse every file of one rank session into its store partitions (or into ``sink``),
    within ``seconds`` (the session fails past them, however far it got). Never raises."""
    started = time.perf_counter()
    outcome = SessionOutcome(
        session.rank,
        session.session,
        path_text(session.path),
        "ingested",
        profiler_level=session.profiler_level,
        formats_present=list(session.formats),
    )
    if sink is None:
        sink = PartitionSink(out, session.rank, session.session, seconds)
    trace = pool = scratch = None
    try:
        scratch = Path(tempfile.mkdtemp(dir=out, prefix=SCRATCH))
        db = None
        if source_of(session) == "db":
            db = read_db(session, sink, outcome, threads, scratch)
        outcome.source_format = "db" if db else "text"
        # Small side files parse on a thread once the trace parse's memory peak is behind it,
        # while its last tables are written (parse_trace_view's on_read); large ones (a real
        # rank's are a third of its trace) after the trace, once the trace parse's freed memory
        # is handed back: the parses' memory never adds up. Two large files at a time stay
        # below the trace parse's peak since each large buffer is mapped on its own (process_env).
        side_files = SideFiles(session, sink, scratch, frozenset(sink.rows) if db else frozenset())
        side: list[Future[dict[str, list[str]]]] = []
        large = side_files.size > SIDE_FILES_ALONGSIDE_BYTES
        if not large and not db:
            pool = ThreadPoolExecutor(1)

        def trace_read() -> None:
            if pool and not side:
                side.append(pool.submit(side_files.parse, threads))

        trace_path = session.output_dir / TRACE_FILE
        if db:
            pass  # the Db holds the trace's events
        elif session.readable(trace_path):
            try:
                trace = parse_trace_view(trace_path, sink, scratch, threads, memory, trace_read)
                outcome.warnings += trace.warnings
                outcome.trace_reader = trace.reader
                if trace.incomplete:
                    outcome.incomplete_files.append(f"{TRACE_FILE} ({trace.incomplete})")
            except Exception as exc:
                if outdir.is_output_failure(exc, out):
                    raise  # the output's fault (disk full...), not the trace's
                # The rank's main input is unreadable (garbage bytes, out of memory...): fail the
                # rank rather than analyse it blind. (The parser salvages damage inside the array.)
                raise RankFailed(f"{trace_path}: unreadable ({type(exc).__name__}: {exc})") from exc
        else:
            outcome.missing_files.append(TRACE_FILE)
        if large and trace is not None:
            release_memory()
        headers = side[0].result() if side else side_files.parse(threads)
        if not db:  # a Db's tables are one file's
            span = (trace.start_ns, trace.end_ns) if trace else (session.order_ns, session.end_ns)
            leave_out_foreign_files(sink, span, outcome)
        for table in TABLES:
            if table not in sink.rows and table != "sessions":
                sink.empty(table)
        if db:
            outcome.generation = db.generation
        else:
            outcome.generation = _generation(
                session,
                headers,
                trace.processes if trace else [],
                trace.hw_stream_arg if trace else None,
            )
        # after the generation is known: files this generation never writes are said apart
        side_files.report(outcome)
        if db:
            settings = session.config.get("experimental_config") or {}
            outcome.not_collected += [
                f"{table}: collected ({setting[1:]}=True) but a Db export has no table for it; "
                f"a Text export writes {source} (export_type=[Text, Db] keeps both)"
                for table, setting, source in TEXT_ONLY_TABLES
                if settings.get(setting) is True and not sink.rows.get(table)
            ]
        sink.arrow("sessions", _session_row(session, trace, outcome, db))
        outcome.warnings += sink.impossible.notes(_table_sources(session, db))
        outcome.rows = dict(sink.rows)
    except Exception as exc:
        failed(outcome, exc, out)
    finally:
        if pool:
            pool.shutdown(wait=True)  # a failed trace still waits for the side files' writes
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    outcome.seconds = round(time.perf_counter() - started, 3)
    outcome.peak_rss_mb = peak_rss_mb()
    if input_bytes(session) >= RELEASE_AFTER_BYTES:
        release_memory()
    return outcome


def _generation(
    session: RankSession,
    headers: dict[str, list[str]],
    trace_processes: list[str],
    hw_stream_arg: str | None,
) -> str:
    """Name the export generation from the evidence the format doc lists for each."""
    kernel = headers.get("kernel_details.csv", [])
    if "Block Num" in kernel:  # renamed from Block Dim after G3
        return "current"
    if (
        any("Device_id" in h for h in headers.values())
        or session.cann_version
        or session.torch_npu_version
    ):
        return "g3"
    if "Communication" in trace_processes:  # a trace without CSV evidence, from current msprof
        return "current"
    if hw_stream_arg == "Stream Id":
        return "g1"
    return "g2"


def _table_sources(session: RankSession, db: DbResult | None) -> dict[str, str]:
    """The file each table of ``session`` was read from (the Db's tables from the Db), for the
    notes that name it."""
    info = session.info_file.name if session.info_file else session.path.name
    sources = {"sessions": info} | dict.fromkeys(("slices", "counters", "flows"), TRACE_FILE)
    sources |= {spec.table: spec.file for spec in SPECS}
    sources |= {table: name for name, table, _ in COMM_FILES}
    return sources | (db.sources if db else {})


def _session_row(
    session: RankSession, trace: Any, outcome: SessionOutcome, db: DbResult | None = None
) -> pa.Table:
    """The session's row, from ``db`` when the Db export was read, else from ``trace`` (the
    trace's result, None without one)."""
    files = (
        sorted(path_text(p.name) for p in session.output_dir.iterdir())
        if session.output_dir.is_dir()
        else []
    )
    metadata = dict(session.metadata)
    if db is not None:
        trace = db  # the Db holds the trace's events: its span, host and pid
        device_id = session.device_id if session.device_id is not None else db.device_id
        metadata.update({f"db.{k}": v for k, v in db.metadata.items()})
        # A Db export writes no profiler_metadata.json: its META_DATA records the same keys
        # (ENV_VARIABLES, parallel_group_info, add_metadata's), under the key the Text export
        # uses, so rules cannot tell the formats apart.
        for key, value in db.profiler_metadata.items():
            metadata.setdefault(key, value)
        if db.schema_version:
            metadata["db.SCHEMA_VERSION"] = db.schema_version
    else:
        device_id = session.device_id
    row = {
        "path": path_text(session.path),
        "start_ns": trace.start_ns if trace and trace.start_ns is not None else session.order_ns,
        "end_ns": trace.end_ns if trace and trace.end_ns is not None else session.end_ns,
        "profiler_level": session.profiler_level,
        "export_type": ",".join(session.export_type or session.formats) or None,
        "torch_npu_version": session.torch_npu_version,
        "cann_version": session.cann_version,
        "generation": outcome.generation,
        "device_id": device_id,
        "hostname": session.hostname or getattr(trace, "hostname", None),
        "os_pid": session.os_pid or getattr(trace, "os_pid", None),
        "metadata": json.dumps(metadata, ensure_ascii=False, sort_keys=True),
        "config": json.dumps(session.config, ensure_ascii=False, sort_keys=True),
        "files": json.dumps(files),
        "source_format": "db" if db is not None else "text",
    }
    return table_from_rows("sessions", [row])


def ingest_group(
    sessions: list[RankSession],
    out: Path,
    group: str,
    threads: int = 1,
    memory: ParseMemory = DEFAULT_PARSE_MEMORY,
    seconds: list[float | None] | None = None,
) -> list[SessionOutcome]:
    """Ingest a rank group's small sessions, one after the other, and store them together: one
    file per table (``store.commit_group``). A session that fails is left out of the files,
    the others are stored. Never raises."""
    limits = seconds or [None] * len(sessions)
    outcomes, sinks = [], []
    for session, limit in zip(sessions, limits, strict=True):
        sink = BufferedSink(out, session.rank, session.session, limit)
        outcomes.append(ingest_session(session, out, threads, memory, limit, sink=sink))
        if outcomes[-1].status != "failed":
            sinks.append(sink)
    try:
        for table in TABLES:
            parts = [part for sink in sinks for part in sink.keyed(table)]
            schema = TABLES[table].arrow_schema
            body = pa.concat_tables(parts) if parts else schema.empty_table()
            commit_group(
                out,
                table,
                group,
                lambda p, b=body, t=table: pq.write_table(b, p, **write_options(t, b.schema)),
            )
    except Exception as exc:  # nothing of the group is stored: every session fails
        for outcome in outcomes:
            if outcome.status != "failed":
                failed(outcome, exc, out)
    return outcomes


def ingest_unit(
    sessions: list[RankSession],
    out: Path,
    group: str | None,
    threads: int,
    memory: ParseMemory,
    seconds: list[float | None],
) -> list[SessionOutcome]:
    """The worker task: a session stored on its own (``group`` None), or a rank group's."""
    if group is None:
        return [ingest_session(sessions[0], out, threads, memory, seconds[0])]
    return ingest_group(sessions, out, group, threads, memory, seconds)
