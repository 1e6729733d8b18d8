"""Where tasks run: in this process, in a spawn process pool, or on Ray.

A generic task runner: ``Executor.map(fn, args)`` runs a top-level function over argument tuples
and yields each result (or :class:`TaskCrashed`) as it finishes. It knows nothing of traces or
rules (it imports only :mod:`traceanalyzer.interrupts`, so that a worker tells the user's Ctrl-C
from a task's own KeyboardInterrupt as the driver does, and :mod:`traceanalyzer.process_env`,
whose library settings a joined Ray cluster's workers are given); the project maps rank
sessions through it (ingest: one task per rank session; rules: one task per rank shard,
:mod:`traceanalyzer.engine.shards`), so a worker's memory is bounded by one task's working set
and the driver's by the small results that come back.

A task may be given a deadline (``map(..., timeouts=)``): past it, it is reported as
:class:`TaskCrashed` (``timed_out``), never waited for, and the map goes on: ``processes``
kills its worker (and runs the tasks that shared the broken pool again, each alone), ``ray``
ends its worker from inside, ``local`` leaves the task's thread behind (nothing can stop a read
stuck in a C library; the run no longer waits for it).

An executor states what callers need to know to size their tasks, instead of callers asking
for its name: :attr:`Executor.parallel` (tasks run side by side), :attr:`Executor.shares_memory`
(side by side on *this* machine, so they share its memory) and :attr:`Executor.cpus_per_task`
(the CPUs a task gets, when the backend fixes it).

Backends (``--executor``):

- ``auto`` (default): ``local`` when the work is small (one task, or little input in all: a
  pool's start-up costs more than it saves), ``processes`` otherwise. The caller states the
  work before it maps (:meth:`Executor.plan`) and is told what was chosen and why.
- ``local``: everything in this process, one rank after the other. No crash isolation: a rank
  that kills the process kills the run (the next run resumes).
- ``processes``: a ``ProcessPoolExecutor`` with the *spawn* start method -- the driver
  already runs DuckDB/polars thread pools, and a forked child inherits their locks in whatever
  state they were in (a deadlock, seen in tests). Workers die with the driver (:func:`worker_start`:
  ``PR_SET_PDEATHSIG`` on Linux, a watch on the parent elsewhere), even when it is killed with
  SIGKILL and has no chance to stop them. A worker killed by the OOM killer breaks the
  whole pool (``BrokenProcessPool`` for every pending task), so the unfinished tasks are
  resubmitted to a fresh pool, and the tasks that were running when it broke are retried one at
  a time in their own process: only a task that kills its process again is reported as crashed.
- ``ray``: one Ray task per rank (``pip install 'traceanalyzer[ray]'``). ``--ray-address``
  joins a running cluster (``auto`` or ``HOST:PORT``); without it Ray starts locally with
  ``--jobs`` CPUs. Ray retries a task whose worker or node died once, then reports it crashed.
  A joined cluster's workers start from their node's environment, not this process's: the job
  carries this process's library settings (:func:`traceanalyzer.process_env.in_effect`) as
  its ``runtime_env``, so they allocate and query as a local run does.
  The store path must be visible to every node (a shared filesystem; see ``docs/scale.md``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from traceanalyzer import interrupts, process_env

EXECUTORS: tuple[str, ...] = ("auto", "local", "processes", "ray")
RAY_INSTALL_HINT = "pip install 'traceanalyzer[ray]'"
_INFLIGHT_PREFIX = "task-"


class ExecutorError(Exception):
    """The executor cannot be used (unknown name, Ray not installed or not reachable)."""


@dataclass(frozen=True)
class TaskCrashed:
    """A task did not return: its worker died (OOM kill, segfault, lost node), it raised, or it
    ran past its deadline (``timed_out``)."""

    reason: str
    timed_out: bool = False

    def __str__(self) -> str:
        return self.reason


def _timed_out(seconds: float) -> TaskCrashed:
    return TaskCrashed(f"did not finish within {seconds:.0f} s: stopped", timed_out=True)


_POLL_SECONDS = 0.5  # how often a map looks for a task past its deadline


MapResult = Iterator[tuple[int, Any]]
Task = Callable[..., Any]  # a top-level function, called with one task's arguments
TaskArgs = Sequence[tuple[Any, ...]]
Deadlines = Sequence[float] | None  # a task's deadline in seconds, by task


class Executor(ABC):
    """Runs one top-level function over a list of argument tuples, yielding results as they finish.

    ``map`` yields ``(index, result)`` pairs in completion order; a task that did not return
    yields a :class:`TaskCrashed` instead of its result, and the other tasks carry on.
    """

    name: str = ""
    parallel: bool = False  # tasks run side by side
    shares_memory: bool = False  # ... on this machine, so side-by-side tasks share its memory
    cpus_per_task: int | None = None  # CPUs the backend gives a task; None: what this machine has

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, int(jobs))

    def map(
        self,
        fn: Callable[..., Any],
        args: Sequence[tuple[Any, ...]],
        width: int | None = None,
        timeouts: Sequence[float] | None = None,
    ) -> MapResult:
        """``width``: at most this many tasks at once, below ``jobs`` (the process pool honours
        it; ``local`` runs one at a time anyway; Ray schedules by its own resources).
        ``timeouts``: each task's deadline in seconds, from when it starts (see the module
        doc)."""
        return self._map(fn, args, width, timeouts)

    @abstractmethod
    def _map(self, fn: Task, args: TaskArgs, width: int | None, timeouts: Deadlines) -> MapResult:
        """:meth:`map` as the backend runs it."""

    def threads_per_task(self, side_by_side: int) -> int:
        """Threads a task may use when ``side_by_side`` tasks run at once: this machine's cores
        split between them (all of them for a task that runs alone), unless the backend gives
        each task its CPUs."""
        if self.cpus_per_task:
            return self.cpus_per_task
        running = min(self.jobs, side_by_side) if self.parallel else 1
        return max(1, (os.cpu_count() or 1) // max(1, running))

    def plan(self, tasks: int, work_bytes: int) -> str:
        """Told the work ahead (``tasks`` of ``work_bytes`` input in all) before the first
        ``map``; says which executor runs it and why (``auto`` chooses here)."""
        return f"{self.describe()}, as asked"

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

    def describe(self) -> str:
        return "local"

    def _map(self, fn: Task, args: TaskArgs, width: int | None, timeouts: Deadlines) -> MapResult:
        for index, task_args in enumerate(args):
            if timeouts is None:
                yield index, _called(fn, task_args)
            else:
                yield index, _within(timeouts[index], fn, task_args)


def _called(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return TaskCrashed(f"{type(exc).__name__}: {exc}")


def _within(seconds: float, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` on a thread of its own, waited for ``seconds`` at most (then left running,
    and reported as timed out)."""
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(_called(fn, args)), daemon=True)
    worker.start()
    worker.join(seconds)
    return done[0] if done else _timed_out(seconds)


