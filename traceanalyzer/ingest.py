"""Ingest: discover → parse → store, one rank session per task, cached and resumable.

The driver never holds table data: each worker parses one session and writes its partitions
itself (atomically); the driver only records outcomes, appending one line per finished session
to ``OUT/manifest.journal`` (folded into ``manifest.json`` at the end of the run), so an
interrupted run -- Ctrl-C, a killed driver or worker, a lost Ray node -- resumes with the sessions
that are missing or stale. Where the sessions run is the executor's business
(:mod:`traceanalyzer.executor`: in-process, a spawn process pool, or Ray).

What "corrupt" means: a ``trace_view.json`` that is not a JSON array at all (binary garbage, an
HTML error page) or that the parser cannot read for any other reason (including running out of
memory) fails the rank: it is reported with its error and left out of the analysis. A damaged
array (truncated, empty, a malformed event, invalid UTF-8) keeps every well-formed event, and an
unreadable secondary file (a CSV, ``communication.json``) only empties its table; both come with
a warning, and a file that lost data is listed in ``incomplete_files`` (the run is partial).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from traceanalyzer import json_shape, outdir
from traceanalyzer.codekey import ROOT, closure, files_digest
from traceanalyzer.discover import TRACE_FILE, Discovery, RankSession, discover, input_root
from traceanalyzer.hints import path_did_you_mean
from traceanalyzer.parse import native_scan, trace_native
from traceanalyzer.parse.comm import parse_communication, parse_communication_matrix
from traceanalyzer.parse.csv_tables import (
    CSV_MEMORY_MB,
    SPECS,
    CsvDatabase,
    CsvResult,
    CsvSpec,
    parse_csv,
)
from traceanalyzer.parse.sink import body_columns, conform_body, table_from_rows, write_options
from traceanalyzer.parse.times import Tally, checked_arrow
from traceanalyzer.parse.trace_view import DEFAULT_PARSE_MEMORY, ParseMemory, parse_trace_view
from traceanalyzer.printable import path_text
from traceanalyzer.schema import TABLES
from traceanalyzer.store import (
    Manifest,
    commit_group,
    commit_partition,
    describe_partitions,
    fold_journal,
    group_name,
    journal_append,
    load_manifest,
    remove_group,
    remove_session,
    remove_unlisted,
    verify_partitions,
)
from traceanalyzer.vocabulary import GENERATIONS, generation_label

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor
    from traceanalyzer.parse.db import DbResult

# The native scanner's source: its build is part of the code that parses a trace.
NATIVE_SOURCES = ("parse/_trace_scan.c",)
_SAMPLE = 1 << 16
_SCRATCH = ".scratch."  # a session's private folder in OUT while it is ingested
# A session's deadline: this much, plus this much per MB of its files (a 200 MB rank takes
# seconds; a 2 GB one salvaged by DuckDB, minutes), or run --rank-timeout. Past it the session
# fails, said so: a read that never ends (a file on a mount that hangs) costs that rank.
RANK_SECONDS = 300.0
RANK_SECONDS_PER_MB = 2.0
# for the session to fail by itself, before its worker is stopped: a quarter of its deadline,
# 30 s at most
_STOP_GRACE = 0.25
_STOP_GRACE_SECONDS = 30.0


def _too_long(seconds: float) -> str:
    return (
        f"did not finish within {seconds:.0f} s (run --rank-timeout SECONDS gives it longer): "
        "a file of it reads too slowly, or not at all (a mount that hangs?)"
    )


# Fault injection for tests of crash recovery (never set in normal use): the worker ingesting
# this rank kills itself with SIGKILL, like the kernel's OOM killer would. With
# TRACEANALYZER_FAULT_ONCE=<path> it only does so while <path> does not exist (and creates it).
FAULT_KILL_RANK = "TRACEANALYZER_FAULT_KILL_RANK"
FAULT_ONCE = "TRACEANALYZER_FAULT_ONCE"
# ... and the worker ingesting this rank blocks, as a read stuck in a library would.
FAULT_HANG_RANK = "TRACEANALYZER_FAULT_HANG_RANK"
# `text` or `db`: the source to read when a rank has both formats (default: db, see _source).
PREFER_FORMAT = "TRACEANALYZER_PREFER_FORMAT"


class InputError(Exception):
    """The input cannot be analysed at all (bad path, output inside the input, ...)."""


class RankFailed(Exception):
    """One rank session cannot be analysed (its trace_view.json is unreadable)."""


@dataclass
class SessionOutcome:
    rank: int
    session: str
    path: str
    status: str  # ingested | cached | failed
    rows: dict[str, int] = field(default_factory=dict)
    missing_files: list[str] = field(default_factory=list)
    # Optional files the profile was not asked for, as "file (option that writes it)".
    not_collected: list[str] = field(default_factory=list)
    # Files this session's generation never writes (an older export): reported once per run.
    not_in_generation: list[str] = field(default_factory=list)
    # Files read only in part or not at all (truncated trace, unparseable CSV), as "file (why)":
    # the rank is analysed, but without their lost data, so the run counts as partial.
    incomplete_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # How files were read when not as they are (a Db with its WAL applied in a private copy),
    # and what a Db export has no place for that its Text twin holds.
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    # Where an unexpected error (a bug, not the input) was raised: ingest.json only.
    traceback: str | None = None
    seconds: float = 0.0
    generation: str | None = None
    profiler_level: str | None = None
    # Which reader parsed the events: "native" (the C scanner) or "duckdb" (built without a
    # compiler, or a file the scanner does not read, such as a damaged one) for trace_view.json;
    # "db" for ascend_pytorch_profiler_{rank}.db.
    trace_reader: str | None = None
    # The export format the tables were read from ("text" or "db"), and every format present:
    # a [Text, Db] export is one session, read from one source (the Db, unless it is unreadable
    # or TRACEANALYZER_PREFER_FORMAT=text), with the Text files the Db has no table for.
    source_format: str | None = None
    formats_present: list[str] = field(default_factory=list)
    db_schema_version: str | None = None  # META_DATA SCHEMA_VERSION of the Db, when it has one
    # Peak RSS of the process that ingested the session (the worker; the driver for `local`),
    # as the kernel reports it: the evidence that memory is bounded by one rank's working set.
    peak_rss_mb: float | None = None
    # The session failed because the output could not be written (disk full...): not the input.
    output_error: bool = False

    @property
    def key(self) -> str:
        return f"{self.rank}/{self.session}"


@dataclass
class IngestResult:
    out: Path
    discovery: Discovery
    outcomes: list[SessionOutcome]
    executor: str = ""  # which executor ran the sessions, and why (Executor.plan)
    # Stored partitions the manifest did not list (a killed run's leftovers, another
    # collection's), removed before the rules could read them as this input's
    removed_unlisted: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[SessionOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def partial(self) -> bool:
        """Some input could not be analysed: a failed session, a file read only in part or not
        at all, or an unusable directory."""
        return (
            bool(self.failed)
            or any(o.incomplete_files for o in self.outcomes)
            or any(p.severity == "error" for p in self.discovery.problems)
        )

    @property
    def generation_notes(self) -> list[str]:
        """What whole generations never write, once per run: ``G2 exports never write
        task_time.csv (its tables are empty)``."""
        files: dict[str, dict[str, None]] = {}
        for o in self.outcomes:
            for name in o.not_in_generation:
                files.setdefault(generation_label(o.generation), {})[name] = None
        return [
            f"{label} exports never write {', '.join(names)} (tables from them are empty)"
            for label, names in files.items()
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "executor": self.executor,
            "notes": self.generation_notes,
            "removed_unlisted": self.removed_unlisted,
            "sessions": [asdict(o) for o in self.outcomes],
            "problems": [p.to_dict() for p in self.discovery.problems],
        }


# --------------------------------------------------------------------------- fingerprints


def _file_fingerprint(path: Path) -> dict[str, Any]:
    """Size, mtime and a content sample: cheap enough for a warm re-run, sensitive to rewrites."""
    stat = path.stat()
    digest = hashlib.blake2b(digest_size=12)
    with open(path, "rb") as fh:
        digest.update(fh.read(_SAMPLE))
        if stat.st_size > 2 * _SAMPLE:
            fh.seek(stat.st_size // 2)
            digest.update(fh.read(_SAMPLE))
            fh.seek(-_SAMPLE, os.SEEK_END)
            digest.update(fh.read(_SAMPLE))
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sample": digest.hexdigest()}


def session_fingerprint(session: RankSession) -> dict[str, Any]:
    files: dict[str, Any] = {}
    candidates = [p for p in session.path.iterdir() if p.suffix == ".json"]
    if session.output_dir.is_dir() and session.output_dir not in session.refused:
        candidates += list(session.output_dir.iterdir())
    candidates = [p for p in candidates if session.readable(p)]
    for path in sorted(candidates):
        try:
            files[os.path.relpath(path, session.path)] = _file_fingerprint(path)
        except OSError as exc:  # unreadable: never cached, the parse says why
            files[os.path.relpath(path, session.path)] = {"error": str(exc), "at": time.time()}
    return {"parser_version": parser_key(), "files": files}


@functools.cache
def parser_key() -> str:
    """The key of the code that writes a session's tables (this module's import closure in the
    package and the native scanner's source): a session stored by other code is ingested
    again, never trusted (no version to bump by hand)."""
    native = [ROOT / name for name in NATIVE_SOURCES if (ROOT / name).is_file()]
    return files_digest([*closure(__name__), *native])


# --------------------------------------------------------------------------- one session


class _PartitionSink:
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
            raise RankFailed(_too_long(self.seconds or 0))

    def _body(self, table: str, data: pa.Table) -> pa.Table:
        """``data`` in the table's columns, without impossible times."""
        return checked_arrow(table, conform_body(table, data), self.impossible)

    def arrow(self, table: str, data: pa.Table) -> int:
        self._in_time()
        body = self._body(table, data)
        commit_partition(
            self.out,
            table,
            self.rank,
            self.session,
            lambda p: pq.write_table(body, p, **write_options(table, body.schema)),
        )
        self.rows[table] = body.num_rows
        self.spans.pop(table, None)
        self._note_span(table, body)
        return body.num_rows

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


