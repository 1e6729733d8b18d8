"""How the native libraries behave in the processes traceanalyzer owns: set before they load.

- **polars' allocator.** polars allocates through jemalloc, which by default keeps freed memory
  in one arena per CPU (times four) for ten seconds. The native trace reader allocates and frees
  a row group at a time, so that retention, not the data, set a worker's peak
  (docs/benchmarks/ingest.md). One arena, purged by a background thread after 100 ms, keeps the
  peak at the data without costing time. Importing polars writes its own default into the
  environment (``POLARS_IMPORT_JEMALLOC_CONF``), so a CLI started by a process that imported
  polars (a notebook's ``!traceanalyzer run``, a script, the benchmarks) inherits it: that is no
  user's choice, and ours goes before what the user added to it.
- **pyarrow's allocator.** pyarrow allocates through its bundled mimalloc by default, which
  commits whole arena chunks and keeps freed pages for reuse: a higher peak at the same speed
  (docs/benchmarks/compare.md). The system allocator hands freed pages back.
- **glibc's heap.** What the system allocator frees below its mmap threshold stays in the
  heap, scattered between live blocks, and the threshold rises with every large block freed (a
  CSV read in a stream of 4 MB batches grew the heap by three times its size). A fixed 1 MiB
  threshold maps each large buffer on its own and returns it when freed. Children read
  ``MALLOC_MMAP_THRESHOLD_`` when they start; this process has started, so :func:`configure`
  sets it with ``mallopt`` too.
- **polars' engine.** polars 2 runs a lazy query on its streaming engine unless told otherwise
  (``POLARS_ENGINE_AFFINITY``, read when polars loads). The analysis after the ingest is
  thousands of queries over frames held in memory or a few columns of a rank's tables, where
  the streaming engine's set-up costs more than it streams.
- **numpy's BLAS threads.** OpenBLAS starts a thread per core when numpy is imported, and they
  spin waiting for work for a while, taking CPU from the parse; traceanalyzer does no linear
  algebra worth threads.

The libraries read these settings once, when they load, so :func:`configure` runs at the top
of the CLI (worker processes inherit the environment). A value the user set wins, when it is
one the library takes (:data:`VALID`): a wrong one is replaced by ours, or removed where we set
none, and the CLI says so (``POLARS_MAX_THREADS=0`` makes polars panic at its first query,
far more threads than cores slow a run a hundredfold). The workers of a Ray cluster the CLI joins start from their node's environment instead, so the executor
hands them this process's values (:func:`in_effect`) with the job. A notebook that imported
polars or numpy before traceanalyzer keeps their defaults: slower and higher peaks, nothing
else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
from collections.abc import Callable

POLARS_JEMALLOC_CONF = "narenas:1,background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0"
SETTINGS = {
    "_RJEM_MALLOC_CONF": POLARS_JEMALLOC_CONF,  # the name polars' jemalloc build reads
    "ARROW_DEFAULT_MEMORY_POOL": "system",  # read once, when pyarrow loads
    "MALLOC_MMAP_THRESHOLD_": str(1 << 20),  # glibc, when a process starts
    "OPENBLAS_NUM_THREADS": "1",
    "POLARS_ENGINE_AFFINITY": "in-memory",  # read once, when polars loads
}
# what ``import polars`` (1.x-2.x) puts first in _RJEM_MALLOC_CONF, before a value already set
POLARS_IMPORT_JEMALLOC_CONF = "dirty_decay_ms:500,muzzy_decay_ms:1000"
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64 bits)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def most_threads() -> int:
    """The most threads a thread-count setting may ask for: 4 per core (more only wait)."""
    return 4 * _cores()


def _count(low: int, high: Callable[[], int]) -> Callable[[str], bool]:
    return lambda value: (
        bool(re.fullmatch(r"\s*[0-9]{1,12}\s*", value)) and (low <= int(value) <= high())
    )


def _one_of(*words: str) -> Callable[[str], bool]:
    return lambda value: value.strip().lower() in words


# The library settings the CLI reads or sets, with what each library takes: (the check, what
# it expects).
VALID: dict[str, tuple[Callable[[str], bool], str]] = {
    "POLARS_MAX_THREADS": (_count(1, most_threads), "a thread count from 1 to {most}"),
    "POLARS_ENGINE_AFFINITY": (
        _one_of("auto", "in-memory", "streaming", "gpu"),
        "auto, in-memory, streaming or gpu",
    ),
    "ARROW_DEFAULT_MEMORY_POOL": (
        _one_of("system", "jemalloc", "mimalloc"),
        "system, jemalloc or mimalloc",
    ),
    "MALLOC_MMAP_THRESHOLD_": (
        _count(0, lambda: MAX_MMAP_THRESHOLD),
        f"a size in bytes from 0 to {MAX_MMAP_THRESHOLD}",
    ),
    "OPENBLAS_NUM_THREADS": (_count(1, most_threads), "a thread count from 1 to {most}"),
}


def configure() -> list[str]:
    """Apply :data:`SETTINGS`, each unless the environment already sets it (polars' own
    jemalloc default, inherited from a parent that imported polars, is not a setting). Returns
    what was wrong: each value a library would not take (:data:`VALID`), replaced by ours or
    removed."""
    notes = _drop_invalid()
    jemalloc = os.environ.get("_RJEM_MALLOC_CONF")
    if jemalloc is not None and jemalloc.startswith(POLARS_IMPORT_JEMALLOC_CONF):
        added = jemalloc[len(POLARS_IMPORT_JEMALLOC_CONF) :].lstrip(",")
        # jemalloc reads the options in order: the last of a name wins, so the user's stay last
        mine = SETTINGS["_RJEM_MALLOC_CONF"]
        os.environ["_RJEM_MALLOC_CONF"] = mine + ("," + added if added and added != mine else "")
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)
    _mmap_threshold(os.environ["MALLOC_MMAP_THRESHOLD_"])
    return notes


def _drop_invalid() -> list[str]:
    """Remove each setting of :data:`VALID` whose value its library would not take, and say
    what takes its place."""
    notes = []
    for name, (valid, wanted) in VALID.items():
        value = os.environ.get(name)
        if value is None or valid(value):
            continue
        del os.environ[name]
        instead = f"using {SETTINGS[name]}" if name in SETTINGS else "using the library's default"
        wanted = wanted.format(most=most_threads())
        notes.append(f"{name}={value[:40]!r} is not {wanted}: ignored, {instead}")
    return notes


def in_effect() -> dict[str, str]:
    """This process's value of each of :data:`SETTINGS` (the user's, or ours once
    :func:`configure` ran): what a worker started elsewhere needs to behave alike."""
    return {name: os.environ[name] for name in SETTINGS if name in os.environ}


def _mmap_threshold(value: str) -> None:
    """This process's glibc mmap threshold (elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    # not glibc (no mallopt), no libc to load, or a value that is no number
    with contextlib.suppress(AttributeError, OSError, TypeError, ValueError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, int(value))
