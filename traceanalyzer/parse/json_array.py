"""Byte-level work on a trace_view.json array: event boundaries, chunk copies, truncated prefixes.

DuckDB reads one JSON array file mostly on one core; given several files it reads them in
parallel. :func:`split` copies a large array into chunk files cut at event boundaries, so a
2-core machine parses the trace in about half the time. No JSON is decoded here.

A boundary is found by a byte pattern (``}`` ``,`` ``{`` with optional whitespace), which can also
occur inside a string or a nested array. A chunk cut at such a false boundary is never valid
JSON (an unclosed string or bracket on each side), so the reader rejects it and the caller falls
back to the whole file: a wrong guess costs time, never data.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO

EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_WINDOW = 1 << 20  # bytes searched for a boundary after each cut point
_COPY_BLOCK = 8 << 20


def _read_at(src: BinaryIO, offset: int, size: int) -> bytes:
    src.seek(offset)
    return src.read(size)


def _copy_range(src: BinaryIO, dst: BinaryIO, offset: int, length: int) -> None:
    """Append ``length`` bytes of ``src`` from ``offset`` to ``dst`` (in the kernel on Linux)."""
    dst.flush()
    end = offset + length
    while offset < end:
        try:
            copied = os.copy_file_range(src.fileno(), dst.fileno(), end - offset, offset)
        except (AttributeError, OSError):  # not Linux, or across file systems on older kernels
            copied = dst.write(_read_at(src, offset, min(end - offset, _COPY_BLOCK)))
            dst.flush()
        if copied <= 0:
            raise OSError(f"short copy at byte {offset}")
        offset += copied


def copy_prefix(path: Path, cut: int, target: Path) -> None:
    """Write bytes [0, cut) of ``path`` plus a closing bracket to ``target``."""
    _write_array(path, target, 0, cut, opening=False)


def _write_array(path: Path, target: Path, begin: int, end: int, opening: bool = True) -> None:
    """Write bytes [begin, end) of ``path`` to ``target`` as a JSON array (brackets added)."""
    # Unbuffered, so the kernel copy and our own writes land in order.
    with open(path, "rb") as src, open(target, "wb", buffering=0) as out:
        if opening:
            out.write(b"[")
        _copy_range(src, out, begin, max(0, end - begin))
        out.write(b"]")


def _boundaries(src: BinaryIO, size: int, parts: int) -> list[int] | None:
    """Byte offsets where each chunk's events start, plus the end of the last event.

    None when the file does not look like an array (or has no boundary near a cut point).
    """
    head = _read_at(src, 0, 4096)
    tail_start = max(0, size - 4096)
    tail = _read_at(src, tail_start, 4096)
    first, last = head.find(b"["), tail.rfind(b"]")
    if first < 0 or last < 0 or head[:first].strip():
        return None
    starts = [first + 1]
    for i in range(1, parts):
        window_start = size * i // parts
        match = EVENT_BOUNDARY.search(_read_at(src, window_start, _WINDOW))
        if match is None:
            return None
        boundary = window_start + match.start() + 1  # just after the closing brace
        if boundary <= starts[-1]:
            return None
        starts.append(boundary)
    starts.append(tail_start + last)
    return starts


def split(path: Path, scratch: Path, parts: int) -> list[Path] | None:
    """Copy the array at ``path`` into ``parts`` chunk files under ``scratch``, each a JSON array.

    Returns the chunk paths, or None when the file cannot be cut (then read it whole). The
    chunks together hold every event once; the caller deletes them.
    """
    chunks: list[Path] = []
    try:
        with open(path, "rb") as src:
            starts = _boundaries(src, path.stat().st_size, parts)
            if starts is None:
                return None
            scratch.mkdir(parents=True, exist_ok=True)
            for i, (begin, end) in enumerate(zip(starts, starts[1:], strict=False)):
                # Drop the separator that leads every chunk but the first.
                lead = _read_at(src, begin, 64)
                begin += len(lead) - len(lead.lstrip(b", \t\r\n"))
                chunk = scratch / f"trace_view.part{i}.json"
                chunks.append(chunk)
                _write_array(path, chunk, begin, end)
        return chunks
    except OSError:  # a full disk, say: read the file whole instead
        for chunk in chunks:
            chunk.unlink(missing_ok=True)
        return None
