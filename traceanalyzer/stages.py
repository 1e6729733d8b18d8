"""Derived tables as declared stages, and the one runner that brings them up to date.

A :class:`Stage` is a declaration: its name, the derived tables it writes (their columns are
``schema.DERIVED_TABLES``'), what it reads (ingested tables, other stages' tables), its
parameters and one ``derive(store, ranks, params)`` function. :func:`declare` registers it;
the pipeline runs the stages the rules read before them (``before_rules``) and the others
after (:func:`declared`), each through :func:`run_stages`:

- **map**: the store's shards (a rank, or a rank group, ``store.rank_shards``) on the executor,
  a shard's tables written into the store as its task derives them (``run`` stages: once over
  every rank, here);
- **keys**: a shard's result is keyed by :func:`result_key` of the code the stage runs (its
  module's import closure, ``codekey``, with the package version), its parameters, the shard's
  input fingerprints and the keys of the derived tables it reads, and the store's format: a
  shard whose key is unchanged is not derived again, and one whose code, settings or inputs
  changed always is. The rule outcome cache keys by the same function;
- **crashes**: a task that did not return leaves nothing of its shards (their tables and keys
  are removed: their readers derive them again), and is reported by rank;
- **stale**: partitions of ranks no longer in the store, or regrouped, are removed.

Every file is written to a temporary name and renamed (``store.write_derived_table``,
``write_atomic_text``), the key after the tables: a killed run leaves a shard derived again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from traceanalyzer.codekey import code_key
from traceanalyzer.executor import TaskCrashed
from traceanalyzer.schema import DERIVED_TABLES, TABLES, TABLES_DIR
from traceanalyzer.store import (
    DERIVED_READERS,
    MANIFEST_VERSION,
    RankStore,
    Store,
    derived_key,
    derived_key_path,
    load_manifest,
    rank_shards,
    remove_stale_shards,
    shard_input_bytes,
    shard_label,
    store_ranks,
    stored_or_derived,
    write_atomic_text,
    write_derived_table,
)

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor

Shard = tuple[int, ...]
# what a derive returns: its one table's rows, its tables' by name, or (table, rows) pairs as it
# derives them (each written, and its memory free, before the next is derived)
Derived = pl.DataFrame | Mapping[str, pl.DataFrame] | Iterable[tuple[str, pl.DataFrame]]


def no_params(settings: Any = None) -> None:
    """A stage without parameters."""
    return None


@dataclass(frozen=True)
class Stage:
    """One derivation of derived tables, declared.

    ``derive(store, ranks, params)`` gives the rows of ``tables`` for ``ranks`` (every table's
    rows carry ``rank`` and ``session``), reading only ``store``: the tables named in
    ``inputs`` (ingested ones, other stages' tables, read through ``store.derived``, or other
    stages by name).
    ``params(settings)`` turns the run's settings for the stage (``--set NAMESPACE.NAME=...``
    for a stage with a ``namespace``; None: the defaults) into what ``derive`` is given, and
    raises on a bad one; it runs in the worker, so settings travel as plain values.
    ``before_rules``: the rules read its tables, so it is derived before them and its key is
    part of every rule outcome's key. ``scope``: ``shard``, one task per shard (shards of up to
    ``task_bytes`` of input batched into one task when it is set: a task's queries cost about
    the same for one rank as for many), or ``run``, once over every rank in the driver (a
    reduce over the shards' rows). The first of ``tables`` stands for the stage: a shard
    without its partitions is derived again.
    """

    name: str
    tables: tuple[str, ...]
    derive: Callable[[Store, list[int], Any], Derived]
    inputs: tuple[str, ...] = ()
    namespace: str | None = None
    params: Callable[[Any], Any] = no_params
    before_rules: bool = False
    scope: Literal["shard", "run"] = "shard"
    task_bytes: int | None = None

    @property
    def code(self) -> str:
        """The key of the code the stage runs: its module's whole import closure."""
        return code_key(self.derive.__module__)


# Every declared stage, in the order declared (a stage after the stages it reads).
STAGES: dict[str, Stage] = {}


def declare(stage: Stage) -> Stage:
    """Register ``stage``: its inputs must be ingested tables, or stages declared before it or
    their tables. A table of it whose module registers no reader of its own
    (``store.DERIVED_READERS``) is read as stored, else derived in-process at the defaults."""
    made = {table for known in STAGES.values() for table in known.tables if known is not stage}
    if not stage.tables:
        raise ValueError(f"stage {stage.name} derives no table")
    for table in stage.tables:
        if table not in DERIVED_TABLES:
            raise ValueError(f"stage {stage.name}: {table} is no derived table (schema.py)")
        if table in made:
            raise ValueError(f"stage {stage.name}: {table} is another stage's")
    for name in stage.inputs:
        if name not in TABLES and name not in made and name not in STAGES:
            raise ValueError(f"stage {stage.name}: input {name} is no table derived before it")
    STAGES[stage.name] = stage
    if stage.scope == "shard":
        for table in stage.tables:
            DERIVED_READERS.setdefault(table, _reader(stage, table))
    return stage


def declared(*, before_rules: bool) -> list[Stage]:
    """The declared stages derived before the rules, or after them, in order."""
    return [stage for stage in STAGES.values() if stage.before_rules == before_rules]


def rule_input_tables() -> tuple[str, ...]:
    """The tables of the stages derived before the rules: their keys are part of every rule
    outcome's key."""
    return tuple(table for stage in declared(before_rules=True) for table in stage.tables)


def _reader(stage: Stage, table: str) -> Callable[[Store, Any], pl.DataFrame]:
    def read(store: Store, ranks: Any) -> pl.DataFrame:
        def derive(rank: int) -> pl.DataFrame:
            tables = store.memo(
                (stage.name, rank), lambda: dict(_outputs(stage, store, [rank], stage.params(None)))
            )
            return tables[table]

        return stored_or_derived(store, table, ranks, derive)

    return read


def _plain(params: Any) -> Any:
    """A stage's parameters as JSON values, for its key."""
    if is_dataclass(params) and not isinstance(params, type):
        return asdict(params)
    return dict(params) if isinstance(params, Mapping) else params


def result_key(code: str, params: Any, inputs: Mapping[str, Any]) -> str:
    """The key of a cached result (a stage's shard, a rule's outcome): the key of the code that
    made it (``codekey``: it holds the package version), its parameters, its inputs (input
    fingerprints, the keys of the derived tables it read) and the store's format."""
    doc = {"code": code, "params": params, "inputs": inputs, "store": MANIFEST_VERSION}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def shard_inputs(
    root: Path, sessions: Mapping[str, Any], shards: Sequence[Shard], derived: Sequence[str]
) -> dict[Shard, dict[str, Any]]:
    """What a result of each shard is derived from: its sessions' input fingerprints (the
    manifest's ``sessions``) and the keys of the ``derived`` tables it reads; none for a shard
    a rank of which is not in the manifest (ingested otherwise: nothing to key on)."""
    by_rank: dict[int, dict[str, Any]] = {}
    for key, entry in sessions.items():
        by_rank.setdefault(int(key.partition("/")[0]), {})[key] = entry.get("fingerprint")
    inputs = {}
    for shard in shards:
        if not all(rank in by_rank for rank in shard):
            continue
        found = {key: value for rank in shard for key, value in by_rank[rank].items()}
        for table in derived:  # none: derived by its reader, from the inputs at the defaults
            if (table_key := derived_key(root, table, shard)) is not None:
                found[f"derived:{table}"] = table_key
        inputs[shard] = found
    return inputs


@dataclass
class StageRun:
    """What :func:`run_stages` did: the store's ranks, the ranks whose task crashed (with why),
    by stage the ranks derived (the rest were cached), and by table the seconds its derivation
    took, summed over the tasks."""

    ranks: list[int]
    failed: dict[int, str] = field(default_factory=dict)
    computed: dict[str, list[int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def run_stages(
    out: str | Path,
    executor: Executor,
    stages: Sequence[Stage],
    settings: Mapping[str, Any] | None = None,
    *,
    cache: bool = True,
) -> StageRun:
    """Bring the tables of ``stages`` (in order) up to date in the store at ``out``;
    ``settings``: by stage name, the run's settings for it (see :class:`Stage`). ``cache``
    False derives every shard again."""
    root = Path(out)
    ranks = store_ranks(Store.open(root))
    sessions = load_manifest(root).sessions
    shards = rank_shards(root, ranks, sessions)
    run = StageRun(ranks)
    for stage in stages:
        given = (settings or {}).get(stage.name)
        params = _plain(stage.params(given))  # a bad setting stops here, before any worker
        keys = _keys(root, stage, params, sessions, shards)
        todo = [shard for shard in shards if not (cache and _cached(root, stage, shard, keys))]
        if stage.scope == "run" and todo:  # its rows depend on every shard's
            todo = shards
        run.computed[stage.name] = [rank for shard in todo for rank in shard]
        if stage.scope == "run":
            results: Iterable[tuple[int, Any]] = (
                [(0, derive_shards(str(root), stage, shards, given))] if todo else []
            )
            batches = [shards]
        else:
            batches = _batches(todo, sessions, executor, stage.task_bytes)
            tasks = [(str(root), stage, batch, given) for batch in batches]
            results = executor.map(derive_shards, tasks)
        for index, result in results:
            _settle(root, stage, batches[index], keys, result, run)
        for table in stage.tables:  # ranks no longer in the store, or regrouped
            remove_stale_shards(root, table, shards)
    return run


def _keys(
    root: Path,
    stage: Stage,
    params: Any,
    sessions: Mapping[str, Any],
    shards: list[Shard],
) -> dict[Shard, str]:
    """Each shard's key (a ``run`` stage: one key of every shard's inputs, for each); none for
    a shard not in the manifest."""
    derived = [
        name if name in DERIVED_TABLES else STAGES[name].tables[0]
        for name in stage.inputs
        if name not in TABLES
    ]
    inputs = shard_inputs(root, sessions, shards, derived)
    if stage.scope == "run":
        if len(inputs) < len(shards):
            return {}
        every = {shard_label(shard): found for shard, found in inputs.items()}
        return dict.fromkeys(shards, result_key(stage.code, params, every))
    return {shard: result_key(stage.code, params, found) for shard, found in inputs.items()}


def _cached(root: Path, stage: Stage, shard: Shard, keys: Mapping[Shard, str]) -> bool:
    """Whether every table of the stage holds ``shard``'s rows as derived under its key (a
    shard without partitions of the stage's first table counts for none: removed by hand)."""
    return (
        shard in keys
        and all(derived_key(root, table, shard) == keys[shard] for table in stage.tables)
        and (root / TABLES_DIR / stage.tables[0] / shard_label(shard)).is_dir()
    )


def _settle(
    root: Path,
    stage: Stage,
    batch: list[Shard],
    keys: Mapping[Shard, str],
    result: Any,
    run: StageRun,
) -> None:
    """Record a task's end: its shards' keys, or, when it crashed, nothing of them (no stale
    rows: their readers derive them again)."""
    crashed = isinstance(result, TaskCrashed)
    if not crashed:
        for table, seconds in result.items():
            run.seconds[table] = run.seconds.get(table, 0.0) + seconds
    for shard in batch:
        if crashed:
            run.failed.update(dict.fromkeys(shard, str(result)))
        for table in stage.tables:
            path = derived_key_path(root, table, shard)
            if crashed:
                path.unlink(missing_ok=True)
                shutil.rmtree(root / TABLES_DIR / table / shard_label(shard), ignore_errors=True)
            elif shard in keys:
                write_atomic_text(path, keys[shard])
            else:
                path.unlink(missing_ok=True)  # not keyed: never taken for cached


def _outputs(
    stage: Stage, store: Store, ranks: list[int], params: Any
) -> Iterator[tuple[str, pl.DataFrame]]:
    """``stage.derive``'s tables, as (table, rows) pairs, each only once and declared."""
    derived = stage.derive(store, ranks, params)
    if isinstance(derived, pl.DataFrame):
        pairs: Iterable[tuple[str, pl.DataFrame]] = [(stage.tables[0], derived)]
    elif isinstance(derived, Mapping):
        pairs = derived.items()
    else:
        pairs = derived
    seen = set()
    for table, frame in pairs:
        if table not in stage.tables or table in seen:
            raise ValueError(f"stage {stage.name} derived {table}: not one of its tables, or twice")
        seen.add(table)
        yield table, frame


def derive_shards(
    store_root: str, stage: Stage, shards: list[Shard], settings: Any
) -> dict[str, float]:
    """The task: ``stage``'s tables of ``shards`` (each one rank, or a rank group), derived for
    all their ranks at once and written shard by shard into the store as each is derived (a
    table the derivation gave no rows for: none stored); returns by table the seconds its
    derivation took."""
    root = Path(store_root)
    ranks = sorted({rank for shard in shards for rank in shard})
    store = RankStore(root, ranks)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    for table, frame in _outputs(stage, store, ranks, stage.params(settings)):
        seconds[table] = time.perf_counter() - started
        for shard in shards:
            part = frame if len(shards) == 1 else frame.filter(pl.col("rank").is_in(shard))
            write_derived_table(root, table, shard, part)
        del frame, part  # not held while the next table is derived
        started = time.perf_counter()
    for table in stage.tables:
        if table not in seconds:
            none = pl.DataFrame(schema=DERIVED_TABLES[table].polars_schema)
            for shard in shards:
                write_derived_table(root, table, shard, none)
    return seconds


def _batches(
    shards: list[Shard], sessions: Mapping[str, Any], executor: Executor, most: int | None
) -> list[list[Shard]]:
    """``shards`` as tasks: one each, or, with ``most`` bytes of input at most in a task, in
    rank order, as few as the executor's workers allow and none over ``most`` (what a task
    holds grows with its input)."""
    if most is None or not shards:
        return [[shard] for shard in shards]
    size = {shard: shard_input_bytes(sessions, shard) for shard in shards}
    workers = executor.jobs if executor.parallel else 1
    count = min(len(shards), max(workers, -(-sum(size.values()) // most)))
    target = sum(size.values()) / count
    batches: list[list[Shard]] = [[]]
    held = 0
    for shard in shards:
        if batches[-1] and (held + size[shard] > most or held >= target):
            batches.append([])
            held = 0
        batches[-1].append(shard)
        held += size[shard]
    return batches
