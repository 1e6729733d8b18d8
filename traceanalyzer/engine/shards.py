"""Rank-scoped rules evaluated one rank shard per task, on any executor, with an outcome cache.

- **map**: one task per shard (a rank, or a group of small ranks stored together,
  :func:`traceanalyzer.store.rank_shards`) evaluates the ``scope="rank"`` rules it needs on a
  store restricted to its partitions (:func:`evaluate_shard`); only :class:`RuleOutcome`
  objects (findings, notes, key figures) come back, never tables.
- **reduce**, in the driver: grouping the per-rank findings and the ``scope="global"`` rules,
  which read only the columns they need, lazily, from the store
  (:func:`traceanalyzer.engine.runner.evaluate`).

Rules are loaded once per run, by the driver. A task carries where they came from
(:class:`~traceanalyzer.engine.loader.RuleSource`) and their code digests: a worker in this
process uses the driver's very rule objects, a worker process loads the same files once, and a
rule file edited since the driver loaded it is reported rather than evaluated with other code.
Each rule's outcome on each shard is cached (:mod:`traceanalyzer.engine.cache`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from traceanalyzer.engine.cache import OutcomeCache, RankEntries, Shard
from traceanalyzer.engine.findings import Note
from traceanalyzer.engine.loader import LoadedRules, RuleSource, load_rules
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.rule import Rule
from traceanalyzer.engine.runner import (
    GlobalRun,
    RuleOutcome,
    RunResult,
    evaluate,
    evaluate_rule,
)
from traceanalyzer.executor import Executor, TaskCrashed
from traceanalyzer.stages import result_key, rule_input_tables, shard_inputs
from traceanalyzer.store import (
    RankStore,
    Store,
    load_manifest,
    rank_shards,
    shard_words,
    store_ranks,
)

Digests = tuple[tuple[str, str], ...]  # (rule id, code digest), sorted


# Rule sets by (source, digests): the driver's own (so an in-process executor reuses its rule
# objects) and those a worker process loaded. The digests in the key mean an edited rule file
# can never be answered by rule objects built from the old code.
_RULE_SETS: dict[tuple[RuleSource, Digests], RuleSet] = {}


def _digests(loaded: LoadedRules) -> Digests:
    return tuple(sorted(loaded.digests().items()))


def _remember(source: RuleSource, digests: Digests, rules: RuleSet) -> None:
    """Keep only the newest rules of a source (a long-lived process does not pile them up)."""
    for key in [k for k in _RULE_SETS if k[0] == source]:
        del _RULE_SETS[key]
    _RULE_SETS[source, digests] = rules


def _rules_for(source: RuleSource, digests: Digests) -> RuleSet:
    if (source, digests) not in _RULE_SETS:
        loaded = source.load()
        if _digests(loaded) != digests:
            raise RuntimeError(
                "the rules' code (rule files or traceanalyzer) changed during the run; run again"
            )
        _remember(source, digests, loaded.rules)
    return _RULE_SETS[source, digests]


def evaluate_shard(
    store_root: str,
    source: RuleSource,
    digests: Digests,
    rule_ids: tuple[str, ...],
    params: Mapping[str, Mapping[str, Any]],
    shard: tuple[int, ...],
    threads: int = 1,
) -> list[RuleOutcome]:
    """Evaluate rank-scoped rules on one shard (a rank, or a rank group, evaluated at once);
    returns small RuleOutcome objects.

    With ``threads`` > 1 the rules run side by side: most of a rule's time is in polars, which
    releases the GIL, and each rule has a context of its own (the outcomes keep rule order).
    """
    rules = _rules_for(source, digests)
    store = RankStore(Path(store_root), shard)
    ranks = frozenset(shard)

    def one(rid: str) -> RuleOutcome:
        return evaluate_rule(rules.get(rid), store, params[rid], ranks)

    if threads <= 1 or len(rule_ids) <= 1:
        return [one(rid) for rid in rule_ids]
    with ThreadPoolExecutor(min(threads, len(rule_ids))) as pool:
        return list(pool.map(one, rule_ids))


def rank_map_for(
    executor: Executor,
    store_root: Path,
    loaded: LoadedRules,
    cache: bool = True,
) -> Callable[..., Iterator[RuleOutcome]]:
    """A ``rank_map`` for :func:`~traceanalyzer.engine.runner.evaluate` that runs on ``executor``.

    With ``cache``, each rule's outcome on each rank is looked up first (keyed by the rule's
    code digest, its parameters and the rank's inputs): a warm re-run evaluates only what
    changed, and starts no workers when nothing did.
    """
    if loaded.source is None:
        raise ValueError("rules built in memory cannot be loaded by workers; use evaluate()")
    source, digests = loaded.source, _digests(loaded)
    _remember(source, digests, loaded.rules)  # an in-process worker uses these very rules
    by_id = dict(digests)
    outcome_cache = OutcomeCache(store_root)

    def rank_map(
        rules: Sequence[Rule], params: Mapping[str, Mapping[str, Any]], ranks: Sequence[int]
    ) -> Iterator[RuleOutcome]:
        shipped = {r.id: dict(params[r.id]) for r in rules}
        sessions = load_manifest(store_root).sessions
        shards = rank_shards(store_root, ranks, sessions)
        inputs = shard_inputs(store_root, sessions, shards, rule_input_tables()) if cache else {}
        done: dict[tuple[Shard, str], RuleOutcome] = {}
        notes: dict[tuple[Shard, str], list[Note]] = {}
        keys: dict[tuple[Shard, str], str] = {}
        cached: dict[Shard, RankEntries] = {}
        for shard in shards:
            if shard not in inputs:
                continue
            cached[shard] = outcome_cache.load(shard)
            for r in rules:
                keys[shard, r.id] = result_key(by_id[r.id], shipped[r.id], inputs[shard])
                hit = outcome_cache.lookup(cached[shard], r.id, keys[shard, r.id])
                if isinstance(hit, RuleOutcome):
                    done[shard, r.id] = hit
                elif hit is not None:
                    notes.setdefault((shard, r.id), []).append(hit)
        todo = [
            (shard, tuple(r.id for r in rules if (shard, r.id) not in done))
            for shard in shards
            if any((shard, r.id) not in done for r in rules)
        ]
        threads = executor.threads_per_task(len(todo))
        tasks = [
            (str(store_root), source, digests, ids, {i: shipped[i] for i in ids}, shard, threads)
            for shard, ids in todo
        ]
        for position, result in executor.map(evaluate_shard, tasks):
            shard, ids = todo[position]
            if isinstance(result, TaskCrashed):
                result = [
                    RuleOutcome(
                        rid, frozenset(shard), "error", error=f"{shard_words(shard)}: {result}"
                    )
                    for rid in ids
                ]
            for outcome in result:
                done[shard, outcome.rule] = outcome
            if shard in cached:
                outcome_cache.save(
                    cached[shard], {o.rule: (keys[shard, o.rule], o) for o in result}
                )
        # rank order, not completion order: notes and statuses read the same on every backend
        for shard in shards:
            for r in rules:
                outcome = done[shard, r.id]
                outcome.notes = [*notes.get((shard, r.id), []), *outcome.notes]
                yield outcome

    return rank_map


def global_run_for(
    store_root: Path,
    loaded: LoadedRules,
    cache: bool = True,
) -> GlobalRun:
    """A ``run_global`` for :func:`~traceanalyzer.engine.runner.evaluate`: a rule that reads every
    rank at once is looked up in the outcome cache first, keyed by its code digest, its
    parameters and every rank's inputs, so a warm re-run does not evaluate it again."""
    by_id = dict(_digests(loaded))
    outcome_cache = OutcomeCache(store_root)

    def run_global(rule: Rule, store: Store, params: Mapping[str, Any]) -> RuleOutcome:
        sessions = load_manifest(store_root).sessions if cache else {}
        shards = rank_shards(store_root, store_ranks(store), sessions) if cache else []
        inputs = shard_inputs(store_root, sessions, shards, rule_input_tables())
        if not shards or len(inputs) < len(shards):
            return evaluate_rule(rule, store, params)  # a rank not ingested through the manifest
        every_rank = {",".join(map(str, shard)): inputs[shard] for shard in shards}
        key = result_key(by_id[rule.id], dict(params), every_rank)
        cached = outcome_cache.load(None)
        hit = outcome_cache.lookup(cached, rule.id, key)
        if isinstance(hit, RuleOutcome):
            return hit
        outcome = evaluate_rule(rule, store, params)
        if hit is not None:
            outcome.notes.insert(0, hit)
        outcome_cache.save(cached, {rule.id: (key, outcome)})
        return outcome

    return run_global


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
    # The rules that read every rank get one snapshot of the store, as a rank's rules do: what
    # a rule's detection and its key figures both derive (ctx.shared) is derived once.
    every_rank = RankStore(root, store_ranks(Store.open(root)))
    return evaluate(
        every_rank,
        rules=loaded,
        rank_map=rank_map_for(executor, root, loaded, cache=cache),
        run_global=global_run_for(root, loaded, cache=cache),
        **kwargs,
    )