def _ended_within(seconds: float, fn: Callable[..., Any], *args: Any) -> Any:
    """A Ray task with a deadline: its result, or a timeout report, after which the worker
    process ends itself (its task's thread cannot be stopped otherwise)."""
    result = _within(seconds, fn, args)
    if isinstance(result, TaskCrashed) and result.timed_out:
        threading.Timer(_POLL_SECONDS * 4, os._exit, (1,)).start()  # once Ray has the result
    return result


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PARENT_POLL_SECONDS = 1.0


def worker_start(parent: int) -> None:
    """The first thing a worker process does: die with ``parent`` (the driver), however it ends,
    and tell the user's Ctrl-C from a task's KeyboardInterrupt (:mod:`traceanalyzer.interrupts`)."""
    interrupts.install()
    if not _die_with_parent():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the driver was gone before the death signal was set
        os._exit(1)


def _die_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_SECONDS)
    os._exit(1)  # orphaned: the driver is gone, nobody waits for this work


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


def _running(inflight: str) -> list[int]:
    """The tasks whose markers are in ``inflight``: they were running."""
    return sorted(
        int(name[len(_INFLIGHT_PREFIX) :])
        for name in os.listdir(inflight)
        if name.startswith(_INFLIGHT_PREFIX)
    )


def _stop_overdue(inflight: str, timeouts: Sequence[float]) -> set[int]:
    """Kill the worker of every task running past its deadline (its marker is as old as the
    task, and holds the worker's pid); return those tasks. The pool breaks, and says so."""
    stopped = set()
    for index in _running(inflight):
        marker = os.path.join(inflight, f"{_INFLIGHT_PREFIX}{index}")
        try:
            started = os.stat(marker).st_mtime
            if time.time() - started <= timeouts[index]:
                continue
            with open(marker) as fh:
                os.kill(int(fh.read()), signal.SIGKILL)
        except (OSError, ValueError):  # it just finished, or the marker is half written
            continue
        stopped.add(index)
    return stopped


