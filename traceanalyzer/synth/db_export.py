"""The Db view of a synthetic rank: ``ascend_pytorch_profiler_{rank}.db`` and ``analysis.db``.

torch_npu's ``export_type=Db`` writes a session as SQLite instead of (or beside) the Text
files. :class:`RankWriter` hands each fact it writes to the Text view (trace_view.json, the
CSVs) to a :class:`DbExport` too, so the two formats are two views of one synthetic session.

The schema is the real G2 export's (``/work/shared/real_traces/g2_db_level1``): the same
tables, columns and declared types, names and texts interned in ``STRING_IDS`` (torch_npu's
framework strings from id 2^28, msprof's from 0), codes named by the ``ENUM_*`` tables,
int64 ns times (``PYTORCH_API`` keeps its times as text, as torch_npu writes them), flows as
connection ids (``CONNECTION_IDS``, ``connectionCats``). Later generations differ where their
readers do: G3+ names the HCCL API level ``communication``, COMPUTE_TASK_INFO records
``opState``/``hf32Eligible`` and, in the current generation, ``blockNum``/``mixBlockNum``
instead of ``blockDim``/``mixBlockDim``; G3+ StepTraceTime records the device.

Rows are inserted as the facts arrive (constant memory), into temporary files renamed into
place by :meth:`DbExport.close`: a reader never sees a half-written database.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from traceanalyzer.synth.memory import OperatorMemory, Record
from traceanalyzer.synth.profiles import Generation
from traceanalyzer.synth.trace_view import COMM_ALG, COMM_DTYPE, CommStep, DeviceTask

SCHEMA_VERSION = "1.0.0"
# A copy step's notify id: none, uint64 max in the Text export; SQLite's INTEGER holds int64,
# where msprof records it as int64 max.
_NOTIFY_NONE = (1 << 63) - 1
FRAMEWORK_STRING_BASE = 1 << 28  # torch_npu numbers its strings from here, msprof from 0
MEMORY_STRING_BASE = 1 << 29  # ... and its memory records' (components, operator names) from here

# ENUM_API_TYPE: the CANN API levels (5500 is `communication` from G3 on) and PYTORCH_API kinds.
API_TYPES = {
    "runtime": 5000,
    "hccl": 5500,
    "node": 10000,
    "model": 15000,
    "acl": 20000,
    "op": 50001,
    "queue": 50002,
    "trace": 50003,
    "mstx": 50004,
}


def _enum(*names: str) -> dict[int, str]:
    """An msprof enum: its names coded from 0 in order, then its N/A and invalid codes."""
    return {**dict(enumerate(names)), 65534: "N/A", 65535: "INVALID_TYPE"}


_ENUMS: dict[str, dict[int, str]] = {
    "ENUM_HCCL_RDMA_TYPE": _enum(
        "RDMA_SEND_NOTIFY",
        "RDMA_SEND_PAYLOAD",
        "RDMA_PAYLOAD_PREPARE",
        "RDMA_PAYLOAD_CHECK",
        "RDMA_PAYLOAD_ACK",
        "RDMA_SEND_OP",
    ),
    "ENUM_MSTX_EVENT_TYPE": {0: "marker", 1: "push/pop", 2: "start/end", 3: "marker_ex"},
    "ENUM_HCCL_LINK_TYPE": _enum(
        "ON_CHIP", "HCCS", "PCIE", "ROCE", "SIO", "HCCS_SW", "STANDARD_ROCE", "RESERVED"
    ),
    "ENUM_HCCL_TRANSPORT_TYPE": _enum("SDMA", "RDMA", "LOCAL"),
    "ENUM_HCCL_DATA_TYPE": _enum(
        "INT8",
        "INT16",
        "INT32",
        "FP16",
        "FP32",
        "INT64",
        "UINT64",
        "UINT8",
        "UINT16",
        "UINT32",
        "FP64",
        "BFP16",
        "INT128",
    ),
    "ENUM_MODULE": dict(
        enumerate(
            [
                "SLOG",
                "IDEDD",
                "IDEDH",
                "HCCL",
                "FMK",
                "HIAIENGINE",
                "DVPP",
                "RUNTIME",
                "CCE",
                "HDC",
                "DRV",
                "MDCFUSION",
                "MDCLOCATION",
                "MDCPERCEPTION",
                "MDCFSM",
                "MDCCOMMON",
                "MDCMONITOR",
                "MDCBSWP",
                "MDCDEFAULT",
                "MDCSC",
                "MDCPNC",
                "MLL",
                "DEVMM",
                "KERNEL",
                "LIBMEDIA",
                "CCECPU",
                "ASCENDDK",
                "ROS",
                "HCCP",
                "ROCE",
                "TEFUSION",
                "PROFILING",
                "DP",
                "APP",
                "TS",
                "TSDUMP",
                "AICPU",
                "LP",
                "TDT",
                "FE",
                "MD",
                "MB",
                "ME",
                "IMU",
                "IMP",
                "GE",
                "MDCFUSA",
                "CAMERA",
                "ASCENDCL",
                "TEEOS",
                "ISP",
                "SIS",
                "HSM",
                "DSS",
                "PROCMGR",
                "BBOX",
                "AIVECTOR",
                "TBE",
                "FV",
                "MDCMAP",
                "TUNE",
                "HSS",
                "FFTS",
                "OP",
                "UDF",
                "HICAID",
                "TSYNC",
                "AUDIO",
                "TPRT",
                "ASCENDCKERNEL",
                "ASYS",
                "ATRACE",
                "RTC",
                "SYSMONITOR",
                "AMP",
                "ADETECT",
                "MBUFF",
                "CUSTOM",
            ]
        )
    ),
}
# Each ENUM_* table's code of a name.
_CODES = {table: {name: code for code, name in names.items()} for table, names in _ENUMS.items()}
# The runtime's task type of a kernel by its core (TASK.taskType; COMPUTE_TASK_INFO has the core).
KERNEL_TASK_TYPE = {
    "AI_CORE": "KERNEL_AICORE",
    "AI_VECTOR_CORE": "KERNEL_AIVEC",
    "MIX_AIC": "KERNEL_MIX_AIC",
    "MIX_AIV": "KERNEL_MIX_AIV",
    "AI_CPU": "KERNEL_AICPU",
    "DSA_SQE": "STARS_COMMON",
}

# The real G2 export's tables, columns and declared types (sqlite3 .schema of the file).
_PROFILER_TABLES = """
CREATE TABLE NPU_INFO (id INTEGER,name TEXT);
CREATE TABLE SESSION_TIME_INFO (startTimeNs INTEGER,endTimeNs INTEGER);
CREATE TABLE HOST_INFO (hostUid TEXT,hostName TEXT);
CREATE TABLE ENUM_HCCL_RDMA_TYPE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE ENUM_MSTX_EVENT_TYPE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE ENUM_HCCL_LINK_TYPE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE COMPUTE_TASK_INFO (name INTEGER,globalTaskId INTEGER PRIMARY KEY,{block},taskType INTEGER,opType INTEGER,inputFormats INTEGER,inputDataTypes INTEGER,inputShapes INTEGER,outputFormats INTEGER,outputDataTypes INTEGER,outputShapes INTEGER,attrInfo INTEGER{op_state}, waitNs INTEGER);
CREATE TABLE ENUM_HCCL_TRANSPORT_TYPE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE COMMUNICATION_TASK_INFO (name INTEGER,globalTaskId INTEGER,taskType INTEGER,planeId INTEGER,groupName INTEGER,notifyId INTEGER,rdmaType INTEGER,srcRank INTEGER,dstRank INTEGER,transportType INTEGER,size INTEGER,dataType INTEGER,linkType INTEGER,opId INTEGER);
CREATE INDEX CommunicationTaskIndex ON COMMUNICATION_TASK_INFO (globalTaskId);
CREATE TABLE TASK (startNs INTEGER,endNs INTEGER,deviceId INTEGER,connectionId INTEGER,globalTaskId INTEGER,globalPid INTEGER,taskType INTEGER,contextId INTEGER,streamId INTEGER,taskId INTEGER,modelId INTEGER, depth integer);
CREATE TABLE NPU_MEM (type INTEGER,ddr NUMERIC,hbm NUMERIC,timestampNs INTEGER,deviceId INTEGER);
CREATE INDEX TaskIndex ON TASK (startNs,globalTaskId);
CREATE TABLE COMMUNICATION_OP (opName INTEGER,startNs INTEGER,endNs INTEGER,connectionId INTEGER,groupName INTEGER,opId INTEGER PRIMARY KEY,relay INTEGER,retry INTEGER,dataType INTEGER,algType INTEGER,count NUMERIC,opType INTEGER, waitNs INTEGER);
CREATE TABLE CANN_API (startNs INTEGER,endNs INTEGER,type INTEGER,globalTid INTEGER,connectionId INTEGER PRIMARY KEY,name INTEGER, depth integer);
CREATE TABLE NPU_OP_MEM (operatorName INTEGER,addr INTEGER,type INTEGER,size INTEGER,timestampNs INTEGER,globalTid INTEGER,totalAllocate NUMERIC,totalReserve NUMERIC,component INTEGER,deviceId INTEGER);
CREATE TABLE HBM (deviceId INTEGER,timestampNs INTEGER,bandwidth NUMERIC,hbmId INTEGER,type INTEGER);
CREATE TABLE TASK_PMU_INFO (globalTaskId INTEGER,name INTEGER,value NUMERIC);
CREATE TABLE ENUM_HCCL_DATA_TYPE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE LLC (deviceId INTEGER,llcId INTEGER,timestampNs INTEGER,hitRate REAL,throughput INTEGER,mode INTEGER);
CREATE TABLE ACC_PMU (accId INTEGER,readBwLevel INTEGER,writeBwLevel INTEGER,readOstLevel INTEGER,writeOstLevel INTEGER,timestampNs NUMERIC,deviceId INTEGER);
CREATE TABLE SOC_BANDWIDTH_LEVEL (l2BufferBwLevel INTEGER,mataBwLevel INTEGER,timestampNs NUMERIC,deviceId INTEGER);
CREATE TABLE META_DATA (name TEXT,value TEXT);
CREATE TABLE AICORE_FREQ (deviceId INTEGER,timestampNs NUMERIC,freq INTEGER);
CREATE TABLE ENUM_MODULE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE ENUM_API_TYPE (id INTEGER PRIMARY KEY,name TEXT);
CREATE TABLE NPU_MODULE_MEM (moduleId INTEGER,timestampNs INTEGER,totalReserved NUMERIC,deviceId INTEGER);
CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY,value TEXT);
CREATE TABLE RANK_DEVICE_MAP (rankId INTEGER, deviceId INTEGER);
CREATE TABLE STEP_TIME (id INTEGER, startNs INTEGER, endNs INTEGER);
CREATE TABLE MEMORY_RECORD (component INTEGER, timestamp INTEGER, totalAllocated INTEGER, totalReserved INTEGER, totalActive INTEGER, streamPtr INTEGER, deviceId INTEGER);
CREATE TABLE OP_MEMORY (name INTEGER, size INTEGER, allocationTime INTEGER, releaseTime INTEGER, activeReleaseTime INTEGER, duration INTEGER, activeDuration INTEGER, allocationTotalAllocated INTEGER, allocationTotalReserved INTEGER, allocationTotalActive INTEGER, releaseTotalAllocated INTEGER, releaseTotalReserved INTEGER, releaseTotalActive INTEGER, streamPtr INTEGER, deviceId INTEGER);
CREATE TABLE PYTORCH_API (startNs TEXT, endNs TEXT, globalTid INTEGER, connectionId INTEGER, name INTEGER, sequenceNumber INTEGER, fwdThreadId INTEGER, inputDtypes INTEGER, inputShapes INTEGER, callchainId INTEGER, type INTEGER, depth integer);
CREATE TABLE CONNECTION_IDS (id INTEGER, connectionId INTEGER);
CREATE TABLE PYTORCH_CALLCHAINS (id INTEGER, stack INTEGER, stackDepth INTEGER);
CREATE TABLE OVERLAP_ANALYSIS (id INTEGER PRIMARY KEY AUTOINCREMENT, deviceId integer, startNs integer, endNs integer, type integer);
CREATE TABLE status_info(id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, value TEXT);
CREATE TABLE connectionCats(connectionId INT,cat);
"""
_ANALYSIS_TABLES = """
CREATE TABLE StepTraceTime ({device}step TEXT, computing NUMERIC, communication_not_overlapped NUMERIC, overlapped NUMERIC, communication NUMERIC, free NUMERIC, stage NUMERIC, bubble NUMERIC, communication_not_overlapped_and_exclude_receive NUMERIC, preparing NUMERIC);
CREATE TABLE CommAnalyzerBandwidth (hccl_op_name TEXT, group_name TEXT, transport_type TEXT, transit_size NUMERIC, transit_time NUMERIC, bandwidth NUMERIC, large_packet_ratio NUMERIC, package_size NUMERIC, count NUMERIC, total_duration NUMERIC, step TEXT, type TEXT);
CREATE TABLE CommAnalyzerMatrix (hccl_op_name TEXT, group_name TEXT, src_rank TEXT, dst_rank TEXT, transport_type TEXT, transit_size NUMERIC, transit_time NUMERIC, bandwidth NUMERIC, step TEXT, type TEXT, op_name TEXT);
CREATE TABLE CommAnalyzerTime (hccl_op_name TEXT, group_name TEXT, start_timestamp NUMERIC, elapse_time NUMERIC, transit_time NUMERIC, wait_time NUMERIC, synchronization_time NUMERIC, idle_time NUMERIC, step TEXT, type TEXT);
"""
_PYTORCH_API = f"INSERT INTO PYTORCH_API VALUES ({', '.join('?' * 12)})"
# PMU metric names in TASK_PMU_INFO: kernel_details.csv's columns without `(us)`, the two
# busy times under msprof's own names.
_PMU_NAME = {"aicore_time(us)": "aic_total_time", "aiv_time(us)": "aiv_total_time"}


@lru_cache(maxsize=256)
def pmu_metric(column: str) -> str:
    """The TASK_PMU_INFO name of a kernel_details.csv metric column."""
    return _PMU_NAME.get(column, column.removesuffix("(us)"))


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _create(path: Path, ddl: str) -> sqlite3.Connection:
    tmp = _temp(path)
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp, isolation_level=None)
    # A scratch file until the rename: no journal to keep, nothing to sync until then.
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.executescript(ddl)
    con.execute("BEGIN")  # one transaction for all the rows: SQLite inserts fast inside one
    return con


def _publish(con: sqlite3.Connection, path: Path) -> None:
    con.execute("COMMIT")
    con.close()
    os.replace(_temp(path), path)


class _Rows:
    """Rows buffered per INSERT statement and written a batch at a time: one statement per
    row costs three times as much as the rows themselves."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con
        self._rows: dict[str, list[Sequence[object]]] = {}

    def add(self, sql: str, row: Sequence[object]) -> None:
        self.extend(sql, [row])

    def extend(self, sql: str, rows: list[Sequence[object]]) -> None:
        buffered = self._rows.setdefault(sql, [])
        buffered.extend(rows)
        if len(buffered) >= _BATCH_ROWS:
            self._con.executemany(sql, buffered)
            buffered.clear()

    def flush(self) -> None:
        for sql, rows in self._rows.items():
            self._con.executemany(sql, rows)
            rows.clear()


