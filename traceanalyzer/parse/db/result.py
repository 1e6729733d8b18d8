"""What the Db reader found: row counts, the session's facts, and what the file did not hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from traceanalyzer.parse.db.database import Db


@dataclass
class DbResult:
    """What the Db reader found, for the session row and the outcome."""

    rows: dict[str, int] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    processes: list[str] = field(default_factory=list)
    schema_version: str | None = None
    generation: str = "g2"
    device_id: int | None = None
    hostname: str | None = None
    os_pid: int | None = None
    # META_DATA (ENV_VARIABLES decoded), SESSION_TIME_INFO and NPU_INFO, for the sessions row.
    metadata: dict[str, Any] = field(default_factory=dict)
    # The META_DATA keys a Text export writes to profiler_metadata.json (ENV_VARIABLES,
    # parallel_group_info, prof.add_metadata keys), decoded.
    profiler_metadata: dict[str, Any] = field(default_factory=dict)
    # Db tables absent from the file: what they would fill was not collected.
    not_collected: list[str] = field(default_factory=list)
    # What the Text twin of this export would hold and the Db cannot (text_only.text_only).
    text_only: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # How the files were read when not as they are (a private copy with its WAL applied).
    notes: list[str] = field(default_factory=list)
    # Files read in part or not at all, as "file (why)": analysis.db when it is unreadable.
    incomplete: list[str] = field(default_factory=list)
    reader: str = "db"
    # The file each table was read from (the profiler database or analysis.db), by table.
    sources: dict[str, str] = field(default_factory=dict)


def collected(db: Db, result: DbResult, *tables: str) -> bool:
    """True when every one of ``tables`` is in the database; else it is noted as not collected."""
    absent = [t for t in tables if not db.has(t)]
    result.not_collected += [f"{t} (table absent from {db.path.name})" for t in absent]
    return not absent
