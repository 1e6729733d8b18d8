"""Byte-level work on a trace_view.json array: event boundaries, chunk copies, damaged files.

DuckDB reads one JSON array file mostly on one core; given several files it reads them in
parallel. :func:`split` copies a large array into chunk files cut at event boundaries, so a
2-core machine parses the trace in about half the time. For a damaged file, the parser copies
prefixes (:func:`copy_prefix`), ranges of events (:func:`copy_events`, :func:`boundary_near`) or
a UTF-8-clean copy (:func:`copy_as_utf8`). No JSON is decoded here.

A boundary is found by a byte pattern (``}`` ``,`` ``{`` with optional whitespace), which can also
occur inside a string or a nested array. A chunk cut at such a false boundary is never valid
JSON (an unclosed string or bracket on each side), so the reader rejects it and the caller falls
back to the whole file: a wrong guess costs time, never data.
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path
from typing import BinaryIO

EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_SEPARATOR = b", \t\r\n"  # what may lead an event after a boundary
_PADDING = b" \t\r\n\x00"  # what may follow the closing bracket (a crash can leave NULs)
_PAD_BLOCK = 1 << 16
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


def event_start(src: BinaryIO, offset: int) -> int:
    """``offset`` moved past the separator (a comma, whitespace) that may lead an event there."""
    lead = _read_at(src, offset, 64)
    return offset + len(lead) - len(lead.lstrip(_SEPARATOR))


def copy_prefix(path: Path, cut: int, target: Path) -> None:
    """Write bytes [0, cut) of ``path`` plus a closing bracket to ``target``."""
    _write_array(path, target, 0, cut, opening=False)


def copy_events(path: Path, begin: int, end: int, target: Path) -> None:
    """Write the events in bytes [begin, end) of ``path`` to ``target`` as a JSON array.

    ``begin`` may sit on the separator before an event (as returned by :func:`boundary_near`).
    """
    with open(path, "rb") as src:
        begin = event_start(src, begin)
    _write_array(path, target, begin, end)


def boundary_near(path: Path, begin: int, end: int) -> int | None:
    """The event boundary strictly inside (begin, end) nearest its middle; None if there is none.

    The offset returned is just after an event's closing brace, as in :func:`split`. Only a
    window around the middle is read, so a long range costs no more than a short one.
    """
    mid = (begin + end) // 2
    low, high = max(begin, mid - _WINDOW), min(end, mid + _WINDOW)
    with open(path, "rb") as src:
        window = _read_at(src, low, high - low)
    inside = [
        low + m.start() + 1
        for m in EVENT_BOUNDARY.finditer(window)
        if begin < low + m.start() + 1 < end
    ]
    return min(inside, key=lambda offset: abs(offset - mid)) if inside else None


def array_body(path: Path) -> tuple[int, int, bool] | None:
    """Where the events of the array in ``path`` lie: (first byte after ``[``, end, closed).

    ``end`` is the closing bracket when the array has one (followed by nothing but whitespace or
    NUL padding, as a crash can leave), else the end of the file (a truncated array). None when
    the file does not start with ``[``.
    """
    size = path.stat().st_size
    with open(path, "rb") as src:
        head = _read_at(src, 0, 4096)
        first = head.find(b"[")
        if first < 0 or head[:first].strip():
            return None
        last = size  # one past the last byte that is not padding
        while last > 0:
            block_start = max(0, last - _PAD_BLOCK)
            kept = _read_at(src, block_start, last - block_start).rstrip(_PADDING)
            if kept:
                last = block_start + len(kept)
                break
            last = block_start
        closing = _read_at(src, last - 1, 1) if last > first + 1 else b""
    if closing == b"]":
        return first + 1, last - 1, True
    return first + 1, size, False


def padding_note(path: Path) -> str | None:
    """The note for what follows the array's closing bracket in ``path`` when it is more than
    whitespace (NUL padding, as a crash can leave): both readers read past it, and say so in
    the same words. None for a file without such padding."""
    body = array_body(path)
    size = path.stat().st_size
    if body is None or not body[2] or body[1] + 1 >= size:
        return None
    at = body[1] + 1
    with open(path, "rb") as src:
        while at < size:  # stops at the first NUL: a crash's padding starts with them
            block = _read_at(src, at, _PAD_BLOCK)
            if block.strip(b" \t\r\n"):
                return (
                    f"{path}: {size - body[1] - 1} byte(s) after the closing bracket ignored "
                    "(NUL padding or whitespace, as a crash can leave)"
                )
            at += len(block) or size
    return None


def copy_as_utf8(path: Path, target: Path) -> int:
    """Copy ``path`` to ``target`` with each invalid UTF-8 sequence replaced by U+FFFD.

    Returns how many were replaced. Streams in blocks, so memory stays small.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    replaced = 0
    with open(path, "rb") as src, open(target, "w", encoding="utf-8", newline="") as out:
        while block := src.read(_COPY_BLOCK):
            text = decoder.decode(block)
            replaced += text.count("\ufffd") - block.count("\ufffd".encode())
            out.write(text)
        text = decoder.decode(b"", final=True)
        replaced += text.count("\ufffd")
        out.write(text)
    return replaced


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
                begin = event_start(src, begin)  # the separator that leads all but the first
                chunk = scratch / f"trace_view.part{i}.json"
                chunks.append(chunk)
                _write_array(path, chunk, begin, end)
        return chunks
    except OSError:  # a full disk, say: read the file whole instead
        for chunk in chunks:
            chunk.unlink(missing_ok=True)
        return None