_BATCH_ROWS = 1 << 14


class _Strings:
    """STRING_IDS: one id per text, numbered from ``base``."""

    def __init__(self, rows: _Rows, base: int) -> None:
        self._rows = rows
        self._ids: dict[str, int] = {}
        self._next = base

    def __call__(self, text: str | None) -> int | None:
        if text is None:
            return None
        sid = self._ids.get(text)
        if sid is None:
            sid = self._ids[text] = self._next
            self._next += 1
            self._rows.add("INSERT INTO STRING_IDS VALUES (?, ?)", (sid, text))
        return sid


class DbExport:
    """One rank's databases, filled fact by fact; :meth:`close` publishes them."""

    def __init__(
        self,
        out: Path,
        gen: Generation,
        *,
        rank: int,
        device: int,
        ospid: int,
        host: str,
        device_pids: tuple[int, int],
    ) -> None:
        """``device_pids``: the trace pids of Ascend Hardware and of the communication process,
        by which :meth:`torch_to_npu` names the task a torch op launched."""
        self.gen, self.rank, self.device, self.ospid, self.host = gen, rank, device, ospid, host
        self._hw_pid, self._comm_pid = device_pids
        self.path = out / f"ascend_pytorch_profiler_{rank}.db"
        self.analysis_path = out / "analysis.db"
        block = f"block{gen.block_word} INTEGER,mixBlock{gen.block_word} INTEGER"
        self._op_state = gen.db_op_state
        op_state = ",opState INTEGER,hf32Eligible INTEGER" if self._op_state else ""
        self.con = _create(self.path, _PROFILER_TABLES.format(block=block, op_state=op_state))
        self.rows = _Rows(self.con)
        self.msprof = _Strings(self.rows, 0)
        self.framework = _Strings(self.rows, FRAMEWORK_STRING_BASE)
        self.memory = _Strings(self.rows, MEMORY_STRING_BASE)
        self._task_ids = 0
        self._comm_ops: dict[str, int] = {}  # op name -> opId
        self._links = 0  # CONNECTION_IDS ids
        # The current chunk (see RankWriter.flush), held until its torch_to_npu flows are
        # known: its PYTORCH_API rows (connectionId set by the flows), each op by (globalTid,
        # startNs), its device tasks' connection ids by (trace pid, tid, start ns), its flows.
        self._python: list[list[object]] = []
        self._ops: dict[tuple[int, int], int] = {}
        self._device_conns: dict[tuple[int, int, int], int] = {}
        self._to_npu: list[tuple[int, int, tuple[int, int, int]]] = []
        self._write_enums()

    # ---- ids -------------------------------------------------------------------
    def _tid(self, tid: int) -> int:
        """globalTid: the OS pid in the high 32 bits, the thread id in the low."""
        return (self.ospid << 32) | tid

    def _cat(self, connection_id: int, cat: str) -> None:
        self.rows.add("INSERT INTO connectionCats VALUES (?, ?)", (connection_id, cat))

    def _write_enums(self) -> None:
        for table, names in _ENUMS.items():
            self.con.executemany(f"INSERT INTO {table} VALUES (?, ?)", names.items())
        api_types = {
            (self.gen.comm_level if name == "hccl" else name): code
            for name, code in API_TYPES.items()
        }
        self.con.executemany(
            "INSERT INTO ENUM_API_TYPE VALUES (?, ?)", ((c, n) for n, c in api_types.items())
        )
        self._api_type = api_types

    # ---- framework -------------------------------------------------------------
    def _pytorch_api(
        self, kind: str, tid: int, name: str, start: int, dur: int, link: int | None = None
    ) -> None:
        """A PYTORCH_API row of ``kind`` in the current chunk: no inputs, no call chain; a torch
        op's sequence number -1 and forward thread 0."""
        row = [str(start), str(start + dur), self._tid(tid), link, self.framework(name)]
        row += [-1, 0] if kind == "op" else [None, None]
        self._python.append(row + [None, None, None, API_TYPES[kind], 0])

    def python_op(self, tid: int, name: str, start: int, dur: int) -> None:
        """A torch op (PYTORCH_API ``op``), as the synthetic ops record it: no inputs, no stack."""
        self._ops.setdefault((self._tid(tid), start), len(self._python))
        self._pytorch_api("op", tid, name, start, dur)

    def python_function(self, tid: int, name: str, start: int, dur: int) -> None:
        """A Python tracer event (PYTORCH_API ``trace``)."""
        self._pytorch_api("trace", tid, name, start, dur)

    def task_queue(
        self,
        op: str,
        correlation: int,
        enqueue: tuple[int, int, int],
        dequeue: tuple[int, int, int],
    ) -> None:
        """torch_npu's task queue hands ``op`` over: an Enqueue and its ``Dequeue@op``
        (PYTORCH_API ``queue``; each (tid, start, dur)), each listing the correlation id in
        CONNECTION_IDS."""
        for name, (tid, start, dur) in (("Enqueue", enqueue), (f"Dequeue@{op}", dequeue)):
            self._pytorch_api("queue", tid, name, start, dur, self._link(correlation))
        self._cat(correlation, "async_task_queue")

    def _link(self, connection_id: int) -> int:
        link = self._links
        self._links += 1
        self.rows.add("INSERT INTO CONNECTION_IDS VALUES (?, ?)", (link, connection_id))
        return link

    def torch_to_npu(self, op_tid: int, op_start: int, task: tuple[int, int, int]) -> None:
        """The op starting at ``op_start`` on ``op_tid`` launched ``task`` (its trace pid, tid
        and start, as the Text export's flow names it), in the current chunk."""
        self._to_npu.append((self._tid(op_tid), op_start, task))

    def flush(self) -> None:
        """Close the current chunk: link its ops to their tasks and write its PYTORCH_API rows."""
        for gtid, op_start, task in self._to_npu:
            connection_id = self._device_conns.get(task)
            op = self._ops.get((gtid, op_start))
            if connection_id is None or op is None:
                raise ValueError(f"torch_to_npu from {gtid}@{op_start} to {task}: not in the chunk")
            row = self._python[op]
            if row[3] is None:
                row[3] = self._link(connection_id)
            else:
                self.rows.add("INSERT INTO CONNECTION_IDS VALUES (?, ?)", (row[3], connection_id))
            self._cat(connection_id, "async_npu")
        for row in self._python:
            self.rows.add(_PYTORCH_API, row)
        self._python.clear()
        self._ops.clear()
        self._device_conns.clear()
        self._to_npu.clear()

    # ---- CANN and device -------------------------------------------------------
    def cann_api(self, tid: int, level: str, api: str, start: int, dur: int, conn: int) -> None:
        self.rows.add(
            "INSERT INTO CANN_API VALUES (?, ?, ?, ?, ?, ?, 0)",
            (start, start + dur, self._api_type[level], self._tid(tid), conn, self.msprof(api)),
        )

    def host_to_device(self, conn: int) -> None:
        """The host API of ``conn`` launched a device task (a HostToDevice flow)."""
        self._cat(conn, "HostToDevice")

    def task(self, task: DeviceTask, task_type: str, depth: int = 0) -> int:
        """A TASK row (``task_type`` is the runtime's: MEMCPY_ASYNC, KERNEL_AIVEC, SDMA, ...);
        returns its globalTaskId."""
        gid = self._task_ids
        self._task_ids += 1
        self._device_conns.setdefault((self._hw_pid, task.stream, task.start), task.conn)
        self.rows.add(
            "INSERT INTO TASK VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                task.start,
                task.start + task.dur,
                self.device,
                task.conn,
                gid,
                self.ospid,
                self.msprof(task_type),
                task.context,
                task.stream,
                task.task_id,
                task.model_id,
                depth,
            ),
        )
        return gid

    def compute_info(
        self,
        task: int,
        *,
        name: str,
        block_dim: int,
        wait_ns: int,
        op_type: str | None = None,
        core: str | None = None,
        mix_block_dim: int | None = None,
        shapes: Sequence[str] | None = None,
        op_state: str | None = None,
        hf32_eligible: str | None = None,
        pmu: Iterable[tuple[str, object]] = (),
    ) -> None:
        """The COMPUTE_TASK_INFO of a kernel task; ``shapes`` as kernel_details.csv lists them
        (input shapes, types, formats, output shapes, types, formats; None at Level0, which
        records no op info); ``pmu`` its metrics
        (kernel_details.csv column, value; `N/A` values are not recorded)."""
        s = self.msprof
        ins, in_types, in_formats, outs, out_types, out_formats = shapes or [None] * 6
        values = [
            s(name),
            task,
            block_dim,
            mix_block_dim,
            s(core),
            s(op_type),
            s(in_formats),
            s(in_types),
            s(ins),
            s(out_formats),
            s(out_types),
            s(outs),
            s("N/A"),
        ]
        if self._op_state:
            values += [s(op_state), s(hf32_eligible)]
        values.append(wait_ns)
        self.rows.add(
            f"INSERT INTO COMPUTE_TASK_INFO VALUES ({', '.join('?' * len(values))})", values
        )
        self.rows.extend(
            "INSERT INTO TASK_PMU_INFO VALUES (?, ?, ?)",
            [(task, s(pmu_metric(k)), v) for k, v in pmu if v != "N/A"],
        )

    def comm_op(
        self,
        name: str,
        start: int,
        dur: int,
        *,
        conn: int,
        group: str,
        count: int,
        op_type: str,
    ) -> Callable[[int], None]:
        """A COMMUNICATION_OP row; returns what writes it, given its `waitNs` (the op's wait
        time as kernel_details.csv lists it, known once the chunk's kernels are ordered)."""
        op_id = self._comm_ops[name] = len(self._comm_ops) + 1
        self._device_conns[(self._comm_pid, 0, start)] = conn
        dtype = _CODES["ENUM_HCCL_DATA_TYPE"][COMM_DTYPE]
        row = (
            self.msprof(name),
            start,
            start + dur,
            conn,
            self.msprof(group),
            op_id,
            dtype,
            self.msprof(COMM_ALG),
            count,
            self.msprof(op_type),
        )

        def write(wait_ns: int) -> None:
            self.rows.add(
                "INSERT INTO COMMUNICATION_OP VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?, ?, ?, ?)",
                (*row, wait_ns),
            )

        return write

    def comm_task(self, task: int, op: str, step: CommStep, group: str) -> None:
        """The COMMUNICATION_TASK_INFO of the TASK ``task``, one step of the op ``op``."""
        self.rows.add(
            "INSERT INTO COMMUNICATION_TASK_INFO VALUES (?, ?, ?, ?, ?, ?, 65535, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.msprof(op),
                task,
                self.msprof(step.kind),
                step.plane,
                self.msprof(group),
                _NOTIFY_NONE if step.notify is None else step.notify,
                step.src,
                step.dst,
                _CODES["ENUM_HCCL_TRANSPORT_TYPE"][step.transport],
                step.size,
                _CODES["ENUM_HCCL_DATA_TYPE"]["INVALID_TYPE"],
                _CODES["ENUM_HCCL_LINK_TYPE"][step.link],
                self._comm_ops[op],
            ),
        )

    def overlap(self, kind: int, start: int, dur: int) -> None:
        """An Overlap Analysis slice: 0 computing, 1 communication, 2 not overlapped, 3 free."""
        self.rows.add(
            "INSERT INTO OVERLAP_ANALYSIS (deviceId, startNs, endNs, type) VALUES (?, ?, ?, ?)",
            (self.device, start, start + dur, kind),
        )

    def ai_core_freq(self, ts: int, mhz: int) -> None:
        self.rows.add("INSERT INTO AICORE_FREQ VALUES (?, ?, ?)", (self.device, ts, mhz))

    def module_memory(self, component: str, ts: int, reserved_mb: float) -> None:
        module = _CODES["ENUM_MODULE"][component]
        reserved = reserved_mb * (1 << 20)  # bytes
        self.rows.add(
            "INSERT INTO NPU_MODULE_MEM VALUES (?, ?, ?, ?)",
            (module, ts, int(reserved) if reserved.is_integer() else reserved, self.device),
        )

    def memory_record(self, record: Record) -> None:
        """A MEMORY_RECORD row (PTA, GE, PTA+GE totals in bytes)."""
        t = record.totals
        self.rows.add(
            "INSERT INTO MEMORY_RECORD VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                self.memory(record.component),
                record.ts,
                t.allocated,
                t.reserved,
                t.active,
                record.stream_ptr,
                self.device,
            ),
        )

    def op_memory(self, op: OperatorMemory) -> None:
        """An OP_MEMORY row: a tensor's allocation and, when freed, its release (bytes, ns)."""
        a, b = op.at_alloc, op.at_release
        released = op.release_ns is not None and b is not None
        after = (b.allocated, b.reserved, b.active) if released and b else (None,) * 3
        dur = op.release_ns - op.alloc_ns if op.release_ns is not None else None
        self.rows.add(
            f"INSERT INTO OP_MEMORY VALUES ({', '.join('?' * 15)})",
            (
                self.memory(op.name),
                op.size,
                op.alloc_ns,
                op.release_ns,
                op.release_ns,
                dur,
                dur,
                a.allocated,
                a.reserved,
                a.active,
                *after,
                op.stream_ptr,
                self.device,
            ),
        )

    def npu_mem(self, kind: str, ts: int, used: int) -> None:
        """An NPU_MEM sample: the process's (``app``) or the whole device's (``device``) memory,
        all of it HBM."""
        self.rows.add(
            "INSERT INTO NPU_MEM VALUES (?, ?, ?, ?, ?)",
            (self.msprof(kind), 0, used, ts, self.device),
        )

    def step(self, number: int, start: int, end: int) -> None:
        self.rows.add("INSERT INTO STEP_TIME VALUES (?, ?, ?)", (number, start, end))

    # ---- close -----------------------------------------------------------------
    def close(
        self,
        *,
        start_ns: int,
        end_ns: int,
        metadata: dict,
        step_rows: Iterable[Sequence[object]],
        communication: tuple[dict, dict] | None,
    ) -> None:
        """Write the session's own records and analysis.db, and publish both files.

        ``metadata`` is profiler_metadata.json's content (torch_npu keeps each key in
        META_DATA, its value as JSON); ``step_rows`` are step_trace_time.csv's rows; and
        ``communication`` communication.json's and communication_matrix.json's documents.
        """
        self.flush()
        self.rows.flush()
        con = self.con
        con.execute("INSERT INTO NPU_INFO VALUES (?, ?)", (self.device, "Ascend910B"))
        con.execute("INSERT INTO SESSION_TIME_INFO VALUES (?, ?)", (start_ns, end_ns))
        con.execute(
            "INSERT INTO HOST_INFO VALUES (?, ?)",
            (str(3538958389648580163 + self.ospid), self.host),
        )
        con.execute("INSERT INTO RANK_DEVICE_MAP VALUES (?, ?)", (self.rank, self.device))
        major, minor, micro = SCHEMA_VERSION.split(".")
        meta = [
            ("SCHEMA_VERSION_MICRO", micro),
            ("SCHEMA_VERSION_MINOR", minor),
            ("SCHEMA_VERSION_MAJOR", major),
            ("SCHEMA_VERSION", SCHEMA_VERSION),
        ]
        meta += [(k, json.dumps(v, ensure_ascii=False)) for k, v in metadata.items()]
        con.executemany("INSERT INTO META_DATA VALUES (?, ?)", meta)
        con.executemany(
            "INSERT INTO status_info (key, value) VALUES (?, ?)",
            [
                ("OVERLAP_ANALYSIS_STATUS", "FINISH"),
                ("WAIT_TIME_STATUS", "FINISH"),
                ("CONNECTION_STATUS", "FINISH"),
            ],
        )
        _publish(con, self.path)
        self._write_analysis(list(step_rows), communication)

    def _write_analysis(
        self, step_rows: list[Sequence[object]], communication: tuple[dict, dict] | None
    ) -> None:
        with_device = self.gen.device_id_column
        con = _create(
            self.analysis_path,
            _ANALYSIS_TABLES.format(device="deviceId INTEGER, " if with_device else ""),
        )
        width = 11 if with_device else 10
        con.executemany(
            f"INSERT INTO StepTraceTime VALUES ({', '.join('?' * width)})",
            (_step_row(row, width) for row in step_rows),
        )
        if communication is not None:
            comm, matrix = communication
            con.executemany(
                "INSERT INTO CommAnalyzerTime VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _times(comm)
            )
            con.executemany(
                "INSERT INTO CommAnalyzerBandwidth VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _bandwidths(comm),
            )
            con.executemany(
                "INSERT INTO CommAnalyzerMatrix VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _matrix(matrix),
            )
        _publish(con, self.analysis_path)


