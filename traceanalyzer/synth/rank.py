"""One rank's export: the single place that keeps all output files consistent.

Scenarios and fixture builders describe *what happened* (a torch op, a CANN API
call, a device task, a kernel, a collective); :class:`RankWriter` turns each
fact into every record torch_npu would have written for it: trace_view events
and flows, kernel_details rows, api/op statistics, Overlap Analysis slices,
step_trace_time rows and communication summaries. Times are integer ns.

Events are buffered per *chunk* (a step or a capture) and flushed in time order,
so memory stays bounded by the largest chunk, not by the run.
"""

from __future__ import annotations

import bisect
import json
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from traceanalyzer.synth.comm import (
    CollectiveRecord,
    communication_documents,
    write_communication,
)
from traceanalyzer.synth.db_export import KERNEL_TASK_TYPE, DbExport
from traceanalyzer.synth.fmt import csv_ts, js
from traceanalyzer.synth.memory import (
    APP_PERIOD_NS,
    DEVICE_LAG_NS,
    OTHER_PROCESSES,
    CachingAllocator,
    OperatorMemory,
    Record,
    Totals,
    write_memory_record,
    write_operator_memory,
)
from traceanalyzer.synth.profiles import (
    G1_METRIC_COLUMNS,
    PIPE_UTILIZATION_COLUMNS,
    Generation,
)
from traceanalyzer.synth.tables import (
    OPERATOR_DETAILS_HEADER,
    TASK_TIME_HEADER,
    ApiStatistic,
    CsvFile,
    OpStatistic,
    StepTotals,
    kernel_details_header,
    kernel_row_tail,
    module_mem_samples,
    step_trace_rows,
    write_module_mem,
    write_step_trace,
)
from traceanalyzer.synth.trace_view import NO_ID, CommStep, DeviceTask, TraceView
from traceanalyzer.vocabulary import CORE_TASK_TYPE

INVALID_MODEL = NO_ID
NOMINAL_MHZ = 1800  # AI Core frequency of Atlas A2/A3 at full speed
_LAYER_LEVEL = {"AscendCL@": "acl", "Runtime@": "runtime", "Node@": "node", "Model@": "model"}
# A collective's two steps on each plane: (trace name, hardware name, transport, link,
# estimated µs, GB/s); the copy has no notify id (uint64 max in the trace).
_PLANE_STEPS = (
    ("Notify_Wait", "Notify Wait", "LOCAL", "INVALID_TYPE", 0.02, 0.0),
    ("Memcpy", "SDMA", "SDMA", "HCCS", 108.46, 18.9),
)
# The variables profiler_metadata.json's ENV_VARIABLES lists (empty when unset).
_RECORDED_ENV = (
    "ASCEND_GLOBAL_LOG_LEVEL",
    "HCCL_RDMA_TC",
    "HCCL_RDMA_SL",
    "ACLNN_CACHE_LIMIT",
    "HOST_CACHE_CAPACITY",
    "ASCEND_ENHANCE_ENABLE",
    "PYTORCH_NPU_ALLOC_CONF",
    "ASCEND_LAUNCH_BLOCKING",
)
EXPORT_TYPES = ("text", "db")
# torch_npu's `export_type` options: Text, Db, or both ([Text, Db]).
EXPORTS: dict[str, tuple[str, ...]] = {"text": ("text",), "db": ("db",), "both": EXPORT_TYPES}


@dataclass
class RankConfig:
    """Identity and profiler settings of one rank directory."""

    rank: int
    generation: Generation
    level: int = 1
    device: int | None = None  # defaults to the rank
    ospid: int = 3096504
    host: str = "localhost"
    start_ns: int = 1_736_408_883_000_000_000
    group: list[int] = field(default_factory=lambda: [0, 1])
    group_hash: str = "17522688603477080586"
    schedule: bool = True  # steps exist (ProfilerStep#N, Step Id column)
    metadata: dict = field(default_factory=dict)  # extra prof.add_metadata keys
    env: dict = field(default_factory=dict)  # ENV_VARIABLES overrides
    clock_offset_ns: int = 0  # time since the rank's first session (later sessions of a process)
    export: tuple[str, ...] = ("text",)  # the formats written: "text", "db" or both

    @property
    def dev(self) -> int:
        return self.rank if self.device is None else self.device


def rank_dir_name(host: str, ospid: int, start_ns: int) -> str:
    """``{host}_{pid}_{YYYYMMDDhhmmssSSS}_ascend_pt`` (UTC, so names do not depend on the machine)."""
    stamp = datetime.fromtimestamp(start_ns // 1_000_000_000, tz=timezone.utc).strftime(
        "%Y%m%d%H%M%S"
    )
    return f"{host}_{ospid}_{stamp}{(start_ns // 1_000_000) % 1000:03d}_ascend_pt"