class _BufferedSink(_PartitionSink):
    """Holds each table of one small session in memory, for its rank group to write with the
    group's other sessions (:func:`ingest_group`): a small session's tables are a few hundred
    KB, and its own files would be mostly Parquet footers."""

    def __init__(self, out: Path, rank: int, session: str, seconds: float | None = None):
        super().__init__(out, rank, session, seconds)
        self.parts: dict[str, list[pa.Table]] = {}

    def arrow(self, table: str, data: pa.Table) -> int:
        return self.batches(table, [data])

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
        schema = pa.schema([pa.field(c.name, c.type) for c in TABLES[table].columns])
        keyed = []
        for part in self.parts.get(table, []):
            rows = part.num_rows
            rank = pa.repeat(pa.scalar(self.rank, pa.int32()), rows)
            session = pa.repeat(pa.scalar(self.session, pa.string()), rows)
            part = part.add_column(0, "rank", rank).add_column(1, "session", session)
            keyed.append(part.select(schema.names).cast(schema))
        return keyed


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


# Side files larger than this are parsed after the trace, not beside its last tables: each CSV
# parse holds a batch's text and its conversion (docs/benchmarks/ingest.md).
_SIDE_FILES_ALONGSIDE_BYTES = 32 << 20
_COMM_FILES = (
    ("communication.json", "comm_ops", parse_communication),
    ("communication_matrix.json", "comm_links", parse_communication_matrix),
)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # gone since it was listed: its parse says so
        return 0