def _step_row(row: Sequence[object], width: int) -> list[object]:
    """A step_trace_time.csv row as a StepTraceTime row: no step number (no schedule) and no
    Preparing column (older releases) are NULL."""
    return [None if v == "" else v for v in row] + [None] * (width - len(row))


def _ops(doc: dict) -> Iterable[tuple[str, str, str, str, dict]]:
    """(step, kind, op name, group, info) of every op of communication.json."""
    for step, kinds in doc.items():
        for kind, ops in kinds.items():
            for key, info in ops.items():
                if key == "Total Op Info":
                    continue
                name, _, group = key.rpartition("@")
                yield step, kind, name, group, info


def _times(comm: dict) -> Iterable[tuple[object, ...]]:
    for step, kind, name, group, info in _ops(comm):
        t = info["Communication Time Info"]
        yield (
            name,
            group,
            t["Start Timestamp(us)"],
            t["Elapse Time(ms)"],
            t["Transit Time(ms)"],
            t["Wait Time(ms)"],
            t["Synchronization Time(ms)"],
            t["Idle Time(ms)"],
            step,
            kind,
        )


def _bandwidths(comm: dict) -> Iterable[tuple[object, ...]]:
    """One row per transport and packet size of its size distribution (one with zeros when
    the distribution is empty), as msprof flattens `Communication Bandwidth Info`."""
    for step, kind, name, group, info in _ops(comm):
        for transport, bw in info["Communication Bandwidth Info"].items():
            head = (
                name,
                group,
                transport,
                bw["Transit Size(MB)"],
                bw["Transit Time(ms)"],
                bw.get("Bandwidth(GB/s)", 0),
                bw.get("Large Packet Ratio", 0),
            )
            sizes = bw["Size Distribution"].items() or [("0", [0, 0])]
            for package, (count, total) in sizes:
                yield (*head, float(package), count, total, step, kind)


def _matrix(matrix: dict) -> Iterable[tuple[object, ...]]:
    for step, kinds in matrix.items():
        for kind, ops in kinds.items():
            for key, links in ops.items():
                op_key, _, group = key.rpartition("@")
                for pair, link in links.items():
                    src, _, dst = pair.partition("-")
                    yield (
                        op_key,
                        group,
                        src,
                        dst,
                        link["Transport Type"],
                        link["Transit Size(MB)"],
                        link["Transit Time(ms)"],
                        link["Bandwidth(GB/s)"],
                        step,
                        kind,
                        link.get("Op Name"),
                    )


__all__ = ["DbExport", "KERNEL_TASK_TYPE", "pmu_metric"]
