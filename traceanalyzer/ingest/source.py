"""Which export of a rank session ingest reads: its only one, or for a [Text, Db] export the Db
(``TRACEANALYZER_PREFER_FORMAT=text`` reads the Text files instead); and the Db read, with what
it cannot hold that its Text twin would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from traceanalyzer.discover import RankSession
from traceanalyzer.ingest.outcome import RankFailed, SessionOutcome
from traceanalyzer.ingest.sink import PartitionSink

if TYPE_CHECKING:
    from traceanalyzer.parse.db import DbResult


# `text` or `db`: the source to read when a rank has both formats (default: db, see source_of).
PREFER_FORMAT = "TRACEANALYZER_PREFER_FORMAT"


def source_of(session: RankSession) -> str:
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


# What a Db export cannot hold though it was collected: (canonical table, the profiler setting
# that collects it, the Text file that holds it).
TEXT_ONLY_TABLES = (("l2_cache", "_l2_cache", "l2_cache.csv"),)


def _text_only_note(held: list[str], text_beside: bool) -> str:
    """What a Db export cannot hold that its Text twin would (``held``), and where to get it:
    the Text export beside it (``text_beside``), else a profile that writes both."""
    where = (
        "the Text export beside it has them (TRACEANALYZER_PREFER_FORMAT=text reads it)"
        if text_beside
        else "export_type=[Text, Db] writes both"
    )
    return f"a Db export has no place for what its Text twin holds: {'; '.join(held)}; {where}"


def read_db(
    session: RankSession,
    sink: PartitionSink,
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
