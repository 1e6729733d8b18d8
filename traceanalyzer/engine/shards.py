"""Rank-scoped rules evaluated one rank shard per task, on any executor, with an outcome cache.

- **map**: one task per rank evaluates the ``scope="rank"`` rules that rank needs on a store
  restricted to its partitions (:func:`evaluate_rank`); only :class:`RuleOutcome` objects
  (findings, notes, key figures) come back, never tables.
- **reduce**, in the driver: grouping the per-rank findings and the ``scope="global"`` rules,
  which read only the columns they need, lazily, from the store
  (:func:`traceanalyzer.engine.runner.evaluate`).

Rules are loaded once per run, by the driver. A task carries where they came from
(:class:`~traceanalyzer.engine.loader.RuleSource`) and their code digests: a worker in this
process uses the driver's very rule objects, a worker process loads the same files once, and a
rule file edited since the driver loaded it is reported rather than evaluated with other code.
Each rule's outcome on each rank is cached (:mod:`traceanalyzer.engine.cache`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from traceanalyzer.engine.cache import OutcomeCache, outcome_key
from traceanalyzer.engine.loader import LoadedRules, RuleSource, load_rules
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.rule import Rule
from traceanalyzer.engine.runner import RuleOutcome, RunResult, evaluate, evaluate_rule
from traceanalyzer.executor import Executor, TaskCrashed
from traceanalyzer.store import TABLES_DIR, Store, load_manifest

Digests = tuple[tuple[str, str], ...]  # (rule id, code digest), sorted


class RankStore(Store):
    """A store that only sees the partitions of some ranks (a worker's shard).

    Listing and scanning only ``rank=R`` directories keeps the worker's reads (and the Parquet
    footers it parses) proportional to its shard, not to the collection.
    """

    def __init__(self, root: Path, ranks: Iterable[int]):
        super().__init__(root)
        self.shard = sorted(set(ranks))

    def _files(self, name: str) -> list[Path]:
        if self.root is None:
            return []
        base = self.root / TABLES_DIR / name
        return sorted(
            path
            for rank in self.shard
            for path in base.glob(f"rank={rank}/session=*/part-0.parquet")
        )


# Rule sets by (source, digests): the driver's own (so an in-process executor reuses its rule
# objects) and those a worker process loaded. The digests in the key mean an edited rule file
# can never be answered by rule objects built from the old code.
_RULE_SETS: dict[tuple[RuleSource, Digests], RuleSet] = {}


def _digests(loaded: LoadedRules) -> Digests:
    return tuple(sorted(loaded.digests().items()))


def _rules_for(source: RuleSource, digests: Digests) -> RuleSet:
    key = (source, digests)
    if key not in _RULE_SETS:
        loaded = source.load()
        if _digests(loaded) != digests:
            raise RuntimeError("rule files changed during the run; run again")
        _RULE_SETS[key] = loaded.rules
    return _RULE_SETS[key]


def evaluate_rank(
    store_root: str,
    source: RuleSource,
    digests: Digests,
    rule_ids: tuple[str, ...],
    params: Mapping[str, Mapping[str, Any]],
    rank: int,
) -> list[RuleOutcome]:
    """Evaluate rank-scoped rules on one rank's shard; returns small RuleOutcome objects."""
    rules = _rules_for(source, digests)
    store = RankStore(Path(store_root), [rank])
    shard = frozenset({rank})
    return [evaluate_rule(rules.get(rid), store, params[rid], shard) for rid in rule_ids]


def _rank_inputs(store_root: Path) -> dict[int, dict[str, Any]]:
    """Each rank's input fingerprints, from the manifest ({} for a rank ingested otherwise)."""
    by_rank: dict[int, dict[str, Any]] = {}
    for key, entry in load_manifest(store_root).sessions.items():
        rank, _, session = key.partition("/")
        by_rank.setdefault(int(rank), {})[session] = entry.get("fingerprint")
    return by_rank


def rank_map_for(
    executor: Executor, store_root: Path, loaded: LoadedRules, cache: bool = True
) -> Callable[..., Iterator[RuleOutcome]]:
    """A ``rank_map`` for :func:`~traceanalyzer.engine.runner.evaluate` that runs on ``executor``.

    With ``cache``, each rule's outcome on each rank is looked up first (keyed by the rule's
    code digest, its parameters and the rank's inputs): a warm re-run evaluates only what
    changed, and starts no workers when nothing did.
    """
    if loaded.source is None:
        raise ValueError("rules built in memory cannot be loaded by workers; use evaluate()")
    source, digests = loaded.source, _digests(loaded)
    _RULE_SETS[(source, digests)] = loaded.rules  # an in-process worker uses these very rules
    by_id = dict(digests)
    store = OutcomeCache(store_root)

    def rank_map(
        rules: Sequence[Rule], params: Mapping[str, Mapping[str, Any]], ranks: Sequence[int]
    ) -> Iterator[RuleOutcome]:
        shipped = {r.id: dict(params[r.id]) for r in rules}
        inputs = _rank_inputs(store_root) if cache else {}
        done: dict[tuple[int, str], RuleOutcome] = {}
        notes: dict[tuple[int, str], list[Any]] = {}
        keys: dict[tuple[int, str], str] = {}
        for rank in ranks:
            if not inputs.get(rank):
                continue  # not ingested through the manifest: nothing to key on
            for r in rules:
                keys[rank, r.id] = outcome_key(by_id[r.id], shipped[r.id], inputs[rank])
                hit = store.read(rank, r.id, keys[rank, r.id])
                if isinstance(hit, RuleOutcome):
                    done[rank, r.id] = hit
                elif hit is not None:
                    notes.setdefault((rank, r.id), []).append(hit)
        todo = [
            (rank, tuple(r.id for r in rules if (rank, r.id) not in done))
            for rank in ranks
            if any((rank, r.id) not in done for r in rules)
        ]
        tasks = [
            (str(store_root), source, digests, ids, {i: shipped[i] for i in ids}, rank)
            for rank, ids in todo
        ]
        for position, result in executor.map(evaluate_rank, tasks):
            rank, ids = todo[position]
            if isinstance(result, TaskCrashed):
                result = [
                    RuleOutcome(rid, frozenset({rank}), "error", error=f"rank {rank}: {result}")
                    for rid in ids
                ]
            for outcome in result:
                done[rank, outcome.rule] = outcome
                if (rank, outcome.rule) in keys:
                    store.write(rank, keys[rank, outcome.rule], outcome)
        # rank order, not completion order: notes and statuses read the same on every backend
        for rank in ranks:
            for r in rules:
                outcome = done[rank, r.id]
                outcome.notes = [*notes.get((rank, r.id), []), *outcome.notes]
                yield outcome

    return rank_map


def evaluate_store(
    out: str | os.PathLike[str],
    executor: Executor,
    rules: LoadedRules | None = None,
    cache: bool = True,
    **kwargs: Any,
) -> RunResult:
    """``evaluate`` on the store at ``out``: rank rules on ``executor``, the reduce here.

    ``rules`` are the run's rules, loaded once by the caller (default: the built-in rules and
    installed rule packs).
    """
    root = Path(out)
    loaded = rules if rules is not None else load_rules()
    return evaluate(
        Store.open(root),
        rules=loaded,
        rank_map=rank_map_for(executor, root, loaded, cache=cache),
        **kwargs,
    )
