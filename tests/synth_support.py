"""Shared helpers for the synth tests: where the shared reference data lives, trace loading."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

_HERE = Path(__file__).resolve()
# Work tree: /work/main/tests -> /work/shared; CI: a copy of shared/ beside the clone.
SHARED_CANDIDATES = [_HERE.parents[2] / "shared", _HERE.parents[1].parent / "shared"]


def shared_dir() -> Path | None:
    for cand in SHARED_CANDIDATES:
        if (cand / "real_traces" / "g2_level1").is_dir():
            return cand
    return None


def real_g2_level1() -> Path | None:
    shared = shared_dir()
    return shared / "real_traces" / "g2_level1" if shared else None


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