def _isolated_entry(conn: Any, parent: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    worker_start(parent)
    conn.send(_called(fn, args))
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
    shares_memory = True

    def __init__(self, jobs: int = 1):
        super().__init__(jobs)
        self._context = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        self._pool_size = 0
        self.restarts = 0  # pools replaced after a worker died (for tests and logs)

    def _get_pool(self, size: int, at_most: bool = False) -> ProcessPoolExecutor:
        # Reuse one pool across maps (ingest, then rules): spawning a worker costs an interpreter
        # start plus the polars/DuckDB imports, about a second each on this class of machine.
        # A map limited in width (``at_most``) never runs on a wider pool.
        if self._pool is None or self._pool_size < size or (at_most and self._pool_size > size):
            self._shutdown(wait=True)
            self._pool = ProcessPoolExecutor(
                size, mp_context=self._context, initializer=worker_start, initargs=(os.getpid(),)
            )
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

    def _map(self, fn: Task, args: TaskArgs, width: int | None, timeouts: Deadlines) -> MapResult:
        pending = set(range(len(args)))
        overdue: set[int] = set()  # killed past their deadline: reported, never run again
        while pending:
            inflight = tempfile.mkdtemp(prefix="traceanalyzer-inflight-")
            broken = False
            try:
                size = min(self.jobs, width or self.jobs, len(pending))
                pool = self._get_pool(size, at_most=bool(width and width < self.jobs))
                futures: dict[Future[Any], int] = {
                    pool.submit(_tracked, inflight, i, fn, args[i]): i for i in sorted(pending)
                }
                waiting = set(futures)
                while waiting:
                    done, waiting = wait(waiting, _POLL_SECONDS, FIRST_COMPLETED)
                    if timeouts is not None:
                        overdue |= _stop_overdue(inflight, timeouts)
                    for future in done:
                        index = futures[future]
                        try:
                            result = future.result()
                        except BrokenProcessPool:
                            broken = True
                            continue  # every unfinished task lands here; sorted out below
                        except Exception as exc:  # the task raised, or its args did not pickle
                            result = TaskCrashed(f"{type(exc).__name__}: {exc}")
                        pending.discard(index)
                        yield index, result
                suspects = _running(inflight)
            except BaseException:  # Ctrl-C, or the consumer stopped early: leave no workers
                self._shutdown(wait=False)
                raise
            finally:
                shutil.rmtree(inflight, ignore_errors=True)
            if not broken:
                continue
            self._shutdown(wait=False)
            self.restarts += 1
            for index in sorted(overdue & pending):
                pending.discard(index)
                yield index, _timed_out(timeouts[index] if timeouts else 0)
            suspects = [i for i in suspects if i in pending] or sorted(pending)[:1]
            # Each task that was running when the pool broke runs alone once more: only the one
            # that kills its own process again is reported; the innocent ones just finish.
            for index in suspects:
                pending.discard(index)
                timeout = timeouts[index] if timeouts is not None else None
                yield index, self._run_isolated(fn, args[index], timeout)

    def _run_isolated(
        self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None = None
    ) -> Any:
        receiver, sender = self._context.Pipe(duplex=False)
        proc = self._context.Process(target=_isolated_entry, args=(sender, os.getpid(), fn, args))
        proc.start()
        sender.close()
        try:
            if not receiver.poll(timeout):
                proc.kill()
                proc.join()
                return _timed_out(timeout or 0)
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
    cpus_per_task = 1  # each task asks Ray for one CPU (see _remote_fn)

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
        # Ray's own warnings (a small /dev/shm, deprecations) are not the run's to print: they
        # would land between the progress lines. Its errors still raise.
        logging.getLogger("ray").setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
                if self.address:
                    env = {"env_vars": process_env.in_effect()}
                    ray.init(address=self.address, runtime_env=env, **quiet)
                else:
                    ray.init(num_cpus=self.jobs, include_dashboard=False, **quiet)
        except Exception as exc:
            where = self.address or "a local instance"
            raise ExecutorError(f"could not start or join Ray ({where}): {exc}") from exc
        self._started = True

    def _remote_fn(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remote:
            # max_retries covers system failures only (worker died, node lost): a rank whose
            # worker the OOM killer took is retried once elsewhere, then reported as crashed.
            self._remote[fn] = self.ray.remote(fn).options(
                num_cpus=self.cpus_per_task, max_retries=self.retries, retry_exceptions=False
            )
        return self._remote[fn]

    def _map(self, fn: Task, args: TaskArgs, width: int | None, timeouts: Deadlines) -> MapResult:
        if not args:
            return
        self._ensure()
        ray = self.ray
        if timeouts is None:
            remote = self._remote_fn(fn)
            refs = {remote.remote(*task_args): i for i, task_args in enumerate(args)}
        else:  # the deadline is kept by the task itself: Ray does not say when a task starts
            remote = self._remote_fn(_ended_within)
            refs = {
                remote.remote(timeouts[i], fn, *task_args): i for i, task_args in enumerate(args)
            }
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                for ref in ready:
                    index = refs.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # RayTaskError, WorkerCrashedError, OutOfMemoryError
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


# --------------------------------------------------------------------------------------------
# auto
# --------------------------------------------------------------------------------------------

# Below this much input a spawn pool loses: its workers' start-up (importing the data libraries,
# about 2.5 s on 2 cores) exceeds what parsing side by side saves (a 200 MB trace parses in
# 1.6 s, on every core, in this process too).
SMALL_WORK_BYTES = 256 << 20
# From this many tasks a pool wins however small they are: each rank has a fixed cost of about
# 0.3 s (its store, its steps, its rules), so with two jobs 2.5 s of start-up pays back from
# about 17 ranks; twice that to be sure on a busy machine.
MANY_TASKS = 32


class AutoExecutor(Executor):
    """``local`` for small work, ``processes`` otherwise; chosen in :meth:`plan` (or at the first
    ``map``, by its task count), then kept for every later map of the run."""

    name = "auto"

    def __init__(
        self, jobs: int = 1, small_bytes: int = SMALL_WORK_BYTES, many_tasks: int = MANY_TASKS
    ):
        super().__init__(jobs)
        self.small_bytes = small_bytes
        self.many_tasks = many_tasks
        self.chosen: Executor | None = None

    def plan(self, tasks: int, work_bytes: int) -> str:
        if self.chosen is not None:
            return f"{self.chosen.describe()}, chosen earlier in this run"
        work = f"{tasks} task(s), {work_bytes / (1 << 20):.1f} MB of input"
        small = work_bytes < self.small_bytes and tasks < self.many_tasks
        if self.jobs == 1 or tasks <= 1 or small:
            self.chosen = LocalExecutor(self.jobs)
            if self.jobs == 1:
                return f"local ({work}, one job)"
            if tasks <= 1:
                return f"local ({work}: nothing to run side by side)"
            return (
                f"local ({work}, below {self.small_bytes >> 20} MB and {self.many_tasks} tasks: "
                "a process pool would cost more than it saves)"
            )
        self.chosen = ProcessExecutor(self.jobs)
        why = (
            f"at least {self.small_bytes >> 20} MB"
            if work_bytes >= self.small_bytes
            else f"at least {self.many_tasks} tasks, each with a fixed cost"
        )
        return f"{self.chosen.describe()} ({work}, {why})"

    def _executor(self, tasks: int) -> Executor:
        if self.chosen is None:
            self.plan(tasks, 0 if tasks <= 1 else self.small_bytes)
        assert self.chosen is not None
        return self.chosen

    @property
    def parallel(self) -> bool:  # type: ignore[override]
        return self.chosen is not None and self.chosen.parallel

    @property
    def shares_memory(self) -> bool:  # type: ignore[override]
        return self.chosen is not None and self.chosen.shares_memory

    def _map(self, fn: Task, args: TaskArgs, width: int | None, timeouts: Deadlines) -> MapResult:
        return self._executor(len(args)).map(fn, args, width=width, timeouts=timeouts)

    def close(self) -> None:
        if self.chosen is not None:
            self.chosen.close()

    def describe(self) -> str:
        return f"auto: {self.chosen.describe()}" if self.chosen else "auto (not chosen yet)"


def make_executor(name: str = "auto", jobs: int = 1, ray_address: str | None = None) -> Executor:
    """The executor called ``name`` (``auto``, ``local``, ``processes``, ``ray``)."""
    if name == "auto":
        return AutoExecutor(jobs)
    if name == "local":
        return LocalExecutor(jobs)
    if name == "processes":
        # one worker gains nothing over running in-process, and costs a spawn
        return ProcessExecutor(jobs) if jobs > 1 else LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(jobs, address=ray_address)
    raise ExecutorError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")
