"""``OUT/annotations.json``: the findings as a Chrome-trace overlay for Perfetto / chrome://tracing /
MindStudio Insight.

One process ("traceanalyzer findings") with one thread per finding; each of the finding's
marks is an ``X`` slice at its own time. A rule says what its marks are (``Rule.marks``, e.g.
every window of a series, beyond the evidence rows it caps); by default they are its evidence
rows. A mark with a ``track`` of its own gets a thread of its own under the finding's.
Timestamps are written exactly like torch_npu writes them (µs as a string with 3 decimals,
converted from int64 ns with integer arithmetic), on the same epoch clock, so the slices line
up with ``trace_view.json`` to the nanosecond.
"""

from __future__ import annotations

from typing import Any

from traceanalyzer.report import fmt
from traceanalyzer.report.fmt import trace_us
from traceanalyzer.report.inputs import ReportData

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


def _meta(tid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "pid": PID, "tid": tid, "name": name, "args": args}


def overlay_events(
    report: ReportData, where: tuple[int, str] | None = None
) -> list[dict[str, Any]]:
    """The overlay's events: its process, one thread per finding, the findings' marks.

    ``where`` (rank, session) keeps the marks on that rank session only, and the findings that
    have a mark there or are about that rank (what ``annotate`` merges into one rank's trace).
    """
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": PROCESS_NAME}},
        # sort first, above the trace's own processes
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_sort_index", "args": {"sort_index": -1}},
    ]
    tracks: dict[tuple[int, str | None], int] = {}

    def track(index: int, f: dict[str, Any], name: str | None) -> int:
        if (index, name) not in tracks:
            tid = tracks[index, name] = len(tracks) + 1
            label = f"[{f.get('severity')}] {f.get('name')} ({fmt.where(f)})"
            events.append(
                _meta(tid, "thread_name", {"name": label + (f": {name}" if name else "")})
            )
            events.append(_meta(tid, "thread_sort_index", {"sort_index": tid}))
        return tracks[index, name]

    arrows: dict[str, list[dict[str, Any]]] = {}  # flow id -> its ends, "s" first
    for index, f in enumerate(report.findings.get("findings", [])):
        view = report.view(f)
        if view.marks_failed is not None:  # the rule's marks function failed: say so here
            raise view.marks_failed
        marks = list(view.marks)
        if where is not None:
            marks = [m for m in marks if (m.rank, m.session) == where]
            if not marks and where[0] not in (f.get("ranks") or ()):
                continue
        track(index, f, None)  # the finding's own track comes first, even without marks
        common = {
            "rule": f.get("rule"),
            "finding": f.get("title"),
            "fingerprint": f.get("fingerprint"),
        }
        for mark in marks:
            args = {
                **common,
                "rank": mark.rank,
                "session": mark.session,
                **mark.args,
                "start_ns": str(mark.start_ns),
            }
            tid = track(index, f, mark.track)
            events.append(_slice(tid, mark.name, mark.start_ns, mark.dur_ns, mark.category, args))
            for ph, ids in (("s", mark.flows_out), ("f", mark.flows_in)):
                for flow in ids:
                    arrows.setdefault(flow, []).append(_flow(ph, flow, tid, mark.start_ns))
    # an arrow both of whose ends are here (a rank's own trace holds only its marks)
    for ends in arrows.values():
        if sorted(e["ph"] for e in ends) == ["f", "s"]:
            events += sorted(ends, key=lambda e: e["ph"] != "s")
    return events


def _flow(ph: str, flow: str, tid: int, start_ns: int) -> dict[str, Any]:
    """One end of an arrow between two marks, bound to the mark's slice at its start."""
    end = {"ph": ph, "pid": PID, "tid": tid, "name": "waits for", "cat": "chain of waits",
           "id": flow, "ts": trace_us(start_ns)}  # fmt: skip
    return {**end, "bp": "e"} if ph == "f" else end


def build_annotations(report: ReportData) -> dict[str, Any]:
    """The overlay document: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``."""
    return {
        "traceEvents": overlay_events(report),
        "displayTimeUnit": "ms",
        "otherData": {"generator": "traceanalyzer", "version": report.version},
    }
