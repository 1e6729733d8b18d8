"""Device memory of a synthetic rank, as ``profile_memory=True`` records it.

torch_npu records its caching allocator (component ``PTA``) after every allocation and free:
the totals allocated, reserved (segments held from the driver) and active, in
memory_record.csv (Db ``MEMORY_RECORD``), with GE's allocator (``GE``) and their sum
(``PTA+GE``); each tensor's allocation and release in operator_memory.csv (``OP_MEMORY``);
and msprof samples the whole process's device memory about every 20 ms (``APP``: NPU_MEM's
``app`` rows, memory_record.csv's ``APP`` rows), which holds what lies outside both
allocators too (HCCL buffers, the runtime's workspaces).

:class:`CachingAllocator` is the model a scenario drives (``alloc``, ``free``, ``outside``);
it hands each record to :class:`~traceanalyzer.synth.rank.RankWriter`, which writes it to the
Text and Db views alike. All sizes are int bytes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from traceanalyzer.synth.fmt import csv_ts
from traceanalyzer.synth.tables import CsvFile
from traceanalyzer.vocabulary import MEMORY_STREAM_PTR as STREAM_PTR

MB = 1 << 20  # memory_record.csv's "MB" is 2^20 bytes (the Db records bytes)
SEGMENT = 2 * MB  # torch's allocator rounds a large block's segment up to 2 MiB
APP_PERIOD_NS = 20_000_000  # msprof samples NPU_MEM about every 20 ms
OTHER_PROCESSES = 256 * MB  # NPU_MEM `device` rows: the whole device, other processes too
DEVICE_LAG_NS = 234_000  # msprof samples the device's memory this long after the process's

MEMORY_RECORD_HEADER = [
    "Component",
    "Timestamp(us)",
    "Total Allocated(MB)",
    "Total Reserved(MB)",
    "Total Active(MB)",
    "Stream Ptr",
    "Device Type",
]
OPERATOR_MEMORY_HEADER = [
    "Name",
    "Size(KB)",
    "Allocation Time(us)",
    "Release Time(us)",
    "Active Release Time(us)",
    "Duration(us)",
    "Active Duration(us)",
    "Allocation Total Allocated(MB)",
    "Allocation Total Reserved(MB)",
    "Allocation Total Active(MB)",
    "Release Total Allocated(MB)",
    "Release Total Reserved(MB)",
    "Release Total Active(MB)",
    "Stream Ptr",
    "Device Type",
]


@dataclass(frozen=True)
class Totals:
    """An allocator's totals after an event (bytes); GE records no active total, APP only
    what the process reserved."""

    allocated: int | None
    reserved: int
    active: int | None


@dataclass(frozen=True)
class Record:
    """One memory_record row: ``component``'s totals at ``ts`` (APP: reserved only)."""

    component: str
    ts: int
    totals: Totals
    stream_ptr: int | None


@dataclass(frozen=True)
class OperatorMemory:
    """One operator_memory row: a tensor's allocation and, if it was freed, its release."""

    name: str
    size: int
    alloc_ns: int
    at_alloc: Totals
    release_ns: int | None = None
    at_release: Totals | None = None
    stream_ptr: int = STREAM_PTR


def _mb(value: int | None) -> float | str:
    return "" if value is None else value / MB


def write_memory_record(path: Path, device: int, app: list[Record], other: list[Record]) -> None:
    """memory_record.csv as torch_npu writes it (CRLF): the APP samples first, then the
    allocators' records in time order."""
    f = CsvFile(path, MEMORY_RECORD_HEADER, crlf=True)
    for r in [*app, *other]:
        t = r.totals
        row = [r.component, csv_ts(r.ts), _mb(t.allocated), _mb(t.reserved), _mb(t.active)]
        f.row(row + ["" if r.stream_ptr is None else r.stream_ptr, f"NPU:{device}"])
    f.close()


def write_operator_memory(path: Path, device: int, rows: list[OperatorMemory]) -> None:
    """operator_memory.csv (CRLF); an allocation never freed in the profile leaves its release
    columns empty."""
    f = CsvFile(path, OPERATOR_MEMORY_HEADER, crlf=True)
    for r in rows:
        a = r.at_alloc
        end = [""] * 8
        if r.release_ns is not None and r.at_release is not None:
            dur = f"{(r.release_ns - r.alloc_ns) / 1000:.3f}\t"
            b = r.at_release
            end = [csv_ts(r.release_ns), csv_ts(r.release_ns), dur, dur]
            end += [_mb(b.allocated), _mb(b.reserved), _mb(b.active), ""]
        row = [r.name, r.size / 1024, csv_ts(r.alloc_ns)] + end[:4]
        row += [_mb(a.allocated), _mb(a.reserved), _mb(a.active)] + end[4:7]
        f.row(row + [r.stream_ptr, f"NPU:{device}"])
    f.close()


