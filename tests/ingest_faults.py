"""Test-only faults in ingest, which the product has no path for: the worker ingesting a rank
dies by SIGKILL (as the kernel's OOM killer kills it) or blocks (as a read stuck in a library
does).

:func:`arm` sets them for this process and the ones it starts: the variables name the rank
(``KILL_RANK``, ``HANG_RANK``; with ``ONCE`` a file, the kill happens only while it does not
exist, and creates it), and ``PYTHONPATH`` gains ``ingest_faults_site``, whose sitecustomize
wraps ``ingest_session`` in every Python process that imports it (a process pool's workers,
Ray's, a run in a subprocess); :func:`environment` gives those variables for an environment of
its own (a subprocess, Ray's ``runtime_env``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

KILL_RANK = "TRACEANALYZER_FAULT_KILL_RANK"
ONCE = "TRACEANALYZER_FAULT_ONCE"
HANG_RANK = "TRACEANALYZER_FAULT_HANG_RANK"
SITE = Path(__file__).with_name("ingest_faults_site")
TARGET = "traceanalyzer.ingest.session"


def environment(
    kill_rank: int | None = None, once: Path | None = None, hang_rank: int | None = None
) -> dict[str, str]:
    """The variables that arm the faults in a process started with them."""
    faults = {KILL_RANK: kill_rank, ONCE: once, HANG_RANK: hang_rank}
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path} | {k: str(v) for k, v in faults.items() if v is not None}


def arm(monkeypatch: pytest.MonkeyPatch, **faults: Any) -> None:
    """Arm ``faults`` (:func:`environment`'s) here and in every process started from here."""
    install()
    for name, value in environment(**faults).items():
        monkeypatch.setenv(name, value)


def install() -> None:
    """Wrap ``ingest_session`` now, or as soon as its module is imported."""
    module = sys.modules.get(TARGET)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _OnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnImport())


class _OnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


def _wrap(module: Any) -> None:
    real = module.ingest_session
    if getattr(real, "faulty", False):
        return

    @functools.wraps(real)
    def ingest_session(session: Any, *args: Any, **kwargs: Any) -> Any:
        _strike(session.rank)
        return real(session, *args, **kwargs)

    ingest_session.faulty = True  # type: ignore[attr-defined]
    module.ingest_session = ingest_session


def _strike(rank: int) -> None:
    if os.environ.get(HANG_RANK) == str(rank):
        threading.Event().wait()  # never set: blocks, the GIL released, as a stuck read does
    if os.environ.get(KILL_RANK) != str(rank):
        return
    once = os.environ.get(ONCE)
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