class _SideFiles:
    """The CSV and communication JSON files of a session: parsed into ``sink``, with what went
    wrong kept for the outcome (merged after the trace's, so the order never depends on which
    finished first)."""

    def __init__(
        self,
        session: RankSession,
        sink: _PartitionSink,
        scratch: Path,
        filled: frozenset[str] = frozenset(),
    ):
        """``filled``: tables already read from the Db; their files are not read, and the
        files of the other tables are optional (the Db was the session's source). ``scratch``
        takes the private copies of damaged files."""
        self.session, self.sink, self.filled = session, sink, filled
        self.scratch = scratch
        self.missing: list[str] = []
        self.not_collected: list[CsvSpec] = []
        self.warnings: list[str] = []
        self.incomplete: list[str] = []
        self.specs = [spec for spec in SPECS if spec.table not in filled]
        self.comm = [entry for entry in _COMM_FILES if entry[1] not in filled]
        names = [spec.file for spec in self.specs] + [name for name, _, _ in self.comm]
        paths = [session.output_dir / name for name in names]
        self.size = sum(_file_size(p) for p in paths if session.readable(p))

    def parse(self, threads: int = 1) -> dict[str, list[str]]:
        """Parse every side file, the CSVs on up to ``threads`` threads (the CSV readers, polars
        and the Parquet writer release the GIL); returns the CSV headers (they tell the generation)."""
        headers: dict[str, list[str]] = {}
        present: list[tuple[CsvSpec, Path]] = []
        for spec in self.specs:
            path = self.session.output_dir / spec.file
            if self.session.readable(path):
                present.append((spec, path))
            elif self.filled:
                continue  # the Db was the source: the file is optional
            elif spec.collected_with:
                self.not_collected.append(spec)
            else:
                self.missing.append(spec.file)
        csv_db = CsvDatabase(self.scratch)

        def parse_one(item: tuple[CsvSpec, Path]) -> CsvResult | Exception:
            try:
                return parse_csv(item[1], item[0], self.sink, csv_db)
            except Exception as exc:
                if outdir.is_output_failure(exc, self.sink.out):
                    raise
                return exc

        # the largest first, so that the last to finish is a small one (results in file order)
        largest_first = sorted(range(len(present)), key=lambda i: -_file_size(present[i][1]))
        try:
            with ThreadPoolExecutor(max(1, min(threads, len(present)))) as pool:
                done = pool.map(parse_one, [present[i] for i in largest_first])
                by_position = dict(zip(largest_first, done, strict=True))
            results = [by_position[i] for i in range(len(present))]
        finally:
            csv_db.close()
        for (spec, path), parsed in zip(present, results, strict=True):  # in file order
            if isinstance(parsed, Exception):
                self.warnings.append(f"{path}: could not be parsed ({parsed})")
                self.incomplete.append(f"{spec.file} (could not be parsed)")
            else:
                headers[spec.file] = parsed.header
                self.warnings += parsed.warnings
        for name, _table, parser in self.comm:
            path = self.session.output_dir / name
            if not self.session.readable(path):
                if not self.filled:
                    self.missing.append(name)
                continue
            try:
                parser(path, self.sink)
            except Exception as exc:
                if outdir.is_output_failure(exc, self.sink.out):
                    raise
                self.warnings.append(f"{path}: could not be parsed ({exc})")
                self.incomplete.append(f"{name} (could not be parsed)")
        return headers

    def report(self, outcome: SessionOutcome) -> None:
        """Into ``outcome`` (its generation already named)."""
        outcome.missing_files += self.missing
        age = GENERATIONS.index(outcome.generation) if outcome.generation in GENERATIONS else -1
        for spec in self.not_collected:
            if spec.written_from in GENERATIONS and age < GENERATIONS.index(spec.written_from):
                outcome.not_in_generation.append(spec.file)
            elif _setting_on(self.session.config, spec.collected_with):
                # asked for (profiler_info says so) and not written: missing, not uncollected
                outcome.missing_files.append(f"{spec.file} ({spec.collected_with} was set)")
            else:
                outcome.not_collected.append(f"{spec.file} ({spec.collected_with})")
        outcome.warnings += self.warnings
        outcome.incomplete_files += self.incomplete


# Side tables whose rows carry times, and the column that holds them.
_TIMED_TABLES = {
    "kernels": "start_ns", "task_times": "start_ns", "memory_records": "ts_ns",
    "op_memory": "alloc_ns", "module_memory": "ts_ns", "comm_ops": "start_ns",
}  # fmt: skip
# One profiler session writes all its files on one host clock, seconds apart: a file whose
# times lie farther than this from the session's (its trace, else its directory time) belongs
# to another session (a kernel_details.csv of November beside a trace of January).
_FOREIGN_GAP_NS = 10 * 60 * 10**9


def _leave_out_foreign_files(
    sink: _PartitionSink, span: tuple[int | None, int | None], outcome: SessionOutcome
) -> None:
    """Empty the tables of side files whose times lie far outside ``span`` (the session's first
    and last time), and say which and why: their rows are another session's."""
    start, end = span
    if start is None:
        return
    end = end if end is not None else start
    for table, (first, last) in sorted(sink.spans.items()):
        gap = max(start - last, first - end)
        if gap <= _FOREIGN_GAP_NS:
            continue
        name = Path(TABLES[table].source).name
        sink.empty(table)
        side = "before" if last < start else "after"
        outcome.warnings.append(
            f"{name} does not belong to this session: its times ({_when(first)} to "
            f"{_when(last)}) lie {_ago(gap)} {side} the session's ({_when(start)} to "
            f"{_when(end)}); left out, not mixed in"
        )
        outcome.incomplete_files.append(f"{name} (another session's: left out)")


