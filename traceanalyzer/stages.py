"""Derived tables as declared stages, and the one runner that brings them up to date.

A :class:`Stage` is a declaration: its name, the derived tables it writes (their columns are
``schema.DERIVED_TABLES``'), what it reads (ingested tables, other stages' tables), its
parameters and one ``derive(store, ranks, params)`` function. :func:`declare` registers it;
the pipeline runs the stages the rules read before them (``before_rules``) and the others
after (:func:`declared`), each through :func:`run_stages`:

- **map**: the store's shards (a rank, or a rank group, ``store.rank_shards``) on the executor,
  a shard's tables written into the store as its task derives them (``run`` stages: once over
  every rank, here). Consecutive ``shard`` stages run in one task per shard: the ones out of
  date there, in order, sharing their reads (:class:`Read`: the slices, the device tasks, the
  tables derived before them in the task), each read once and let go when no stage left needs
  it;
- **keys**: a shard's result is keyed by :func:`result_key` of the code the stage runs (its
  module's import closure, ``codekey``, with the package version), its parameters, the shard's
  input fingerprints and the keys of the derived tables it reads, and the store's format: a
  shard whose key is unchanged is not derived again, and one whose code, settings or inputs
  changed always is, and so is every stage that reads it (its key holds the input's). The rule
  outcome cache keys by the same function;
- **crashes**: a task that did not return leaves nothing of its shards (their tables and keys
  are removed: their readers derive them again), and is reported by rank;
- **stale**: partitions of ranks no longer in the store, or regrouped, are removed.

Every file is written to a temporary name and renamed (``store.write_derived_table``,
``write_atomic_text``), the key after the tables: a killed run leaves a shard derived again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
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
class Read:
    """What several stages read (the slices, the device tasks, a derived table's rows): read
    once per task, when the first stage of the task that needs it runs, and let go as soon as
    no stage left in the task needs it.

    ``compute(store, ranks, params, **reads)`` gives it from the store and the values of its
    own ``reads``; ``params``: those of the stage named ``params_of`` (its settings in the run;
    its defaults outside one), None without. A stage is given its reads as keywords, by name.
    """

    name: str
    compute: Callable[..., Any]
    reads: tuple[Read, ...] = ()
    params_of: str | None = None

    @property
    def table(self) -> bool:
        """Whether it is a derived table's rows (:func:`rows_of`)."""
        return self.name in DERIVED_TABLES


@functools.cache
def rows_of(table: str) -> Read:
    """The read of a derived table's rows: those a stage of the task just derived (kept while a
    stage left reads them), else the store's (its reader's, ``store.derived``)."""
    return Read(table, functools.partial(_stored_rows, table))


def _stored_rows(table: str, store: Store, ranks: list[int], params: None) -> pl.DataFrame:
    return store.derived(table, ranks).collect()


@dataclass(frozen=True)
class Stage:
    """One derivation of derived tables, declared.

    ``derive(store, ranks, params, **reads)`` gives the rows of ``tables`` for ``ranks``
    (every table's rows carry ``rank`` and ``session``), reading only ``store`` and its
    ``reads`` (:class:`Read`: what it shares with other stages; a read of a table of another
    stage's, :func:`rows_of`): the tables named in ``inputs`` (ingested ones, other stages'
    tables, read through ``store.derived`` or ``rows_of``, or other stages by name).
    ``params(settings)`` turns the run's settings for the stage (``--set NAMESPACE.NAME=...``
    for a stage with a ``namespace``; None: the defaults) into what ``derive`` is given, and
    raises on a bad one; it runs in the worker, so settings travel as plain values.
    ``before_rules``: the rules read its tables, so it is derived before them and its key is
    part of every rule outcome's key. ``scope``: ``shard``, one task per shard (shards of up to
    ``task_bytes`` of input batched into one task when it is set: a task's queries cost about
    the same for one rank as for many), or ``run``, once over every rank in the driver (a
    reduce over the shards' rows). The first of ``tables`` stands for the stage: a shard
    without its partitions is derived again. ``order``: the columns its tables' rows are read
    in (``store.derived``), none: as stored.
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
    reads: tuple[Read, ...] = ()
    order: tuple[str, ...] = ()

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules of the code the stage runs: its derivation's and its reads'."""
        reads = {_module_of(read.compute) for read in _closure(self.reads)}
        return (self.derive.__module__, *sorted(reads - {self.derive.__module__}))

    @property
    def code(self) -> str:
        """The key of the code the stage runs: its modules' whole import closure."""
        return code_key(*self.modules)


def _module_of(function: Callable[..., Any]) -> str:
    return getattr(function, "func", function).__module__  # a partial's function's


def _closure(reads: Iterable[Read], computed: Collection[str] = ()) -> list[Read]:
    """``reads`` and every read they are computed from (through those not yet ``computed``),
    each once; a name two reads have is refused."""
    found: dict[str, Read] = {}
    todo = list(reads)
    while todo:
        read = todo.pop()
        if read.name in found:
            if found[read.name] is not read:
                raise ValueError(f"read {read.name} is another read's name")
            continue
        found[read.name] = read
        if read.name not in computed:
            todo += read.reads
    return list(found.values())


# Every declared stage, in the order declared (a stage after the stages it reads), and by name
# every read of theirs.
STAGES: dict[str, Stage] = {}
READS: dict[str, Read] = {}


def declare(stage: Stage) -> Stage:
    """Register ``stage``: its inputs must be ingested tables, or stages declared before it or
    their tables, and hold what its reads read (a table's rows, another stage's parameters).
    Its tables are read through ``store.derived``: as stored, else derived in-process at the
    defaults (``store.DERIVED_READERS``)."""
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
    _check_reads(stage)
    STAGES[stage.name] = stage
    READS.update({read.name: read for read in _closure(stage.reads)})
    if stage.scope == "shard":
        for table in stage.tables:
            DERIVED_READERS[table] = _reader(stage, table)
    return stage


def _check_reads(stage: Stage) -> None:
    """A stage's reads: one read by each name (``READS``), a table's rows read only by stages
    (never computed from: a stage of the task may not have derived it yet), and what they read
    among the stage's inputs (its key holds theirs)."""
    inputs = {*stage.inputs}
    for name in stage.inputs:
        if name in STAGES:
            inputs.update({name, *STAGES[name].tables})
        for known in STAGES.values():
            if name in known.tables:
                inputs.add(known.name)
    for read in _closure(stage.reads):
        if READS.get(read.name, read) is not read:
            raise ValueError(f"stage {stage.name}: read {read.name} is another read's name")
        if read.table and (read is not rows_of(read.name) or read.name not in inputs):
            raise ValueError(f"stage {stage.name}: read {read.name} is no table of its inputs")
        if any(inner.table for inner in read.reads):
            raise ValueError(f"read {read.name} is computed from a table's rows")
        if read.params_of is not None and read.params_of not in inputs | {stage.name}:
            raise ValueError(f"stage {stage.name}: read {read.name} is read at the parameters "
                             f"of {read.params_of}, which is not among its inputs")  # fmt: skip


def declared(*, before_rules: bool) -> list[Stage]:
    """The declared stages derived before the rules, or after them, in order."""
    return [stage for stage in STAGES.values() if stage.before_rules == before_rules]


def rule_input_tables() -> tuple[str, ...]:
    """The tables of the stages derived before the rules: their keys are part of every rule
    outcome's key."""
    return tuple(table for stage in declared(before_rules=True) for table in stage.tables)


def _reader(stage: Stage, table: str) -> Callable[[Store, Any], pl.DataFrame]:
    """The one reader of ``table``: its stored rows, else (a rank the store holds none of) the
    stage's tables of the rank derived here at the defaults, once per store; in ``order``."""
    schema = DERIVED_TABLES[table].polars_schema

    def read(store: Store, ranks: Any) -> pl.DataFrame:
        def derive(rank: int) -> pl.DataFrame:
            return store.memo((stage.name, rank), lambda: _derive_here(stage, store, [rank]))[table]

        rows = stored_or_derived(store, table, ranks, derive, schema)
        return rows.sort(stage.order, maintain_order=True) if stage.order else rows

    return read


def _derive_here(stage: Stage, store: Store, ranks: list[int]) -> dict[str, pl.DataFrame]:
    """``stage``'s tables of ``ranks`` at the defaults, derived in this process (its reads
    too, the tables it reads through their readers)."""
    reads = _TaskReads(store, ranks, [stage], {})
    tables = dict(_outputs(stage, store, ranks, stage.params(None), reads.of(stage)))
    empty = {
        table: pl.DataFrame(schema=DERIVED_TABLES[table].polars_schema) for table in stage.tables
    }
    return empty | tables


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
    root: Path,
    sessions: Mapping[str, Any],
    shards: Sequence[Shard],
    derived: Sequence[str],
    known: Mapping[str, Mapping[Shard, str]] | None = None,
) -> dict[Shard, dict[str, Any]]:
    """What a result of each shard is derived from: its sessions' input fingerprints (the
    manifest's ``sessions``) and the keys of the ``derived`` tables it reads (``known``: by
    table, the keys this run derives them under, else the stored ones); none for a shard a
    rank of which is not in the manifest (ingested otherwise: nothing to key on)."""
    by_rank: dict[int, dict[str, Any]] = {}
    for key, entry in sessions.items():
        by_rank.setdefault(int(key.partition("/")[0]), {})[key] = entry.get("fingerprint")
    known = known or {}
    inputs = {}
    for shard in shards:
        if not all(rank in by_rank for rank in shard):
            continue
        found = {key: value for rank in shard for key, value in by_rank[rank].items()}
        for table in derived:  # none: derived by its reader, from the inputs at the defaults
            table_key = (
                known[table].get(shard) if table in known else derived_key(root, table, shard)
            )
            if table_key is not None:
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
    False derives every shard again. Consecutive ``shard`` stages of one ``task_bytes`` run
    together: per shard, the ones out of date there in one task."""
    root = Path(out)
    settings = dict(settings or {})
    ranks = store_ranks(Store.open(root))
    sessions = load_manifest(root).sessions
    shards = rank_shards(root, ranks, sessions)
    run = StageRun(ranks)
    keys: dict[str, dict[Shard, str]] = {}  # by table, this run's key of each shard
    for group in _groups(stages):
        for stage in group:  # a bad setting stops here, before any worker
            params = _plain(stage.params(settings.get(stage.name)))
            keys.update(
                dict.fromkeys(stage.tables, _keys(root, stage, params, sessions, shards, keys))
            )
        todo = {
            shard: tuple(s for s in group if not (cache and _cached(root, s, shard, keys)))
            for shard in shards
        }
        if group[0].scope == "run":  # its rows depend on every shard's
            todo = dict.fromkeys(shards, tuple(group)) if any(todo.values()) else {}
        for stage in group:
            run.computed[stage.name] = [
                rank for shard in shards if stage in todo.get(shard, ()) for rank in shard
            ]
        if group[0].scope == "run":  # in the driver
            tasks = [(str(root), group, shards, settings)] if todo else []
            results: Iterable[tuple[int, Any]] = [(0, derive_shards(*t)) for t in tasks]
        else:
            alike: dict[tuple[Stage, ...], list[Shard]] = {}
            for shard, derived in todo.items():
                if derived:
                    alike.setdefault(derived, []).append(shard)
            tasks = [
                (str(root), list(derived), batch, settings)
                for derived, some in alike.items()
                for batch in _batches(some, sessions, executor, group[0].task_bytes)
            ]
            results = executor.map(derive_shards, tasks)
        for index, result in results:
            _settle(root, tasks[index][1], tasks[index][2], keys, result, run)
        for stage in group:
            for table in stage.tables:  # ranks no longer in the store, or regrouped
                remove_stale_shards(root, table, shards)
    return run


def _groups(stages: Sequence[Stage]) -> list[list[Stage]]:
    """``stages`` as they run: consecutive ``shard`` stages of one ``task_bytes`` together, a
    ``run`` stage alone."""
    groups: list[list[Stage]] = []
    for stage in stages:
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and stage.scope == last.scope == "shard"
            and stage.task_bytes == last.task_bytes
        ):
            groups[-1].append(stage)
        else:
            groups.append([stage])
    return groups


def _keys(
    root: Path,
    stage: Stage,
    params: Any,
    sessions: Mapping[str, Any],
    shards: list[Shard],
    known: Mapping[str, Mapping[Shard, str]],
) -> dict[Shard, str]:
    """Each shard's key (a ``run`` stage: one key of every shard's inputs, for each); none for
    a shard not in the manifest. ``known``: by table, the keys of the tables derived before it
    in this run."""
    derived = [
        name if name in DERIVED_TABLES else STAGES[name].tables[0]
        for name in stage.inputs
        if name not in TABLES
    ]
    inputs = shard_inputs(root, sessions, shards, derived, known)
    if stage.scope == "run":
        if len(inputs) < len(shards):
            return {}
        every = {shard_label(shard): found for shard, found in inputs.items()}
        return dict.fromkeys(shards, result_key(stage.code, params, every))
    return {shard: result_key(stage.code, params, found) for shard, found in inputs.items()}


def _cached(
    root: Path, stage: Stage, shard: Shard, keys: Mapping[str, Mapping[Shard, str]]
) -> bool:
    """Whether every table of the stage holds ``shard``'s rows as derived under its key (a
    shard without partitions of the stage's first table counts for none: removed by hand)."""
    key = keys[stage.tables[0]].get(shard)
    return (
        key is not None
        and all(derived_key(root, table, shard) == key for table in stage.tables)
        and (root / TABLES_DIR / stage.tables[0] / shard_label(shard)).is_dir()
    )


