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

The verbs it shares with the synthetic generator's ``RankBuilder`` (``span``, ``step``, ``api``,
``replay``, ``task``, ``kernel``, ``compute_task``, ``event_wait``, ``memcpy_async``,
``counter``, ``memory``) are defined once, in
:class:`~traceanalyzer.kit.testing.verbs.FixtureVerbs`; here they take the ``rank`` and
``session`` the rows belong to first (:func:`per_session`; ``b.on(rank, session)`` speaks them
without), and :class:`_SessionRows` lands their facts as rows. The other verbs write rows a
generator composes from events (``session``, ``flow``, ``api_stat``, ``hccl_op``, ``hccl_task``,
``hccl_collective``, ``comm_op``, ``step_time``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec

import traceanalyzer.kit.testing.verbs as facts
from traceanalyzer.kit.testing.verbs import FixtureVerbs, Launch, exact_ns, exact_times
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    CANN_PROCESS,
    HARDWARE_PROCESS,
    MEMORY_STREAM_PTR,
    PYTHON_GC_PROCESS,
)

LEVEL_OF_LAYER = {"AscendCL": "acl", "Runtime": "runtime", "Node": "node", "Hccl": "hccl"}

MAIN_THREAD = "Thread 1"  # the Python main thread of StoreBuilder fixtures
CANN_THREAD = "Thread 100"  # where host CANN calls run unless a fixture says otherwise

P = ParamSpec("P")


def per_session(
    verb: Callable[Concatenate[_SessionRows, P], object],
) -> Callable[Concatenate[StoreBuilder, int, str, P], StoreBuilder]:
    """A :class:`FixtureVerbs` verb as a :class:`StoreBuilder` method: the same keywords, after
    the ``rank`` and ``session`` its rows belong to (its signature and docs are the verb's)."""

    @functools.wraps(verb)
    def in_session(
        self: StoreBuilder, rank: int, session: str, *args: P.args, **kwargs: P.kwargs
    ) -> StoreBuilder:
        verb(_SessionRows(self, rank, session), *args, **kwargs)
        return self

    own, *keywords = inspect.signature(verb).parameters.values()
    where = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind)
        for name, kind in (("rank", "int"), ("session", "str"))
    ]
    in_session.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [own.replace(annotation="StoreBuilder"), *where, *keywords],
        return_annotation="StoreBuilder",
    )
    in_session.__qualname__ = f"StoreBuilder.{verb.__name__}"
    return in_session


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
        start, dur = exact_times(start_ns, dur_ns)
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

    # ---- the verbs shared with RankBuilder (kit/testing/verbs.py) ------------------------
    def on(self, rank: int, session: str) -> FixtureVerbs:
        """The shared verbs for one rank session, without the leading ``rank, session``, as a
        :class:`RankBuilder` speaks them: ``b.on(0, "s").api("aclrtMalloc", start_ns=...)``."""
        return _SessionRows(self, rank, session)

    span = per_session(FixtureVerbs.span)
    step = per_session(FixtureVerbs.step)
    api = per_session(FixtureVerbs.api)
    replay = per_session(FixtureVerbs.replay)
    task = per_session(FixtureVerbs.task)
    kernel = per_session(FixtureVerbs.kernel)
    compute_task = per_session(FixtureVerbs.compute_task)
    event_wait = per_session(FixtureVerbs.event_wait)
    memcpy_async = per_session(FixtureVerbs.memcpy_async)
    counter = per_session(FixtureVerbs.counter)
    memory = per_session(FixtureVerbs.memory)

    # ---- CANN -----------------------------------------------------------------------------
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

    def gc(self, rank: int, session: str, *, start_ns: int, dur_ns: int) -> StoreBuilder:
        """A garbage collection torch_npu recorded (``gc_detect_threshold``): the ``Python GC``
        process's ``GC`` event."""
        self._slice(rank, session, start_ns, dur_ns, process=PYTHON_GC_PROCESS,
                    thread=MAIN_THREAD, name="GC", cat="GC")  # fmt: skip
        return self

    def hccl_task(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        stream: int,
        start_ns: int,
        dur_ns: int,
        plane: int = 0,
        args: Mapping[str, Any] | None = None,
    ) -> StoreBuilder:
        """A small HCCL task on communication plane ``plane`` (``Notify_Wait``, ``Memcpy``, ...)
        for ``stream``; ``args`` as the trace writes them (``{"dst rank": 1, "size(Byte)": n,
        "link type": "HCCS"}``: the size also in ``memcpy_size``)."""
        self._slice(
            rank,
            session,
            start_ns,
            dur_ns,
            process="HCCL",
            thread=f"Plane {plane}",
            name=name,
            stream_id=stream,
            task_type=name,
            args=None if args is None else json.dumps(dict(args)),
            memcpy_size=None if args is None else args.get("size(Byte)"),
        )
        return self

    def hccl_collective(
        self,
        rank: int,
        session: str,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        wait_ns: int,
        transfer: bool = True,
        stream: int = 4,
        connection_id: int | None = None,
    ) -> StoreBuilder:
        """A collective with its device tasks: the op (:meth:`hccl_op`), the ``Notify Wait`` on
        ``stream`` in which this rank waits ``wait_ns`` for its peers, then (``transfer``) the
        ``SDMA`` copy for the rest of the op, all with ``connection_id``."""
        self.hccl_op(
            rank, session, name, start_ns=start_ns, dur_ns=dur_ns, connection_id=connection_id
        )
        tasks = [("Notify Wait", start_ns, wait_ns), ("SDMA", start_ns + wait_ns, dur_ns - wait_ns)]
        for task, at, dur in tasks if transfer else tasks[:1]:
            self.task(
                rank,
                session,
                task,
                stream=stream,
                start_ns=at,
                dur_ns=dur,
                connection_id=connection_id,
            )
        return self

    def comm_link(
        self,
        rank: int,
        session: str,
        step: str,
        op_key: str,
        *,
        src_rank: int,
        dst_rank: int,
        transit_size_mb: float,
        transit_ns: int,
        transport_type: str = "HCCS",
        op_name: str | None = None,
        group: str | None = None,
    ) -> StoreBuilder:
        """One communication_matrix.json link entry (``allreduce-top1`` with its ``op_name``, or
        ``allreduce-total`` without)."""
        self.rows["comm_links"].append(
            {
                "rank": rank, "session": session, "step": step, "kind": "collective",
                "op_key": op_key, "group": group, "src_rank": src_rank, "dst_rank": dst_rank,
                "transport_type": transport_type, "transit_size_mb": transit_size_mb,
                "transit_ns": exact_ns(transit_ns, "transit_ns"),
                "bandwidth_gbps": transit_size_mb / (transit_ns / 1e6) if transit_ns else 0.0,
                "op_name": op_name,
            }
        )  # fmt: skip
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


