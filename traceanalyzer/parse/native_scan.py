"""The native scanner's pass over trace_view.json, in the libraries' absence: byte ranges,
blocks, the scanner's raw columns; and a scan started ahead, while a run loads its libraries.

:mod:`traceanalyzer.parse.trace_native` makes frames of the raw columns (polars, pyarrow). This
module imports neither, so a run that will parse one large trace can start scanning it before
it has loaded them (:func:`scan_ahead`): on two cores the scan then takes the core that the
imports, about 0.4 s of one core, leave idle.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceanalyzer.parse.json_array import array_body, boundary_near, event_start
from traceanalyzer.parse.trace_shared import ARG_COLUMNS

try:
    from traceanalyzer.parse._trace_scan import Scanner, args_text
except ImportError:  # built without a C compiler: the DuckDB path does everything
    Scanner = args_text = None

_BLOCK_BYTES = 8 << 20  # read per step: the memory a scan holds besides its columns
_PARALLEL_MIN_BYTES = 32 << 20  # below this one scanner is as fast as several
_NEAR = 1 << 20  # how far from an equal share a range may be cut


class NativeUnreadable(Exception):
    """The scanner does not read this file (damaged, or not the shape torch_npu writes)."""


def available() -> bool:
    """True when the scanner is built and not turned off (TRACEANALYZER_NATIVE=0)."""
    return Scanner is not None and os.environ.get("TRACEANALYZER_NATIVE", "1") != "0"


def unavailable_note() -> str | None:
    """Why traces are read by the slower DuckDB reader in this install, or None."""
    if Scanner is None:
        return (
            "trace_view.json: the native scanner is not built (no C compiler or Python headers "
            "at install), so DuckDB reads traces, about 2x slower; reinstall with one to speed "
            "up the ingest"
        )
    if not available():
        return "trace_view.json: the native scanner is turned off (TRACEANALYZER_NATIVE=0)"
    return None


# What the scanner hands over for one byte range: per table, its columns as Arrow buffers.
RawTables = dict[str, dict[str, tuple[Any, ...]]]
# inode, size, mtime: a file changed since it was scanned is not read as if it were not
Identity = tuple[int, int, int]


def stat_identity(stat: os.stat_result) -> Identity:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def identity(path: Path) -> Identity:
    return stat_identity(path.stat())


def feed(path: Path, begin: int, end: int, wrap: bool) -> RawTables:
    """The raw tables of bytes [begin, end) of ``path``; with ``wrap``, read as an array of their
    events. The scanner runs without the GIL, so ranges scan side by side; its columns grow in
    place and are handed over once. The file is read block by block into one buffer, the event
    torn at a block's end moved to its start: no block is copied. The slices' args are
    located (``trace_native.FileArgs`` reads them), not copied."""
    scanner = Scanner(ARG_COLUMNS)
    buffer = bytearray(_BLOCK_BYTES)
    kept = 0  # bytes at the buffer's start not scanned yet: "[", or an event torn at its end
    at = begin  # the file offset of the buffer's first byte
    if wrap:
        buffer[0], kept, at = ord("["), 1, begin - 1
    with open(path, "rb") as fh:
        fh.seek(begin)
        left, final = end - begin, False
        while not final:
            if kept + 1 >= len(buffer):  # an event longer than the buffer (and room for "]")
                buffer.extend(bytes(len(buffer)))
            with memoryview(buffer) as view:
                room = min(len(buffer) - kept - 1, left)
                got = fh.readinto(view[kept : kept + room]) if room else 0
                left -= got
                filled, final = kept + got, not got
                if final and wrap:
                    view[filled], filled = ord("]"), filled + 1
                try:
                    consumed = scanner.feed(view[:filled], final, at)
                except ValueError as exc:
                    raise NativeUnreadable(
                        f"{path}: {exc} (of the range from byte {begin})"
                    ) from exc
            kept = filled - consumed
            buffer[:kept] = buffer[consumed:filled]
            at += consumed
    return scanner.take()


def ranges(path: Path, parts: int) -> list[tuple[int, int, bool]]:
    """Byte ranges scanned side by side: cut at event boundaries near equal shares."""
    size = path.stat().st_size
    body = array_body(path) if parts > 1 and size >= _PARALLEL_MIN_BYTES else None
    if body is None or not body[2]:
        return [(0, size, False)]
    cuts = [body[0]]
    for i in range(1, parts):
        # shares of the array's body, not of the file: NUL padding after it (a crash) is no share
        middle = body[0] + (body[1] - body[0]) * i // parts
        begin, end = max(cuts[-1], middle - _NEAR), min(body[1], middle + _NEAR)
        cut = boundary_near(path, begin, end) if begin < end else None
        if cut is None or cut <= cuts[-1]:
            return [(0, size, False)]
        cuts.append(cut)
    cuts.append(body[1])
    with open(path, "rb") as fh:
        return [
            (event_start(fh, begin), end, True) for begin, end in zip(cuts, cuts[1:], strict=False)
        ]


def scan_raw(path: Path, threads: int) -> list[RawTables]:
    """The raw tables of ``path``, a byte range per core on up to ``threads`` cores.

    A cut that falls inside a string (the boundary pattern can occur there) fails one range;
    the file is then scanned whole before giving up.
    """
    parts = ranges(path, threads)
    try:
        with ThreadPoolExecutor(len(parts)) as pool:
            return list(pool.map(lambda r: feed(path, *r), parts))
    except NativeUnreadable:
        if len(parts) == 1:
            raise
        return [feed(path, 0, path.stat().st_size, False)]


# ------------------------------------------------------------------ the scan ahead of a run


@dataclass
class _Ahead:
    identity: Identity
    done: threading.Event = field(default_factory=threading.Event)
    tables: list[RawTables] | None = None  # None: it failed (the parse then scans, and says why)


_AHEAD: dict[Path, _Ahead] = {}
_AHEAD_LOCK = threading.Lock()


def scan_ahead(path: Path, threads: int) -> None:
    """Start scanning ``path`` on a thread of its own; :func:`take_ahead` hands the result to
    the parse. A daemon thread: a run that stops before its parse does not wait for it."""
    if not available():
        return
    try:
        ahead = _Ahead(identity(path))
    except OSError:
        return

    def scan() -> None:
        try:
            ahead.tables = scan_raw(path, threads)
        except Exception:  # noqa: BLE001 - the parse scans again and reports what is wrong
            ahead.tables = None
        finally:
            ahead.done.set()

    with _AHEAD_LOCK:
        _AHEAD[path.resolve()] = ahead
    threading.Thread(target=scan, name="scan-ahead", daemon=True).start()


def take_ahead(path: Path) -> tuple[list[RawTables], Identity] | None:
    """The raw tables of ``path`` scanned ahead, and the identity they were scanned at; None
    when it was not scanned ahead, the scan failed, or the file changed since."""
    with _AHEAD_LOCK:
        ahead = _AHEAD.pop(path.resolve(), None)
    if ahead is None:
        return None
    ahead.done.wait()
    try:
        unchanged = identity(path) == ahead.identity
    except OSError:
        return None
    if ahead.tables is None or not unchanged:
        return None
    return ahead.tables, ahead.identity


def drop_ahead() -> None:
    """Forget every scan started ahead and not taken (the ingest is over: none will be)."""
    with _AHEAD_LOCK:
        _AHEAD.clear()
