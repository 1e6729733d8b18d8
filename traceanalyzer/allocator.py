"""Settings for polars' memory allocator in the processes traceanalyzer owns.

polars allocates through jemalloc, which by default keeps freed memory in one arena per CPU
(times four) for ten seconds. The native trace reader allocates and frees a row group at a
time, so that retention, not the data, set a worker's peak: 1.7x the trace instead of 1.5x
(docs/benchmarks/ingest.md). One arena, purged by a background thread after 100 ms, keeps the
peak at the data without costing time.

jemalloc reads the setting once, when polars is first imported, so :func:`configure` runs at
the top of the CLI (and worker processes inherit it). A value the user set wins. A notebook that
imported polars before traceanalyzer keeps the defaults: its parses peak higher, nothing else.
"""

from __future__ import annotations

import os

POLARS_JEMALLOC_CONF = "narenas:1,background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0"
_VARIABLE = "_RJEM_MALLOC_CONF"  # the name polars' jemalloc build reads


def configure() -> None:
    """Apply :data:`POLARS_JEMALLOC_CONF` unless the environment already sets one."""
    os.environ.setdefault(_VARIABLE, POLARS_JEMALLOC_CONF)
