"""``OUT/annotated/rank=R/<session>/trace_view.json``: each rank's own trace with its findings'
marks merged in, to open as is in Perfetto or MindStudio Insight.

The marks are the overlay's (:func:`~traceanalyzer.report.annotations.overlay_events`: the
"traceanalyzer findings" process, one named thread per finding), kept to the rank session of the
copy. The copy streams: the trace's bytes are copied unparsed and the overlay's events spliced in
right after the array's opening bracket. Splicing at the start rather than before the closing
``]`` keeps a truncated trace (which has none; the Chrome trace format allows that) exactly as
openable as the original. The copy is written into OUT, atomically, never next to the input.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from traceanalyzer.report.annotations import overlay_events
from traceanalyzer.report.inputs import TRACE_FILE, ReportInputs
from traceanalyzer.store import write_atomic_stream

ANNOTATED_DIR = "annotated"
# An optional BOM, then a JSON array, or an object whose first key is "traceEvents".
_OPENING = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*(?:\{\s*"traceEvents"\s*:\s*)?\[\s*')
_HEAD_BYTES = 64 * 1024
_COPY_CHUNK = 4 * 1024 * 1024


class NotAnnotatable(Exception):
    """The rank session's trace cannot be copied with the marks (says why)."""


@dataclass
class AnnotatedTrace:
    """One rank session's annotated copy (``path``), or why there is none (``skipped``)."""

    rank: int
    session: str
    path: Path | None = None
    marks: int = 0
    skipped: str | None = None


def annotated_path(out: Path, rank: int, session: str) -> Path:
    return out / ANNOTATED_DIR / f"rank={rank}" / session / TRACE_FILE.name


def splice_trace(source: Path, target: Path, events: list[dict[str, Any]]) -> None:
    """Copy ``source`` to ``target`` with ``events`` spliced in first, without parsing it."""
    with source.open("rb") as src:
        head = src.read(_HEAD_BYTES)
        opening = _OPENING.match(head)
        if opening is None:
            raise NotAnnotatable(f"{source} is not a Chrome JSON trace (no opening '[')")
        rest = head[opening.end() :]
        spliced = b",".join(json.dumps(e, separators=(",", ":")).encode() for e in events)
        # a comma after our events unless the trace's array is empty (or holds nothing yet)
        if rest[:1] not in (b"]", b""):
            spliced += b","

        def write(dst: BinaryIO) -> None:
            dst.write(head[: opening.end()])
            dst.write(spliced)
            dst.write(rest)
            shutil.copyfileobj(src, dst, _COPY_CHUNK)

        write_atomic_stream(target, write)


def write_annotated(inputs: ReportInputs) -> list[AnnotatedTrace]:
    """An annotated copy of every rank session's trace, in ``OUT/annotated/``."""
    results = []
    for (rank, session), rank_dir in sorted(inputs.session_paths().items()):
        result = AnnotatedTrace(rank, session)
        results.append(result)
        source = rank_dir / TRACE_FILE
        target = annotated_path(inputs.out, rank, session)
        if rank_dir.resolve() in target.resolve().parents:
            result.skipped = f"{target} would be inside the input {rank_dir}"
            continue
        if not source.is_file():
            result.skipped = f"no trace at {source}"
            continue
        events = overlay_events(inputs, where=(rank, session))
        try:
            splice_trace(source, target, events)
        except (NotAnnotatable, OSError) as exc:
            result.skipped = str(exc)
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