def _when(ns: int) -> str:
    import datetime as dt

    try:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


def _ago(ns: int) -> str:
    seconds = ns / 1e9
    for unit, size in (("days", 86_400), ("hours", 3_600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _setting_on(config: dict[str, Any], collected_with: str) -> bool:
    """Whether profiler_info's ``config`` has the ``NAME=True`` setting ``collected_with``
    names on (``common_config.NAME``, or ``experimental_config._NAME``)."""
    name, _, value = collected_with.partition("=")
    if value != "True" or not name.isidentifier():
        return False
    common, experimental = config.get("common_config"), config.get("experimental_config")
    # (a received profiler_info may hold anything: a field of another type says nothing)
    return (isinstance(common, dict) and common.get(name) is True) or (
        isinstance(experimental, dict) and experimental.get(f"_{name}") is True
    )


# What a Db export cannot hold though it was collected: (canonical table, the profiler setting
# that collects it, the Text file that holds it).
_TEXT_ONLY_TABLES = (("l2_cache", "_l2_cache", "l2_cache.csv"),)


def _text_only_note(held: list[str], text_beside: bool) -> str:
    """What a Db export cannot hold that its Text twin would (``held``), and where to get it:
    the Text export beside it (``text_beside``), else a profile that writes both."""
    where = (
        "the Text export beside it has them (TRACEANALYZER_PREFER_FORMAT=text reads it)"
        if text_beside
        else "export_type=[Text, Db] writes both"
    )
    return f"a Db export has no place for what its Text twin holds: {'; '.join(held)}; {where}"


def _source(session: RankSession) -> str:
    """The format to read a session from: its only one, or for a [Text, Db] export the Db.

    The Db is preferred: its events are typed rows (no JSON to decode, so it reads at least as
    fast as the trace) and it holds what trace_view.json and the CSVs hold; the Text files it
    has no table for (l2_cache.csv, operator_details.csv, task_time.csv) are read as well.
    ``TRACEANALYZER_PREFER_FORMAT=text`` reads the Text export instead.
    """
    if "db" not in session.formats:
        return "text"
    if "text" in session.formats and os.environ.get(PREFER_FORMAT, "").lower() == "text":
        return "text"
    return "db"


def _read_db(
    session: RankSession,
    sink: _PartitionSink,
    outcome: SessionOutcome,
    threads: int,
    scratch: Path,
) -> DbResult | None:
    """Fill the session's tables from its Db; None (and nothing stored) when it is unreadable
    but a Text export is there to read instead. Raises RankFailed when it is all there is."""
    # The Db reader (and its SQLite driver) is imported only for the sessions it reads.
    from traceanalyzer.parse.db import DbUnreadable, parse_db

    try:
        result = parse_db(session.db_file, session.analysis_db, sink, threads, scratch)
    except DbUnreadable as exc:
        sink.rows.clear()  # tables stored before the damage are rewritten from the Text files
        if "text" not in session.formats:
            raise RankFailed(str(exc)) from exc
        outcome.warnings.append(f"{exc}; read the Text export instead")
        return None
    outcome.trace_reader = result.reader
    outcome.db_schema_version = result.schema_version
    outcome.not_collected += result.not_collected
    outcome.warnings += result.warnings
    outcome.notes += result.notes
    if result.text_only:
        outcome.notes.append(_text_only_note(result.text_only, "text" in session.formats))
    outcome.incomplete_files += result.incomplete
    return result


def ingest_session(
    session: RankSession,
    out: Path,
    threads: int = 1,
    memory: ParseMemory = DEFAULT_PARSE_MEMORY,
    seconds: float | None = None,
    sink: _PartitionSink | None = None,
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
        sink = _PartitionSink(out, session.rank, session.session, seconds)
    trace = pool = scratch = None
    try:
        scratch = Path(tempfile.mkdtemp(dir=out, prefix=_SCRATCH))
        db = None
        if _source(session) == "db":
            _fault_hook(session)
            db = _read_db(session, sink, outcome, threads, scratch)
        outcome.source_format = "db" if db else "text"
        # Small side files parse on a thread once the trace parse's memory peak is behind it,
        # while its last tables are written (parse_trace_view's on_read); large ones (a real
        # rank's are a third of its trace) after the trace, once the trace parse's freed memory
        # is handed back: the parses' memory never adds up (alongside the last tables, the
        # 200 MB benchmark rank peaked 20 MB higher). Two large files at a time stay below the
        # trace parse's peak since each large buffer is mapped on its own (process_env).
        side_files = _SideFiles(session, sink, scratch, frozenset(sink.rows) if db else frozenset())
        side: list[Future[dict[str, list[str]]]] = []
        large = side_files.size > _SIDE_FILES_ALONGSIDE_BYTES
        if not large and not db:
            pool = ThreadPoolExecutor(1)

        def trace_read() -> None:
            if pool and not side:
                side.append(pool.submit(side_files.parse, threads))

        trace_path = session.output_dir / TRACE_FILE
        if db:
            pass  # the Db holds the trace's events
        elif session.readable(trace_path):
            _fault_hook(session)
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
            _release_memory()
        headers = side[0].result() if side else side_files.parse(threads)
        if not db:  # a Db's tables are one file's
            span = (trace.start_ns, trace.end_ns) if trace else (session.order_ns, session.end_ns)
            _leave_out_foreign_files(sink, span, outcome)
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
                for table, setting, source in _TEXT_ONLY_TABLES
                if settings.get(setting) is True and not sink.rows.get(table)
            ]
        sink.arrow("sessions", _session_row(session, trace, outcome, db))
        outcome.warnings += sink.impossible.notes(_table_sources(session, db))
        outcome.rows = dict(sink.rows)
    except Exception as exc:
        _failed(outcome, exc, out)
    finally:
        if pool:
            pool.shutdown(wait=True)  # a failed trace still waits for the side files' writes
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    outcome.seconds = round(time.perf_counter() - started, 3)
    outcome.peak_rss_mb = peak_rss_mb()
    if input_bytes(session) >= _RELEASE_AFTER_BYTES:
        _release_memory()
    return outcome


def _table_sources(session: RankSession, db: DbResult | None) -> dict[str, str]:
    """The file each table of ``session`` was read from (the Db's tables from the Db), for the
    notes that name it."""
    info = session.info_file.name if session.info_file else session.path.name
    sources = {"sessions": info} | dict.fromkeys(("slices", "counters", "flows"), TRACE_FILE)
    sources |= {spec.table: spec.file for spec in SPECS}
    sources |= {table: name for name, table, _ in _COMM_FILES}
    return sources | (db.sources if db else {})


def _failed(outcome: SessionOutcome, exc: Exception, out: Path) -> None:
    """Mark ``outcome`` failed by ``exc``: the input's fault (``RankFailed``, said in full by
    its message), the output's (disk full...), or a bug (with its traceback)."""
    outcome.status = "failed"
    if isinstance(exc, RankFailed):
        outcome.error = str(exc)
    elif outdir.is_output_failure(exc, out):
        outcome.output_error = True
        outcome.error = f"cannot write the output {out}: {outdir.failure_text(exc)}"
    else:
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.traceback = traceback.format_exc(limit=5)


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
        sink = _BufferedSink(out, session.rank, session.session, limit)
        outcomes.append(ingest_session(session, out, threads, memory, limit, sink=sink))
        if outcomes[-1].status != "failed":
            sinks.append(sink)
    try:
        for table in TABLES:
            parts = [part for sink in sinks for part in sink.keyed(table)]
            schema = pa.schema([pa.field(c.name, c.type) for c in TABLES[table].columns])
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
                _failed(outcome, exc, out)
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


# After a session this large, what its parse freed is handed back to the system, so the rules
# (or the worker's next session) start from the libraries, not from the parse's high-water mark.
_RELEASE_AFTER_BYTES = 32 << 20


def _release_memory() -> None:
    """Free the parse's reference cycles and hand the Arrow pool's unused pages back (the
    system allocator's ``malloc_trim``; mimalloc's arenas where a user chose that pool): the
    rules then start from the libraries, not from the parse's high-water mark."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()


# What a worker holds: the interpreter and libraries (about 100 MB, with room), and the decoded
# events with the row group being written: on the 200 MB benchmark the native reader peaks at
# 1.0x the trace above its imports (it reads the slices' args again per row group), DuckDB's
# at 1.2x above imports and buffers; room is kept for DuckDB, which reads any damaged file.
_WORKER_BASE_MB = 150
_WORKER_PER_TRACE_MB = 1.4
# A Db holds its events as ids, about 7x denser than the trace's JSON, so the tables it fills
# take many times its size: the 200 MB benchmark's Db twin peaks at the base plus 9x the
# database (docs/benchmarks/ingest.md); 10x leaves a margin.
_WORKER_PER_DB_MB = 10


def input_bytes(session: RankSession) -> int:
    """The size of the session's exported files (what parsing and the rules work through)."""
    try:
        return sum(p.stat().st_size for p in session.output_dir.iterdir() if session.readable(p))
    except OSError:  # unreadable: its parse reports why; it weighs nothing here
        return 0


def session_memory_mb(session: RankSession, memory: ParseMemory = DEFAULT_PARSE_MEMORY) -> int:
    """Peak RSS to expect from the worker that ingests ``session``, in MB: the larger of the
    trace parse (or the Db read) and the CSV parse (which streams in a fixed budget)."""
    csv_peak = _WORKER_BASE_MB + CSV_MEMORY_MB
    if _source(session) == "db" and session.db_file is not None:
        size_mb = session.db_file.stat().st_size / (1 << 20)
        return round(max(_WORKER_BASE_MB + _WORKER_PER_DB_MB * size_mb, csv_peak))
    trace = session.output_dir / TRACE_FILE
    if not session.readable(trace):
        return csv_peak
    size_mb = trace.stat().st_size / (1 << 20)
    # Both readers hold the decoded events; DuckDB's buffers come on top, counted when no
    # scanner is built (a damaged file, which DuckDB reads too, is found out only by reading).
    trace_peak = _WORKER_BASE_MB + _WORKER_PER_TRACE_MB * size_mb
    if not trace_native.available():
        trace_peak += memory.limit_mb(trace)
    return round(max(trace_peak, csv_peak))


def session_seconds(session: RankSession) -> float:
    """The session's deadline, in seconds (see :data:`RANK_SECONDS`)."""
    return RANK_SECONDS + RANK_SECONDS_PER_MB * input_bytes(session) / (1 << 20)


def sessions_that_fit(needs_mb: list[int], jobs: int, available_mb: int | None) -> int:
    """How many sessions may run side by side (at most ``jobs``, at least one) so that the
    largest of them fit in 80% of ``available_mb`` together. ``needs_mb``: largest first."""
    if available_mb is None:
        return jobs
    budget, width = 0.8 * available_mb, 0
    for need in needs_mb[:jobs]:
        budget -= need
        if budget < 0:
            break
        width += 1
    return max(1, width)


def _fit_in_memory(
    sessions: list[RankSession], width: int, memory: ParseMemory
) -> tuple[int, str | None]:
    """How many of ``sessions`` to ingest side by side on this machine (at most ``width``), and
    a note when that is fewer. Fewer at a time is slower; the OOM killer is worse (a killed
    worker's session is retried alone, but its time is lost)."""
    available = available_memory_mb()
    needs = sorted((session_memory_mb(s, memory) for s in sessions), reverse=True)
    fitting = sessions_that_fit(needs, width, available)
    if fitting >= width or available is None:
        return width, None
    return fitting, (
        f"memory: {fitting} rank session(s) at a time, not {width}: the largest need about "
        f"{needs[0] / 1024:.1f} GB each (--parse-memory {memory}), {available / 1024:.1f} GB "
        "is available"
    )


def available_memory_mb(
    proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Memory this process may still use, in MB: the smaller of the machine's ``MemAvailable``
    and what its cgroup (a container's limit) leaves. None where neither can be read."""
    found: list[float] = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) / 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text().strip())
            # The page cache (the traces just read, say) counts as used but is reclaimable.
            for line in (cgroup / "memory.stat").read_text().splitlines():
                if line.startswith("inactive_file "):
                    used -= int(line.split()[1])
            found.append((int(limit) - used) / (1 << 20))
    except (OSError, ValueError):
        pass
    return round(min(found)) if found else None


def peak_rss_mb() -> float | None:
    """Peak resident set size of this process so far, in MB (None where unsupported)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    # ru_maxrss is in KiB on Linux (bytes on macOS, where this overstates by 1024x; fine for a hint)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _fault_hook(session: RankSession) -> None:
    """Test-only crash and hang injection (see :data:`FAULT_KILL_RANK`)."""
    if _fault_rank(FAULT_HANG_RANK) == session.rank:
        threading.Event().wait()  # never set: blocks, the GIL released, as a stuck read does
    if _fault_rank(FAULT_KILL_RANK) != session.rank:
        return
    once = os.environ.get(FAULT_ONCE)
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _fault_rank(variable: str) -> int | None:
    """The rank a fault variable names; None when unset or not a rank number (a typo must not
    fail every rank)."""
    rank = os.environ.get(variable, "").strip()
    return int(rank) if rank.lstrip("-").isdigit() else None


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


# --------------------------------------------------------------------------- driver


# (event, sessions done, sessions in all, the finished session). Events: "start", "session",
# "done", and any other string is a note to show as is (e.g. fewer workers for memory).
ProgressFn = Callable[[str, int, int, SessionOutcome | None], None]


_OUTCOME_TEXT_LISTS = (
    "missing_files", "not_collected", "not_in_generation", "incomplete_files", "warnings",
    "notes", "formats_present",
)  # fmt: skip
_OUTCOME_TEXTS = (
    "error", "traceback", "generation", "profiler_level", "trace_reader", "source_format",
    "db_schema_version",
)  # fmt: skip
_STORED_OUTCOME = json_shape.Obj(
    {
        "rows": json_shape.Obj(values=json_shape.integer(0, (1 << 63) - 1)),
        **dict.fromkeys(_OUTCOME_TEXT_LISTS, json_shape.list_of(json_shape.string)),
        **dict.fromkeys(_OUTCOME_TEXTS, json_shape.string),
        "seconds": json_shape.number,
        "peak_rss_mb": json_shape.number,
    }
)
"""What a manifest entry's ``outcome`` must be to be reported as the session's (an OUT someone
sent is data: a value of another type would fail the summary, not the session)."""


def _cached_outcome(entry: dict[str, Any], session: RankSession) -> SessionOutcome | None:
    """The outcome a manifest entry recorded for ``session``, or None when it is not one
    (hand-edited, another tool's). Its rank, session id and path are the session's own: what
    a manifest says of them is never used."""
    _, problems = json_shape.conform(entry.get("outcome"), _STORED_OUTCOME)
    if problems:
        return None
    own = {"rank": session.rank, "session": session.session, "path": str(session.path)}
    try:
        return SessionOutcome(**{**entry["outcome"], **own, "status": "cached"})
    except (KeyError, TypeError):
        return None


def _crashed(session: RankSession, error: str) -> SessionOutcome:
    return SessionOutcome(
        session.rank, session.session, path_text(session.path), "failed", error=error
    )


def ingest(
    root: str | os.PathLike[str],
    out: str | os.PathLike[str],
    jobs: int = 1,
    progress: ProgressFn | None = None,
    force: bool = False,
    executor: Executor | None = None,
    memory: ParseMemory = DEFAULT_PARSE_MEMORY,
    lock_wait: float = outdir.LOCK_WAIT_SECONDS,
    follow_links: bool = False,
    rank_timeout: float | None = None,
) -> IngestResult:
    """Discover every rank session under ``root`` and bring the store at ``out`` up to date.

    ``executor`` runs the per-session work (:func:`traceanalyzer.executor.make_executor`); by
    default ``auto``: in this process when the work is small, else in a spawn process pool.
    ``memory`` is each trace's parse budget (DuckDB's buffers, per worker).
    The output is checked (never inside the input or a rank directory) and locked for the
    ingest (:mod:`traceanalyzer.outdir`), waiting up to ``lock_wait`` seconds for another run
    that holds it (said to ``progress``). Without a rank session, nothing is written.
    Links that leave ``root`` are followed only with ``follow_links``. A session that takes
    longer than ``rank_timeout`` seconds (default: :func:`session_seconds`) fails, said so.
    """
    try:
        if not Path(root).exists():
            raise InputError(f"{root}: no such file or directory{path_did_you_mean(root)}")
        root_path, out_path = input_root(root), Path(out)
        outdir.check_out(out_path, root_path)
        try:
            found = discover(root_path, follow_links)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise InputError(str(exc)) from exc
        if not found.sessions:  # nothing to analyse: `out` is left exactly as it was found
            return IngestResult(out_path, found, [])
        outdir.check_out(out_path, root_path, [s.path for s in found.sessions])
        total = len(found.sessions)
        say = (lambda note: progress(note, 0, total, None)) if progress else None
        with outdir.locked(out_path, lock_wait, on_wait=say):
            return _ingest(found, out_path, jobs, progress, force, executor, memory, rank_timeout)
    finally:
        native_scan.drop_ahead()  # a scan started ahead (read_ahead) and not taken: not held


# Many small ranks are stored, and analysed, in rank groups (store.rank_shards): a rank of a few
# hundred KB costs more in fixed costs (its files, its tasks, each map's queries) than in
# parsing. A rank of at most SMALL_RANK_BYTES of exported files is small; a collection with at
# least GROUP_FROM_RANKS of them packs them, in rank order, into groups of about an eighth of
# them (a pool of up to eight workers stays busy), GROUP_RANKS and GROUP_BYTES at most. The
# plan depends on the input alone, never on the executor: every backend stores and judges the
# same shards, so their findings agree.
SMALL_RANK_BYTES = 4 << 20
GROUP_FROM_RANKS = 32
GROUP_RANKS = 64
GROUP_BYTES = 64 << 20
_GROUPS_AT_LEAST = 8


def plan_groups(sessions: Iterable[RankSession], sizes: Mapping[str, int]) -> dict[str, str]:
    """The rank group of each session stored in one (session key -> group name); sessions not
    named are stored on their own. ``sizes``: each session's input bytes, by key."""
    by_rank: dict[int, list[RankSession]] = {}
    for session in sessions:
        by_rank.setdefault(session.rank, []).append(session)
    weight = {rank: sum(sizes[s.key] for s in members) for rank, members in by_rank.items()}
    small = [rank for rank in sorted(by_rank) if weight[rank] <= SMALL_RANK_BYTES]
    if len(small) < GROUP_FROM_RANKS:
        return {}
    most = min(GROUP_RANKS, -(-len(small) // _GROUPS_AT_LEAST))
    groups: list[list[int]] = [[]]
    held = 0
    for rank in small:
        if groups[-1] and (len(groups[-1]) >= most or held + weight[rank] > GROUP_BYTES):
            groups.append([])
            held = 0
        groups[-1].append(rank)
        held += weight[rank]
    return {
        session.key: group_name(ranks)
        for ranks in groups
        if len(ranks) > 1  # a group of one rank is that rank stored on its own
        for rank in ranks
        for session in by_rank[rank]
    }


def _units(
    sessions: Iterable[RankSession], groups: Mapping[str, str]
) -> list[tuple[str | None, list[RankSession]]]:
    """What ingest runs as one task, in discovery order: each session stored on its own
    (``None``), and each rank group with its sessions."""
    units: list[tuple[str | None, list[RankSession]]] = []
    members: dict[str, list[RankSession]] = {}
    for session in sessions:
        group = groups.get(session.key)
        if group is None:
            units.append((None, [session]))
        elif group in members:
            members[group].append(session)
        else:
            members[group] = [session]
            units.append((group, members[group]))
    return units


def _recorded_groups(manifest: Manifest) -> dict[str, set[str]]:
    """The session keys the manifest records in each rank group."""
    groups: dict[str, set[str]] = {}
    for key, entry in manifest.sessions.items():
        group = entry.get("group")
        if isinstance(group, str):
            groups.setdefault(group, set()).add(key)
    return groups


def _drop_group(out: Path, manifest: Manifest, group: str) -> None:
    """Forget a rank group: its files and its sessions' entries (they are ingested again)."""
    remove_group(out, group)
    for key in [k for k, v in manifest.sessions.items() if v.get("group") == group]:
        del manifest.sessions[key]


def _stored_unit(
    out: Path,
    manifest: Manifest,
    group: str | None,
    members: list[RankSession],
    fingerprints: Mapping[str, dict[str, Any]],
    recorded: Mapping[str, set[str]],
) -> tuple[list[SessionOutcome] | None, str | None]:
    """The outcomes of a unit the store holds as its input is now (the same files, stored the
    same way: alone, or in a group of the same sessions), or None and why it is not (None
    when it was never stored)."""
    found = [manifest.sessions.get(session.key) for session in members]
    if any(entry is None for entry in found):
        return None, None
    entries: list[dict[str, Any]] = [entry for entry in found if entry is not None]
    keys = {session.key for session in members}
    if {entry.get("group") for entry in entries} != {group} or (
        group is not None and recorded.get(group) != keys
    ):
        return None, None  # stored otherwise: a group of other ranks, or alone
    if any(
        entry.get("fingerprint") != fingerprints[session.key]
        for session, entry in zip(members, entries, strict=True)
    ):
        return None, None
    first = members[0]
    damaged = verify_partitions(out, first.rank, first.session, entries[0].get("partitions"), group)
    cached = [_cached_outcome(entry, s) for entry, s in zip(entries, members, strict=True)]
    outcomes = [outcome for outcome in cached if outcome is not None]
    if damaged is None and len(outcomes) == len(cached):
        return outcomes, None
    return None, damaged or "its manifest entry is not a record of an ingest"


def _remove_scratch(out_path: Path) -> None:
    for scratch in out_path.glob(f"{_SCRATCH}*"):
        shutil.rmtree(scratch, ignore_errors=True)


def _ingest(
    found: Discovery,
    out_path: Path,
    jobs: int,
    progress: ProgressFn | None,
    force: bool,
    executor: Executor | None,
    memory: ParseMemory,
    rank_timeout: float | None,
) -> IngestResult:
    from traceanalyzer.executor import TaskCrashed, make_executor

    manifest = load_manifest(out_path)
    _remove_scratch(out_path)  # a killed run's: nothing reads it now

    # Sessions no longer in the input leave the store, so it always mirrors the input (a group
    # with them: its other sessions are ingested again, in the groups planned now).
    current = {s.key for s in found.sessions}
    for key in [k for k in manifest.sessions if k not in current]:
        if key not in manifest.sessions:
            continue  # its group's, dropped with it
        group = manifest.sessions[key].get("group")
        if isinstance(group, str):
            _drop_group(out_path, manifest, group)
        else:
            rank, _, session = key.partition("/")
            remove_session(out_path, int(rank), session)
            del manifest.sessions[key]
    with outdir.writes(out_path):
        fold_journal(out_path, manifest)
        # What the manifest does not list is not ours to read (another collection written
        # here, a killed run's leftovers): the rules would analyse it as if it were this input.
        unlisted = remove_unlisted(out_path, manifest.sessions, _recorded_groups(manifest))

    sizes = {session.key: input_bytes(session) for session in found.sessions}
    units = _units(found.sessions, plan_groups(found.sessions, sizes))
    fingerprints = {session.key: session_fingerprint(session) for session in found.sessions}
    outcomes: list[SessionOutcome] = []
    todo: list[tuple[str | None, list[RankSession]]] = []
    notes = []  # why stored sessions are ingested again, for the progress
    recorded = _recorded_groups(manifest)
    for group, members in units:
        if force:
            todo.append((group, members))
            continue
        cached, why = _stored_unit(out_path, manifest, group, members, fingerprints, recorded)
        if cached is not None:
            outcomes += cached
            continue
        if why:
            where = f"ranks {group}" if group else f"rank {members[0].rank} {members[0].session}"
            notes.append(f"{where}: {why}; ingested again")
        todo.append((group, members))
    # what the sessions ingested again were stored in goes first: a group they left, or their
    # own partitions when they now join a group
    for group, members in todo:
        for session in members:
            old = manifest.sessions.get(session.key, {}).get("group")
            if isinstance(old, str):
                _drop_group(out_path, manifest, old)
            elif group is not None:
                remove_session(out_path, session.rank, session.session)
    total = len(found.sessions)
    done = len(outcomes)
    if progress:
        progress("start", done, total, None)
        for note in notes:
            progress(note, done, total, None)

    described: dict[str, dict[str, Any]] = {}  # a group's files, described once for its sessions

    def record(outcome: SessionOutcome, group: str | None) -> None:
        nonlocal done
        if outcome.output_error:  # disk full or the like: no later session would fare better
            raise outdir.OutputError(outcome.error)
        done += 1
        outcomes.append(outcome)
        if outcome.status == "failed":
            # a failed (or killed) session may have left some partitions: drop them all, so the
            # rules never analyse half a rank, and the next run ingests it again (a group's
            # files never hold a failed session)
            if group is None:
                remove_session(out_path, outcome.rank, outcome.session)
            manifest.sessions.pop(outcome.key, None)
        else:
            with outdir.writes(out_path):
                if group is None:
                    partitions = describe_partitions(out_path, outcome.rank, outcome.session)
                else:
                    if group not in described:
                        described[group] = describe_partitions(
                            out_path, outcome.rank, outcome.session, group
                        )
                    partitions = described[group]
            value = {
                "fingerprint": fingerprints[outcome.key],
                "outcome": asdict(outcome),
                "partitions": partitions,
            }
            if group is not None:
                value["group"] = group
            manifest.sessions[outcome.key] = value
            with outdir.writes(out_path):
                journal_append(out_path, outcome.key, value)
        if progress:
            progress("session", done, total, outcome)

    reads_traces = any(_source(s) == "text" for _, members in todo for s in members)
    if reads_traces and progress and (note := trace_native.unavailable_note()):
        progress(note, done, total, None)
    owned = executor is None
    if executor is None:
        executor = make_executor("auto", jobs=jobs)
    # all sessions, cached ones too: the rules map over every rank with the same executor
    executor_note = executor.plan(len(found.sessions), sum(sizes.values()))
    if progress:
        progress(f"executor: {executor_note}", done, total, None)
    side_by_side = min(executor.jobs, len(todo)) if executor.parallel else 1
    if executor.shares_memory and side_by_side > 1:
        largest = [max(members, key=lambda s: sizes[s.key]) for _, members in todo]
        side_by_side, note = _fit_in_memory(largest, side_by_side, memory)
        if note and progress:
            progress(note, done, total, None)
    # e.g. a single 2 GB rank scans on every core
    threads = executor.threads_per_task(side_by_side)
    try:
        seconds = [[rank_timeout or session_seconds(s) for s in members] for _, members in todo]
        results = executor.map(
            ingest_unit,
            [
                (members, out_path, group, threads, memory, limits)
                for (group, members), limits in zip(todo, seconds, strict=True)
            ],
            labels=[
                f"ranks {group} ({len(members)} sessions)"
                if group
                else f"rank {members[0].rank} {members[0].session}"
                for group, members in todo
            ],
            width=side_by_side,
            # past its own deadline (above), a session is stopped: a read stuck in a library
            # never saw it
            timeouts=[
                sum(t + min(_STOP_GRACE * t, _STOP_GRACE_SECONDS) for t in limits)
                for limits in seconds
            ],
        )
        left_running = False
        for index, result in results:
            group, members = todo[index]
            if isinstance(result, TaskCrashed):
                left_running |= result.timed_out
                if result.timed_out:
                    why = _too_long(sum(seconds[index]))
                else:
                    why = f"worker died: {result}"
                if group is not None:  # what the dead worker wrote of the group is not kept
                    remove_group(out_path, group)
                result = [_crashed(session, why) for session in members]
            for outcome in result:
                record(outcome, group)
        # Every task has returned, so a scratch folder still here is a dead worker's (one the
        # OOM killer took, its task retried and done): it may hold a trace's spill, and this
        # run is its last user. Not when a task was stopped past its deadline: `local` leaves
        # that task's thread running in it (the next run removes it).
        if not left_running:
            _remove_scratch(out_path)
    finally:
        # also on Ctrl-C: everything finished so far is in the manifest for the next run
        with outdir.writes(out_path):
            fold_journal(out_path, manifest)
        if owned:
            executor.close()
    outcomes.sort(key=lambda o: (o.rank, o.session))
    if progress:
        progress("done", done, total, None)
    return IngestResult(
        out_path, found, outcomes, executor=executor_note, removed_unlisted=unlisted
    )
