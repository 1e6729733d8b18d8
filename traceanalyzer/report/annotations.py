"""``OUT/annotations.json``: the findings as a Chrome-trace overlay for Perfetto / chrome://tracing /
MindStudio Insight.

One process ("traceanalyzer findings") with one thread per finding; each evidence row is an
``X`` slice at its own time. Timestamps are written exactly like torch_npu writes them (µs as a
string with 3 decimals, converted from int64 ns with integer arithmetic), on the same epoch
clock, so the slices line up with ``trace_view.json`` to the nanosecond.

Beyond the evidence rows (which a rule caps), the overlay draws from the finding's series where
that is richer: every capture window of every rank with its memcpy count (capture-memcpy-growth).
"""

from __future__ import annotations

from typing import Any

from traceanalyzer.report.fmt import trace_us
from traceanalyzer.report.inputs import ReportInputs
from traceanalyzer.report.plots import rank_series

PROCESS_NAME = "traceanalyzer findings"
# A pid no torch_npu export uses (they are OS pids or device ids with high bits): the overlay
# must never merge into one of the trace's own processes.
PID = 2_000_000_001


def _slice(tid: int, name: str, start_ns: int, dur_ns: int | None, cat: str, args: dict) -> dict:
    return {
        "ph": "X",
        "pid": PID,
        "tid": tid,
        "name": name,
        "cat": cat,
        "ts": trace_us(start_ns),
        # durations as numbers, like torch_npu writes them (exact: far below 2**53 ns)
        "dur": round(max(int(dur_ns or 0), 0) / 1000, 3),
        "args": {k: v for k, v in args.items() if v is not None},
    }


def _capture_slices(tid: int, finding: dict[str, Any]) -> list[dict]:
    events = []
    for ranks, s in rank_series(finding):
        starts, durs = s.get("start_ns") or [], s.get("capture_ns") or []
        counts, sessions = s.get("memcpy_calls") or [], s.get("session") or []
        for i, start in enumerate(starts):
            if start is None or i >= len(durs) or durs[i] is None:
                continue  # api_statistic.csv points have no window on the clock
            calls = counts[i] if i < len(counts) else None
            calls_text = "?" if calls is None else f"{calls:g}"
            events.append(
                _slice(
                    tid,
                    f"capture #{i}: {calls_text} memcpy",
                    int(start),
                    int(durs[i]),
                    "capture",
                    {
                        "rank": ranks[0] if len(ranks) == 1 else ranks,
                        "session": sessions[i] if i < len(sessions) else None,
                        "memcpy_calls": calls,
                        "capture_index": i,
                    },
                )
            )
    return events


def build_annotations(inputs: ReportInputs) -> dict[str, Any]:
    """The overlay document: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``."""
    findings = inputs.findings.get("findings", [])
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": PROCESS_NAME}},
        # sort first, above the trace's own processes
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_sort_index", "args": {"sort_index": -1}},
    ]
    for tid, f in enumerate(findings, start=1):
        label = f"[{f.get('severity')}] {f.get('name')} ({f.get('ranks_label')})"
        events.append(
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": label}}
        )
        events.append(
            {
                "ph": "M",
                "pid": PID,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )
        common = {
            "rule": f.get("rule"),
            "finding": f.get("title"),
            "fingerprint": f.get("fingerprint"),
        }
        captures = _capture_slices(tid, f) if f.get("name") == "capture-memcpy-growth" else []
        events += [{**e, "args": {**common, **e["args"]}} for e in captures]
        for e in f.get("evidence") or []:
            if e.get("start_ns") is None:
                continue
            if captures and str(e.get("name", "")).startswith("capture #"):
                continue  # already drawn from the full series
            kind = "wait" if e.get("stream") is not None else "span"
            name = e.get("name") or "evidence"
            if e.get("stream") is not None:
                name = f"stream {e['stream']}: {name}"
            events.append(
                _slice(
                    tid,
                    name,
                    int(e["start_ns"]),
                    e.get("dur_ns"),
                    kind,
                    {
                        **common,
                        "rank": e.get("rank"),
                        "session": e.get("session"),
                        "stream": e.get("stream"),
                        "detail": e.get("detail"),
                        "start_ns": str(e["start_ns"]),
                    },
                )
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "traceanalyzer", "version": inputs.version},
    }
