"""Compute the overview of a store: one task per shard on the executor, then the cluster rows.

- **map**: :func:`overview_shard` runs in a worker on a shard of the store (a rank, or a rank
  group: the same :class:`~traceanalyzer.store.RankStore` the rank rules read) and writes its
  ``summary_steps``/``summary_kernels``/``summary_host_apis``/``summary_collectives``
  partitions; only a row count comes back.
- **reduce**, in the driver: ``summary_ranks`` (one row per rank, outliers flagged) from the
  small per-rank tables, and the ``summary.overview`` section of findings.json.

A shard whose inputs, the overview's code and the top-N sizes are unchanged since the last run
is not recomputed (``OUT/.cache/overview/rank=R.key``, ``group=LO-HI.key``), like the rules'
per-shard cache.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.codekey import code_key
from traceanalyzer.overview.cluster import cluster_rows
from traceanalyzer.overview.compute import DEFAULT_TOP, TopSizes, summarize_rank
from traceanalyzer.overview.memory import TABLES as MEMORY_TABLES
from traceanalyzer.store import (
    TABLES_DIR,
    RankStore,
    Store,
    load_manifest,
    rank_shards,
    remove_stale_shards,
    shard_fingerprints,
    shard_label,
    write_atomic_text,
    write_derived_table,
)

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor

CACHE_DIR = Path(".cache") / "overview"
RANK_TABLES = (
    "summary_steps",
    "summary_kernels",
    "summary_host_apis",
    "summary_collectives",
    *MEMORY_TABLES,
)
CLUSTER_TABLE = "summary_ranks"


def overview_shard(store_root: str, shard: tuple[int, ...], sizes: Mapping[str, int]) -> int:
    """The worker task: the summary tables of a shard's ranks (one rank, or a rank group),
    written into the store; returns their rows."""
    root = Path(store_root)
    store, top = RankStore(root, shard), TopSizes(**sizes)
    by_table: dict[str, list[pl.DataFrame]] = {}
    for rank in shard:
        for table, frame in summarize_rank(store, rank, top).items():
            by_table.setdefault(table, []).append(frame.with_columns(rank=pl.lit(rank, pl.Int32)))
    frames = {table: pl.concat(parts, how="diagonal_relaxed") for table, parts in by_table.items()}
    for table, frame in frames.items():
        write_derived_table(root, table, shard, frame)
    return sum(f.height for f in frames.values())


def _code_digest() -> str:
    """The key of the code the overview's task runs: its whole import closure in the package
    (the steps, ``classify_gaps``, the kit's MoE verdict it reads)."""
    return code_key(__name__)


def _shard_keys(
    shards: list[tuple[int, ...]], sessions: Mapping[str, Any], sizes: TopSizes
) -> dict[tuple[int, ...], str]:
    code = _code_digest()
    keys = {}
    for shard in shards:
        inputs = shard_fingerprints(sessions, shard)
        if inputs:
            doc = {"code": code, "inputs": inputs, "sizes": asdict(sizes)}
            keys[shard] = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return keys


def _key_path(root: Path, shard: tuple[int, ...]) -> Path:
    return root / CACHE_DIR / f"{shard_label(shard)}.key"


def _cached(root: Path, shard: tuple[int, ...], key: str) -> bool:
    try:
        stored = _key_path(root, shard).read_text("utf-8")
    except OSError:
        return False
    return stored == key and (root / TABLES_DIR / "summary_steps" / shard_label(shard)).is_dir()


def summarize_store(
    out: str | Path, executor: Executor, sizes: TopSizes = DEFAULT_TOP, *, cache: bool = True
) -> dict[str, Any]:
    """Bring the store's summary tables up to date; returns what failed, by rank."""
    from traceanalyzer.engine.runner import store_ranks
    from traceanalyzer.executor import TaskCrashed

    root = Path(out)
    ranks = store_ranks(Store.open(root))
    sessions = load_manifest(root).sessions
    shards = rank_shards(root, ranks, sessions)
    keys = _shard_keys(shards, sessions, sizes) if cache else {}
    todo = [shard for shard in shards if not (shard in keys and _cached(root, shard, keys[shard]))]
    failed: dict[int, str] = {}
    tasks = [(str(root), shard, asdict(sizes)) for shard in todo]
    for index, result in executor.map(overview_shard, tasks):
        shard = todo[index]
        if isinstance(result, TaskCrashed):  # say so, and show nothing stale for the ranks
            failed.update(dict.fromkeys(shard, str(result)))
            _key_path(root, shard).unlink(missing_ok=True)
            for table in RANK_TABLES:
                shutil.rmtree(root / TABLES_DIR / table / shard_label(shard), ignore_errors=True)
        elif shard in keys:
            write_atomic_text(_key_path(root, shard), keys[shard])
    for table in (*RANK_TABLES, CLUSTER_TABLE):  # ranks no longer in the store, or regrouped
        remove_stale_shards(root, table, shards)
    store = Store.open(root)
    rows = cluster_rows(
        store.table("summary_steps").collect(), store.table("summary_kernels").collect()
    )
    shutil.rmtree(root / TABLES_DIR / CLUSTER_TABLE, ignore_errors=True)
    for shard in shards:
        part = rows.filter(pl.col("rank").is_in(shard))
        if not part.is_empty():
            write_derived_table(root, CLUSTER_TABLE, shard, part)
    return {"failed": failed, "computed": [rank for shard in todo for rank in shard]}
