"""Tiny rank directories for rule fixtures, a few lines each.

Times are µs offsets from :data:`~traceanalyzer.synth.fmt.EPOCH_NS`
(``1736408883000000.000``) and land on disk as exact 3-decimal strings. The
builder records calls and replays them through the same :class:`RankWriter` the
scenarios use, so a fixture has every cross-file consistency of a generated run
(api_statistic rows for API calls, kernel_details rows for kernels, flows…)::

    b = RankBuilder(rank=0)
    with b.python_span("batch_get_into_multi_buffers", start_us=1000, dur_us=2_000_000):
        b.api("aclrtMemcpyAsync", start_us=1100, dur_us=12)
    b.task(stream=39, name="Notify Wait", task_type="NOTIFY_WAIT_SQE", start_us=900, dur_us=1_900_000)
    rank_dir = b.write(tmp_path)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceanalyzer.synth.fmt import EPOCH_NS
from traceanalyzer.synth.profiles import get_generation
from traceanalyzer.synth.rank import RankConfig, RankWriter

if TYPE_CHECKING:
    from traceanalyzer.store import Store

Action = Callable[[RankWriter], None]


def ns(us: float | int | str) -> int:
    """µs offset -> absolute ns on the fixture epoch (exact for up to 3 decimals)."""
    return EPOCH_NS + round(float(us) * 1000)


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

    # ---- framework --------------------------------------------------------------
    @contextmanager
    def python_span(
        self, name: str, *, start_us: float, dur_us: float, tid: int | None = None
    ) -> Iterator[None]:
        """A Python-side span (``record_function`` → cpu_op) on the main thread; nest calls in the block."""
        self.cpu_op(name, start_us=start_us, dur_us=dur_us, tid=tid)
        yield

    def cpu_op(
        self, name: str, *, start_us: float, dur_us: float, tid: int | None = None
    ) -> RankBuilder:
        s, d = ns(start_us), round(float(dur_us) * 1000)
        self._actions.append(lambda rw: rw.cpu_op(name, s, d, tid=tid))
        return self

    def step(self, number: int, *, start_us: float, dur_us: float) -> RankBuilder:
        """A ProfilerStep window (adds the Step Id column and a step_trace_time row)."""
        self._steps.append((number, ns(start_us), ns(start_us) + round(float(dur_us) * 1000)))
        return self

    def metadata(self, **keys: Any) -> RankBuilder:
        """Extra profiler_metadata.json keys (what ``prof.add_metadata`` writes)."""
        self._metadata.update(keys)
        return self

    # ---- CANN ---------------------------------------------------------------------
    def api(
        self,
        name: str,
        *,
        start_us: float,
        dur_us: float,
        mode: str = "ACL_RTS",
        tid: int | None = None,
    ) -> RankBuilder:
        """A CANN API event; ``name`` is ``aclrtMemcpy`` (AscendCL) or ``Layer@api`` (``Runtime@MemCopySync``)."""
        layer, _, api = name.rpartition("@")
        layer = (layer or "AscendCL") + "@"
        s, d = ns(start_us), round(float(dur_us) * 1000)
        mode = api if layer == "Runtime@" and mode == "ACL_RTS" else mode
        self._actions.append(lambda rw: rw.api(layer, api, s, d, tid=tid, mode=mode))
        return self

    def capture(
        self, *, start_us: float, dur_us: float, memcpy_calls: int = 0, memcpy_us: float = 40
    ) -> RankBuilder:
        """``aclmdlRICaptureBegin`` … ``aclmdlRICaptureEnd`` with ``memcpy_calls`` aclrtMemcpy evenly inside."""
        start, end = float(start_us), float(start_us) + float(dur_us)
        self.api("aclmdlRICaptureBegin", start_us=start, dur_us=10)
        inner = (end - start - 40) / max(memcpy_calls, 1)
        for i in range(memcpy_calls):
            t = start + 20 + i * inner
            self.api("aclrtMemcpy", start_us=t, dur_us=memcpy_us)
            self.api("Runtime@MemCopySync", start_us=t + 2, dur_us=memcpy_us - 4)
        self.api("aclmdlRICaptureEnd", start_us=end - 15, dur_us=15)
        return self

    # ---- device -------------------------------------------------------------------
    def task(
        self, *, stream: int, name: str, task_type: str, start_us: float, dur_us: float, **args: Any
    ) -> RankBuilder:
        """A device task without op info (waits, memcpy, records); extra ``args`` go into the HW event."""
        s, d = ns(start_us), round(float(dur_us) * 1000)
        extra = {k.replace("_", " "): v for k, v in args.items()} or None
        self._actions.append(lambda rw: rw.task(stream, name, task_type, s, d, extra=extra))
        return self

    def kernel(
        self,
        *,
        stream: int = 2,
        name: str = "aclnnMm_MatMulCommon_MatMulV2",
        op_type: str = "MatMulV2",
        core: str = "AI_CORE",
        start_us: float,
        dur_us: float,
    ) -> RankBuilder:
        """A kernel (HW slice with op info): also a kernel_details row and an op_statistic entry."""
        s, d = ns(start_us), round(float(dur_us) * 1000)
        self._actions.append(lambda rw: rw.kernel(stream, name, op_type, core, s, d))
        return self

    def memcpy_async(
        self,
        *,
        start_us: float,
        stream: int,
        task_start_us: float,
        task_dur_us: float,
        size: int = 1 << 20,
        direction: str = "host to device",
        dur_us: float = 12,
    ) -> RankBuilder:
        """``aclrtMemcpyAsync`` linked by a HostToDevice flow to its MEMCPY_ASYNC task."""
        s, d, ts, td = (
            ns(start_us),
            round(float(dur_us) * 1000),
            ns(task_start_us),
            round(float(task_dur_us) * 1000),
        )
        task_type = "SDMA_SQE" if direction == "device to device" else "PCIE_DMA_SQE"

        def act(rw: RankWriter) -> None:
            conn = rw.api("AscendCL@", "aclrtMemcpyAsync", s, d)
            extra = {"data size(Byte)": size, "memcpy direction": direction}
            rw.task(stream, "MEMCPY_ASYNC", task_type, ts, td, conn=conn, extra=extra)
            rw.h2d(conn, False, rw.main_tid, s, rw.hw_pid, stream, ts)

        self._actions.append(act)
        return self

    def collective(
        self, *, start_us: float, dur_us: float, op: str = "allReduce", stream: int = 4
    ) -> RankBuilder:
        """An HCCL collective executed on ``stream`` (communication.json entry at Level1+)."""
        s, d = ns(start_us), round(float(dur_us) * 1000)
        self._actions.append(lambda rw: rw.collective(op, s, d, stream=stream))
        return self

    # ---- output -------------------------------------------------------------------
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
    :class:`~traceanalyzer.engine.testing.StoreBuilder`, but it proves a rule reads what ingest
    writes). The temporary files are removed.
    """
    import tempfile

    from traceanalyzer.schema import TABLES
    from traceanalyzer.store import Store

    with tempfile.TemporaryDirectory(prefix="ta-fixture-") as tmp:
        on_disk = Store.open(build_store(Path(tmp), *builders))
        return Store.from_frames({name: on_disk.table(name).collect() for name in TABLES})
