"""What a warm run trusts of the store: each session's fingerprint (its files' size, mtime and
content samples, and the key of the code that parsed them), and a unit's outcomes as its manifest
entries recorded them, when its input is unchanged and its partitions verify (an OUT someone
sent is data: an entry that is no record of an ingest is not reported as one)."""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traceanalyzer import json_shape
from traceanalyzer.codekey import ROOT, closure, files_digest
from traceanalyzer.discover import RankSession
from traceanalyzer.ingest.outcome import SessionOutcome
from traceanalyzer.store import Manifest, verify_partitions

# The native scanner's source: its build is part of the code that parses a trace.
NATIVE_SOURCES = ("parse/_trace_scan.c",)


_SAMPLE = 1 << 16


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
    return files_digest([*closure("traceanalyzer.ingest.session"), *native])


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


def stored_unit(
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
