"""Compute the overview of a store: one task per rank on the executor, then the cluster rows.

- **map**: :func:`overview_rank` runs in a worker on the rank's shard of the store (the same
  :class:`~traceanalyzer.store.RankStore` the rank rules read) and writes the rank's
  ``summary_steps``/``summary_kernels``/``summary_host_apis``/``summary_collectives``
  partitions; only a row count comes back.
- **reduce**, in the driver: ``summary_ranks`` (one row per rank, outliers flagged) from the
  small per-rank tables, and the ``summary.overview`` section of findings.json.

A rank whose inputs, the overview's code and the top-N sizes are unchanged since the last run is
not recomputed (``OUT/.cache/overview/rank=R.key``), like the rules' per-rank cache.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceanalyzer.overview.cluster import cluster_rows
from traceanalyzer.overview.compute import DEFAULT_TOP, TopSizes, summarize_rank
from traceanalyzer.store import TABLES_DIR, RankStore, Store, write_atomic_text, write_derived_table

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor

CACHE_DIR = Path(".cache") / "overview"
RANK_TABLES = ("summary_steps", "summary_kernels", "summary_host_apis", "summary_collectives")
CLUSTER_TABLE = "summary_ranks"


def overview_rank(store_root: str, rank: int, sizes: Mapping[str, int]) -> int:
    """The worker task: the rank's summary tables, written into the store; returns their rows."""
    root = Path(store_root)
    frames = summarize_rank(RankStore(root, [rank]), rank, TopSizes(**sizes))
    for table, frame in frames.items():
        write_derived_table(root, table, rank, frame)
    return sum(f.height for f in frames.values())


def _code_digest() -> str:
    from traceanalyzer import __version__

    digest = hashlib.sha256(__version__.encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _rank_keys(root: Path, ranks: list[int], sizes: TopSizes) -> dict[int, str]:
    from traceanalyzer.store import load_manifest

    code = _code_digest()
    sessions = load_manifest(root).sessions
    keys = {}
    for rank in ranks:
        inputs = {k: v.get("fingerprint") for k, v in sessions.items() if k.startswith(f"{rank}/")}
        if inputs:
            doc = {"code": code, "inputs": inputs, "sizes": asdict(sizes)}
            keys[rank] = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return keys


def _cached(root: Path, rank: int, key: str) -> bool:
    try:
        stored = (root / CACHE_DIR / f"rank={rank}.key").read_text("utf-8")
    except OSError:
        return False
    return stored == key and (root / TABLES_DIR / "summary_steps" / f"rank={rank}").is_dir()


def summarize_store(
    out: str | Path, executor: Executor, sizes: TopSizes = DEFAULT_TOP, *, cache: bool = True
) -> dict[str, Any]:
    """Bring the store's summary tables up to date; returns what failed, by rank."""
    from traceanalyzer.engine.runner import store_ranks
    from traceanalyzer.executor import TaskCrashed

    root = Path(out)
    ranks = store_ranks(Store.open(root))
    keys = _rank_keys(root, ranks, sizes) if cache else {}
    todo = [r for r in ranks if not (r in keys and _cached(root, r, keys[r]))]
    failed: dict[int, str] = {}
    tasks = [(str(root), rank, asdict(sizes)) for rank in todo]
    for index, result in executor.map(overview_rank, tasks):
        rank = todo[index]
        if isinstance(result, TaskCrashed):  # say so, and show nothing stale for the rank
            failed[rank] = str(result)
            (root / CACHE_DIR / f"rank={rank}.key").unlink(missing_ok=True)
            for table in RANK_TABLES:
                shutil.rmtree(root / TABLES_DIR / table / f"rank={rank}", ignore_errors=True)
        elif rank in keys:
            write_atomic_text(root / CACHE_DIR / f"rank={rank}.key", keys[rank])
    for table in (*RANK_TABLES, CLUSTER_TABLE):  # ranks no longer in the store
        for stale in (root / TABLES_DIR / table).glob("rank=*"):
            if int(stale.name.split("=", 1)[1]) not in ranks:
                shutil.rmtree(stale, ignore_errors=True)
    store = Store.open(root)
    rows = cluster_rows(
        store.table("summary_steps").collect(), store.table("summary_kernels").collect()
    )
    shutil.rmtree(root / TABLES_DIR / CLUSTER_TABLE, ignore_errors=True)
    for (rank,), part in rows.group_by("rank"):
        write_derived_table(root, CLUSTER_TABLE, int(rank), part)  # type: ignore[arg-type]
    return {"failed": failed, "computed": todo}
