"""A tiny in-memory store builder for rule fixtures: a few lines per slice, call, task or flow.

Times are exact integer nanoseconds, the unit of every table (``start_ns``, ``dur_ns``,
``end_ns``, ``ts_ns``); write ``us(100)`` to give them in the microseconds you read off a
timeline. Every row fills the canonical columns the way the parsers do (``api_layer``/``api_name``
from the CANN name, ``stream_id`` and ``thread = "Stream N"`` on Ascend Hardware, ...), so a rule
that works on a fixture works on ingested data::

    b = StoreBuilder()
    b.session(0, "s0", start_ns=0, end_ns=us(10_000))
    b.api(0, "s0", "aclmdlRICaptureBegin", start_ns=us(100), dur_ns=us(5))
    b.api(0, "s0", "aclrtMemcpy", start_ns=us(110), dur_ns=us(20))
    b.kernel(0, "s0", stream=2, start_ns=us(300), dur_ns=us(10), launch=Launch(us(150)))
    store = b.store()

The verbs and keywords are those of the synthetic generator's ``RankBuilder``
(:mod:`traceanalyzer.synth.fixtures`), which writes the same things as real files; a
``StoreBuilder`` verb only adds the ``rank`` and ``session`` a row belongs to.
"""

from __future__ import annotations

import json
import operator
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from traceanalyzer.store import Store
from traceanalyzer.vocabulary import CANN_PROCESS, HARDWARE_PROCESS

LEVEL_OF_LAYER = {"AscendCL": "acl", "Runtime": "runtime", "Node": "node", "Hccl": "hccl"}

DEFAULT_KERNEL = "aclnnMm_MatMulCommon_MatMulV2"
MAIN_THREAD = "Thread 1"  # the Python main thread of StoreBuilder fixtures
CANN_THREAD = "Thread 100"  # where host CANN calls run unless a fixture says otherwise


def us(value: float | str) -> int:
    """Microseconds as written to exact integer nanoseconds: ``us(1100.5) == 1_100_500``,
    ``us("0.0005") == 1`` (half a ns rounds up). A float counts as its shortest repr, so
    ``us(0.1)`` is 100 ns, not the binary float times 1000."""
    if isinstance(value, bool):
        raise TypeError(f"not a time: {value!r}")
    ns = Decimal(repr(value) if isinstance(value, float) else value) * 1000
    return int(ns.to_integral_value(ROUND_HALF_UP))


