"""The output directory: where it may be, who writes it, and what a failure to write it means.

- ``--out`` is refused inside the input root or inside the real path of any rank directory (a
  symlinked rank dir is resolved): traceanalyzer never writes into its input.
- One run at a time writes an output directory: :func:`locked` holds an ``fcntl`` lock on
  ``OUT/.lock`` for the run (the file says which run: its pid and start time); a second run
  says it waits, waits :data:`LOCK_WAIT_SECONDS` (``run --lock-wait``), then refuses.
- ``OUT`` is the product's own (:func:`check_own`): a link, a FIFO, a socket or a device
  anywhere in it was not made by traceanalyzer, which would follow, block on or write through
  it; the run refuses such an ``OUT`` with what it found, before it reads or writes there.
- A write that fails (disk full, read-only, permissions) is an :class:`OutputError`, which blames
  the output, never the input; ``run`` exits with its own code for it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from traceanalyzer.printable import valid_text

LOCK_FILE = ".lock"
LOCK_WAIT_SECONDS = 5.0
# errno values that only writing can cause: reading an input never runs out of space.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
_WRITE_TEXTS = tuple(os.strerror(e) for e in _WRITE_ERRNOS)
_NOFOLLOW, _NONBLOCK = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_NONBLOCK", 0)  # POSIX

# Output dirs this process has locked, with their lock's fd (None: not yet taken, or no locks).
_held: dict[Path, int | None] = {}


class OutputRefused(Exception):
    """``--out`` cannot be used at all (inside the input, under a file, locked by another run,
    not writable): a usage error, found before any work."""


class OutputError(Exception):
    """Writing the output failed during the run (disk full, permissions changed, ...)."""


def _inside(path: Path, container: Path) -> bool:
    return path == container or container in path.parents


def check_out(out: Path, root: Path, rank_dirs: Iterable[Path] = ()) -> None:
    """Refuse ``out`` inside the input ``root`` or the real path of any of ``rank_dirs``, or
    named with bytes that are not UTF-8 (the store's libraries take names as UTF-8 text)."""
    target = out.resolve()
    if valid_text(str(target)) != str(target):
        raise OutputRefused(
            f"--out {valid_text(str(target))}: its name is not UTF-8 text (written \\xNN here), "
            "which the store's files need; choose another --out"
        )
    for protected in (root, *rank_dirs):
        real = protected.resolve()
        if _inside(target, real):
            what = "the input" if protected == root else f"the rank directory {protected}"
            raise OutputRefused(
                f"--out {target} is inside {what} ({real}); traceanalyzer never writes into its input"
            )
    if out.exists() and not out.is_dir():
        raise OutputRefused(f"--out {out} exists and is not a directory")


def check_own(out: Path) -> None:
    """Refuse ``out`` when something in it is not what traceanalyzer makes (a directory or a
    regular file): a symbolic link (the store would write through it, into the input or another
    store), a FIFO (a read would wait forever), a socket or a device. Entries are looked at,
    never followed or opened; the walk keeps its own stack (any depth)."""
    stack = [out]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise OutputRefused(f"--out {out}: cannot read {folder}: {failure_text(exc)}") from exc
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif not entry.is_file(follow_symlinks=False):
                raise _foreign(out, Path(entry.path))


def _foreign(out: Path, path: Path) -> OutputRefused:
    """The refusal of an output directory that holds ``path``, which traceanalyzer never makes."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        kind = f"a symbolic link to {os.readlink(path)}"
    elif stat.S_ISFIFO(mode):
        kind = "a FIFO"
    else:
        kind = "a socket" if stat.S_ISSOCK(mode) else "a device"
    return OutputRefused(
        f"--out {out} holds {path}, {kind}: traceanalyzer never makes one, so this is not its "
        "output as it left it; remove it, or choose another --out"
    )


def open_own(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of ``path``, a regular file of the output directory: never a link followed
    (``O_NOFOLLOW``), never a FIFO waited on (opened without blocking, then checked)."""
    fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK, mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def read_own(path: Path) -> bytes:
    """The bytes of ``path``, a regular file of the output directory (see :func:`open_own`)."""
    fd = open_own(path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def failure_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"


def is_output_failure(exc: BaseException, out: Path) -> bool:
    """Whether ``exc`` (or what caused it) is a failure to write ``out``: an errno only writing
    causes, an OSError on a path inside ``out``, or a library's message saying so (DuckDB
    reports a full disk as text)."""
    resolved = out.resolve()
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            if seen.errno in _WRITE_ERRNOS:
                return True
            if seen.filename and _inside(Path(os.path.abspath(seen.filename)), resolved):
                return True
        if any(text in str(seen) for text in _WRITE_TEXTS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def writes(out: Path) -> Iterator[None]:
    """Turn an OSError raised while writing ``out`` into an :class:`OutputError`."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"cannot write the output {out}: {failure_text(exc)}") from exc


def prepare(out: Path) -> None:
    """Create ``out`` (and its parents), or say why it cannot be an output directory."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputRefused(f"--out {out} cannot be created: {failure_text(exc)}") from exc
    if not os.access(out, os.W_OK | os.X_OK):
        raise OutputRefused(f"--out {out} is not writable")


@contextlib.contextmanager
def held_for(out: Path) -> Iterator[None]:
    """Within this block, the lock of ``out`` once taken (by :func:`locked`, e.g. by the ingest
    after it has checked ``out``) is kept until the block ends: rules and reports run under the
    same lock as the ingest, and ``out`` is not created before it was checked."""
    key = out.resolve()
    if key in _held:
        yield
        return
    _held[key] = None
    try:
        yield
    finally:
        if (fd := _held.pop(key)) is not None:
            os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def locked(
    out: Path, wait: float = LOCK_WAIT_SECONDS, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Create ``out`` if need be and hold its lock for the block (or for the enclosing
    :func:`held_for`); re-entrant in a process. Waits up to ``wait`` seconds for another run to
    finish (saying so to ``on_wait``, with that run's pid and start time), then raises
    :class:`OutputRefused`."""
    prepare(out)
    key = out.resolve()
    if _held.get(key) is not None:
        yield
        return
    fd = _lock(out, key / LOCK_FILE, wait, on_wait)
    try:
        check_own(out)  # under the lock: no other run is writing it now
    except OutputRefused:
        if fd is not None:
            os.close(fd)
        raise
    scoped = key in _held
    _held[key] = fd
    if scoped:  # the enclosing held_for releases it
        yield
        return
    try:
        yield
    finally:
        del _held[key]
        if fd is not None:
            os.close(fd)


def _holder(fd: int) -> str:
    """The run that holds the lock, as its lock file says: ``pid 1234, started 10:41:07``."""
    text = os.pread(fd, 4096, 0).decode(errors="replace")
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']}, started {holder['started']}"
    except (ValueError, TypeError, KeyError):  # written by an older version: its pid alone
        return f"pid {text.strip() or '?'}"


def _lock(out: Path, path: Path, wait: float, on_wait: Callable[[str], None] | None) -> int | None:
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one run at a time is then on the user
        return None
    try:
        fd = open_own(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EINVAL):  # a link, or not a regular file
            raise _foreign(out, path) from exc
        raise OutputRefused(f"--out {out} is not writable: {failure_text(exc)}") from exc
    deadline = time.monotonic() + wait
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                raise OutputRefused(
                    f"--out {out} is in use by another traceanalyzer run ({holder}); waited "
                    f"{wait:g} s: let it finish (--lock-wait SECONDS waits longer), or choose "
                    "another --out"
                ) from None
            if on_wait is not None and not said:
                on_wait(
                    f"waiting up to {wait:g} s (--lock-wait) for another traceanalyzer run to "
                    f"finish with --out {out} ({_holder(fd)})"
                )
                said = True
            time.sleep(0.1)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "started": started}).encode(), 0)
    return fd
