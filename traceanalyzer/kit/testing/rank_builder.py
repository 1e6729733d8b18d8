"""Tiny rank directories for rule fixtures, a few lines each.

Times are exact integer nanoseconds from the session start, the fixture epoch
:data:`~traceanalyzer.synth.fmt.EPOCH_NS` (``1736408883000000.000`` µs), and land on disk as
exact 3-decimal µs strings; write ``us(1000)`` to give them in microseconds. The verbs it
shares with :class:`~traceanalyzer.kit.testing.store_builder.StoreBuilder` are defined once, in
:class:`~traceanalyzer.kit.testing.verbs.FixtureVerbs` (here without the store builder's
leading ``rank, session``: a builder is one rank's session); this module only says how their
facts land. The builder records them and replays them through the same :class:`RankWriter`
the scenarios use, so a fixture has every cross-file consistency of a generated run
(api_statistic rows for API calls, kernel_details rows for kernels, flows...)::

    b = RankBuilder(rank=0)
    b.span("batch_get_into_multi_buffers", start_ns=us(1000), dur_ns=us(2_000_000))
    b.api("aclrtMemcpyAsync", start_ns=us(1100), dur_ns=us(12))
    b.task("Notify Wait", stream=39, task_type="NOTIFY_WAIT_SQE", start_ns=us(900), dur_ns=us(1_900_000))
    b.kernel(start_ns=us(2000), dur_ns=us(10), launch=Launch(us(1950), linked_by="flow"))
    rank_dir = b.write(tmp_path)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import traceanalyzer.kit.testing.verbs as facts
from traceanalyzer.kit.testing.verbs import FixtureVerbs, Launch, exact_ns
from traceanalyzer.synth.fmt import EPOCH_NS
from traceanalyzer.synth.memory import MB, STREAM_PTR, Record, Totals
from traceanalyzer.synth.profiles import get_generation
from traceanalyzer.synth.rank import INVALID_MODEL, RankConfig, RankWriter
from traceanalyzer.vocabulary import AI_CORE_FREQ_PROCESS

if TYPE_CHECKING:
    from traceanalyzer.store import Store

Action = Callable[[RankWriter], None]
BY_LAUNCH = "the generator numbers the connection ids; link a task to its host call with launch="


def at(offset_ns: int, name: str = "start_ns") -> int:
    """An offset from the session start -> absolute ns on the fixture epoch."""
    return EPOCH_NS + exact_ns(offset_ns, name)


def thread_id(thread: str | None) -> int | None:
    """``"Thread 7"`` (as the store names threads) -> tid 7; None: the main thread."""
    if thread is None:
        return None
    prefix, _, tid = thread.partition(" ")
    if prefix != "Thread" or not tid.isdigit():
        raise ValueError(f"thread must be named 'Thread <tid>', not {thread!r}")
    return int(tid)


class RankBuilder(FixtureVerbs):
    """Records what happened on one rank; :meth:`write` renders a complete ``*_ascend_pt`` dir.

    The shared verbs (``span``, ``step``, ``api``, ``replay``, ``task``, ``kernel``,
    ``compute_task``, ``event_wait``, ``memcpy_async``, ``counter``, ``memory``) are
    :class:`FixtureVerbs`'; a host thread left None is the main thread. Only the files have
    :meth:`capture`, :meth:`collective`, :meth:`metadata` and :meth:`env`.
    """

    def __init__(
        self, rank: int = 0, generation: str = "g2", level: int = 1, *, world: int | None = None
    ) -> None:
        self.rank = rank
        self.generation = get_generation(generation)
        self.level = level
        self.world = world
        self._actions: list[Action] = []
        self._steps: list[tuple[int, int, int]] = []
        self._metadata: dict[str, Any] = {}
        self._env: dict[str, str] = {}

    # ---- session ----------------------------------------------------------------------
    def metadata(self, **keys: Any) -> RankBuilder:
        """Extra profiler_metadata.json keys (what ``prof.add_metadata`` writes)."""
        self._metadata.update(keys)
        return self

    def env(self, **variables: str) -> RankBuilder:
        """Environment variables recorded in profiler_metadata.json ``ENV_VARIABLES``."""
        self._env.update(variables)
        return self

    # ---- what only real files have ----------------------------------------------------
    def capture(
        self,
        *,
        start_ns: int,
        dur_ns: int,
        memcpy_calls: int = 0,
        memcpy_dur_ns: int = 40_000,
    ) -> RankBuilder:
        """``aclmdlRICaptureBegin`` ... ``aclmdlRICaptureEnd`` with ``memcpy_calls`` aclrtMemcpy
        (each with its Runtime@MemCopySync) evenly inside."""
        start, end = exact_ns(start_ns, "start_ns"), start_ns + exact_ns(dur_ns, "dur_ns")
        self.api("aclmdlRICaptureBegin", start_ns=start, dur_ns=10_000)
        inner = (end - start - 40_000) // max(memcpy_calls, 1)
        for i in range(memcpy_calls):
            t = start + 20_000 + i * inner
            self.api("aclrtMemcpy", start_ns=t, dur_ns=memcpy_dur_ns)
            self.api("Runtime@MemCopySync", start_ns=t + 2_000, dur_ns=memcpy_dur_ns - 4_000)
        self.api("aclmdlRICaptureEnd", start_ns=end - 15_000, dur_ns=15_000)
        return self

    def collective(
        self,
        op: str = "allReduce",
        *,
        start_ns: int,
        dur_ns: int,
        stream: int = 4,
        wait_ns: int = 0,
    ) -> RankBuilder:
        """An HCCL collective (``hcom_<op>_...``) executed on ``stream`` (communication.json entry at
        Level1+); ``wait_ns``: how long this rank waits inside it for its peers (its first Notify Wait)."""
        s, d, w = at(start_ns), exact_ns(dur_ns, "dur_ns"), exact_ns(wait_ns, "wait_ns")
        self._actions.append(lambda rw: rw.collective(op, s, d, stream=stream, wait_ns=w))
        return self

    # ---- how the shared verbs' facts land: as the events of a Text export -------------
    def _land_span(self, span: facts.Span) -> None:
        if span.cat != "cpu_op":
            self._cannot("span", "cat", span.cat, "the files write torch ops (cpu_op) only")
        s, d, tid = at(span.start_ns), span.dur_ns, thread_id(span.thread)
        self._actions.append(lambda rw: rw.cpu_op(span.name, s, d, tid=tid))

    def _land_step(self, step: facts.Step) -> None:
        start = at(step.start_ns)
        self._steps.append((step.number, start, start + step.dur_ns))

    def _land_api(self, call: facts.ApiCall) -> None:
        if call.connection_id is not None:
            self._cannot("api", "connection_id", call.connection_id, BY_LAUNCH)
        layer, api = call.layer, call.api
        s, d, tid = at(call.start_ns), call.dur_ns, thread_id(call.thread)
        mode = call.mode or (api if layer == "Runtime" else "ACL_RTS")
        self._actions.append(lambda rw: rw.api(f"{layer}@", api, s, d, tid=tid, mode=mode))

    def _land_task(self, task: facts.Task) -> None:
        if task.connection_id is not None:
            self._cannot("task", "connection_id", task.connection_id, BY_LAUNCH)
        s, d = at(task.start_ns), task.dur_ns
        model = INVALID_MODEL if task.model_id is None else task.model_id

        def write(rw: RankWriter, conn: int | None) -> None:
            rw.task(task.stream, task.name, task.task_type, s, d, conn=conn, extra=task.args,
                    model_id=model)  # fmt: skip

        self._actions.append(self._launched(write, task.name, task.stream, s, task.launch))

    def _land_kernel(self, kernel: facts.Kernel) -> None:
        s, d = at(kernel.start_ns), kernel.dur_ns
        op = {
            "model_id": INVALID_MODEL if kernel.model_id is None else kernel.model_id,
            "in_shapes": kernel.input_shapes or "1,4096",
            "in_types": kernel.input_data_types or "DT_BF16",
        }

        def write(rw: RankWriter, conn: int | None) -> None:
            rw.kernel(kernel.stream, kernel.name, kernel.op_type, kernel.core, s, d, conn=conn,
                      **op)  # fmt: skip

        self._actions.append(self._launched(write, kernel.name, kernel.stream, s, kernel.launch))

    @staticmethod
    def _launched(
        write: Callable[[RankWriter, int | None], None],
        name: str,
        stream: int,
        task_start: int,
        launch: Launch | None,
    ) -> Action:
        """``write`` a device task, after its host launch if it has one: the task gets the
        launch's connection id unless linked by flow only (then a fresh one)."""
        if launch is None:
            return lambda rw: write(rw, None)
        start, dur, tid = at(launch.start_ns), launch.dur_ns, thread_id(launch.thread)
        node_offset, node_dur = launch.node
        node = EPOCH_NS + node_offset

        def act(rw: RankWriter) -> None:
            main = rw.main_tid if tid is None else tid
            rw.api("AscendCL@", launch.api, start, dur, tid=main, mode="ACL_NN")
            conn = rw.api("Node@", "launch", node, node_dur, tid=main, mode="launch", item_id=name)
            write(rw, conn if launch.by_connection_id else None)
            if launch.by_flow:
                rw.h2d(conn, True, main, node, rw.hw_pid, stream, task_start)

        return act

    def _land_memcpy_async(self, copy: facts.MemcpyAsync) -> None:
        s, d, tid = at(copy.start_ns), copy.dur_ns, thread_id(copy.thread)
        ts, td, task_type = at(copy.task_start_ns), copy.task_dur_ns, copy.task_type

        def act(rw: RankWriter) -> None:
            caller = rw.main_tid if tid is None else tid
            conn = rw.api("AscendCL@", "aclrtMemcpyAsync", s, d, tid=caller)
            extra = {"data size(Byte)": copy.size, "memcpy direction": copy.direction}
            rw.task(copy.stream, "MEMCPY_ASYNC", task_type, ts, td, conn=conn, extra=extra)
            rw.h2d(conn, False, caller, s, rw.hw_pid, copy.stream, ts)

        self._actions.append(act)

    def _land_counter(self, sample: facts.CounterSample) -> None:
        written = (sample.name, sample.process or sample.name, sample.series)
        if written != (AI_CORE_FREQ_PROCESS, AI_CORE_FREQ_PROCESS, "MHz"):
            why = f"the generator writes the {AI_CORE_FREQ_PROCESS!r} counter (MHz) only"
            self._cannot("counter", "(name, process, series)", written, why)
        ts = at(sample.ts_ns)
        self._actions.append(lambda rw: rw.ai_core_freq(ts, int(sample.value)))

    def _land_memory(self, record: facts.MemoryRecord) -> None:
        ts = at(record.ts_ns)
        torch = record.component in ("PTA", "PTA+GE")

        allocated = None if record.allocated_mb is None else round(record.allocated_mb * MB)
        totals = Totals(allocated, round(record.reserved_mb * MB), allocated if torch else None)
        row = Record(record.component, ts, totals, STREAM_PTR if torch else None)
        self._actions.append(lambda rw: rw.memory_record(row))

    # ---- output -----------------------------------------------------------------------
    def write(self, root: Path) -> Path:
        """Render the rank directory under ``root`` and return it."""
        world = self.world or max(self.rank + 1, 2)
        cfg = RankConfig(
            rank=self.rank,
            generation=self.generation,
            level=self.level,
            ospid=3096504 + 7919 * self.rank,
            start_ns=EPOCH_NS,
            group=list(range(world)),
            schedule=bool(self._steps),
            metadata=dict(self._metadata),
            env=dict(self._env),
        )
        rw = RankWriter(Path(root), cfg)
        for number, start, end in sorted(self._steps, key=lambda s: s[1]):
            rw.step_window(number, start, end)
        for act in self._actions:
            act(rw)
        return rw.close()


