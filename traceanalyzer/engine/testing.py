"""A tiny in-memory store builder for rule fixtures: a few lines per slice, call, task or flow.

Times are given in microseconds (what you read off a timeline) and stored as exact int64 ns.
Every row fills the canonical columns the way the parsers do (``api_layer``/``api_name`` from the
CANN name, ``stream_id`` and ``thread = "Stream N"`` on Ascend Hardware, ...), so a rule that
works on a fixture works on ingested data::

    b = StoreBuilder()
    b.session(rank=0, session="s0", start_us=0, end_us=10_000)
    b.cann(0, "s0", "AscendCL@aclmdlRICaptureBegin", 100, 5)
    b.cann(0, "s0", "AscendCL@aclrtMemcpy", 110, 20)
    b.cann(0, "s0", "AscendCL@aclmdlRICaptureEnd", 900, 5)
    store = b.store()
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from traceanalyzer.store import Store

LEVEL_OF_LAYER = {"AscendCL": "acl", "Runtime": "runtime", "Node": "node", "Hccl": "hccl"}


def us(value: float) -> int:
    """Microseconds to integer nanoseconds (fixtures only; parsers convert exactly from text)."""
    return round(value * 1000)


class StoreBuilder:
    """Collect canonical rows table by table, then build a :class:`Store` with :meth:`store`."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._seq: dict[tuple[int, str], int] = defaultdict(int)

    def _slice(self, rank: int, session: str, **values: Any) -> dict[str, Any]:
        seq = self._seq[(rank, session)]
        self._seq[(rank, session)] += 1
        start = us(values.pop("start_us"))
        dur = us(values.pop("dur_us"))
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

    def session(
        self,
        rank: int,
        session: str,
        start_us: float,
        end_us: float,
        *,
        metadata: Mapping[str, Any] | None = None,
        profiler_level: str = "Level1",
    ) -> StoreBuilder:
        self.rows["sessions"].append(
            {
                "rank": rank,
                "session": session,
                "path": f"/fixtures/{session}",
                "start_ns": us(start_us),
                "end_ns": us(end_us),
                "profiler_level": profiler_level,
                "metadata": json.dumps(dict(metadata or {})),
            }
        )
        return self

    def cann(
        self,
        rank: int,
        session: str,
        name: str,
        start_us: float,
        dur_us: float,
        *,
        thread: str = "Thread 100",
        connection_id: int | None = None,
    ) -> StoreBuilder:
        """A host CANN API call, e.g. ``AscendCL@aclrtMemcpy`` or ``Runtime@MemCopySync``."""
        layer, _, api = name.partition("@")
        self._slice(
            rank,
            session,
            start_us=start_us,
            dur_us=dur_us,
            process="CANN",
            thread=thread,
            name=name,
            api_layer=layer,
            api_name=api,
            api_level=LEVEL_OF_LAYER.get(layer),
            connection_id=connection_id,
        )
        return self

    def task(
        self,
        rank: int,
        session: str,
        stream: int,
        name: str,
        start_us: float,
        dur_us: float,
        *,
        task_type: str | None = None,
        connection_id: int | None = None,
    ) -> StoreBuilder:
        """A device task on ``Ascend Hardware`` stream ``stream``."""
        self._slice(
            rank,
            session,
            start_us=start_us,
            dur_us=dur_us,
            process="Ascend Hardware",
            thread=f"Stream {stream}",
            name=name,
            stream_id=stream,
            task_type=task_type or name,
            connection_id=connection_id,
        )
        return self

    def hccl_task(
        self, rank: int, session: str, stream: int, name: str, start_us: float, dur_us: float
    ) -> StoreBuilder:
        """A small HCCL task on a communication plane (``Notify_Wait``, ``Memcpy``, ...)."""
        self._slice(
            rank,
            session,
            start_us=start_us,
            dur_us=dur_us,
            process="HCCL",
            thread="Plane 0",
            name=name,
            stream_id=stream,
            task_type=name,
        )
        return self

    def span(
        self,
        rank: int,
        session: str,
        name: str,
        start_us: float,
        dur_us: float,
        *,
        cat: str = "python_function",
        thread: str = "Thread 1",
    ) -> StoreBuilder:
        """A Python-side span (``cpu_op``, ``python_function`` or an mstx range)."""
        self._slice(
            rank,
            session,
            start_us=start_us,
            dur_us=dur_us,
            process="Python",
            thread=thread,
            name=name,
            cat=cat,
        )
        return self

    def flow(
        self,
        rank: int,
        session: str,
        start_us: float,
        end_us: float,
        *,
        dst_stream: int,
        src_thread: str = "Thread 100",
        src_process: str = "CANN",
        cat: str = "HostToDevice",
    ) -> StoreBuilder:
        """A host-to-device flow from a host call (at ``start_us``) to a task on ``dst_stream``."""
        self.rows["flows"].append(
            {
                "rank": rank,
                "session": session,
                "cat": cat,
                "name": cat,
                "flow_id": str(len(self.rows["flows"])),
                "start_ns": us(start_us),
                "end_ns": us(end_us),
                "src_process": src_process,
                "src_thread": src_thread,
                "dst_process": "Ascend Hardware",
                "dst_thread": f"Stream {dst_stream}",
                "dst_tid": dst_stream,
            }
        )
        return self

    def api_stat(
        self, rank: int, session: str, api_name: str, count: int, *, level: str = "acl"
    ) -> StoreBuilder:
        self.rows["api_stats"].append(
            {"rank": rank, "session": session, "level": level, "api_name": api_name, "count": count}
        )
        return self

    def step_time(
        self,
        rank: int,
        session: str,
        step: int,
        *,
        computing_us: float,
        free_us: float,
        communication_us: float = 0.0,
    ) -> StoreBuilder:
        """One step_trace_time.csv row: the step's compute, free (idle) and exposed comm time."""
        self.rows["step_times"].append(
            {
                "rank": rank,
                "session": session,
                "step": step,
                "computing_ns": us(computing_us),
                "communication_not_overlapped_ns": us(communication_us),
                "communication_ns": us(communication_us),
                "overlapped_ns": 0,
                "free_ns": us(free_us),
                "stage_ns": us(computing_us + free_us + communication_us),
            }
        )
        return self

    def comm_op(
        self, rank: int, session: str, step: str, op_name: str, *, transit_us: float, wait_us: float
    ) -> StoreBuilder:
        """One communication.json op with its transit and wait time."""
        self.rows["comm_ops"].append(
            {
                "rank": rank,
                "session": session,
                "step": step,
                "kind": "collective",
                "op_name": op_name,
                "transit_ns": us(transit_us),
                "wait_ns": us(wait_us),
                "elapse_ns": us(transit_us + wait_us),
            }
        )
        return self

    def store(self) -> Store:
        return Store.from_frames({table: rows for table, rows in self.rows.items() if rows})
