"""Start scanning a run's one large trace before the libraries load.

A run spends its first 0.35-0.5 s on one core, importing polars, pyarrow and the engine. When
this process is about to parse exactly one large trace_view.json with the native scanner, the
scan can take the other core meanwhile (:func:`~traceanalyzer.parse.native_scan.scan_ahead`);
the parse takes the result over, or scans again if the file changed since. On the 200 MB
benchmark rank that is 0.2-0.4 s of the run, less on a loaded machine (docs/benchmarks/compare.md).

Only when nothing else could read the file first: one rank session, exported as Text only
(a Db is read instead of its trace), parsed in this process (the local executor, or ``auto``
with one task), into an output folder with no store yet (a re-run may have it cached). Any
other run is left to the ingest as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from traceanalyzer.discover import TRACE_FILE, only_session
from traceanalyzer.parse import native_scan

# Below this a scan takes milliseconds: nothing to overlap.
MIN_TRACE_BYTES = 32 << 20
IN_PROCESS_EXECUTORS = ("auto", "local")


def start(path: str | os.PathLike[str], out: Path, *, executor: str, force: bool) -> None:
    """Start the scan of the trace that :func:`traceanalyzer.ingest.ingest` will parse first,
    if it will parse it in this process and nothing it holds already stands in for it."""
    if executor not in IN_PROCESS_EXECUTORS or not native_scan.available():
        return
    try:
        if not force and out.is_dir() and any(out.iterdir()):
            return
        session = only_session(path)
        if session is None or "db" in session.formats:
            return
        trace = session.output_dir / TRACE_FILE
        if not session.readable(trace) or trace.stat().st_size < MIN_TRACE_BYTES:
            return
    except Exception:  # noqa: BLE001 - the ingest looks again, and says what is wrong
        return
    native_scan.scan_ahead(trace, os.cpu_count() or 1)