def build_store(tmp_path: Path, *builders: RankBuilder) -> Path:
    """Write the builders' rank dirs under ``tmp_path/traces`` and ingest them into ``tmp_path/store``."""
    from traceanalyzer.ingest import ingest  # the parsers load for the fixtures that use them

    root = Path(tmp_path) / "traces"
    for b in builders:
        b.write(root)
    out = Path(tmp_path) / "store"
    ingest(root, out)
    return out


def ingested(*builders: RankBuilder) -> Store:
    """Write ``RankBuilder`` rank directories, ingest them, and return the store in memory.

    This takes fixtures through the real files and parsers (slower than
    :class:`~traceanalyzer.kit.testing.store_builder.StoreBuilder`, but it proves a rule reads
    what ingest writes). The temporary files are removed.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ta-fixture-") as tmp:
        return _in_memory(build_store(Path(tmp), *builders))


def scenario_store(scenario: str, *, ranks: int = 1, level: int = 1, **knobs: Any) -> Store:
    """A generated scenario (``traceanalyzer synth SCENARIO``), ingested, as an in-memory store."""
    import tempfile

    from traceanalyzer.ingest import ingest
    from traceanalyzer.synth.generate import generate

    with tempfile.TemporaryDirectory(prefix="ta-fixture-") as tmp:
        generate(scenario, Path(tmp) / "traces", ranks=ranks, level=level, **knobs)
        ingest(Path(tmp) / "traces", Path(tmp) / "store")
        return _in_memory(Path(tmp) / "store")


def _in_memory(out: Path) -> Store:
    from traceanalyzer.schema import TABLES
    from traceanalyzer.store import Store

    on_disk = Store.open(out)
    return Store.from_frames({name: on_disk.table(name).collect() for name in TABLES})
