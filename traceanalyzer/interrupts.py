"""The user's Ctrl-C, told apart from code that raises what Ctrl-C raises.

Rule code (a rule, its figure, a fixture) runs in the run's own process. When it raises
``SystemExit``, ``KeyboardInterrupt`` or any other ``BaseException``, that is the rule's own
failure: it is reported as the rule's error and the run goes on (partial, every report written).
Only the user's Ctrl-C ends the run: :func:`install` puts a SIGINT handler in place that notes
the signal before it raises ``KeyboardInterrupt``, so :func:`contained` can tell the two apart.
Without the handler (a notebook, a library caller), every ``KeyboardInterrupt`` is taken for
the user's.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_received = threading.Event()
_installed = threading.Event()


def on_signal(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: the user asked to stop."""
    _received.set()
    raise KeyboardInterrupt


@contextmanager
def installed() -> Iterator[None]:
    """Within the block, SIGINT is noted before it raises (in the main thread; elsewhere, and
    where the platform cannot, nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, on_signal)
    _received.clear()
    _installed.set()
    try:
        yield
    finally:
        _installed.clear()
        signal.signal(signal.SIGINT, previous)


def install() -> None:
    """SIGINT noted before it raises, for good (a worker process's initializer)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        _installed.set()


def contained(exc: BaseException) -> bool:
    """Whether ``exc``, raised by rule code, is that code's own failure (to report, and go on)
    rather than the user's Ctrl-C (to let through)."""
    if isinstance(exc, KeyboardInterrupt):
        return _installed.is_set() and not _received.is_set()
    return True
