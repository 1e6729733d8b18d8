"""The overview's stages, derived after the rules (beside them they save no time and raise the
run's peak):

- ``summary``: per shard on the executor (the same snapshot store the rank rules read), the
  ``summary_steps``, ``summary_kernels``, ``summary_host_apis``, ``summary_collectives`` and
  ``summary_memory*`` tables of each of its ranks;
- ``summary_ranks``: one row per rank, outliers flagged, from every rank's small tables.

findings.json's ``summary.overview`` is then read from them (``document.py``).
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.overview.cluster import cluster_rows
from traceanalyzer.overview.compute import summarize_rank
from traceanalyzer.overview.memory import TABLES as MEMORY_TABLES
from traceanalyzer.overview.model import DEFAULT_TOP, TopSizes
from traceanalyzer.stages import Stage, declare
from traceanalyzer.store import Store


def top_sizes(sizes: TopSizes | None) -> TopSizes:
    """The top-N sizes of the run (``run --top-kernels/--top-apis/--top-collectives``)."""
    return sizes or DEFAULT_TOP


def derive_summary(store: Store, ranks: list[int], sizes: TopSizes) -> dict[str, pl.DataFrame]:
    """The summary tables of ``ranks``, each rank's derived on its own."""
    by_table: dict[str, list[pl.DataFrame]] = {}
    for rank in ranks:
        for table, frame in summarize_rank(store, rank, sizes).items():
            by_table.setdefault(table, []).append(frame.with_columns(rank=pl.lit(rank, pl.Int32)))
    return {table: pl.concat(parts, how="diagonal_relaxed") for table, parts in by_table.items()}


def derive_summary_ranks(store: Store, ranks: list[int], params: None) -> pl.DataFrame:
    """One row per rank of the store, outliers among them flagged."""
    return cluster_rows(
        store.table("summary_steps").collect(), store.table("summary_kernels").collect()
    )


SUMMARY = declare(
    Stage(
        name="summary",
        tables=(
            "summary_steps",
            "summary_kernels",
            "summary_host_apis",
            "summary_collectives",
            *MEMORY_TABLES,
        ),
        derive=derive_summary,
        inputs=(
            "sessions",
            "slices",
            "flows",
            "kernels",
            "step_times",
            "comm_ops",
            "memory_records",
            "op_memory",
            "module_memory",
            "steps",
            "launches",
            "exchanges",
        ),
        params=top_sizes,
    )
)
SUMMARY_RANKS = declare(
    Stage(
        name="summary_ranks",
        tables=("summary_ranks",),
        derive=derive_summary_ranks,
        inputs=("summary_steps", "summary_kernels"),
        scope="run",
    )
)
