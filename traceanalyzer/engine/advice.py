"""What to collect, said from what the export says about itself.

A requirement names how its data is collected ("profiler_level=Level1", "ProfilerActivity.NPU
in a multi-rank job"). Told to an export that was collected that way already, that advice is
wrong: the sessions' ``profiler_level``, ``config`` (profiler_info's activities) and ``files``
say what was collected and which file is missing, and the advice names that instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass

import polars as pl

from traceanalyzer.schema import TABLES
from traceanalyzer.store import Store

LEVEL = re.compile(r"profiler_level=(Level\d)(?:\s+or\s+Level\d)*")
ACTIVITY = re.compile(r"ProfilerActivity\.(?:NPU|CPU)")
# the file of a Text export a table is read from: the first file its source names
SOURCE_FILE = re.compile(r"[\w*{}]+\.(?:json|csv)")


@dataclass(frozen=True)
class ExportFacts:
    """What the sessions in scope say they collected: their levels, the activities every one
    collected, and per file of the Text export the ranks whose session lacks it."""

    levels: tuple[str, ...] = ()
    activities: frozenset[str] = frozenset()
    files_missing: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def missing_from(self, name: str) -> tuple[int, ...]:
        return dict(self.files_missing).get(name, ())


def export_facts(sessions: pl.DataFrame) -> ExportFacts:
    """The facts of ``sessions`` (the store's sessions table: rank, profiler_level, config,
    files, source_format)."""
    if sessions.is_empty():
        return ExportFacts()
    levels = sorted({str(v) for v in sessions["profiler_level"].drop_nulls()})
    activities: set[str] | None = None
    files: dict[str, set[int]] = {}
    text_ranks: list[tuple[int, set[str]]] = []
    for row in sessions.iter_rows(named=True):
        # (a received profiler_info may hold anything: a field of another type says nothing)
        config = _json(row.get("config"))
        common = config.get("common_config") if isinstance(config, dict) else None
        listed = common.get("activities") if isinstance(common, dict) else None
        collected = {a for a in listed if isinstance(a, str)} if isinstance(listed, list) else set()
        activities = collected if activities is None else activities & collected
        if (row.get("source_format") or "text") == "text":
            present = _json(row.get("files"))
            text_ranks.append(
                (int(row["rank"]), set(present) if isinstance(present, list) else set())
            )
    for table in TABLES.values():
        for name in SOURCE_FILE.findall(table.source)[:1]:
            lacking = {rank for rank, present in text_ranks if present and name not in present}
            if lacking:
                files.setdefault(name, set()).update(lacking)
    return ExportFacts(
        tuple(levels),
        frozenset(activities or ()),
        tuple((name, tuple(sorted(ranks))) for name, ranks in sorted(files.items())),
    )


def store_facts(store: Store, ranks: Collection[int] | None = None) -> ExportFacts:
    """The facts of the store's sessions of ``ranks`` (None: every rank)."""
    sessions = store.table("sessions")
    if ranks is not None:
        sessions = sessions.filter(pl.col("rank").is_in(sorted(ranks)))
    wanted = ["rank", "profiler_level", "config", "files", "source_format"]
    have = [c for c in wanted if c in sessions.collect_schema().names()]
    return export_facts(sessions.select(have).collect())


def _json(text: object) -> object:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _level_number(level: str) -> int:
    digits = re.sub(r"\D", "", level)
    return int(digits) if digits else -1


def collect_hint(collect_with: str, facts: ExportFacts, table: str) -> str:
    """`` (collect with X)``, or, when every session in scope was collected that way, what
    the export says instead: the file that holds the data is missing, or the export records
    such data and has none (and what else it takes)."""
    if not collect_with:
        return ""
    asked_level, asked_activity = LEVEL.search(collect_with), ACTIVITY.search(collect_with)
    plain = f" (collect with {collect_with})"
    if not (asked_level or asked_activity) or not facts.levels:
        return plain
    if asked_level and min(map(_level_number, facts.levels)) < _level_number(asked_level[1]):
        return plain
    if asked_activity and asked_activity[0] not in facts.activities:
        return plain
    export = f"this {'/'.join(facts.levels)} export" if asked_level else "this export"
    if asked_activity:
        export += f" with {asked_activity[0]}"
    records = f"{export} records them"
    source = TABLES[table].source if table in TABLES else ""
    for name in SOURCE_FILE.findall(source)[:1]:
        if facts.missing_from(name):  # the ingest summary names the ranks (one text per shard)
            return f" ({records} in {name}, which is missing)"
    rest = collect_with
    for asked in (asked_level, asked_activity):
        if asked:
            rest = rest.replace(asked[0], "")
    rest = rest.strip(" ,;")
    return f" ({records} but has none" + (f"; they appear only {rest}" if rest else "") + ")"