def exact_ns(value: Any, name: str) -> int:
    """``value`` as int ns; a float is refused, as it would not be exact (use :func:`us`)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be int nanoseconds, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be int nanoseconds, not {type(value).__name__} {value!r} "
            "(write us(...) for microseconds)"
        ) from None


def copy_task_type(direction: str) -> str:
    """The device task type of an async copy: SDMA on the device, PCIe DMA to or from the host."""
    return "SDMA_SQE" if direction == "device to device" else "PCIE_DMA_SQE"


def split_api_name(name: str) -> tuple[str, str]:
    """``"aclrtMemcpy"`` (AscendCL) or ``"Layer@api"`` -> (layer, api)."""
    layer, _, api = name.rpartition("@")
    return layer or "AscendCL", api


@dataclass(frozen=True)
class Launch:
    """The host launch of a device task (``task(..., launch=Launch(us(150)))``): ``AscendCL@<api>``
    from ``start_ns`` for ``dur_ns`` around its ``Node@launch``, on ``thread`` (None: the
    builder's default host thread), linked to the task by the launch's connection id on the task,
    a HostToDevice flow onto it, or both (``linked_by``; a Level1 export has both)."""

    start_ns: int
    dur_ns: int = 20_000
    api: str = "aclnnMm"
    thread: str | None = None
    linked_by: Literal["connection_id", "flow", "both"] = "both"

    def __post_init__(self) -> None:
        exact_ns(self.start_ns, "Launch.start_ns")
        exact_ns(self.dur_ns, "Launch.dur_ns")
        if self.linked_by not in ("connection_id", "flow", "both"):
            raise ValueError(
                f"linked_by must be connection_id, flow or both, not {self.linked_by!r}"
            )

    @property
    def node(self) -> tuple[int, int]:
        """Start and duration of the ``Node@launch`` inside the API call (where the flow leaves)."""
        return self.start_ns + self.dur_ns // 4, self.dur_ns // 2

    @property
    def by_connection_id(self) -> bool:
        return self.linked_by != "flow"

    @property
    def by_flow(self) -> bool:
        return self.linked_by != "connection_id"


class StoreBuilder:
    """Collect canonical rows table by table, then build a :class:`Store` with :meth:`store`."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._seq: dict[tuple[int, str], int] = defaultdict(int)
        # connection ids of Launch()es, far from the small ids fixtures give by hand
        self._connections = 1_000_000_000

    def _slice(
        self, rank: int, session: str, start_ns: int, dur_ns: int, **values: Any
    ) -> dict[str, Any]:
        seq = self._seq[(rank, session)]
        self._seq[(rank, session)] += 1
        start, dur = exact_ns(start_ns, "start_ns"), exact_ns(dur_ns, "dur_ns")
        row = {
            "rank": rank,
            "session": session,
            "seq": seq,
            "ph": "X",
            "start_ns": start,
            "dur_ns": dur,
            "end_ns": start + dur,
            **values,
        }
        self.rows["slices"].append(row)
        return row

    # ---- sessions -------------------------------------------------------------------------
    def session(
        self,
        rank: int,
        session: str,
        *,
        start_ns: int,
        end_ns: int,
        metadata: Mapping[str, Any] | None = None,
        profiler_level: str = "Level1",
    ) -> StoreBuilder:
        """One profiled session of ``rank`` (``metadata``: its profiler_metadata.json keys)."""
        self.rows["sessions"].append(
            {
                "rank": rank,
                "session": session,
                "path": f"/fixtures/{session}",
                "start_ns": exact_ns(start_ns, "start_ns"),
                "end_ns": exact_ns(end_ns, "end_ns"),
                "profiler_level": profiler_level,
                "metadata": json.dumps(dict(metadata or {})),
            }
        )
        return self

    # ---- framework ------------------------------------------------------------------------
    def span(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        thread: str = MAIN_THREAD,
        cat: str = "cpu_op",
    ) -> StoreBuilder:
        """A Python-side span: a torch op (``cpu_op``), a ``python_function`` or an mstx range."""
        self._slice(
            rank, session, start_ns, dur_ns, process="Python", thread=thread, name=name, cat=cat
        )
        return self

    def step(
        self, rank: int, session: str, number: int, *, start_ns: int, dur_ns: int
    ) -> StoreBuilder:
        """A ``ProfilerStep#<number>`` window on the main thread."""
        return self.span(rank, session, f"ProfilerStep#{number}", start_ns=start_ns, dur_ns=dur_ns)

    # ---- CANN -----------------------------------------------------------------------------
    def api(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        thread: str = CANN_THREAD,
        connection_id: int | None = None,
    ) -> StoreBuilder:
        """A host CANN API call: ``aclrtMemcpy`` (AscendCL) or ``Layer@api`` (``Runtime@MemCopySync``)."""
        layer, api = split_api_name(name)
        self._slice(
            rank,
            session,
            start_ns,
            dur_ns,
            process=CANN_PROCESS,
            thread=thread,
            name=f"{layer}@{api}",
            api_layer=layer,
            api_name=api,
            api_level=LEVEL_OF_LAYER.get(layer),
            connection_id=connection_id,
        )
        return self

    def replay(
        self, rank: int, session: str, *, start_ns: int, dur_ns: int = 30_000
    ) -> StoreBuilder:
        """``AscendCL@aclmdlRIExecuteAsync``: one graph replay (its tasks carry a ``model_id``)."""
        return self.api(rank, session, "aclmdlRIExecuteAsync", start_ns=start_ns, dur_ns=dur_ns)

    def api_stat(
        self, rank: int, session: str, api_name: str, *, count: int, level: str = "acl"
    ) -> StoreBuilder:
        """One api_statistic.csv row: how often ``api_name`` was called."""
        self.rows["api_stats"].append(
            {"rank": rank, "session": session, "level": level, "api_name": api_name, "count": count}
        )
        return self

    def flow(
        self,
        rank: int,
        session: str,
        *,
        start_ns: int,
        end_ns: int,
        stream: int,
        thread: str = CANN_THREAD,
        process: str = CANN_PROCESS,
        cat: str = "HostToDevice",
    ) -> StoreBuilder:
        """A flow from a host call on ``thread`` of ``process`` (at ``start_ns``) to the task that
        starts on ``stream`` at ``end_ns`` (``cat="async_npu"``: from a torch op)."""
        self.rows["flows"].append(
            {
                "rank": rank,
                "session": session,
                "cat": cat,
                "name": cat,
                "flow_id": str(len(self.rows["flows"])),
                "start_ns": exact_ns(start_ns, "start_ns"),
                "end_ns": exact_ns(end_ns, "end_ns"),
                "src_process": process,
                "src_thread": thread,
                "dst_process": HARDWARE_PROCESS,
                "dst_thread": f"Stream {stream}",
                "dst_tid": stream,
            }
        )
        return self

    # ---- device ---------------------------------------------------------------------------
    def task(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        stream: int,
        start_ns: int,
        dur_ns: int,
        task_type: str | None = None,
        model_id: int | None = None,
        connection_id: int | None = None,
        launch: Launch | None = None,
    ) -> StoreBuilder:
        """A device task on ``Ascend Hardware`` stream ``stream`` (``task_type`` defaults to the name;
        ``model_id``: of a captured graph).

        ``launch`` adds its host launch (:class:`Launch`).
        """
        if launch is not None:
            connection_id = self._launch(rank, session, launch, stream=stream, task_ns=start_ns)
        self._slice(
            rank,
            session,
            start_ns,
            dur_ns,
            process=HARDWARE_PROCESS,
            thread=f"Stream {stream}",
            name=name,
            stream_id=stream,
            task_type=task_type or name,
            connection_id=connection_id,
            model_id=model_id,
        )
        return self

    def _launch(
        self, rank: int, session: str, launch: Launch, *, stream: int, task_ns: int
    ) -> int | None:
        """Write a task's host launch; returns the connection id the task carries."""
        self._connections += 1
        conn = self._connections
        thread = launch.thread or CANN_THREAD
        self.api(rank, session, launch.api, start_ns=launch.start_ns, dur_ns=launch.dur_ns,
                 thread=thread)  # fmt: skip
        node_ns, node_dur = launch.node
        self.api(rank, session, "Node@launch", start_ns=node_ns, dur_ns=node_dur, thread=thread,
                 connection_id=conn)  # fmt: skip
        if launch.by_flow:
            self.flow(rank, session, start_ns=node_ns, end_ns=task_ns, stream=stream, thread=thread)
        return conn if launch.by_connection_id else None

    def memcpy_async(
        self,
        rank: int,
        session: str,
        *,
        stream: int,
        start_ns: int,
        task_start_ns: int,
        task_dur_ns: int,
        dur_ns: int = 12_000,
        size: int = 1 << 20,
        direction: str = "host to device",
        thread: str = CANN_THREAD,
    ) -> StoreBuilder:
        """``aclrtMemcpyAsync`` (at ``start_ns`` on ``thread``) linked by a HostToDevice flow to
        its MEMCPY_ASYNC copy task on ``stream`` (at ``task_start_ns``)."""
        self.api(rank, session, "aclrtMemcpyAsync", start_ns=start_ns, dur_ns=dur_ns,
                 thread=thread)  # fmt: skip
        self.flow(rank, session, start_ns=start_ns, end_ns=task_start_ns, stream=stream,
                  thread=thread)  # fmt: skip
        row = self._slice(
            rank,
            session,
            task_start_ns,
            task_dur_ns,
            process=HARDWARE_PROCESS,
            thread=f"Stream {stream}",
            name="MEMCPY_ASYNC",
            stream_id=stream,
            task_type=copy_task_type(direction),
        )
        row.update(memcpy_size=size, memcpy_direction=direction)
        return self

    def kernel(
        self,
        rank: int,
        session: str,
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
    ) -> StoreBuilder:
        """A kernel_details.csv row and its device task on ``Ascend Hardware`` stream ``stream``
        (``launch``: its host launch, :class:`Launch`)."""
        self.task(
            rank,
            session,
            name,
            stream=stream,
            start_ns=start_ns,
            dur_ns=dur_ns,
            task_type=core,
            model_id=model_id,
            launch=launch,
        )
        self.rows["kernels"].append(
            {
                "rank": rank,
                "session": session,
                "stream_id": stream,
                "name": name,
                "type": op_type,
                "accelerator_core": core,
                "start_ns": start_ns,
                "dur_ns": dur_ns,
                "input_data_types": input_data_types,
                "input_shapes": input_shapes,
            }
        )
        return self

    def counter(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        ts_ns: int,
        value: float,
        process: str | None = None,
        series: str = "MHz",
    ) -> StoreBuilder:
        """One counter sample (``AI Core Freq`` in MHz by default), held until the next one."""
        self.rows["counters"].append(
            {
                "rank": rank,
                "session": session,
                "process": process or name,
                "name": name,
                "series": series,
                "ts_ns": exact_ns(ts_ns, "ts_ns"),
                "value": float(value),
            }
        )
        return self

    # ---- communication --------------------------------------------------------------------
    def hccl_op(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        thread: str = "Group 0 Communication",
        connection_id: int | None = None,
    ) -> StoreBuilder:
        """A collective as the HCCL process shows it (``hcom_allReduce__...`` on its group row)."""
        self._slice(
            rank,
            session,
            start_ns,
            dur_ns,
            process="HCCL",
            thread=thread,
            name=name,
            connection_id=connection_id,
        )
        return self

    def hccl_task(
        self, rank: int, session: str, name: str, *, stream: int, start_ns: int, dur_ns: int
    ) -> StoreBuilder:
        """A small HCCL task on a communication plane (``Notify_Wait``, ``Memcpy``, ...) for ``stream``."""
        self._slice(
            rank,
            session,
            start_ns,
            dur_ns,
            process="HCCL",
            thread="Plane 0",
            name=name,
            stream_id=stream,
            task_type=name,
        )
        return self

    def comm_op(
        self,
        rank: int,
        session: str,
        step: str,
        op_name: str,
        *,
        transit_ns: int,
        wait_ns: int,
        start_ns: int | None = None,
        synchronization_ns: int | None = None,
        group: str | None = None,
    ) -> StoreBuilder:
        """One communication.json op with its transit and wait time (and start, sync, group)."""
        self.rows["comm_ops"].append(
            {
                "rank": rank,
                "session": session,
                "step": step,
                "kind": "collective",
                "op_name": op_name,
                "group": group,
                "start_ns": None if start_ns is None else exact_ns(start_ns, "start_ns"),
                "transit_ns": exact_ns(transit_ns, "transit_ns"),
                "wait_ns": exact_ns(wait_ns, "wait_ns"),
                "synchronization_ns": None
                if synchronization_ns is None
                else exact_ns(synchronization_ns, "synchronization_ns"),
                "elapse_ns": transit_ns + wait_ns,
            }
        )
        return self

    def step_time(
        self,
        rank: int,
        session: str,
        step: int | None,
        *,
        computing_ns: int,
        free_ns: int,
        communication_ns: int = 0,
    ) -> StoreBuilder:
        """One step_trace_time.csv row: the step's compute, free (idle) and exposed comm time
        (``step`` None: the row of a profile without ProfilerStep, Step empty)."""
        computing = exact_ns(computing_ns, "computing_ns")
        free = exact_ns(free_ns, "free_ns")
        communication = exact_ns(communication_ns, "communication_ns")
        self.rows["step_times"].append(
            {
                "rank": rank,
                "session": session,
                "step": step,
                "computing_ns": computing,
                "communication_not_overlapped_ns": communication,
                "communication_ns": communication,
                "overlapped_ns": 0,
                "free_ns": free,
                "stage_ns": computing + free + communication,
            }
        )
        return self

    def store(self) -> Store:
        return Store.from_frames({table: rows for table, rows in self.rows.items() if rows})
