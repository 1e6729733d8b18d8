# ruff: noqa: UP031 -- %-templates are deliberate: one format per event, fastest in CPython.
"""Streaming writer for ``trace_view.json`` in torch_npu's exact framing.

Framing (observed in the real G2 export): one line, a bare JSON array; the
framework part (key order ``ph, name, pid, tid, ts, dur, cat, args``) comes
first, joined by ``", "``; then ``","`` and the msprof part (key order
``name, pid, tid, ts, dur, args, ph``): its M events, then its X/C/flow events
in time order, then the torch_to_npu flow pairs. Events are built from
``%``-templates instead of ``json.dumps`` per event, which keeps 200 MB within
seconds while producing the same bytes ``json.dumps`` would.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from traceanalyzer.synth.fmt import dur_us, js, ts_us
from traceanalyzer.synth.profiles import Generation
from traceanalyzer.synth.spool import Spool

OVERLAP_THREADS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
NO_ID = 4294967295  # msprof's "none" of a model or context id (uint32 max)
COMM_DTYPE, COMM_ALG = "FP16", "MESH-RING"  # every synthetic collective's data type, algorithm
# How far the Db's envelope tasks (a collective's own record, a MIX kernel's parent) reach
# beyond what they envelop, each side.
ENVELOPE_LEAD_NS = 1_500


class DeviceTask(NamedTuple):
    """One task on a device stream as msprof records it (the trace's and the Db's TASK)."""

    stream: int
    start: int
    dur: int
    task_id: int
    conn: int
    model_id: int
    context: int  # the subtask (FFTS+ context) id; NO_ID: none

    def envelope(self) -> DeviceTask:
        """The undescribed task msprof alone records around this one, without a context."""
        lead = ENVELOPE_LEAD_NS
        return self._replace(start=self.start - lead, dur=self.dur + 2 * lead, context=NO_ID)


class CommStep(NamedTuple):
    """One step of a collective on one plane, as its trace event and its Db record (besides
    its task) describe it."""

    plane: int
    kind: str  # Notify_Wait, Memcpy
    src: int
    dst: int
    size: int  # bytes
    transport: str
    link: str
    notify: int | None  # the notify id it waits on; None: none (a copy)
    est_us: float  # the trace's estimated duration
    bandwidth: float  # GB/s (the trace's)


class TraceView:
    """Collects one rank's events into the spools that become trace_view.json."""

    def __init__(self, gen: Generation, ospid: int, device: int) -> None:
        self.gen = gen
        self.ospid = ospid
        self.device = device
        self.python_pid = ospid  # the framework process uses the raw OS pid
        self._fw_ops = Spool()
        self._fw_enqueue = Spool()
        self._fw_dequeue = Spool()
        self._ms = Spool()
        self._flows = Spool()
        self._pending: list[tuple[int, int, str]] = []  # (ts_ns, seq, text) of the current chunk
        self._seq = 0
        self.python_threads: dict[int, None] = {}
        self.dequeue_tid: int | None = None
        self.cann_threads: dict[int, None] = {}
        self.hw_streams: set[int] = set()
        self.comm_tids: set[int] = set()
        self.used: set[str] = set()  # msprof process names that carry events
        self.gc_pid: int | None = None  # the Python GC process, once a collection is recorded

    @property
    def size(self) -> int:
        """Approximate bytes written so far (pending chunk included)."""
        spools = (self._fw_ops, self._fw_enqueue, self._fw_dequeue, self._ms, self._flows)
        return sum(s.chars for s in spools) + sum(len(t) + 2 for _, _, t in self._pending)

    # ---- pids ---------------------------------------------------------------
    def pid(self, process: str) -> int:
        """``(ospid << 10) | (sort << 5) | device`` (host layers use 31 in current msprof)."""
        sort = self.gen.sort_index[process]
        dev = self.device
        if process == "CANN" and self.gen.host_device_id is not None:
            dev = self.gen.host_device_id
        return (self.ospid << 10) | (sort << 5) | dev

    # ---- framework part -----------------------------------------------------
    def cpu_op(self, tid: int, name: str, start: int, dur: int, args: str = "") -> None:
        self.python_threads.setdefault(tid)
        self._fw_ops.add(
            '{"ph": "X", "name": %s, "pid": %d, "tid": %d, "ts": "%s", "dur": %s, "cat": "cpu_op", '
            '"args": {"Sequence number": -1, "Fwd thread id": 0%s}}'
            % (js(name), self.python_pid, tid, ts_us(start), dur_us(dur), args)
        )

    def python_function(
        self, tid: int, name: str, start: int, dur: int, python_id: int, parent_id: int
    ) -> None:
        """A Python tracer event (``with_stack``/``with_modules``): ``file.py(line): function``."""
        self.python_threads.setdefault(tid)
        self._fw_ops.add(
            '{"ph": "X", "name": %s, "pid": %d, "tid": %d, "ts": "%s", "dur": %s, '
            '"cat": "python_function", "args": {"Python id": %d, "Python parent id": %d}}'
            % (js(name), self.python_pid, tid, ts_us(start), dur_us(dur), python_id, parent_id)
        )

    def gc(self, start: int, dur: int) -> None:
        """A garbage collection torch_npu saw (``gc_detect_threshold``): an ``X`` event of cat
        ``GC`` on the ``Python GC`` process (pid ``(ospid << 10) | (1 << 5) | device``)."""
        self.gc_pid = (self.ospid << 10) | (1 << 5) | self.device
        self._fw_ops.add(
            '{"ph": "X", "name": "GC", "pid": %d, "tid": %d, "ts": "%s", "dur": %s, "cat": "GC", '
            '"args": {}}' % (self.gc_pid, self.ospid, ts_us(start), dur_us(dur))
        )

    def enqueue(self, tid: int, corr: int, start: int, dur: int) -> None:
        self.python_threads.setdefault(tid)
        self._queue(self._fw_enqueue, tid, corr, "Enqueue", "enqueue", start, dur, "s")

    def dequeue(self, tid: int, corr: int, op: str, start: int, dur: int) -> None:
        self.dequeue_tid = tid
        self._queue(self._fw_dequeue, tid, corr, "Dequeue@" + op, "dequeue", start, dur, "f")

    def _queue(
        self, spool: Spool, tid: int, corr: int, name: str, cat: str, start: int, dur: int, ph: str
    ) -> None:
        """One side of the task queue's hand-over: its event and its end of the flow."""
        p, t = self.python_pid, ts_us(start)
        spool.add(
            '{"ph": "X", "name": %s, "pid": %d, "tid": %d, "ts": "%s", "dur": %s, "cat": "%s", '
            '"args": {"correlation_id": %d}}' % (js(name), p, tid, t, dur_us(dur), cat, corr)
        )
        spool.add(
            '{"ph": "%s", "bp": "e", "name": "enqueue_to_dequeue", "id": %d, "pid": %d, "tid": %d, '
            '"ts": "%s", "cat": "async_task_queue"}' % (ph, corr, p, tid, t)
        )

    def torch_to_npu(
        self, op_tid: int, op_start: int, dst_pid: int, dst_tid: int, dst_start: int
    ) -> None:
        """async_npu flow pair; the id is the device task start in ns (torch_npu ``flow_id = end.ts``)."""
        self._flows.add(
            '{"ph": "s", "bp": "e", "name": "torch_to_npu", "id": %d, "pid": %d, "tid": %d, "ts": "%s", '
            '"cat": "async_npu"}' % (dst_start, self.python_pid, op_tid, ts_us(op_start))
        )
        self._flows.add(
            '{"ph": "f", "bp": "e", "name": "torch_to_npu", "id": %d, "pid": %d, "tid": %d, "ts": "%s", '
            '"cat": "async_npu"}' % (dst_start, dst_pid, dst_tid, ts_us(dst_start))
        )

    # ---- msprof part (time-ordered per chunk) ---------------------------------
    def _push(self, ts: int, text: str) -> None:
        self._seq += 1
        self._pending.append((ts, self._seq, text))

    def _slice(self, process: str, name: str, tid: int, start: int, dur: int, args: str) -> None:
        """An ``X`` event of the msprof part (``args``: its arguments' JSON, without braces)."""
        self.used.add(process)
        self._push(
            start,
            '{"name": %s, "pid": %d, "tid": %d, "ts": "%s", "dur": %s, "args": {%s}, "ph": "X"}'
            % (js(name), self.pid(process), tid, ts_us(start), dur_us(dur), args),
        )

    def cann_api(
        self,
        tid: int,
        layer: str,
        api: str,
        start: int,
        dur: int,
        mode: str,
        level: str,
        api_id: str,
        item_id: str,
        conn: int,
    ) -> None:
        self.cann_threads.setdefault(tid)
        args = (
            '"Thread Id": %d, "Mode": %s, "level": %s, "id": %s, "item_id": %s, "connection_id": %d'
            % (tid, js(mode), js(level), js(api_id), js(item_id), conn)
        )
        self._slice("CANN", layer + api, tid, start, dur, args)

    def hw_task(self, task: DeviceTask, name: str, task_type: str, extra: str) -> None:
        self.hw_streams.add(task.stream)
        args = (
            '"Model Id": %d, "Task Type": %s, "%s": %d, "Task Id": %d, "Batch Id": 0, '
            '"Subtask Id": %d, "connection_id": %d%s'
            % (
                task.model_id,
                js(task_type),
                self.gen.hw_stream_arg,
                task.stream,
                task.task_id,
                task.context,
                task.conn,
                extra,
            )
        )
        self._slice("Ascend Hardware", name, task.stream, task.start, task.dur, args)

    def comm_op(self, name: str, start: int, dur: int, conn: int, count: int) -> None:
        """A collective's group op (tid 0 of the communication process)."""
        self.comm_tids.add(0)
        args = (
            '"connection_id": %d, "model id": 4294967295, "data_type": %s, "alg_type": %s, '
            '"count": %d' % (conn, js(COMM_DTYPE), js(COMM_ALG), count)
        )
        self._slice(self.gen.comm_process, name, 0, start, dur, args)

    def comm_task(self, task: DeviceTask, step: CommStep) -> None:
        tid = step.plane + 1
        self.comm_tids.add(tid)
        notify = "18446744073709551615" if step.notify is None else str(step.notify)  # uint64 max
        args = (
            '"notify_id": %s, "duration estimated(us)": %r, "stream id": %d, "task id": %d, '
            '"context id": %d, "task type": %s, "src rank": %d, "dst rank": %d, '
            '"transport type": %s, "size(Byte)": %d, "data type": "INVALID_TYPE", "link type": %s, '
            '"bandwidth(GB/s)": %r, "model id": 4294967295'
            % (
                js(notify),
                step.est_us,
                task.stream,
                task.task_id,
                task.context,
                js(step.kind),
                step.src,
                step.dst,
                js(step.transport),
                step.size,
                js(step.link),
                step.bandwidth,
            )
        )
        self._slice(self.gen.comm_process, step.kind, tid, task.start, task.dur, args)

    def h2d_flow(
        self, flow_id: str, src_tid: int, src_ts: int, dst_pid: int, dst_tid: int, dst_ts: int
    ) -> None:
        """HostToDevice flow: ``s`` on the CANN API, ``f`` (``bp: e``) on the device task."""
        self._push(
            src_ts,
            '{"name": "HostToDevice%s", "ph": "s", "cat": "HostToDevice", "id": "%s", "pid": %d, "tid": %d, "ts": "%s"}'
            % (flow_id, flow_id, self.pid("CANN"), src_tid, ts_us(src_ts)),
        )
        self._push(
            dst_ts,
            '{"name": "HostToDevice%s", "ph": "f", "id": "%s", "ts": "%s", "cat": "HostToDevice", "pid": %d, '
            '"tid": %d, "bp": "e"}' % (flow_id, flow_id, ts_us(dst_ts), dst_pid, dst_tid),
        )

    def overlap(self, tid: int, start: int, dur: int) -> None:
        self.used.add("Overlap Analysis")
        self._push(
            start,
            '{"name": "%s", "pid": %d, "tid": %d, "ts": "%s", "dur": %r, "ph": "X"}'
            % (
                OVERLAP_THREADS[tid],
                self.pid("Overlap Analysis"),
                tid,
                ts_us(start),
                round(dur / 1000, 3),
            ),
        )

    def counter(self, process: str, name: str, ts: int, args: str, whole_us: bool = False) -> None:
        """A C event. ``whole_us`` writes ts as whole µs without decimals, as msprof does for
        the closing `AI Core Freq` sample in real exports."""
        self.used.add(process)
        self._push(
            ts,
            '{"name": %s, "ts": "%s", "pid": %d, "tid": 0, "args": {%s}, "ph": "C"}'
            % (js(name), str(ts // 1000) if whole_us else ts_us(ts), self.pid(process), args),
        )

    def flush_chunk(self) -> None:
        """Sort the chunk's msprof events by time (msprof's order) and spool them."""
        if self._pending:
            self._pending.sort()
            self._ms.extend([t for _, _, t in self._pending])
            self._pending.clear()

    # ---- M events and assembly ---------------------------------------------
    def _python_meta(self) -> list[str]:
        def m(pid: int, tid: int, name: str, args: str) -> str:
            template = '{"ph": "M", "name": "%s", "pid": %d, "tid": %d, "args": {%s}}'
            return template % (name, pid, tid, args)

        def process(pid: int, name: str, sort: int) -> list[str]:
            return [
                m(pid, 0, "process_name", '"name": "%s"' % name),
                m(pid, 0, "process_labels", '"labels": "CPU"'),
                m(pid, 0, "process_sort_index", '"sort_index": %d' % sort),
            ]

        p = self.python_pid
        out = process(p, "Python", 0)
        tids = list(self.python_threads)
        if self.dequeue_tid is not None and self.dequeue_tid not in self.python_threads:
            tids.append(self.dequeue_tid)
        top = max(tids) if tids else 0
        for tid in tids:
            sort = top + 1 if tid == self.dequeue_tid else tid
            out.append(m(p, tid, "thread_name", '"name": "Thread %d"' % tid))
            out.append(m(p, tid, "thread_sort_index", '"sort_index": %d' % sort))
        if self.gc_pid is not None:
            out += process(self.gc_pid, "Python GC", 1)
            out.append(
                m(self.gc_pid, self.ospid, "thread_name", '"name": "Thread %d"' % self.ospid)
            )
        return out

    def _ms_meta(
        self,
        process: str,
        threads: list[tuple[int, str]],
        interleave: bool,
        sorts: bool,
        label: str,
    ) -> list[str]:
        pid = self.pid(process)

        def m(name: str, tid: int, args: str) -> str:
            template = '{"name": "%s", "pid": %d, "tid": %d, "args": {%s}, "ph": "M"}'
            return template % (name, pid, tid, args)

        out = [m("process_name", 0, '"name": %s' % js(process))]
        names = [m("thread_name", tid, '"name": %s' % js(tname)) for tid, tname in threads]
        sort_ev = (
            [m("thread_sort_index", tid, '"sort_index": %d' % tid) for tid, _ in threads]
            if sorts
            else []
        )
        if interleave and sort_ev:
            for a, b in zip(names, sort_ev, strict=True):
                out += [a, b]
        else:
            out += names + sort_ev
        out.append(m("process_labels", 0, '"labels": %s' % js(label)))
        out.append(m("process_sort_index", 0, '"sort_index": %d' % self.gen.sort_index[process]))
        return out

    def _msprof_meta(self) -> list[str]:
        npu = self.gen.npu_label(self.device)
        out: list[str] = []
        if "Ascend Hardware" in self.used:
            streams = [(s, f"Stream {s}") for s in sorted(self.hw_streams)]
            out += self._ms_meta("Ascend Hardware", streams, True, True, npu)
        if "NPU MEM" in self.used:
            out += self._ms_meta("NPU MEM", [], False, False, npu)
        comm = self.gen.comm_process
        if comm in self.used:
            tids = sorted(self.comm_tids | {0})
            threads = [(t, "Group 0 Communication" if t == 0 else f"Plane {t - 1}") for t in tids]
            out += self._ms_meta(comm, threads, False, True, npu)
        if "CANN" in self.used:
            cann = list(self.cann_threads)
            out += self._ms_meta("CANN", [(t, f"Thread {t}") for t in cann], False, True, "CPU")
        if "Overlap Analysis" in self.used:
            out += self._ms_meta(
                "Overlap Analysis", list(enumerate(OVERLAP_THREADS)), False, False, npu
            )
        if "AI Core Freq" in self.used:
            out += self._ms_meta("AI Core Freq", [], False, False, npu)
        return out

    def write(self, path: Path) -> None:
        """Assemble the spools into ``path`` (streamed; constant memory)."""
        self.flush_chunk()
        with open(path, "w", encoding="utf-8", newline="") as out:
            out.write("[")
            for spool in (self._fw_ops, self._fw_enqueue, self._fw_dequeue):
                if not spool.empty:
                    spool.copy_to(out)
                    out.write(", ")
            out.write(", ".join(self._python_meta()))  # never empty: the Python process's
            out.write(",")
            out.write(", ".join(self._msprof_meta()))
            for spool in (self._ms, self._flows):
                if not spool.empty:
                    out.write(", ")
                    spool.copy_to(out)
            out.write("]")

    def close(self) -> None:
        for spool in (self._fw_ops, self._fw_enqueue, self._fw_dequeue, self._ms, self._flows):
            spool.close()