def _settle(
    root: Path,
    stages: Sequence[Stage],
    batch: list[Shard],
    keys: Mapping[str, Mapping[Shard, str]],
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
        for table in (table for stage in stages for table in stage.tables):
            path = derived_key_path(root, table, shard)
            if crashed:
                path.unlink(missing_ok=True)
                shutil.rmtree(root / TABLES_DIR / table / shard_label(shard), ignore_errors=True)
            elif shard in keys[table]:
                write_atomic_text(path, keys[table][shard])
            else:
                path.unlink(missing_ok=True)  # not keyed: never taken for cached


def _outputs(
    stage: Stage, store: Store, ranks: list[int], params: Any, reads: Mapping[str, Any]
) -> Iterator[tuple[str, pl.DataFrame]]:
    """``stage.derive``'s tables, as (table, rows) pairs, each only once and declared."""
    derived = stage.derive(store, ranks, params, **reads)
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


class _TaskReads:
    """The reads (:class:`Read`) of one task's stages, which run in order: each computed when a
    stage first needs it, and let go once no stage left needs it. A value only reads not yet
    computed still need is made into them at once and let go (the host calls, once the
    launches are derived, into the steps' slices and the capture windows a later stage reads):
    what a task holds while a stage runs is what it and the stages after it read."""

    def __init__(
        self, store: Store, ranks: list[int], stages: Sequence[Stage], settings: Mapping[str, Any]
    ) -> None:
        self._store, self._ranks, self._settings = store, ranks, settings
        self._left = list(stages)  # the stages still to run, the running one first
        self._values: dict[str, Any] = {}

    def of(self, stage: Stage) -> dict[str, Any]:
        """The reads ``stage`` is given, by name."""
        given = {}
        for read in stage.reads:
            given[read.name] = self._value(read)
            self._let_go()
        return given

    def derived(self, table: str, frame: pl.DataFrame) -> None:
        """Keep the rows of ``table``, just derived, while a stage left reads them."""
        if any(read.name == table for stage in self._left[1:] for read in stage.reads):
            self._values[table] = frame

    def done(self, stage: Stage) -> None:
        """``stage`` has run: let go of what no stage left reads."""
        self._left.remove(stage)
        self._let_go()

    def _value(self, read: Read) -> Any:
        if read.name not in self._values:
            inputs = {inner.name: self._value(inner) for inner in read.reads}
            params = None
            if read.params_of is not None:
                params = STAGES[read.params_of].params(self._settings.get(read.params_of))
            self._values[read.name] = read.compute(self._store, self._ranks, params, **inputs)
        return self._values[read.name]

    def _let_go(self) -> None:
        direct = {read.name for stage in self._left for read in stage.reads}
        wanted = _closure([read for stage in self._left for read in stage.reads], self._values)
        for name in list(self._values):
            if name in direct:
                continue
            for read in wanted:  # the reads not yet computed that still need it, now
                if read.name not in self._values and name in {r.name for r in read.reads}:
                    self._value(read)
            del self._values[name]


def derive_shards(
    store_root: str, stages: Sequence[Stage], shards: list[Shard], settings: Mapping[str, Any]
) -> dict[str, float]:
    """The task: the tables of ``stages`` (in order) of ``shards`` (each one rank, or a rank
    group), derived for all their ranks at once and written shard by shard into the store as
    each is derived (a table a derivation gave no rows for: none stored); ``settings``: the
    run's, by stage name. Returns by table the seconds its derivation took."""
    root = Path(store_root)
    ranks = sorted({rank for shard in shards for rank in shard})
    store = RankStore(root, ranks)
    reads = _TaskReads(store, ranks, stages, settings)
    seconds: dict[str, float] = {}
    started = time.perf_counter()  # a table's time: from the one before (the reads made since)
    for stage in stages:
        params = stage.params(settings.get(stage.name))
        for table, frame in _outputs(stage, store, ranks, params, reads.of(stage)):
            seconds[table] = time.perf_counter() - started
            _write(root, table, shards, frame)
            reads.derived(table, frame)
            del frame  # not held while the next table is derived, unless a stage reads it
            started = time.perf_counter()
        for table in stage.tables:
            if table not in seconds:
                none = pl.DataFrame(schema=DERIVED_TABLES[table].polars_schema)
                _write(root, table, shards, none)
                reads.derived(table, none)
        reads.done(stage)
    return seconds


def _write(root: Path, table: str, shards: list[Shard], frame: pl.DataFrame) -> None:
    for shard in shards:
        part = frame if len(shards) == 1 else frame.filter(pl.col("rank").is_in(shard))
        write_derived_table(root, table, shard, part)


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
