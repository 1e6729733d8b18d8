"""Ingest: discover → parse → store, one rank session per task, cached and resumable.

The driver never holds table data: each worker parses one session and writes its partitions
itself (atomically); the driver only records outcomes in the manifest, after each session, so an
interrupted run resumes with the sessions that are missing or stale.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from traceanalyzer.discover import Discovery, RankSession, discover
from traceanalyzer.parse.comm import parse_communication, parse_communication_matrix
from traceanalyzer.parse.csv_tables import SPECS, parse_csv
from traceanalyzer.parse.sink import body_columns, conform_body
from traceanalyzer.parse.trace_view import parse_trace_view
from traceanalyzer.schema import TABLES
from traceanalyzer.store import Manifest, commit_partition, partition_exists, remove_session

# Bump when parsers change what they write: stored sessions are then re-ingested.
PARSER_VERSION = 1
TRACE_FILE = "trace_view.json"
_SAMPLE = 1 << 16


class InputError(Exception):
    """The input cannot be analysed at all (bad path, output inside the input, ...)."""


@dataclass
class SessionOutcome:
    rank: int
    session: str
    path: str
    status: str  # ingested | cached | failed
    rows: dict[str, int] = field(default_factory=dict)
    missing_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    generation: str | None = None
    profiler_level: str | None = None

    @property
    def key(self) -> str:
        return f"{self.rank}/{self.session}"


@dataclass
class IngestResult:
    out: Path
    discovery: Discovery
    outcomes: list[SessionOutcome]

    @property
    def failed(self) -> list[SessionOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def partial(self) -> bool:
        """Some input could not be analysed: a failed session or an unusable directory."""
        return bool(self.failed) or any(p.severity == "error" for p in self.discovery.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
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
    candidates = [p for p in session.path.iterdir() if p.is_file() and p.suffix == ".json"]
    if session.output_dir.is_dir():
        candidates += [p for p in session.output_dir.iterdir() if p.is_file()]
    for path in sorted(candidates):
        files[os.path.relpath(path, session.path)] = _file_fingerprint(path)
    return {"parser_version": PARSER_VERSION, "files": files}


# --------------------------------------------------------------------------- one session


class _PartitionSink:
    """Writes each table of one session straight into its store partition."""

    def __init__(self, out: Path, rank: int, session: str):
        self.out, self.rank, self.session = out, rank, session
        self.rows: dict[str, int] = {}

    def arrow(self, table: str, data: pa.Table) -> int:
        body = conform_body(table, data)
        commit_partition(
            self.out,
            table,
            self.rank,
            self.session,
            lambda p: pq.write_table(body, p, compression="zstd"),
        )
        self.rows[table] = body.num_rows
        return body.num_rows

    def duckdb(self, table: str, con: duckdb.DuckDBPyConnection, query: str) -> int:
        count = 0

        def write(path: Path) -> None:
            nonlocal count
            target = str(path).replace("'", "''")
            count = con.execute(
                f"COPY ({query}) TO '{target}' (FORMAT parquet, COMPRESSION zstd)"
            ).fetchone()[0]

        commit_partition(self.out, table, self.rank, self.session, write)
        self.rows[table] = count
        return count

    def written(self, table: str) -> Path | None:
        if table not in self.rows:
            return None
        return (
            self.out
            / "tables"
            / table
            / f"rank={self.rank}"
            / f"session={self.session}"
            / "part-0.parquet"
        )

    def empty(self, table: str) -> None:
        self.arrow(
            table, pa.table({name: pa.array([], type=typ) for name, typ in body_columns(table)})
        )


def _generation(
    session: RankSession,
    headers: dict[str, list[str]],
    trace_processes: list[str],
    hw_stream_arg: str | None,
) -> str:
    """Name the export generation from the evidence the format doc lists for each."""
    kernel = headers.get("kernel_details.csv", [])
    if "Block Num" in kernel or "Communication" in trace_processes:
        return "current"
    if (
        any("Device_id" in h for h in headers.values())
        or session.cann_version
        or session.torch_npu_version
    ):
        return "g3"
    if hw_stream_arg == "Stream Id":
        return "g1"
    return "g2"


def ingest_session(session: RankSession, out: Path, threads: int = 1) -> SessionOutcome:
    """Parse every file of one rank session into its store partitions. Never raises."""
    started = time.perf_counter()
    outcome = SessionOutcome(
        session.rank,
        session.session,
        str(session.path),
        "ingested",
        profiler_level=session.profiler_level,
    )
    sink = _PartitionSink(out, session.rank, session.session)
    headers: dict[str, list[str]] = {}
    trace = None
    scratch = Path(tempfile.mkdtemp(dir=out, prefix=".scratch."))
    try:
        trace_path = session.output_dir / TRACE_FILE
        if trace_path.is_file():
            try:
                trace = parse_trace_view(trace_path, sink, scratch, threads=threads)
                outcome.warnings += trace.warnings
            except Exception as exc:  # the rest of the session is still useful
                outcome.warnings.append(f"{trace_path}: could not be parsed ({exc})")
        else:
            outcome.missing_files.append(TRACE_FILE)
        for spec in SPECS:
            path = session.output_dir / spec.file
            if not path.is_file():
                outcome.missing_files.append(spec.file)
                continue
            try:
                parsed = parse_csv(path, spec, sink)
                headers[spec.file] = parsed.header
                outcome.warnings += parsed.warnings
            except Exception as exc:
                outcome.warnings.append(f"{path}: could not be parsed ({exc})")
        for name, parser in (
            ("communication.json", parse_communication),
            ("communication_matrix.json", parse_communication_matrix),
        ):
            path = session.output_dir / name
            if not path.is_file():
                outcome.missing_files.append(name)
                continue
            try:
                parser(path, sink)
            except Exception as exc:
                outcome.warnings.append(f"{path}: could not be parsed ({exc})")
        for table in TABLES:
            if table not in sink.rows and table != "sessions":
                sink.empty(table)
        outcome.generation = _generation(
            session,
            headers,
            trace.processes if trace else [],
            trace.hw_stream_arg if trace else None,
        )
        sink.arrow("sessions", _session_row(session, trace, outcome))
        outcome.rows = dict(sink.rows)
    except Exception as exc:
        outcome.status = "failed"
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.warnings.append(traceback.format_exc(limit=5))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    outcome.seconds = round(time.perf_counter() - started, 3)
    return outcome


def _session_row(session: RankSession, trace: Any, outcome: SessionOutcome) -> pa.Table:
    files = (
        sorted(p.name for p in session.output_dir.iterdir()) if session.output_dir.is_dir() else []
    )
    row = {
        "path": str(session.path),
        "start_ns": trace.start_ns if trace and trace.start_ns is not None else session.order_ns,
        "end_ns": trace.end_ns if trace and trace.end_ns is not None else session.end_ns,
        "profiler_level": session.profiler_level,
        "export_type": ",".join(session.export_type) or None,
        "torch_npu_version": session.torch_npu_version,
        "cann_version": session.cann_version,
        "generation": outcome.generation,
        "device_id": session.device_id,
        "hostname": session.hostname,
        "os_pid": session.os_pid,
        "metadata": json.dumps(session.metadata, ensure_ascii=False, sort_keys=True),
        "config": json.dumps(session.config, ensure_ascii=False, sort_keys=True),
        "files": json.dumps(files),
    }
    return pa.Table.from_pylist([row])


# --------------------------------------------------------------------------- driver


def default_out_dir(root: Path) -> Path:
    """Outside the input tree: ./traceanalyzer-out/<name>, or a sibling when cwd is inside root."""
    root = root.resolve()
    cwd = Path.cwd().resolve()
    if cwd == root or root in cwd.parents:
        return root.parent / f"{root.name}-traceanalyzer"
    return cwd / "traceanalyzer-out" / root.name


def _check_out(root: Path, out: Path) -> None:
    root, out = root.resolve(), out.resolve()
    if out == root or root in out.parents:
        raise InputError(
            f"--out {out} is inside the input {root}; traceanalyzer never writes into its input"
        )
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")


ProgressFn = Callable[[str, int, int, SessionOutcome | None], None]


def ingest(
    root: str | os.PathLike[str],
    out: str | os.PathLike[str],
    jobs: int = 1,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> IngestResult:
    """Discover every rank session under ``root`` and bring the store at ``out`` up to date."""
    root_path, out_path = Path(root), Path(out)
    if not root_path.exists():
        raise InputError(f"{root}: no such file or directory")
    _check_out(root_path, out_path)
    try:
        found = discover(root_path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise InputError(str(exc)) from exc
    out_path.mkdir(parents=True, exist_ok=True)
    manifest = Manifest.load(out_path)

    # Sessions no longer in the input leave the store, so it always mirrors the input.
    current = {s.key for s in found.sessions}
    for key in [k for k in manifest.sessions if k not in current]:
        rank, _, session = key.partition("/")
        remove_session(out_path, int(rank), session)
        del manifest.sessions[key]
    manifest.save(out_path)

    outcomes: list[SessionOutcome] = []
    todo: list[tuple[RankSession, dict[str, Any]]] = []
    for session in found.sessions:
        fingerprint = session_fingerprint(session)
        entry = manifest.sessions.get(session.key)
        complete = all(partition_exists(out_path, t, session.rank, session.session) for t in TABLES)
        if not force and entry and entry.get("fingerprint") == fingerprint and complete:
            cached = SessionOutcome(**{**entry["outcome"], "status": "cached"})
            outcomes.append(cached)
        else:
            todo.append((session, fingerprint))
    total = len(found.sessions)
    done = len(outcomes)
    if progress:
        progress("start", done, total, None)

    def record(outcome: SessionOutcome, fingerprint: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        outcomes.append(outcome)
        if outcome.status != "failed":
            manifest.sessions[outcome.key] = {
                "fingerprint": fingerprint,
                "outcome": asdict(outcome),
            }
            manifest.save(out_path)
        if progress:
            progress("session", done, total, outcome)

    workers = max(1, min(jobs, len(todo)))
    if workers <= 1:
        for session, fingerprint in todo:
            record(ingest_session(session, out_path, threads=os.cpu_count() or 1), fingerprint)
    else:
        # spawn, not fork: the parent may already run DuckDB/polars thread pools, and a forked
        # child inherits their locks in whatever state they were in (a deadlock, seen in tests).
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            futures = {pool.submit(ingest_session, s, out_path, 1): (s, fp) for s, fp in todo}
            for future in as_completed(futures):
                session, fingerprint = futures[future]
                try:
                    outcome = future.result()
                except Exception as exc:  # a worker died (OOM kill, crash)
                    outcome = SessionOutcome(
                        session.rank,
                        session.session,
                        str(session.path),
                        "failed",
                        error=f"worker died: {exc}",
                    )
                record(outcome, fingerprint)
    outcomes.sort(key=lambda o: (o.rank, o.session))
    if progress:
        progress("done", done, total, None)
    return IngestResult(out=out_path, discovery=found, outcomes=outcomes)
