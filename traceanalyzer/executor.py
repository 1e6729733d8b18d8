"""Where the per-rank work runs: in this process, in a spawn process pool, or on Ray.

A run is map/reduce over rank sessions (the shape Nsight recipes and msprof-analyze
``cluster_analyse`` users know):

- **map, ingest**: one task per rank session parses its files and writes its own store
  partitions (:func:`traceanalyzer.ingest.ingest_session`); only a small
  :class:`~traceanalyzer.ingest.SessionOutcome` comes back.
- **map, rules**: one task per rank evaluates every ``scope="rank"`` rule on a store restricted
  to that rank's partitions (:func:`evaluate_rank`); only :class:`RuleOutcome` objects (findings,
  notes) come back, never tables.
- **reduce**, in the driver: grouping the per-rank findings ("store-transfer-stall on ranks 2, 5,
  9 (3/64)") and the ``scope="global"`` rules, which read only the columns they need, lazily,
  from the store (:func:`traceanalyzer.engine.runner.evaluate`).

So a worker's memory is bounded by one rank's working set, and the driver's by the outcomes.

Backends (``--executor``):

- ``local``: everything in this process, one rank after the other. No crash isolation: a rank
  that kills the process kills the run (the next run resumes).
- ``processes`` (default): a ``ProcessPoolExecutor`` with the *spawn* start method -- the driver
  already runs DuckDB/polars thread pools, and a forked child inherits their locks in whatever
  state they were in (a deadlock, seen in tests). A worker killed by the OOM killer breaks the
  whole pool (``BrokenProcessPool`` for every pending task), so the unfinished tasks are
  resubmitted to a fresh pool, and the tasks that were running when it broke are retried one at
  a time in their own process: only a task that kills its process again is reported as crashed.
- ``ray``: one Ray task per rank (``pip install 'traceanalyzer[ray]'``). ``--ray-address``
  joins a running cluster (``auto`` or ``HOST:PORT``); without it Ray starts locally with
  ``--jobs`` CPUs. Ray retries a task whose worker or node died once, then reports it crashed.
  The store path must be visible to every node (a shared filesystem; see ``docs/scale.md``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceanalyzer.store import TABLES_DIR, Store, write_atomic_bytes

EXECUTORS: tuple[str, ...] = ("local", "processes", "ray")
RAY_INSTALL_HINT = "pip install 'traceanalyzer[ray]'"
_INFLIGHT_PREFIX = "task-"


class ExecutorError(Exception):
    """The executor cannot be used (unknown name, Ray not installed or not reachable)."""


@dataclass(frozen=True)
class TaskCrashed:
    """A task did not return: its worker died (OOM kill, segfault, lost node) or it raised."""

    reason: str

    def __str__(self) -> str:
        return self.reason


MapResult = Iterator[tuple[int, Any]]


class Executor(ABC):
    """Runs one top-level function over a list of argument tuples, yielding results as they finish.

    ``map`` yields ``(index, result)`` pairs in completion order; a task that did not return
    yields a :class:`TaskCrashed` instead of its result, and the other tasks carry on.
    """

    name: str = ""
    parallel: bool = False

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, int(jobs))

    @abstractmethod
    def map(
        self,
        fn: Callable[..., Any],
        args: Sequence[tuple[Any, ...]],
        labels: Sequence[str] | None = None,
        width: int | None = None,
    ) -> MapResult:
        """``width``: at most this many tasks at once, below ``jobs`` (the process pool honours
        it; ``local`` runs one at a time anyway; Ray schedules by its own resources)."""

    def close(self) -> None:  # noqa: B027 - optional hook; local has nothing to release
        """Release workers. Idempotent."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        return f"{self.name} ({self.jobs} job{'s' if self.jobs != 1 else ''})"


# --------------------------------------------------------------------------------------------
# local
# --------------------------------------------------------------------------------------------


class LocalExecutor(Executor):
    """Every task in this process, in order."""

    name = "local"

    def map(
        self,
        fn: Callable[..., Any],
        args: Sequence[tuple[Any, ...]],
        labels: Sequence[str] | None = None,
        width: int | None = None,
    ) -> MapResult:
        for index, task_args in enumerate(args):
            try:
                result = fn(*task_args)
            except Exception as exc:
                result = TaskCrashed(f"{type(exc).__name__}: {exc}")
            yield index, result


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