class _SessionRows(FixtureVerbs):
    """One rank session of a :class:`StoreBuilder`: how each shared verb's fact lands, as the
    canonical rows the parsers would have read from the events."""

    def __init__(self, builder: StoreBuilder, rank: int, session: str) -> None:
        self.builder, self.rank, self.session = builder, rank, session

    def _builder_name(self) -> str:
        return "StoreBuilder"

    def _slice(self, start_ns: int, dur_ns: int, **values: Any) -> dict[str, Any]:
        return self.builder._slice(self.rank, self.session, start_ns, dur_ns, **values)

    def _device_task(
        self, name: str, stream: int, start_ns: int, dur_ns: int, **values: Any
    ) -> None:
        """A task on ``Ascend Hardware`` stream ``stream``, as the parsers name its row."""
        where = {"process": HARDWARE_PROCESS, "thread": f"Stream {stream}", "stream_id": stream}
        self._slice(start_ns, dur_ns, name=name, **where, **values)

    def _land_span(self, span: facts.Span) -> None:
        thread = span.thread or MAIN_THREAD
        self._slice(span.start_ns, span.dur_ns, process="Python", thread=thread, name=span.name,
                    cat=span.cat)  # fmt: skip

    def _land_step(self, step: facts.Step) -> None:
        name = f"ProfilerStep#{step.number}"
        self._land_span(facts.Span(name, step.start_ns, step.dur_ns, MAIN_THREAD, "cpu_op"))

    def _land_api(self, call: facts.ApiCall) -> None:
        self._slice(
            call.start_ns,
            call.dur_ns,
            process=CANN_PROCESS,
            thread=call.thread or CANN_THREAD,
            name=f"{call.layer}@{call.api}",
            api_layer=call.layer,
            api_name=call.api,
            api_level=LEVEL_OF_LAYER.get(call.layer),
            api_mode=call.mode,
            connection_id=call.connection_id,
        )

    def _land_task(self, task: facts.Task) -> None:
        if task.args is not None:
            why = "the store holds the columns parsed from them (memcpy_size, ...)"
            self._cannot("task", "args", task.args, why)
        connection_id = task.connection_id
        if task.launch is not None:
            connection_id = self._launch(task.launch, stream=task.stream, task_ns=task.start_ns)
        self._device_task(
            task.name,
            task.stream,
            task.start_ns,
            task.dur_ns,
            task_type=task.task_type,
            connection_id=connection_id,
            model_id=task.model_id,
        )

    def _launch(self, launch: Launch, *, stream: int, task_ns: int) -> int | None:
        """Write a task's host launch; returns the connection id the task carries."""
        self.builder._connections += 1
        conn = self.builder._connections
        thread = launch.thread or CANN_THREAD
        self.api(launch.api, start_ns=launch.start_ns, dur_ns=launch.dur_ns, thread=thread)
        node_ns, node_dur = launch.node
        self.api("Node@launch", start_ns=node_ns, dur_ns=node_dur, thread=thread,
                 connection_id=conn)  # fmt: skip
        if launch.by_flow:
            self.builder.flow(self.rank, self.session, start_ns=node_ns, end_ns=task_ns,
                              stream=stream, thread=thread)  # fmt: skip
        return conn if launch.by_connection_id else None

    def _land_kernel(self, kernel: facts.Kernel) -> None:
        self._land_task(facts.Task(kernel.name, kernel.stream, kernel.start_ns, kernel.dur_ns,
                                   kernel.core, kernel.model_id, launch=kernel.launch))  # fmt: skip
        self.builder.rows["kernels"].append(
            {
                "rank": self.rank,
                "session": self.session,
                "stream_id": kernel.stream,
                "name": kernel.name,
                "type": kernel.op_type,
                "accelerator_core": kernel.core,
                "start_ns": kernel.start_ns,
                "dur_ns": kernel.dur_ns,
                "input_data_types": kernel.input_data_types,
                "input_shapes": kernel.input_shapes,
            }
        )

    def _land_memcpy_async(self, copy: facts.MemcpyAsync) -> None:
        thread = copy.thread or CANN_THREAD
        self.api("aclrtMemcpyAsync", start_ns=copy.start_ns, dur_ns=copy.dur_ns, thread=thread)
        self.builder.flow(self.rank, self.session, start_ns=copy.start_ns,
                          end_ns=copy.task_start_ns, stream=copy.stream, thread=thread)  # fmt: skip
        copied = {"memcpy_size": copy.size, "memcpy_direction": copy.direction}
        self._device_task("MEMCPY_ASYNC", copy.stream, copy.task_start_ns, copy.task_dur_ns,
                          task_type=copy.task_type, **copied)  # fmt: skip

    def _land_memory(self, record: facts.MemoryRecord) -> None:
        torch = record.component in ("PTA", "PTA+GE")  # the rows with a stream and active total
        self.builder.rows["memory_records"].append(
            {
                "rank": self.rank,
                "session": self.session,
                "component": record.component,
                "ts_ns": record.ts_ns,
                "total_allocated_mb": record.allocated_mb,
                "total_reserved_mb": float(record.reserved_mb),
                "total_active_mb": record.allocated_mb if torch else None,
                "stream_ptr": MEMORY_STREAM_PTR if torch else None,
                "device_type": f"NPU:{self.rank}",
            }
        )

    def _land_counter(self, sample: facts.CounterSample) -> None:
        self.builder.rows["counters"].append(
            {
                "rank": self.rank,
                "session": self.session,
                "process": sample.process or sample.name,
                "name": sample.name,
                "series": sample.series,
                "ts_ns": sample.ts_ns,
                "value": float(sample.value),
            }
        )
