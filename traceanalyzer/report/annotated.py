"""``OUT/annotated/rank=R/<session>/trace_view.json``: each rank session's timeline with its
findings' marks merged in, to open as is in Perfetto or MindStudio Insight.

The timeline is rebuilt from the store (:mod:`~traceanalyzer.store_trace`), so every
session gets one, whatever it was read from: a Text export's trace, a Db export (which has no
trace_view.json), a damaged trace's salvaged events. It is handed over as
:attr:`ReportData.timelines <traceanalyzer.report.inputs.ReportData.timelines>`, each
session's events streamed as they are written. The marks are the overlay's
(:func:`~traceanalyzer.report.annotations.overlay_events`: the "traceanalyzer findings" process,
one named thread per finding), kept to the rank session. The file streams into OUT,
atomically, never next to the input.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from traceanalyzer.interrupts import contained
from traceanalyzer.report.annotations import overlay_events
from traceanalyzer.report.inputs import TRACE_FILE, ReportData
from traceanalyzer.store import write_atomic_stream
from traceanalyzer.store_trace import write_trace

ANNOTATED_DIR = "annotated"


@dataclass
class AnnotatedTrace:
    """One rank session's annotated timeline (``path``), or why there is none (``skipped``)."""

    rank: int
    session: str
    path: Path | None = None
    marks: int = 0
    skipped: str | None = None


def annotated_path(out: Path, rank: int, session: str) -> Path:
    return out / ANNOTATED_DIR / f"rank={rank}" / session / TRACE_FILE.name


def write_annotated(report: ReportData) -> list[AnnotatedTrace]:
    """An annotated timeline of every rank session, in ``OUT/annotated/``."""
    results = []
    for (rank, session), timeline in report.timelines.items():
        result = AnnotatedTrace(rank, session)
        results.append(result)
        target = annotated_path(report.out, rank, session)
        try:
            events = overlay_events(report, where=(rank, session))
        except BaseException as exc:  # a rule's marks, over a finding's values: rule code
            if not contained(exc):
                raise
            result.skipped = f"a finding's marks failed ({type(exc).__name__}: {exc})"
            continue
        try:
            write_atomic_stream(target, partial(write_trace, extra=events, events=timeline))
        except OSError as exc:
            result.skipped = f"cannot write {target}: {exc.strerror or exc}"
            continue
        result.path = target
        result.marks = sum(e["ph"] == "X" for e in events)
    return results


def annotated_text(results: list[AnnotatedTrace], out: Path) -> str:
    """What ``annotate`` and ``run --annotate`` print: where the copies are, what was skipped."""
    written = [r for r in results if r.path is not None]
    lines = [f"not annotated: rank {r.rank} {r.session}: {r.skipped}" for r in results if r.skipped]
    marks = sum(r.marks for r in written)
    lines.append(
        f"annotated traces: {out / ANNOTATED_DIR} ({len(written)} rank session(s), "
        f"{marks} mark(s); open a trace_view.json in Perfetto or MindStudio Insight)"
    )
    return "\n".join(lines)