def _tracked(inflight: str, index: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Run one task in a pool worker, leaving a marker while it runs.

    The pool does not say which task's worker died; a marker that is still there after the pool
    broke names a task that was running at that moment (a suspect).
    """
    marker = os.path.join(inflight, f"{_INFLIGHT_PREFIX}{index}")
    with open(marker, "w") as fh:
        fh.write(str(os.getpid()))
    try:
        return fn(*args)
    finally:
        os.unlink(marker)


def _isolated_entry(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result: Any = fn(*args)
    except Exception as exc:
        result = TaskCrashed(f"{type(exc).__name__}: {exc}")
    conn.send(result)
    conn.close()


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = (
            " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        )
        return f"worker killed by {name}{hint}"
    return f"worker exited with code {exitcode}"


class ProcessExecutor(Executor):
    """A spawn process pool that survives workers being killed (see the module docstring)."""

    name = "processes"
    parallel = True

    def __init__(self, jobs: int = 1, max_tasks_per_child: int | None = None):
        super().__init__(jobs)
        self._context = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        self._pool_size = 0
        self.max_tasks_per_child = max_tasks_per_child
        self.restarts = 0  # pools replaced after a worker died (for tests and logs)

    def _get_pool(self, size: int, at_most: bool = False) -> ProcessPoolExecutor:
        # Reuse one pool across maps (ingest, then rules): spawning a worker costs an interpreter
        # start plus the polars/DuckDB imports, about a second each on this class of machine.
        # A map limited in width (``at_most``) never runs on a wider pool.
        if self._pool is None or self._pool_size < size or (at_most and self._pool_size > size):
            self._shutdown(wait=True)
            kwargs: dict[str, Any] = {"max_workers": size, "mp_context": self._context}
            if self.max_tasks_per_child:
                kwargs["max_tasks_per_child"] = self.max_tasks_per_child
            self._pool = ProcessPoolExecutor(**kwargs)
            self._pool_size = size
        return self._pool

    def _shutdown(self, wait: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if not wait:
            # Ctrl-C or a broken pool: do not wait for running tasks (they may never finish)
            for proc in list(getattr(pool, "_processes", {}).values()):
                if proc.is_alive():
                    proc.terminate()
        pool.shutdown(wait=wait, cancel_futures=True)

    def close(self) -> None:
        self._shutdown(wait=True)

    def map(
        self,
        fn: Callable[..., Any],
        args: Sequence[tuple[Any, ...]],
        labels: Sequence[str] | None = None,
        width: int | None = None,
    ) -> MapResult:
        pending = set(range(len(args)))
        while pending:
            inflight = tempfile.mkdtemp(prefix="traceanalyzer-inflight-")
            broken = False
            try:
                size = min(self.jobs, width or self.jobs, len(pending))
                pool = self._get_pool(size, at_most=bool(width and width < self.jobs))
                futures: dict[Future[Any], int] = {
                    pool.submit(_tracked, inflight, i, fn, args[i]): i for i in sorted(pending)
                }
                for future in as_completed(futures):
                    index = futures[future]
                    try:
                        result = future.result()
                    except BrokenProcessPool:
                        broken = True
                        continue  # every unfinished task lands here; sorted out below
                    except Exception as exc:  # the task raised, or its arguments did not pickle
                        result = TaskCrashed(f"{type(exc).__name__}: {exc}")
                    pending.discard(index)
                    yield index, result
                suspects = sorted(
                    int(name[len(_INFLIGHT_PREFIX) :])
                    for name in os.listdir(inflight)
                    if name.startswith(_INFLIGHT_PREFIX)
                )
            except BaseException:  # Ctrl-C, or the consumer stopped early: leave no workers
                self._shutdown(wait=False)
                raise
            finally:
                shutil.rmtree(inflight, ignore_errors=True)
            if not broken:
                continue
            self._shutdown(wait=False)
            self.restarts += 1
            suspects = [i for i in suspects if i in pending] or sorted(pending)[:1]
            # Each task that was running when the pool broke runs alone once more: only the one
            # that kills its own process again is reported; the innocent ones just finish.
            for index in suspects:
                pending.discard(index)
                yield index, self._run_isolated(fn, args[index])

    def _run_isolated(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        receiver, sender = self._context.Pipe(duplex=False)
        proc = self._context.Process(target=_isolated_entry, args=(sender, fn, args))
        proc.start()
        sender.close()
        try:
            result = receiver.recv()  # before join(): a large result would block the child
        except EOFError:
            result = None
        finally:
            receiver.close()
        proc.join()
        return result if result is not None else TaskCrashed(_exit_reason(proc.exitcode))


# --------------------------------------------------------------------------------------------
# ray
# --------------------------------------------------------------------------------------------


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ExecutorError(
            f"--executor ray needs Ray, which is not installed: {RAY_INSTALL_HINT}"
        ) from exc
    return ray


class RayExecutor(Executor):
    """One Ray task per rank; joins ``address`` or starts a local Ray with ``jobs`` CPUs."""

    name = "ray"
    parallel = True

    def __init__(self, jobs: int = 1, address: str | None = None, retries: int = 1):
        super().__init__(jobs)
        self.ray = _import_ray()
        self.address = address
        self.retries = retries
        self._started = False
        self._remote: dict[Callable[..., Any], Any] = {}

    def _ensure(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return  # the caller (a notebook, a test) owns this Ray instance
        try:
            if self.address:
                ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)
            else:
                ray.init(
                    num_cpus=self.jobs,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
        except Exception as exc:
            where = self.address or "a local instance"
            raise ExecutorError(f"could not start or join Ray ({where}): {exc}") from exc
        self._started = True

    def _remote_fn(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remote:
            # max_retries covers system failures only (worker died, node lost): a rank whose
            # worker the OOM killer took is retried once elsewhere, then reported as crashed.
            self._remote[fn] = self.ray.remote(fn).options(
                num_cpus=1, max_retries=self.retries, retry_exceptions=False
            )
        return self._remote[fn]

    def map(
        self,
        fn: Callable[..., Any],
        args: Sequence[tuple[Any, ...]],
        labels: Sequence[str] | None = None,
        width: int | None = None,
    ) -> MapResult:
        if not args:
            return
        self._ensure()
        ray = self.ray
        remote = self._remote_fn(fn)
        refs = {remote.remote(*task_args): i for i, task_args in enumerate(args)}
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                for ref in ready:
                    index = refs.pop(ref)
                    try:
                        result = ray.get(ref)
                    except (
                        Exception
                    ) as exc:  # RayTaskError, WorkerCrashedError, OutOfMemoryError, ...
                        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                        result = TaskCrashed(f"{type(exc).__name__}: {first}"[:500])
                    yield index, result
        except BaseException:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise

    def close(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False

    def describe(self) -> str:
        return f"ray ({self.address or f'local, {self.jobs} CPUs'})"


def make_executor(
    name: str = "processes", jobs: int = 1, ray_address: str | None = None
) -> Executor:
    """The executor called ``name`` (``local``, ``processes``, ``ray``)."""
    if name == "local":
        return LocalExecutor(jobs)
    if name == "processes":
        # one worker gains nothing over running in-process, and costs a spawn
        return ProcessExecutor(jobs) if jobs > 1 else LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(jobs, address=ray_address)
    raise ExecutorError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")


# --------------------------------------------------------------------------------------------
# The rules map: one rank shard per task
# --------------------------------------------------------------------------------------------


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


_RULES_CACHE: dict[tuple[tuple[str, ...], bool], Any] = {}


def _rules(rule_dirs: tuple[str, ...], builtin: bool) -> Any:
    """Rules loaded once per worker process (rule objects hold functions; they are not shipped)."""
    key = (rule_dirs, builtin)
    if key not in _RULES_CACHE:
        from traceanalyzer.engine.loader import load_rules

        _RULES_CACHE[key] = load_rules(rule_dirs, builtin=builtin).rules
    return _RULES_CACHE[key]


def evaluate_rank(
    store_root: str,
    rule_dirs: tuple[str, ...],
    builtin: bool,
    rule_ids: tuple[str, ...],
    params: Mapping[str, Mapping[str, Any]],
    rank: int,
) -> list[Any]:
    """Evaluate rank-scoped rules on one rank's shard; returns small RuleOutcome objects."""
    from traceanalyzer.engine.runner import evaluate_rule

    rules = _rules(rule_dirs, builtin)
    store = RankStore(Path(store_root), [rank])
    shard = frozenset({rank})
    return [evaluate_rule(rules.get(rid), store, params[rid], shard) for rid in rule_ids]


RULE_CACHE_DIR = Path(".cache") / "rules"


def _rule_code_digest(rules: Sequence[Any]) -> str:
    """Hash of the rules' code: every .py file in their folders (helpers too), and our version."""
    from traceanalyzer import __version__

    digest = hashlib.sha256(__version__.encode())
    folders = sorted({str(Path(r.source).parent) for r in rules if r.source is not None})
    for folder in folders:
        for path in sorted(Path(folder).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _shard_key(
    code: str, rank_entries: Any, rule_ids: Sequence[str], params: Mapping[str, Any]
) -> str:
    doc = {"code": code, "inputs": rank_entries, "rules": list(rule_ids), "params": params}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def rank_map_for(
    executor: Executor,
    store_root: Path,
    rule_dirs: Sequence[str | Path],
    builtin: bool = True,
    cache: bool = True,
) -> Callable[..., Iterator[Any]]:
    """A ``rank_map`` for :func:`traceanalyzer.engine.runner.evaluate` that runs on ``executor``.

    With ``cache``, each rank's outcomes are kept in ``OUT/.cache/rules/rank=R.pkl`` under a key
    made of the rank's input fingerprints (from the manifest), the rules' code and parameters:
    a warm re-run evaluates only ranks whose inputs, rules or parameters changed, and starts no
    workers when none did.
    """
    from traceanalyzer.engine.runner import RuleOutcome
    from traceanalyzer.ingest import load_manifest

    dirs = tuple(str(Path(d).resolve()) for d in rule_dirs)

    def rank_map(
        rules: Sequence[Any], params: Mapping[str, Mapping[str, Any]], ranks: Sequence[int]
    ) -> Iterator[Any]:
        ids = tuple(r.id for r in rules)
        shipped = {rid: dict(params[rid]) for rid in ids}
        by_index: dict[int, list[Any]] = {}
        keys: dict[int, str] = {}
        if cache:
            code = _rule_code_digest(rules)
            sessions = load_manifest(store_root).sessions
            for index, rank in enumerate(ranks):
                entries = {
                    k: v.get("fingerprint") for k, v in sessions.items() if k.startswith(f"{rank}/")
                }
                if not entries:
                    continue  # not ingested through the manifest: nothing to key on
                keys[index] = _shard_key(code, entries, ids, shipped)
                hit = _cache_read(store_root, rank, keys[index])
                if hit is not None:
                    by_index[index] = hit
        todo = [i for i in range(len(ranks)) if i not in by_index]
        tasks = [(str(store_root), dirs, builtin, ids, shipped, ranks[i]) for i in todo]
        for position, result in executor.map(evaluate_rank, tasks):
            index = todo[position]
            rank = ranks[index]
            if isinstance(result, TaskCrashed):
                result = [
                    RuleOutcome(rid, frozenset({rank}), "error", error=f"rank {rank}: {result}")
                    for rid in ids
                ]
            elif index in keys:
                _cache_write(store_root, rank, keys[index], result)
            by_index[index] = result
        # rank order, not completion order: notes and statuses read the same on every backend
        for index in sorted(by_index):
            yield from by_index[index]

    return rank_map


def _cache_path(root: Path, rank: int) -> Path:
    return root / RULE_CACHE_DIR / f"rank={rank}.pkl"


def _cache_read(root: Path, rank: int, key: str) -> list[Any] | None:
    try:
        with open(_cache_path(root, rank), "rb") as fh:
            stored_key, outcomes = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError):
        return None  # absent, torn or from another version: evaluate again
    return outcomes if stored_key == key else None


def _cache_write(root: Path, rank: int, key: str, outcomes: list[Any]) -> None:
    if any(o.status == "error" for o in outcomes):
        return  # a rule that crashed may pass next time: do not remember the failure
    write_atomic_bytes(_cache_path(root, rank), pickle.dumps((key, outcomes)))


def evaluate_store(
    out: str | os.PathLike[str],
    executor: Executor,
    rule_dirs: Sequence[str | Path] = (),
    cache: bool = True,
    **kwargs: Any,
) -> Any:
    """``evaluate`` on the store at ``out``: rank rules on ``executor``, the reduce here."""
    from traceanalyzer.engine.runner import evaluate

    root = Path(out)
    builtin = kwargs.get("builtin", True)
    return evaluate(
        Store.open(root),
        rule_dirs=rule_dirs,
        rank_map=rank_map_for(executor, root, rule_dirs, builtin, cache=cache),
        **kwargs,
    )
