"""Shared helpers for the synth tests: where the shared reference data lives, trace loading."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve()
# The real exports the tests compare against are not in the repo (they are not ours to ship).
# TRACEANALYZER_REAL_TRACES names their folder; otherwise `shared/real_traces` beside the clone.
REAL_TRACES_ENV = "TRACEANALYZER_REAL_TRACES"


def real_traces_dir() -> Path:
    """Where the real exports are looked for (the folder need not exist)."""
    if os.environ.get(REAL_TRACES_ENV):
        return Path(os.environ[REAL_TRACES_ENV]).expanduser()
    return _HERE.parents[1].parent / "shared" / "real_traces"


def real_export(name: str) -> Path | None:
    """``real_traces/<name>`` (e.g. ``g2_level1``), or None when it is not available."""
    path = real_traces_dir() / name
    return path if path.is_dir() else None


def skip_reason(name: str) -> str:
    return (
        f"real export {name} not found in {real_traces_dir()} "
        f"(set {REAL_TRACES_ENV} to the folder holding it)"
    )


def real_g2_level1() -> Path | None:
    return real_export("g2_level1")


def process_names(events: list[dict]) -> dict[int, str]:
    return {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def event_kind(e: dict, procs: dict[int, str]) -> tuple:
    """(process, ph, cat, M-name) — the unit at which key sets are compared."""
    return (procs.get(e["pid"], "?"), e["ph"], e.get("cat"), e["name"] if e["ph"] == "M" else None)


def key_layouts(events: list[dict]) -> dict[tuple, set[tuple]]:
    """Per event kind: the set of (top-level key order, args key order) layouts."""
    procs = process_names(events)
    out: dict[tuple, set[tuple]] = defaultdict(set)
    for e in events:
        args = e.get("args")
        out[event_kind(e, procs)].add((tuple(e), tuple(args) if isinstance(args, dict) else None))
    return out


def load_trace(rank_dir: Path) -> list[dict]:
    return json.loads(
        (rank_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text(encoding="utf-8")
    )
