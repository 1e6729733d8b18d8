"""The run summary every report shows: ranks, sessions, versions, levels, and what was skipped.

Built from the store's ``sessions`` table (versions, generation, level, path) joined with
``OUT/ingest.json`` (status, missing files, warnings, discovery problems), as plain dicts so the
HTML, Markdown and diff writers share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl


# a session's files that could not all be used: its ingest.json key, what the summary says
# of them and what that costs
SKIPPED_FILES = (
    ("missing_files", "missing", "tables from them are empty"),
    ("incomplete_files", "incomplete", "analysed without the lost data"),
    ("not_collected", "not collected", "tables from them are empty"),
)


@dataclass
class RunSummary:
    ranks: list[int]
    sessions: list[dict[str, Any]]
    problems: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # once per run (ingest.json "notes")

    @property
    def skipped(self) -> list[str]:
        """One line per thing that could not be used, with why."""
        lines = []
        for s in self.sessions:
            said = [f"failed: {s.get('error')}"] if s.get("status") == "failed" else []
            said += [
                f"{what} {', '.join(s[key])} ({why})"
                for key, what, why in SKIPPED_FILES
                if s.get(key)
            ]
            said += s.get("warnings") or []
            lines += [f"rank {s['rank']} {s['session']}: {line}" for line in said]
        lines += self.notes
        for p in self.problems:
            where = f"{p.get('path')}: " if p.get("path") else ""
            lines.append(f"{p.get('severity', 'warning')}: {where}{p.get('message')}")
        return lines


def run_summary(
    sessions: pl.DataFrame, ingest: Mapping[str, Any] | None, doc: Mapping[str, Any]
) -> RunSummary:
    """The summary of the store's ``sessions`` table, ``ingest.json`` and the findings document."""
    ingest = ingest or {}
    by_session = {(s["rank"], s["session"]): s for s in ingest.get("sessions", [])}
    rows: list[dict[str, Any]] = []
    seen = set()
    for row in sessions.iter_rows(named=True):
        key = (row["rank"], row["session"])
        seen.add(key)
        rows.append({**row, **_ingest_fields(by_session.get(key))})
    for key, extra in by_session.items():  # failed sessions have no sessions-table row
        if key not in seen:
            rows.append({"rank": key[0], "session": key[1], **_ingest_fields(extra)})
    rows.sort(key=lambda r: (r["rank"], r.get("start_ns") or 0))
    versions: dict[str, list[str]] = {}
    for col in ("generation", "profiler_level", "torch_npu_version", "cann_version"):
        values = sorted({str(r[col]) for r in rows if r.get(col)})
        if values:
            versions[col] = values
    ranks = doc.get("summary", {}).get("ranks") or sorted({r["rank"] for r in rows})
    return RunSummary(
        ranks=list(ranks),
        sessions=rows,
        problems=list(ingest.get("problems", [])),
        notes=list(ingest.get("notes", [])),
        versions=versions,
    )


def _ingest_fields(entry: dict[str, Any] | None) -> dict[str, Any]:
    if not entry:
        return {}
    keep = (
        "status",
        "missing_files",
        "not_collected",
        "incomplete_files",
        "warnings",
        "error",
        "seconds",
        "path",
    )
    out = {k: entry.get(k) for k in keep if entry.get(k) is not None}
    return out | {k: entry[k] for k in ("generation", "profiler_level") if entry.get(k)}
