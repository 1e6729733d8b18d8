"""How the native libraries behave in the processes traceanalyzer owns: set before they load.

- **polars' allocator.** polars allocates through jemalloc, which by default keeps freed memory
  in one arena per CPU (times four) for ten seconds. The native trace reader allocates and frees
  a row group at a time, so that retention, not the data, set a worker's peak: 1.7x the trace
  instead of 1.5x (docs/benchmarks/ingest.md). One arena, purged by a background thread after
  100 ms, keeps the peak at the data without costing time. Importing polars writes its own
  default into the environment (``POLARS_IMPORT_JEMALLOC_CONF``), so a CLI started by a process
  that imported polars (a notebook's ``!traceanalyzer run``, a script, the benchmarks) inherits
  it: that is no user's choice, and ours goes before what the user added to it. Inherited as
  if set, it raised the benchmark rank's peak from 1.3-1.4x the trace to 1.6-1.7x.
- **pyarrow's allocator.** pyarrow allocates through its bundled mimalloc by default, which
  commits whole arena chunks and keeps freed pages for reuse: after the ingest of the 200 MB
  benchmark rank it held 45 MB more than the system allocator, and the run's peak (the rules'
  and the overview's queries on top of what the ingest left) was 10% higher, at the same speed
  (alternated runs; docs/benchmarks/compare.md). The system allocator hands freed pages back.
- **glibc's heap.** What the system allocator frees below its mmap threshold stays in the
  heap, scattered between live blocks, and the threshold rises with every large block freed:
  parsing operator_details.csv of the 200 MB rank (40 MB, a stream of 4 MB batches) grew the
  heap by 120 MB that only ``malloc_trim`` gave back. A fixed 1 MiB threshold maps each large
  buffer on its own and returns it when freed: the ingest peaked at 257 MB instead of 305-329,
  at the same speed. Children read ``MALLOC_MMAP_THRESHOLD_`` when they start; this process
  has started, so :func:`configure` sets it with ``mallopt`` too.
- **polars' engine.** polars 2 runs a lazy query on its streaming engine unless told otherwise
  (``POLARS_ENGINE_AFFINITY``, read when polars loads). The analysis after the ingest is
  thousands of queries over frames held in memory or a few columns of a rank's tables, where
  the streaming engine's set-up costs more than it streams: a window join of 91k kernels took
  7.9 ms on it and 4.4 ms in memory, a three-step query of 16 rows 0.37 and 0.19 ms. The
  realistic benchmark rank's whole run took 3.9 s instead of 4.1 (6.1 s of CPU, 6.4 before);
  on the MoE benchmark collection the rules took 0.8 s instead of 0.9 and the overview 0.6
  instead of 0.7, at a lower peak (277 MB, 295 before); the Db twin's run and the ingest
  alone took as long (medians of alternated runs).
- **numpy's BLAS threads.** OpenBLAS starts a thread per core when numpy is imported, and they
  spin waiting for work for a while (0.1 s of a core at the import alone). traceanalyzer does no
  linear algebra worth threads, so on the 200 MB benchmark rank those spinning threads cost
  0.4 s of CPU taken from the parse on two cores; one BLAS thread costs none.

The libraries read these settings once, when they load, so :func:`configure` runs at the top
of the CLI (worker processes inherit the environment). A value the user set wins. The workers
of a Ray cluster the CLI joins start from their node's environment instead, so the executor
hands them this process's values (:func:`in_effect`) with the job. A notebook that imported
polars or numpy before traceanalyzer keeps their defaults: slower and higher peaks, nothing
else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

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


def configure() -> None:
    """Apply :data:`SETTINGS`, each unless the environment already sets it (polars' own
    jemalloc default, inherited from a parent that imported polars, is not a setting)."""
    jemalloc = os.environ.get("_RJEM_MALLOC_CONF")
    if jemalloc is not None and jemalloc.startswith(POLARS_IMPORT_JEMALLOC_CONF):
        added = jemalloc[len(POLARS_IMPORT_JEMALLOC_CONF) :].lstrip(",")
        # jemalloc reads the options in order: the last of a name wins, so the user's stay last
        mine = SETTINGS["_RJEM_MALLOC_CONF"]
        os.environ["_RJEM_MALLOC_CONF"] = mine + ("," + added if added and added != mine else "")
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)
    _mmap_threshold(os.environ["MALLOC_MMAP_THRESHOLD_"])


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
