"""What ingest says of each rank session and of a run: the errors, a session's outcome (what
was read, from which format, what is missing, incomplete or failed, and why), the run's result,
and the progress it reports on the way."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceanalyzer import outdir
from traceanalyzer.discover import Discovery, RankSession
from traceanalyzer.printable import path_text
from traceanalyzer.vocabulary import generation_label


class InputError(Exception):
    """The input cannot be analysed at all (bad path, output inside the input, ...)."""


class RankFailed(Exception):
    """One rank session cannot be analysed (its trace_view.json is unreadable)."""


def too_long(seconds: float) -> str:
    return (
        f"did not finish within {seconds:.0f} s (run --rank-timeout SECONDS gives it longer): "
        "a file of it reads too slowly, or not at all (a mount that hangs?)"
    )


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


# (event, sessions done, sessions in all, the finished session). Events: "start", "session",
# "done", and any other string is a note to show as is (e.g. fewer workers for memory).
ProgressFn = Callable[[str, int, int, SessionOutcome | None], None]


def failed(outcome: SessionOutcome, exc: Exception, out: Path) -> None:
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


def crashed(session: RankSession, error: str) -> SessionOutcome:
    return SessionOutcome(
        session.rank, session.session, path_text(session.path), "failed", error=error
    )
