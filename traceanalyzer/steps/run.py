"""Derive a store's ``steps``, ``exchanges`` and ``launches`` tables: one task per shard (a rank, or a rank
group, ``store.rank_shards``) on the executor, before the rules.

A shard whose inputs, the derivation's code and its parameters are unchanged since the last run
is not derived again (``store.derived_key``, like the overview's cache); the key is also what
the rules' outcome cache sees of the derived tables, so a rule whose steps changed runs again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.codekey import code_key
from traceanalyzer.engine.config import ConfigError, namespace_params
from traceanalyzer.engine.params import Params
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.steps import collectives, exchanges, launches, layers, moe_layers
from traceanalyzer.steps.derive import derive_ranks, read_slices
from traceanalyzer.steps.evidence import NAMESPACE, STEP_PARAMS
from traceanalyzer.steps.exchanges import device_slices
from traceanalyzer.steps.windows import compute_tasks
from traceanalyzer.store import (
    TABLES_DIR,
    RankStore,
    Store,
    derived_key,
    derived_key_path,
    load_manifest,
    rank_shards,
    remove_stale_shards,
    shard_fingerprints,
    shard_input_bytes,
    shard_label,
    write_atomic_text,
    write_derived_table,
)

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor

TABLE = "steps"
# every table a shard's task derives, each under the same key
DERIVED = (
    TABLE, launches.TABLE, exchanges.TABLE, moe_layers.LAYERS, moe_layers.DENSE, layers.TABLE,
    collectives.TABLE,
)  # fmt: skip
# a steps task's input at most (the auto executor's bound for work in one process)
BATCH_BYTES = SMALL_WORK_BYTES


class StepSettingError(ConfigError):
    """A ``steps.NAME`` setting names no parameter or has a bad value."""


def step_params(values: Mapping[str, Any] | None = None) -> Params:
    """The derivation's parameters: defaults overlaid with ``values`` (``--set steps.X=...``,
    ``[steps]`` of the config file), each coerced to its declared type."""
    return namespace_params(NAMESPACE, STEP_PARAMS, values, StepSettingError)


def steps_shards(
    store_root: str, shards: Sequence[tuple[int, ...]], values: Mapping[str, Any]
) -> dict[str, float]:
    """The worker task: the launches, steps and EP exchanges of ``shards`` (each one rank, or a
    rank group), derived for all their ranks at once and written shard by shard into the store;
    returns the count of steps and the seconds the steps and exchanges took (the serving layer's
    cost: the launches only moved here from the rules and the overview)."""
    root = Path(store_root)
    ranks = sorted({rank for shard in shards for rank in shard})
    store, params = RankStore(root, ranks), step_params(values)

    def each_shard(table: str, frame: pl.DataFrame) -> None:
        for shard in shards:
            write_derived_table(root, table, shard, frame.filter(pl.col("rank").is_in(shard)))

    # One after the other: beside each other on a second thread they took as long in all
    # (each query runs on every core), and the steps' time then counted the launches' too.
    # The launches first: the steps read their kernels' launches from them. (One read of the
    # slices for both, split at once, took no less time and added a fifth to the task's peak:
    # the allocator held the read's pages while the launches' inputs were copied from it.)
    calls = launches.host_calls(store, ranks)  # the graph calls of the steps are some of them
    found = launches.derive_launches(store, ranks, calls=calls)
    each_shard(launches.TABLE, found)
    started = time.perf_counter()
    slices = read_slices(store, ranks, params, calls)
    captured = layers.captures_reader(store, ranks, calls, params)
    del calls
    compute = compute_tasks(slices)  # the steps' and the EP exchanges'
    frame = derive_ranks(store, ranks, params, found, slices, compute)
    each_shard(TABLE, frame)
    device = device_slices(slices)
    ops, moe = exchanges.exchange_inputs(device, compute)
    each_shard(exchanges.TABLE, exchanges.derive_exchanges(ops, moe, frame))
    for table, rows in moe_layers.derive_moe(store, device, ops, moe, frame).items():
        each_shard(table, rows)
    each_shard(layers.TABLE, layers.derive_layers(compute, device, frame, found, captured))
    mc2 = ops.filter(pl.col("path") == "mc2")
    each_shard(collectives.TABLE, collectives.derive_collectives(store, device, mc2, frame))
    seconds = time.perf_counter() - started
    return {"steps": frame.height, "steps_seconds": seconds}


def _batches(
    shards: list[tuple[int, ...]], sessions: Mapping[str, Any], executor: Executor
) -> list[list[tuple[int, ...]]]:
    """``shards`` as the steps' tasks: in rank order, as few as the executor's workers allow
    (a task's queries cost the same for one rank as for many), none over ``BATCH_BYTES`` of
    input (what a task holds grows with it)."""
    if not shards:
        return []
    size = {shard: shard_input_bytes(sessions, shard) for shard in shards}
    workers = executor.jobs if executor.parallel else 1
    count = min(len(shards), max(workers, -(-sum(size.values()) // BATCH_BYTES)))
    target = sum(size.values()) / count
    batches: list[list[tuple[int, ...]]] = [[]]
    held = 0
    for shard in shards:
        if batches[-1] and (held + size[shard] > BATCH_BYTES or held >= target):
            batches.append([])
            held = 0
        batches[-1].append(shard)
        held += size[shard]
    return batches


def _code_digest() -> str:
    """The key of the code the steps' task runs: its whole import closure in the package."""
    return code_key(__name__)


def derive_store(
    out: str | Path,
    executor: Executor,
    values: Mapping[str, Any] | None = None,
    *,
    cache: bool = True,
) -> dict[str, Any]:
    """Bring the store's ``steps``, ``exchanges`` and ``launches`` tables up to date; returns
    what failed, by rank, and the seconds the steps and exchanges took, summed over the shards
    derived."""
    from traceanalyzer.engine.runner import store_ranks
    from traceanalyzer.executor import TaskCrashed

    step_params(values)  # a bad setting stops the run here, before any worker
    root = Path(out)
    ranks = store_ranks(Store.open(root))
    code, sessions = _code_digest(), load_manifest(root).sessions
    shards = rank_shards(root, ranks, sessions)
    keys = {}
    for shard in shards:
        inputs = shard_fingerprints(sessions, shard)
        doc = {"code": code, "inputs": inputs, "params": dict(values or {})}
        keys[shard] = hashlib.sha256(
            json.dumps(doc, sort_keys=True, default=str).encode()
        ).hexdigest()
    # (a shard without device tasks has no launches files: the steps' files stand for both)
    todo = [
        shard
        for shard in shards
        if not (
            cache
            and all(derived_key(root, table, shard) == keys[shard] for table in DERIVED)
            and (root / TABLES_DIR / TABLE / shard_label(shard)).is_dir()
        )
    ]
    failed: dict[int, str] = {}
    steps_seconds = 0.0
    batches = _batches(todo, sessions, executor)
    tasks = [(str(root), batch, dict(values or {})) for batch in batches]
    for index, result in executor.map(steps_shards, tasks):
        crashed = isinstance(result, TaskCrashed)
        if not crashed:
            steps_seconds += result["steps_seconds"]
        for shard in batches[index]:
            if crashed:
                failed.update(dict.fromkeys(shard, str(result)))
            for table in DERIVED:
                if crashed:  # nothing stale: the rules then derive them
                    derived_key_path(root, table, shard).unlink(missing_ok=True)
                    shutil.rmtree(
                        root / TABLES_DIR / table / shard_label(shard), ignore_errors=True
                    )
                else:
                    write_atomic_text(derived_key_path(root, table, shard), keys[shard])
    for table in DERIVED:  # ranks no longer in the store, or regrouped
        remove_stale_shards(root, table, shards)
    return {
        "failed": failed,
        "computed": [rank for shard in todo for rank in shard],
        "ranks": ranks,
        "steps_seconds": steps_seconds,
    }
