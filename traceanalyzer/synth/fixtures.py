"""Tiny rank directories for rule fixtures, a few lines each.

Times are exact integer nanoseconds from the session start, the fixture epoch
:data:`~traceanalyzer.synth.fmt.EPOCH_NS` (``1736408883000000.000`` µs), and land on disk as
exact 3-decimal µs strings; write ``us(1000)`` to give them in microseconds. The verbs and
keywords are those of :class:`~traceanalyzer.kit.store_builder.StoreBuilder` without its leading
``rank, session`` (a builder is one rank's session). The builder records calls and replays them
through the same :class:`RankWriter` the scenarios use, so a fixture has every cross-file
consistency of a generated run (api_statistic rows for API calls, kernel_details rows for
kernels, flows...)::

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

from traceanalyzer.kit.store_builder import (
    DEFAULT_KERNEL,
    Launch,
    copy_task_type,
    exact_ns,
    split_api_name,
)
from traceanalyzer.synth.fmt import EPOCH_NS
from traceanalyzer.synth.profiles import get_generation
from traceanalyzer.synth.rank import INVALID_MODEL, RankConfig, RankWriter
from traceanalyzer.vocabulary import AI_CORE_FREQ_PROCESS

if TYPE_CHECKING:
    from traceanalyzer.store import Store

Action = Callable[[RankWriter], None]


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


class RankBuilder:
    """Records what happened on one rank; :meth:`write` renders a complete ``*_ascend_pt`` dir."""

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

    # ---- framework --------------------------------------------------------------------
    def span(
        self, name: str, *, start_ns: int, dur_ns: int, thread: str | None = None
    ) -> RankBuilder:
        """A torch op (``record_function`` -> ``cpu_op``) on ``thread`` (default: the main thread)."""
        s, d, tid = at(start_ns), exact_ns(dur_ns, "dur_ns"), thread_id(thread)
        self._actions.append(lambda rw: rw.cpu_op(name, s, d, tid=tid))
        return self

    def step(self, number: int, *, start_ns: int, dur_ns: int) -> RankBuilder:
        """A ``ProfilerStep#<number>`` window (adds the Step Id column and a step_trace_time row)."""
        start = at(start_ns)
        self._steps.append((number, start, start + exact_ns(dur_ns, "dur_ns")))
        return self

    # ---- CANN -------------------------------------------------------------------------
    def api(
        self,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        thread: str | None = None,
        mode: str = "ACL_RTS",
    ) -> RankBuilder:
        """A CANN API event: ``aclrtMemcpy`` (AscendCL) or ``Layer@api`` (``Runtime@MemCopySync``)."""
        layer, api = split_api_name(name)
        s, d, tid = at(start_ns), exact_ns(dur_ns, "dur_ns"), thread_id(thread)
        mode = api if layer == "Runtime" and mode == "ACL_RTS" else mode
        self._actions.append(lambda rw: rw.api(f"{layer}@", api, s, d, tid=tid, mode=mode))
        return self

    def replay(self, *, start_ns: int, dur_ns: int = 30_000) -> RankBuilder:
        """``AscendCL@aclmdlRIExecuteAsync``: one graph replay (its tasks carry a ``model_id``)."""
        return self.api("aclmdlRIExecuteAsync", start_ns=start_ns, dur_ns=dur_ns)

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

    # ---- device -----------------------------------------------------------------------
    def task(
        self,
        name: str,
        *,
        stream: int,
        start_ns: int,
        dur_ns: int,
        task_type: str | None = None,
        model_id: int | None = None,
        args: dict[str, Any] | None = None,
        launch: Launch | None = None,
    ) -> RankBuilder:
        """A device task without op info (waits, memcpy, records); ``task_type`` defaults to the
        name, ``args`` go into the HW event (``{"data size(Byte)": 4096}``).

        ``launch`` adds its host launch (:class:`~traceanalyzer.kit.store_builder.Launch`).
        """
        s, d = at(start_ns), exact_ns(dur_ns, "dur_ns")
        model = INVALID_MODEL if model_id is None else model_id

        def write(rw: RankWriter, conn: int | None) -> None:
            rw.task(stream, name, task_type or name, s, d, conn=conn, extra=args, model_id=model)

        self._actions.append(self._launched(write, name, stream, s, launch))
        return self

    def kernel(
        self,
        name: str = DEFAULT_KERNEL,
        *,
        stream: int = 2,
        start_ns: int,
        dur_ns: int,
        op_type: str = "MatMulV2",
        core: str = "AI_CORE",
        input_shapes: str | None = None,
        input_data_types: str | None = None,
        model_id: int | None = None,
        launch: Launch | None = None,
    ) -> RankBuilder:
        """A kernel (HW slice with op info): also a kernel_details row and an op_statistic entry.

        ``launch`` adds its host launch (:class:`~traceanalyzer.kit.store_builder.Launch`; its
        thread defaults to the main thread): ``AscendCL@<api>`` around ``Node@launch``, linked to
        the kernel by connection id, HostToDevice flow or both.
        ``model_id`` marks a kernel of a captured graph (see :meth:`replay`).
        """
        s, d = at(start_ns), exact_ns(dur_ns, "dur_ns")
        op = {
            "model_id": INVALID_MODEL if model_id is None else model_id,
            "in_shapes": input_shapes or "1,4096",
            "in_types": input_data_types or "DT_BF16",
        }

        def write(rw: RankWriter, conn: int | None) -> None:
            rw.kernel(stream, name, op_type, core, s, d, conn=conn, **op)

        self._actions.append(self._launched(write, name, stream, s, launch))
        return self

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

    def memcpy_async(
        self,
        *,
        stream: int,
        start_ns: int,
        task_start_ns: int,
        task_dur_ns: int,
        dur_ns: int = 12_000,
        size: int = 1 << 20,
        direction: str = "host to device",
        thread: str | None = None,
    ) -> RankBuilder:
        """``aclrtMemcpyAsync`` (at ``start_ns`` on ``thread``, default the main thread) linked by
        a HostToDevice flow to its MEMCPY_ASYNC copy task on ``stream`` (at ``task_start_ns``)."""
        s, d, tid = at(start_ns), exact_ns(dur_ns, "dur_ns"), thread_id(thread)
        ts, td = at(task_start_ns, "task_start_ns"), exact_ns(task_dur_ns, "task_dur_ns")
        task_type = copy_task_type(direction)

        def act(rw: RankWriter) -> None:
            caller = rw.main_tid if tid is None else tid
            conn = rw.api("AscendCL@", "aclrtMemcpyAsync", s, d, tid=caller)
            extra = {"data size(Byte)": size, "memcpy direction": direction}
            rw.task(stream, "MEMCPY_ASYNC", task_type, ts, td, conn=conn, extra=extra)
            rw.h2d(conn, False, caller, s, rw.hw_pid, stream, ts)

        self._actions.append(act)
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

    def counter(self, name: str, *, ts_ns: int, value: float) -> RankBuilder:
        """A counter sample, held until the next one; the generator writes the ``AI Core Freq``
        counter (MHz) only."""
        if name != AI_CORE_FREQ_PROCESS:
            raise ValueError(
                f"RankBuilder writes the {AI_CORE_FREQ_PROCESS!r} counter only, not {name!r}"
            )
        ts = at(ts_ns, "ts_ns")
        self._actions.append(lambda rw: rw.ai_core_freq(ts, int(value)))
        return self

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
    from traceanalyzer.ingest import ingest  # written concurrently; imported lazily on purpose

    root = Path(tmp_path) / "traces"
    for b in builders:
        b.write(root)
    out = Path(tmp_path) / "store"
    ingest(root, out)
    return out


def ingested(*builders: RankBuilder) -> Store:
    """Write ``RankBuilder`` rank directories, ingest them, and return the store in memory.

    This takes fixtures through the real files and parsers (slower than
    :class:`~traceanalyzer.kit.store_builder.StoreBuilder`, but it proves a rule reads what ingest
    writes). The temporary files are removed.
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