def check_export(generation: Generation, export: tuple[str, ...]) -> None:
    """Refuse a Db export of a generation that had none."""
    if "db" in export and not generation.db_export:
        raise ValueError(f"generation {generation.name} has no Db export (choose g2 or later)")


class RankWriter:
    """Writes one ``*_ascend_pt`` directory; see the module docstring."""

    def __init__(self, root: Path, cfg: RankConfig) -> None:
        check_export(cfg.generation, cfg.export)
        self.cfg = cfg
        self.gen = cfg.generation
        self.level = cfg.level
        self.dir = Path(root) / rank_dir_name(cfg.host, cfg.ospid, cfg.start_ns)
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.out = self.dir / "ASCEND_PROFILER_OUTPUT"
        self.out.mkdir(parents=True)
        # The Text view is always built (its files carry the totals the Db records too); a
        # Db-only export builds it in a scratch directory that close() removes.
        self.text_out = self.out
        if "text" not in cfg.export:
            self.text_out = Path(tempfile.mkdtemp(prefix="synth-text-"))
            # removed by close(), or with the writer if the scenario fails
            self._drop_text = weakref.finalize(self, shutil.rmtree, self.text_out, True)
        self.db: DbExport | None = None
        self.tv = TraceView(self.gen, cfg.ospid, cfg.dev)
        self.main_tid = cfg.ospid
        self.dequeue_tid = cfg.ospid + 3198
        self.hw_pid = self.tv.pid("Ascend Hardware")
        self.comm_pid = self.tv.pid(self.gen.comm_process)
        if "db" in cfg.export:
            self.db = DbExport(
                self.out,
                self.gen,
                rank=cfg.rank,
                device=cfg.dev,
                ospid=cfg.ospid,
                host=cfg.host,
                device_pids=(self.hw_pid, self.comm_pid),
            )
        self._kernels = CsvFile(
            self.text_out / "kernel_details.csv",
            kernel_details_header(self.gen, self.level, cfg.schedule),
            crlf=True,
        )
        self._operators = CsvFile(
            self.text_out / "operator_details.csv", OPERATOR_DETAILS_HEADER, crlf=False
        )
        # msprof's every-task list: current torch_npu exports it (task_time.csv), at any level.
        self._task_time = None
        if self.gen.name == "current":
            self._task_time = CsvFile(self.text_out / "task_time.csv", TASK_TIME_HEADER, crlf=True)
        self.api_stat = ApiStatistic()
        self.op_stat = OpStatistic()
        self._conn = 900
        self._corr = 8200
        self._python_ids = 0
        self._task_ids: dict[int, int] = {}
        self._stream_end: dict[int, int] = {}  # for kernel_details Wait Time
        # (start, stream, kernel_details row, what writes the Db's record of it given its wait)
        self._chunk_kernels: list[tuple[int, int, list[object], Callable[[int], None] | None]] = []
        self._compute: list[tuple[int, int]] = []
        self._comm: list[tuple[int, int]] = []
        self._last_device_end: int | None = None
        # what earlier chunks wrote of the overlap analysis: a kernel of one chunk can run into
        # the next's time, and torch_npu's Overlap Analysis never counts an instant twice
        self._written: list[list[tuple[int, int]]] = [[], [], []]  # computing, comm, not overlapped
        # Without a schedule there is one unnamed step covering the whole window.
        self.steps: list[StepTotals] = (
            [] if cfg.schedule else [StepTotals("", cfg.start_ns, cfg.start_ns)]
        )
        self._step_starts: list[int] = [] if cfg.schedule else [0]
        self._open_step: tuple[int, int] | None = None
        self._collectives: dict[str, list[CollectiveRecord]] = {}
        self._hccl_index = 0
        self.last_ts = cfg.start_ns
        self._freq: list[tuple[int, int]] = []  # AI Core Freq changes (ts, MHz)
        # profile_memory=True: the allocators' records and the tensors' (memory_record.csv,
        # operator_memory.csv), from the device memory model a scenario drives
        self._memory: CachingAllocator | None = None
        self._memory_records: list[Record] = []
        self._operator_memory: list[OperatorMemory] = []

    # ---- ids ------------------------------------------------------------------
    def next_conn(self) -> int:
        self._conn += 1
        return self._conn

    def next_task_id(self, stream: int) -> int:
        tid = self._task_ids.get(stream, 10 + stream * 7)
        self._task_ids[stream] = tid + 1
        return tid

    def flow_id(self, conn: int, context: bool) -> str:
        """HostToDevice id: plain for memcpy/event APIs, ``(conn<<32)+ctx`` for launches (G1/G2)."""
        if not context:
            return str(conn)
        if self.gen.flow_id_with_context:
            return str((conn << 32) + 4294967295)
        return str(conn << 32)

    def _touch(self, start: int, end: int) -> None:
        if end > self.last_ts:
            self.last_ts = end

    # ---- steps ----------------------------------------------------------------
    def begin_step(self, number: int, start: int) -> None:
        if not self.cfg.schedule:
            raise ValueError("steps need a profiler schedule (RankConfig.schedule=True)")
        self._open_step = (number, start)
        self.steps.append(StepTotals(str(number), start, start))
        self._step_starts.append(start)

    def end_step(self, end: int) -> None:
        assert self._open_step is not None, "end_step without begin_step"
        number, start = self._open_step
        self.flush()
        self.steps[-1].end = end
        self._profiler_step(number, start, end)

    def step_window(self, number: int, start: int, end: int) -> None:
        """Register a whole step at once (fixtures); windows must be added in time order."""
        self.begin_step(number, start)
        self.steps[-1].end = end
        self._profiler_step(number, start, end)

    def _profiler_step(self, number: int, start: int, end: int) -> None:
        self.tv.cpu_op(self.main_tid, f"ProfilerStep#{number}", start, end - start)
        if self.db:
            self.db.python_op(self.main_tid, f"ProfilerStep#{number}", start, end - start)
            self.db.step(number, start, end)
        self._open_step = None
        self._touch(start, end)

    def _step_of(self, ts: int) -> StepTotals | None:
        if not self.steps:
            return None
        i = bisect.bisect_right(self._step_starts, ts) - 1
        return self.steps[i] if i >= 0 else None

    # ---- framework ------------------------------------------------------------
    def cpu_op(
        self,
        name: str,
        start: int,
        dur: int,
        *,
        tid: int | None = None,
        device_ns: int = 0,
        aicore_ns: int = 0,
        self_ns: int | None = None,
        shapes: str = "",
    ) -> None:
        """A torch op (``cpu_op``) plus its operator_details row."""
        tid = self.main_tid if tid is None else tid
        self.tv.cpu_op(tid, name, start, dur)
        if self.db:
            self.db.python_op(tid, name, start, dur)
        host_self = dur if self_ns is None else self_ns
        own_dev = device_ns if self_ns is None else 0
        own_ai = aicore_ns if self_ns is None else 0
        times = (host_self, dur, own_dev, device_ns, own_ai, aicore_ns)
        self._operators.row([name, shapes, "", *(ns / 1000 for ns in times)])
        self._touch(start, start + dur)

    def python_function(
        self, name: str, start: int, dur: int, *, tid: int | None = None, parent_id: int = 0
    ) -> int:
        """A Python tracer event (``file.py(line): function``); returns its Python id, the
        parent id of the calls inside it."""
        tid = self.main_tid if tid is None else tid
        self._python_ids += 1
        self.tv.python_function(tid, name, start, dur, self._python_ids, parent_id)
        if self.db:
            self.db.python_function(tid, name, start, dur)
        self._touch(start, start + dur)
        return self._python_ids

    def gc(self, start: int, dur: int) -> None:
        """A garbage collection on the host (trace only: the Db export has no table for it)."""
        self.tv.gc(start, dur)
        self._touch(start, start + dur)

    def enqueue(self, op: str, start: int, dur: int, deq_start: int, deq_dur: int) -> None:
        """torch_npu task-queue hand-over: Enqueue on the caller, Dequeue@op on the consumer thread."""
        self._corr += 1
        self.tv.enqueue(self.main_tid, self._corr, start, dur)
        self.tv.dequeue(self.dequeue_tid, self._corr, op, deq_start, deq_dur)
        if self.db:
            self.db.task_queue(
                op,
                self._corr,
                (self.main_tid, start, dur),
                (self.dequeue_tid, deq_start, deq_dur),
            )

    def torch_to_npu(
        self,
        op_start: int,
        stream: int,
        task_start: int,
        *,
        tid: int | None = None,
        collective: bool = False,
    ) -> None:
        """async_npu flow from a torch op to its kernel (or, ``collective``, to the HCCL group op on tid 0)."""
        dst_pid, dst_tid = (self.comm_pid, 0) if collective else (self.hw_pid, stream)
        tid = self.main_tid if tid is None else tid
        self.tv.torch_to_npu(tid, op_start, dst_pid, dst_tid, task_start)
        if self.db:
            self.db.torch_to_npu(tid, op_start, (dst_pid, dst_tid, task_start))

    # ---- CANN -------------------------------------------------------------------
    def api(
        self,
        layer: str,
        api: str,
        start: int,
        dur: int,
        *,
        tid: int | None = None,
        mode: str = "ACL_RTS",
        item_id: str = "0",
    ) -> int:
        """A CANN host API event (``AscendCL@…``, ``Runtime@…``, ``Node@…``, HCCL layer); returns its connection id.

        Not recorded at Level0 (torch_npu prunes the CANN layer) and Runtime is Level2-only.
        """
        conn = self.next_conn()
        if self.level == 0 or (layer == "Runtime@" and self.level < 2):
            return conn
        tid = self.main_tid if tid is None else tid
        lvl = _LAYER_LEVEL.get(layer, self.gen.comm_level)  # the HCCL layer's is the generation's
        api_id = api if layer == "AscendCL@" else "0"
        self.tv.cann_api(tid, layer, api, start, dur, mode, lvl, api_id, item_id, conn)
        if self.db:
            self.db.cann_api(tid, lvl, api, start, dur, conn)
        self.api_stat.add(lvl, api, dur)
        self._touch(start, start + dur)
        return conn

    def h2d(
        self,
        conn: int,
        context: bool,
        cann_tid: int,
        cann_ts: int,
        dst_pid: int,
        dst_tid: int,
        dst_ts: int,
    ) -> None:
        if self.level == 0:
            return
        self.tv.h2d_flow(self.flow_id(conn, context), cann_tid, cann_ts, dst_pid, dst_tid, dst_ts)
        if self.db:
            self.db.host_to_device(conn)

    # ---- device ---------------------------------------------------------------
    def task(
        self,
        stream: int,
        name: str,
        task_type: str,
        start: int,
        dur: int,
        *,
        conn: int | None = None,
        extra: dict | None = None,
        model_id: int = INVALID_MODEL,
        subtask: int = NO_ID,
    ) -> int:
        """A device task without op info (memcpy, waits, records): trace only, no kernel_details row."""
        conn = self.next_conn() if conn is None else conn
        extra_s = "".join(
            f", {js(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in (extra or {}).items()
        )
        task = DeviceTask(stream, start, dur, self.next_task_id(stream), conn, model_id, subtask)
        self._device_task(task, name, shown=(name, task_type, extra_s))
        self._device_seen(start, start + dur)
        return conn

    def _device_task(
        self,
        task: DeviceTask,
        runtime_type: str,
        *,
        shown: tuple[str, str, str] | None = None,
        depth: int = 0,
    ) -> int | None:
        """A device task: in the trace when ``shown`` (its name, hardware queue type and extra
        args; the tasks that envelop others msprof alone records), task_time.csv's row (current
        generation) and the Db's TASK (its runtime type); returns the Db's globalTaskId."""
        kernel = None
        if shown is not None:
            name, task_type, extra = shown
            self.tv.hw_task(task, name, task_type, extra)
            kernel = name if name != runtime_type else None  # runtime tasks: named by their type
        if self._task_time is not None:
            ids = [self.cfg.dev, kernel or "N/A", runtime_type, task.stream, task.task_id]
            times = [task.dur / 1000, csv_ts(task.start), csv_ts(task.start + task.dur)]
            self._task_time.row(ids + times)
        return self.db.task(task, runtime_type, depth) if self.db else None

    def _device_seen(self, start: int, end: int) -> None:
        step = self._step_of(start)
        if step is not None and (step.first_device is None or start < step.first_device):
            step.first_device = start
        self._touch(start, end)

    def kernel(
        self,
        stream: int,
        name: str,
        op_type: str,
        core: str,
        start: int,
        dur: int,
        *,
        conn: int | None = None,
        block_dim: int = 24,
        model_id: int = INVALID_MODEL,
        in_shapes: str = "1,4096",
        in_types: str = "DT_BF16",
        out_shapes: str = "1,4096",
        out_types: str = "DT_BF16",
        formats: str = "ND",
    ) -> int:
        """A kernel: HW slice with op info, kernel_details row, op_statistic entry, Computing slice."""
        conn = self.next_conn() if conn is None else conn
        task_id = self.next_task_id(stream)
        mix = core.startswith("MIX")
        subtask = 0 if mix else NO_ID
        task = DeviceTask(stream, start, dur, task_id, conn, model_id, subtask)
        shown = (name, CORE_TASK_TYPE.get(core, core), "")
        db_task = self._device_task(task, KERNEL_TASK_TYPE[core], shown=shown, depth=int(mix))
        if mix:
            # msprof alone records a MIX kernel's parent task around its subtask (the trace
            # draws none), undescribed, with the launch's runtime type (real G2 export:
            # KERNEL_AICORE, 1-2 µs each side).
            self._device_task(task.envelope(), "KERNEL_AICORE")
        self._device_seen(start, start + dur)
        self.op_stat.add(op_type, core, dur)
        self._compute.append((start, start + dur))
        if self.level == 0:
            row = _level0_row(name, "N/A", start, dur)
        else:
            row = [model_id, task_id, stream, name, op_type]
            if self.gen.has_op_state:
                row.append("dynamic")
            row += [core, csv_ts(start), dur / 1000, None, block_dim, 0]
            if self.gen.has_op_state:
                row.append("NO")
            row += [
                f'"{in_shapes}"',
                in_types,
                # an absent optional input has no dims and the NULL format (msprof)
                ";".join(formats if part else "NULL" for part in in_shapes.split(";")),
                f'"{out_shapes}"',
                out_types,
                formats,
                subtask if mix else "N/A",  # Context ID: FFTS+ (MIX) only
            ]
            row += kernel_row_tail(self.gen, core, dur)
        db_row = None
        if db_task is not None:
            db_row = partial(self._db_compute_info, db_task, row)
        self._chunk_kernels.append((start, stream, row, db_row))
        return conn

    def collective(
        self,
        op: str,
        start: int,
        dur: int,
        *,
        host_tid: int | None = None,
        host_start: int | None = None,
        stream: int = 4,
        count: int = 4_097_000,
        wait_ns: int = 0,
        size: int = 2_064_384,
        host_dur: int = 90_000,
        slow_peers: Mapping[int, float] | None = None,
    ) -> str:
        """An HCCL collective launched from the host and executed on ``stream``.

        Emits the HCCL-layer launch (``Hccl@Launch_Ffts``/``Communication@…``) with its HostToDevice flow, the
        big op on the communication process, its plane tasks and HW tasks (Level1+), a kernel_details row with
        the collective Accelerator Core, a Communication Overlap slice and a communication.json record.
        ``slow_peers``: peer -> how many times longer its plane's transfer takes (a slow link).
        """
        self._hccl_index += 1
        name = f"hcom_{op}__{586 + self.cfg.rank}_{self._hccl_index}_1"
        host_tid = self.dequeue_tid if host_tid is None else host_tid
        host_start = start - 40_000 if host_start is None else host_start
        conn = self.api(
            self.gen.comm_prefix,
            "Launch_Ffts",
            host_start,
            host_dur,
            tid=host_tid,
            mode="master",
            item_id="Launch_Ffts",
        )
        self.h2d(conn, True, host_tid, host_start, self.comm_pid, 0, start)
        self.tv.comm_op(name, start, dur, conn, count)
        db_op = None
        if self.db:
            db_op = self.db.comm_op(
                name,
                start,
                dur,
                conn=conn,
                group=self.cfg.group_hash,
                count=count,
                op_type=f"hcom_{op}_",
            )
        self._comm.append((start, start + dur))
        self._device_seen(start, start + dur)
        transit = max(dur - wait_ns, 1000) // 2
        if self.level > 0:
            rank = self.cfg.rank
            peers = [p for p in self.cfg.group if p != rank] or [1]
            factor = {p: (slow_peers or {}).get(p, 1.0) for p in peers}
            share = transit / sum(factor.values())  # one nominal link's part of the transit
            t = start
            task_id = self.next_task_id(stream)
            for ctx, peer in enumerate(peers):
                # each plane first waits for its peer's notify (the first one for the late
                # peer), then moves its data: (duration, context, size, notify id) of each
                sized = (
                    (wait_ns if ctx == 0 else 20, ctx * 2 + 1, 0, 60 + ctx * 8),
                    (int(share * factor[peer]), ctx * 2, size, None),
                )
                for (kind, hw, transport, link, est, bw), (step_ns, context, moved, notify) in zip(
                    _PLANE_STEPS, sized, strict=True
                ):
                    part = CommStep(
                        ctx % 8, kind, rank, peer, moved, transport, link, notify, est, bw
                    )
                    sent = DeviceTask(stream, t, step_ns, task_id, conn, INVALID_MODEL, context)
                    self.tv.comm_task(sent, part)
                    task = self._device_task(sent, hw, shown=(hw, hw, ""), depth=1)
                    if self.db is not None and task is not None:
                        self.db.comm_task(task, name, part, self.cfg.group_hash)
                    t += step_ns
            # msprof alone records the op itself as one more task over its steps on the
            # stream (the trace draws it on the communication process), undescribed, typed
            # AI_CORE (real G2 export), with the op's connection.
            whole = DeviceTask(stream, start, dur, task_id, conn, INVALID_MODEL, NO_ID)
            self._device_task(whole.envelope(), "AI_CORE")
        if self.level == 0:
            row = _level0_row(name, self.gen.comm_core, start, dur)
        else:
            row = [INVALID_MODEL, "N/A", "N/A", name, f"hcom_{op}_"]
            if self.gen.has_op_state:
                row.append("N/A")
            row += [self.gen.comm_core, csv_ts(start), dur / 1000, None, 0, "N/A"]
            if self.gen.has_op_state:
                row.append("N/A")
            row += ["N/A"] * 7 + ["N/A"] * len(kernel_row_tail(self.gen, "HCCL", dur))
        self._chunk_kernels.append((start, -1, row, db_op))
        step = self._step_of(start)
        key = f"step{step.step}" if step is not None else "step"
        self._collectives.setdefault(key, []).append(
            CollectiveRecord(
                name,
                start,
                dur,
                transit,
                wait_ns,
                wait_ns,
                size,
                {p: f for p, f in (slow_peers or {}).items() if f != 1.0},
            )  # fmt: skip
        )
        return name

    def ai_core_freq(self, ts: int, mhz: int) -> None:
        """The AI Core frequency changes to ``mhz`` at ``ts`` (a sample of the counter)."""
        self._freq.append((ts, mhz))
        self._touch(ts, ts)

    # ---- device memory (profile_memory=True) -------------------------------------
    def memory_model(self, model: CachingAllocator) -> None:
        """Record the device memory ``model`` drives: the profile collects memory from now on
        (its APP samples and npu_module_mem.csv follow the model)."""
        self._memory = model

    def memory_record(self, record: Record) -> None:
        """An allocator's totals after an event (a memory_record.csv row)."""
        self._memory_records.append(record)
        self._touch(record.ts, record.ts)

    def operator_memory(self, row: OperatorMemory) -> None:
        """A tensor's allocation and release (an operator_memory.csv row)."""
        self._operator_memory.append(row)

    @property
    def _profile_memory(self) -> bool:
        return self._memory is not None or bool(self._memory_records)

    def _memory_samples(self, end: int) -> list[Record]:
        """The process's device memory (APP): the records given, and what the model held every
        20 ms as msprof samples it; in the trace as `NPU MEM` counters (KB) with the whole
        device's (NPU_MEM's ``app`` and ``device`` rows in a Db)."""
        app = [r for r in self._memory_records if r.component == "APP"]
        if self._memory is not None:
            for ts in range(self.cfg.start_ns, end + 1, APP_PERIOD_NS):
                used = sum(self._memory.held_at(ts))
                app.append(Record("APP", ts, Totals(None, used, None), None))
        app.sort(key=lambda r: r.ts)
        for r in app:
            used = r.totals.reserved
            # msprof reads the device's a little after the process's
            for who, ts, total in (
                ("APP", r.ts, used),
                ("Device", r.ts + DEVICE_LAG_NS, used + OTHER_PROCESSES),
            ):
                for series, value in (("DDR", 0), ("HBM", total), ("Memory", total)):
                    self.tv.counter("NPU MEM", f"{who}/{series}", ts, f'"KB": {value / 1024!r}')
                if self.db:
                    self.db.npu_mem(who.lower(), ts, total)
        return app

    def _write_memory(self, text: Path, app: list[Record]) -> None:
        """memory_record.csv, operator_memory.csv and their Db tables."""
        if not self._profile_memory:
            return
        if self._memory is not None:
            self._memory.close()
        records = sorted(
            (r for r in self._memory_records if r.component != "APP"), key=lambda r: r.ts
        )
        write_memory_record(text / "memory_record.csv", self.cfg.dev, app, records)
        write_operator_memory(text / "operator_memory.csv", self.cfg.dev, self._operator_memory)
        if self.db:
            for r in records:
                self.db.memory_record(r)
            for op in self._operator_memory:
                self.db.op_memory(op)

    # ---- chunk flush ------------------------------------------------------------
    def flush(self) -> None:
        """Close the current chunk: overlap slices, kernel_details rows, time-sorted msprof events."""
        self._flush_overlap()
        self._chunk_kernels.sort(key=lambda r: r[0])
        with_step = self.cfg.schedule
        dur_i = 4 if self.level == 0 else (8 if self.gen.has_op_state else 7)
        for start, stream, row, db_row in self._chunk_kernels:
            end = start + round(row[dur_i] * 1000)
            prev = self._stream_end.get(stream)
            wait_ns = max(start - prev, 0) if prev is not None else 0
            row[dur_i + 1] = wait_ns / 1000 if prev is not None else 0
            if db_row is not None:
                db_row(wait_ns)
            self._stream_end[stream] = end if prev is None else max(end, prev)
            lead: list[object] = []
            if with_step:
                step = self._step_of(start)
                lead.append(step.step if step is not None else "")
            if self.gen.device_id_column:
                lead.append(self.cfg.dev)
            self._kernels.row(lead + row)
        self._chunk_kernels.clear()
        self.tv.flush_chunk()
        if self.db:
            self.db.flush()

    def _db_compute_info(self, task: int, row: list[object], wait_ns: int) -> None:
        """COMPUTE_TASK_INFO from the kernel's kernel_details.csv row (one truth for both)."""
        assert self.db is not None
        if self.level == 0:  # [name, N/A, N/A, start, dur, wait, block dim]: no op info
            block_dim = int(row[6])  # type: ignore[call-overload]
            self.db.compute_info(task, name=str(row[0]), block_dim=block_dim, wait_ns=wait_ns)
            return
        i = 6 if self.gen.has_op_state else 5  # the Accelerator Core column
        op_state = row[5] if self.gen.has_op_state else None
        hf32 = row[i + 6] if self.gen.has_op_state else None
        shapes_at = i + 6 + (1 if self.gen.has_op_state else 0)
        shapes = [str(v) for v in row[shapes_at : shapes_at + 6]]
        metrics = PIPE_UTILIZATION_COLUMNS if self.gen.has_op_state else G1_METRIC_COLUMNS
        self.db.compute_info(
            task,
            name=str(row[3]),
            op_type=str(row[4]),
            core=str(row[i]),
            block_dim=int(row[i + 4]),  # type: ignore[call-overload]
            mix_block_dim=int(row[i + 5]),  # type: ignore[call-overload]
            shapes=shapes,
            wait_ns=wait_ns,
            op_state=str(op_state) if op_state is not None else None,
            hf32_eligible=str(hf32) if hf32 is not None else None,
            pmu=zip(metrics, row[shapes_at + 7 :], strict=True),
        )

    def _flush_overlap(self) -> None:
        if not self._compute and not self._comm:
            return
        compute = _merge(self._compute)
        comm = _merge(self._comm)
        busy = _merge(self._compute + self._comm)
        # not overlapped: communication that no compute covers, earlier chunks' compute included
        exposed = _subtract(comm, _merge(compute + self._written[0]))
        attrs = ("computing", "communication", "not_overlapped")
        for kind, intervals in enumerate((compute, comm, exposed)):
            fresh = _subtract(intervals, self._written[kind])
            for s, e in fresh:
                self._overlap(kind, s, e - s, attrs[kind])
            # only the latest intervals can meet the next chunk's
            self._written[kind] = _merge(self._written[kind] + fresh)[-4:]
        prev = self._last_device_end
        for s, e in busy:
            if prev is not None and s > prev and self._step_of(prev) is self._step_of(s):
                self._overlap(3, prev, s - prev, "free")
            prev = e if prev is None else max(prev, e)
        self._last_device_end = prev
        self._compute.clear()
        self._comm.clear()

    def _overlap(self, kind: int, start: int, dur: int, attr: str) -> None:
        self.tv.overlap(kind, start, dur)
        if self.db:
            self.db.overlap(kind, start, dur)
        self._acc(start, attr, dur)

    def _acc(self, ts: int, attr: str, ns: int) -> None:
        step = self._step_of(ts)
        if step is None:
            return
        setattr(step, attr, getattr(step, attr) + ns)

    # ---- close ------------------------------------------------------------------
    def close(self) -> Path:
        """Write the remaining files and return the rank directory."""
        self.flush()
        cfg = self.cfg
        end = self.last_ts
        # msprof samples the frequency when it changes: nominal at the start, each change, and
        # the value that holds at the end (at whole µs).
        last = sorted(self._freq)[-1][1] if self._freq else NOMINAL_MHZ
        for ts, mhz in [(cfg.start_ns, NOMINAL_MHZ), *sorted(self._freq)]:
            self.tv.counter("AI Core Freq", "AI Core Freq", ts, f'"MHz": {mhz}')
            if self.db:
                self.db.ai_core_freq(ts, mhz)
        self.tv.counter("AI Core Freq", "AI Core Freq", end, f'"MHz": {last}', whole_us=True)
        if self.db:
            self.db.ai_core_freq(end // 1000 * 1000, last)
        app_memory = self._memory_samples(end)
        self.tv.flush_chunk()
        text = self.text_out
        self.tv.write(text / "trace_view.json")
        self.tv.close()
        self._kernels.close()
        self._operators.close()
        if self._task_time is not None:
            self._task_time.close()
        if not cfg.schedule:
            self.steps[0].end = end
        step_rows = step_trace_rows(self.gen, cfg.dev, self.steps)
        write_step_trace(text / "step_trace_time.csv", self.gen, step_rows)
        self._write_memory(text, app_memory)
        levels = None if self._memory is None else self._memory.held_at
        module_mem = module_mem_samples(cfg.start_ns, end, levels)
        write_module_mem(text / "npu_module_mem.csv", self.gen, cfg.dev, module_mem)
        communication = None
        if self.level > 0:
            self.api_stat.write(text / "api_statistic.csv", self.gen)
            self.op_stat.write(text / "op_statistic.csv", self.gen, cfg.dev)
            if self._collectives:
                communication = communication_documents(
                    self._collectives, cfg.rank, cfg.group, cfg.group_hash
                )
                write_communication(text, communication)
        metadata = self._write_info(end)
        if self.db:
            for component, ts, reserved_mb in module_mem:
                self.db.module_memory(component, ts, reserved_mb)
            self.db.close(
                start_ns=cfg.start_ns,
                end_ns=self.session_end,
                metadata=metadata,
                step_rows=step_rows,
                communication=communication,
            )
        if self.text_out != self.out:
            self._drop_text()
        return self.dir

    @property
    def session_end(self) -> int:
        """When the profiler stopped (``end_info.collectionTimeEnd``): 1 ms after the last event."""
        return self.last_ts + 1_000_000

    def _write_info(self, end: int) -> dict:
        """profiler_info_{rank}.json, and profiler_metadata.json in a Text export; returns the
        metadata (a Db records it in META_DATA)."""
        cfg, gen = self.cfg, self.gen
        level_name = f"Level{cfg.level}"
        experimental: dict = {
            "_profiler_level": level_name,
            "_aic_metrics": "ACL_AICORE_PIPE_UTILIZATION",
            "_l2_cache": False,
            "_msprof_tx": False,
            "_data_simplification": True,
            "record_op_args": False,
            "_export_type": self._export_type(),
            "_op_attr": False,
            "_gc_detect_threshold": None,
        }
        if gen.export_type_list:
            experimental.update(
                {
                    "_host_sys": [],
                    "_mstx": False,
                    "_mstx_domain_include": [],
                    "_mstx_domain_exclude": [],
                    "_sys_io": False,
                    "_sys_interconnection": False,
                }
            )
        common = {
            "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
            "schedule": {
                "wait": 0,
                "active": max(len(self.steps), 1),
                "warmup": 1,
                "repeat": 1,
                "skip_first": 0,
            },
            "record_shapes": False,
            "profile_memory": self._profile_memory,
            "with_stack": False,
            "with_flops": False,
            "with_modules": False,
        }
        if not cfg.schedule:
            common.pop("schedule")
        info: dict = {
            "config": {"common_config": common, "experimental_config": experimental},
            "start_info": {
                "syscnt_enable": True,
                "freq": 100,
                # syscnt at 100 MHz ticks every 10 ns; both clocks run on between sessions
                "start_cnt": 17238197612056 + cfg.rank + cfg.clock_offset_ns // 10,
                "start_monotonic": 172163581670080 + cfg.rank + cfg.clock_offset_ns,
            },
            "end_info": {
                "collectionTimeEnd": self.session_end,
                "MonotonicTimeEnd": 172163581670080 + cfg.clock_offset_ns + (end - cfg.start_ns),
            },
        }
        info.update(gen.versions)
        info["rank_id"] = str(cfg.rank) if gen.rank_id_str else cfg.rank
        (self.dir / f"profiler_info_{cfg.rank}.json").write_text(
            json.dumps(info, indent=4), encoding="utf-8"
        )
        env = dict.fromkeys(_RECORDED_ENV, "") | cfg.env
        meta: dict = {"ENV_VARIABLES": env}
        if len(cfg.group) > 1:
            meta["parallel_group_info"] = {
                cfg.group_hash: {
                    "group_name": "default_group",
                    "group_rank": cfg.group.index(cfg.rank) if cfg.rank in cfg.group else 0,
                    "global_ranks": list(cfg.group),
                }
            }
        meta.update(cfg.metadata)
        if "text" in cfg.export:
            (self.dir / "profiler_metadata.json").write_text(
                json.dumps(meta, indent=4), encoding="utf-8"
            )
        return meta

    def _export_type(self) -> str | list[str]:
        """profiler_info's `_export_type`: a string before G3, unless both formats were asked."""
        if len(self.cfg.export) == 1 and not self.gen.export_type_list:
            return self.cfg.export[0]
        return list(self.cfg.export)


def _level0_row(name: str, core: str, start: int, dur: int) -> list[object]:
    """A Level0 kernel_details.csv row: name, type, core, start, duration, wait (set by
    :meth:`RankWriter.flush`), block dim; no op info."""
    return [name, "N/A", core, csv_ts(start), dur / 1000, None, 0]


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of merged intervals ``a`` not covered by merged intervals ``b``."""
    out: list[tuple[int, int]] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


__all__ = ["EXPORTS", "RankConfig", "RankWriter", "rank_dir_name"]