class MemorySink(Protocol):
    """Where the model's records go (a :class:`~traceanalyzer.synth.rank.RankWriter`)."""

    def memory_model(self, model: CachingAllocator) -> None: ...

    def memory_record(self, record: Record) -> None: ...

    def operator_memory(self, row: OperatorMemory) -> None: ...


def _segments(size: int) -> int:
    return -(-size // SEGMENT) * SEGMENT


class CachingAllocator:
    """torch_npu's caching allocator (PTA), GE's, and the process's other device memory, as
    a profile records them. A block is served from the cache while the reserved segments hold
    it; beyond them (or with ``new_segment``: a request no cached block fits) the allocator
    reserves a new segment from the driver. ``allocated`` (the weights), ``ge`` and
    ``outside``: what the process held before the profile began."""

    def __init__(
        self, rw: MemorySink, *, allocated: int = 0, outside: int = 0, ge: Totals | None = None
    ) -> None:
        self.rw = rw
        self.allocated = allocated
        self.reserved = _segments(allocated)
        self.ge = ge or Totals(0, 0, None)
        self.outside = outside  # HCCL buffers, the runtime's workspaces: neither allocator's
        self._live: dict[int, OperatorMemory] = {}
        self._next = 0
        # (ts, PTA reserved, GE reserved, outside) after each change; what it held before the first
        self._history: list[tuple[int, int, int, int]] = [(0, *self._held())]
        rw.memory_model(self)

    # ---- events ------------------------------------------------------------------
    def alloc(self, ts: int, name: str, size: int, *, new_segment: bool = False) -> int:
        """``name`` allocates ``size`` bytes at ``ts``; returns the handle :meth:`free` takes."""
        self.allocated += size
        if new_segment:
            self.reserved += _segments(size)
        elif self.allocated > self.reserved:
            self.reserved += _segments(self.allocated - self.reserved)
        handle, self._next = self._next, self._next + 1
        self._live[handle] = OperatorMemory(name, size, ts, self._pta())
        self._record(ts)
        return handle

    def free(self, ts: int, handle: int, *, release_segment: bool = False) -> None:
        """The tensor of ``handle`` is freed at ``ts`` (``release_segment``: and its segment
        handed back to the driver, as ``empty_cache`` or a retry after a failed malloc does)."""
        op = self._live.pop(handle)
        self.allocated -= op.size
        if release_segment:
            self.reserved -= _segments(op.size)
        self._record(ts)
        self.rw.operator_memory(replace(op, release_ns=ts, at_release=self._pta()))

    def ge_record(self, ts: int) -> None:
        """GE's allocator records its totals at ``ts``."""
        self.rw.memory_record(Record("GE", ts, self.ge, None))
        self._sum(ts)

    def grow_outside(self, ts: int, size: int) -> None:
        """Device memory outside both allocators grows by ``size`` at ``ts`` (an HCCL buffer)."""
        self.outside += size
        self._history.append((ts, *self._held()))

    def _held(self) -> tuple[int, int, int]:
        return self.reserved, self.ge.reserved, self.outside

    # ---- records -----------------------------------------------------------------
    def _pta(self) -> Totals:
        return Totals(self.allocated, self.reserved, self.allocated)

    def _record(self, ts: int) -> None:
        self.rw.memory_record(Record("PTA", ts, self._pta(), STREAM_PTR))
        self._sum(ts)
        self._history.append((ts, *self._held()))

    def _sum(self, ts: int) -> None:
        ge = self.ge
        total = Totals(self.allocated + ge.allocated, self.reserved + ge.reserved, self.allocated)
        self.rw.memory_record(Record("PTA+GE", ts, total, STREAM_PTR))

    def close(self) -> None:
        """Write the allocations never freed in the profile."""
        for op in self._live.values():
            self.rw.operator_memory(op)
        self._live.clear()

    def held_at(self, ts: int) -> tuple[int, int, int]:
        """(PTA reserved, GE reserved, outside both) at ``ts``: their sum is the process's
        device memory (APP), PTA's the ``APP`` module of npu_module_mem.csv, the rest HCCL's
        and the runtime's."""
        return self._history[bisect.bisect_right(self._history, (ts, 1 << 62)) - 1][1:]
