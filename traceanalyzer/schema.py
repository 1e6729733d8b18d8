"""The canonical store schema: every table and column, documented where it is defined.

Parsers emit exactly these columns (in this order, with these types); the store writes them;
rules and reports read them. ``docs/schema.md`` is generated from this module
(``python -m traceanalyzer.schema > docs/schema.md``) and a test keeps it current.

Conventions:
- Column names are snake_case.
- Timestamps (``*_ns``) are int64 nanoseconds on the profiler's epoch clock, parsed exactly
  from torch_npu's 3-decimal microsecond strings. Durations (``dur_ns``, ``*_ns``) are int64 ns.
- Aggregate statistics copied from CANN summary files (``api_stats``, ``op_stats``) keep their
  microsecond float values (``*_us``): they are sums/averages, not points on the clock.
- ``rank`` and ``session`` are on every table; they are also the Hive partition keys.
- Unknown or rarely used source fields are kept, as a JSON object string (``args``/``extra``).
- A Db export (``ascend_pytorch_profiler_{rank}.db``, ``analysis.db``) fills the same tables with
  the same names; each table says where its columns come from in both formats.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from traceanalyzer.step_components import COMPONENTS


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    source: str
    columns: tuple[Column, ...]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])

    @property
    def polars_schema(self) -> dict[str, Any]:
        """Column name -> polars dtype, made without pyarrow's table constructors (building an
        empty Arrow table imports pandas: a quarter of a second of every run that reads it)."""
        return dict(self._polars_dtypes)

    @functools.cached_property
    def _polars_dtypes(self) -> dict[str, Any]:
        # once per table: every open of a table asks (comparing Arrow types is not free)
        import polars as pl

        dtypes = {I32: pl.Int32, I64: pl.Int64, F64: pl.Float64, STR: pl.String, BOOL: pl.Boolean}
        return {c.name: dtypes[c.type] for c in self.columns}

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


I32, I64, F64, STR, BOOL = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()

# Where a table's rows are: OUT/<TABLES_DIR>/<table>/rank=<rank>/session=<session>/<PART_FILE>,
# or OUT/<TABLES_DIR>/<table>/group=<lo>-<hi>/<PART_FILE> for a rank group (store.py)
TABLES_DIR = "tables"
PART_FILE = "part-0.parquet"

_KEY = (
    Column("rank", I32, "Global rank of the profiled process (from profiler_info; -1 if unknown)."),
    Column("session", STR, "Session id: one profiler start/stop of one rank (the rank dir name)."),
)


def _table(name: str, doc: str, source: str, *cols: Column) -> Table:
    return Table(name, doc, source, _KEY + cols)


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _table(
            "sessions",
            "One row per rank session, with its metadata and where it came from.",
            "profiler_info*.json, profiler_metadata.json, directory name",
            Column("path", STR, "Absolute path of the rank directory (`*_ascend_pt`)."),
            Column("start_ns", I64, "Session start (first trace event, else directory timestamp)."),
            Column("end_ns", I64, "Session end (last trace event end, else collectionTimeEnd)."),
            Column("profiler_level", STR, "`Level0`, `Level1`, `Level2` or `Level_none`."),
            Column("export_type", STR, "Comma-separated export types (`text`, `db`)."),
            Column(
                "torch_npu_version", STR, "torch_npu version, when the export records it (G3+)."
            ),
            Column("cann_version", STR, "CANN version, when the export records it (G3+)."),
            Column("generation", STR, "Detected format generation: `g1`, `g2`, `g3`, `current`."),
            Column("device_id", I32, "NPU device id when known."),
            Column(
                "hostname",
                STR,
                "Host part of the directory name, when it follows torch_npu's pattern.",
            ),
            Column("os_pid", I64, "OS pid from the directory name or the Python process."),
            Column(
                "metadata",
                STR,
                "profiler_metadata.json as a JSON string (env vars, add_metadata keys).",
            ),
            Column("config", STR, "profiler_info.json `config` as a JSON string."),
            Column(
                "files", STR, "JSON list of the ASCEND_PROFILER_OUTPUT files that were present."
            ),
            Column(
                "source_format",
                STR,
                "The export the tables were read from: `text` or `db` (a `[Text, Db]` rank is "
                "read from its Db).",
            ),
        ),
        _table(
            "threads",
            "Processes and threads named by trace_view.json metadata (M) events.",
            "trace_view.json M events",
            Column(
                "pid", I64, "Raw pid value from the trace (only for joining; never identify by it)."
            ),
            Column("tid", I64, "Raw tid value (for `Ascend Hardware` it is the stream id)."),
            Column(
                "process",
                STR,
                "process_name: `Python`, `CANN`, `Ascend Hardware`, `HCCL`/`Communication`, ...",
            ),
            Column("process_label", STR, "process_labels: `CPU`, `NPU` or `NPU <device>`."),
            Column("process_sort_index", I64, "process_sort_index (version dependent)."),
            Column(
                "thread",
                STR,
                "thread_name, e.g. `Thread 123`, `Stream 2`, `Group 0 Communication`.",
            ),
            Column("thread_sort_index", I64, "thread_sort_index."),
        ),
        _table(
            "slices",
            "Complete (X) and instant (i/I) events from trace_view.json, with well-known args "
            "flattened; stored grouped by process (by its name), in time order within it "
            "(parents first), so that a scan of one process skips the others' row groups.",
            "trace_view.json",
            Column("ph", STR, "Event phase: `X` (complete) or `i`/`I` (instant, dur_ns = 0)."),
            Column("process", STR, "Process name (from M metadata)."),
            Column("thread", STR, "Thread name (from M metadata); `Stream N` on Ascend Hardware."),
            Column("pid", I64, "Raw pid (joining only)."),
            Column("tid", I64, "Raw tid."),
            Column(
                "name", STR, "Event name, e.g. `aten::mm`, `AscendCL@aclrtMemcpy`, `Notify Wait`."
            ),
            Column(
                "cat", STR, "Chrome-trace category (`cpu_op`, `python_function`, `enqueue`, ...)."
            ),
            Column("start_ns", I64, "Start, exact ns."),
            Column("dur_ns", I64, "Duration in ns."),
            Column("end_ns", I64, "start_ns + dur_ns."),
            Column(
                "stream_id",
                I64,
                "Device stream: `Physic Stream Id`/`Stream Id` arg, else `stream id` (HCCL tasks), else the tid on Ascend Hardware.",
            ),
            Column(
                "task_type",
                STR,
                "`Task Type`/`task type` arg (`AI_CORE`, `EVENT_WAIT_SQE`, `Notify_Wait`, ...).",
            ),
            Column("task_id", I64, "`Task Id`/`task id` arg."),
            Column(
                "model_id", I64, "`Model Id`/`model id` arg (null for the 4294967295 sentinel)."
            ),
            Column(
                "connection_id", I64, "`connection_id` arg (links host API calls to device tasks)."
            ),
            Column(
                "api_layer",
                STR,
                "CANN layer prefix of the name: `AscendCL`, `Runtime`, `Node`, `Hccl`, `Communication`, ...",
            ),
            Column(
                "api_name",
                STR,
                "CANN API name without the layer prefix, e.g. `aclrtMemcpy`, `MemCopySync`.",
            ),
            Column(
                "api_level",
                STR,
                "CANN `level` arg: `acl`, `runtime`, `node`, `hccl`/`communication`, `model`.",
            ),
            Column("api_mode", STR, "CANN `Mode` arg (`ACL_RTS`, `HOST_HCCL`, ...)."),
            Column("api_id", STR, "CANN `id` arg."),
            Column(
                "memcpy_direction",
                STR,
                "`memcpy direction`/`operation` arg of memcpy tasks (`host to device`, ...).",
            ),
            Column("memcpy_size", I64, "`data size(Byte)`/`size(B)`/`size(Byte)` arg in bytes."),
            Column(
                "args",
                STR,
                "The event's args object as a JSON string (null when none): the native reader keeps "
                "each number as written, DuckDB's (a trace the scanner refuses) writes it its own "
                "way (`1e-05` as `0.00001`), the same value; the well-known keys are also in their "
                "own columns.",
            ),
        ),
        _table(
            "counters",
            "Counter (C) events: one row per (event, series); stored grouped by process and "
            "counter name, in time order within them, so that a scan of one counter skips the "
            "others' row groups.",
            "trace_view.json C events",
            Column("process", STR, "Process name (`AI Core Freq`, `NPU MEM`, `HBM`, ...)."),
            Column("pid", I64, "Raw pid (joining only)."),
            Column("tid", I64, "Raw tid."),
            Column("name", STR, "Counter name, e.g. `AI Core Freq`, `APP/HBM`."),
            Column("series", STR, "Arg key holding the value, e.g. `MHz`, `KB`, `value`."),
            Column("ts_ns", I64, "Timestamp, exact ns."),
            Column("value", F64, "Counter value."),
        ),
        _table(
            "flows",
            "Flow (s/f) events paired by (cat, id). Unpaired ends keep nulls on the missing side.",
            "trace_view.json s/f events",
            Column("cat", STR, "`async_npu`, `HostToDevice`, `async_task_queue`, `fwdbwd`, ..."),
            Column("name", STR, "Flow name (`torch_to_npu`, `HostToDevice<id>`, ...)."),
            Column("flow_id", STR, "Flow id as written (int or string in the source)."),
            Column("start_ns", I64, "Timestamp of the `s` end."),
            Column("end_ns", I64, "Timestamp of the `f` end."),
            Column("src_process", STR, "Process of the `s` end."),
            Column("src_thread", STR, "Thread of the `s` end."),
            Column("src_pid", I64, "Raw pid of the `s` end."),
            Column("src_tid", I64, "Raw tid of the `s` end."),
            Column("dst_process", STR, "Process of the `f` end."),
            Column("dst_thread", STR, "Thread of the `f` end (`Stream N` for device tasks)."),
            Column("dst_pid", I64, "Raw pid of the `f` end."),
            Column("dst_tid", I64, "Raw tid of the `f` end (the stream id on Ascend Hardware)."),
        ),
        _table(
            "kernels",
            "Device tasks from kernel_details.csv (one row per hardware task with op info).",
            "ASCEND_PROFILER_OUTPUT/kernel_details.csv",
            Column("step", I64, "`Step Id` (null when no schedule)."),
            Column("device_id", I32, "`Device_id` (G3+; null before)."),
            Column(
                "model_id",
                I64,
                "`Model ID` (null for 4294967295: eager, not from a captured graph).",
            ),
            Column("task_id", I64, "`Task ID`."),
            Column("stream_id", I64, "`Stream ID`."),
            Column("name", STR, "`Name`."),
            Column("type", STR, "`Type` (op type)."),
            Column("op_state", STR, "`OP State` (`dynamic`, `static`)."),
            Column(
                "accelerator_core",
                STR,
                "`Accelerator Core` (`AI_CORE`, `MIX_AIV`, `HCCL`, `COMMUNICATION`, ...).",
            ),
            Column("start_ns", I64, "`Start Time(us)`, exact ns."),
            Column("dur_ns", I64, "`Duration(us)` in ns."),
            Column("wait_ns", I64, "`Wait Time(us)` in ns."),
            Column("block_num", I64, "`Block Num` (current) or `Block Dim` (G1-G3)."),
            Column("mix_block_num", I64, "`Mix Block Num` or `Mix Block Dim`."),
            Column("hf32_eligible", STR, "`HF32 Eligible`."),
            Column("input_shapes", STR, "`Input Shapes` without the literal quotes."),
            Column("input_data_types", STR, "`Input Data Types`."),
            Column("input_formats", STR, "`Input Formats`."),
            Column("output_shapes", STR, "`Output Shapes` without the literal quotes."),
            Column("output_data_types", STR, "`Output Data Types`."),
            Column("output_formats", STR, "`Output Formats`."),
            Column("context_id", I64, "`Context ID` (FFTS+ sub-task)."),
            Column("extra", STR, "All other columns (PMU metrics, ...) as a JSON object string."),
        ),
        _table(
            "api_stats",
            "CANN API statistics, copied from msprof (one row per level and API).",
            "ASCEND_PROFILER_OUTPUT/api_statistic.csv",
            Column("device_id", STR, "`Device_id` (`host` in G3+, null before)."),
            Column(
                "level",
                STR,
                "`acl`, `runtime`, `node`, `model`, `hccl` (G2) or `communication` (G3+).",
            ),
            Column("api_name", STR, "`API Name`, e.g. `aclrtMemcpy`, `MemCopySync`."),
            Column("count", I64, "`Count`."),
            Column("total_us", F64, "`Time(us)`: total time of all calls."),
            Column("avg_us", F64, "`Avg(us)`."),
            Column("min_us", F64, "`Min(us)`."),
            Column("max_us", F64, "`Max(us)`."),
            Column("variance", F64, "`Variance` (population variance of the durations)."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "op_stats",
            "Device op statistics by op type and core type, copied from msprof.",
            "ASCEND_PROFILER_OUTPUT/op_statistic.csv",
            Column("device_id", STR, "`Device_id` (G3+)."),
            Column("op_type", STR, "`OP Type`."),
            Column("core_type", STR, "`Core Type`."),
            Column("count", I64, "`Count`."),
            Column("total_us", F64, "`Total Time(us)`."),
            Column("min_us", F64, "`Min Time(us)`."),
            Column("avg_us", F64, "`Avg Time(us)`."),
            Column("max_us", F64, "`Max Time(us)`."),
            Column("ratio_pct", F64, "`Ratio(%)`."),
            Column("extra", STR, "Other columns (e.g. `Model Name`) as JSON."),
        ),
        _table(
            "step_times",
            "Per-step time breakdown from Overlap Analysis (step_trace_time.csv).",
            "ASCEND_PROFILER_OUTPUT/step_trace_time.csv",
            Column("device_id", I32, "`Device_id` (G3+; -1 when the label is plain `NPU`)."),
            Column("step", I64, "`Step` (null when no schedule)."),
            Column("computing_ns", I64, "`Computing`."),
            Column("communication_not_overlapped_ns", I64, "`Communication(Not Overlapped)`."),
            Column("overlapped_ns", I64, "`Overlapped`."),
            Column("communication_ns", I64, "`Communication`."),
            Column("free_ns", I64, "`Free`."),
            Column("stage_ns", I64, "`Stage`."),
            Column("bubble_ns", I64, "`Bubble`."),
            Column(
                "communication_not_overlapped_exclude_receive_ns",
                I64,
                "`Communication(Not Overlapped and Exclude Receive)`.",
            ),
            Column("preparing_ns", I64, "`Preparing` (absent in old exports: null)."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "operators",
            "Torch operators with host and device durations (operator_details.csv).",
            "ASCEND_PROFILER_OUTPUT/operator_details.csv",
            Column("name", STR, "`Name`."),
            Column("input_shapes", STR, "`Input Shapes`."),
            Column("call_stack", STR, "`Call Stack`, frames separated by `\\n`."),
            Column("host_self_ns", I64, "`Host Self Duration(us)`."),
            Column("host_total_ns", I64, "`Host Total Duration(us)`."),
            Column("device_self_ns", I64, "`Device Self Duration(us)`."),
            Column("device_total_ns", I64, "`Device Total Duration(us)`."),
            Column("device_self_aicore_ns", I64, "`Device Self Duration With AICore(us)`."),
            Column("device_total_aicore_ns", I64, "`Device Total Duration With AICore(us)`."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "task_times",
            "Every device task from task_time.csv (Level0+ in current torch_npu).",
            "ASCEND_PROFILER_OUTPUT/task_time.csv",
            Column("device_id", I32, "`Device_id`."),
            Column("kernel_name", STR, "`kernel_name` (`N/A` for runtime tasks becomes null)."),
            Column("kernel_type", STR, "`kernel_type` (`KERNEL_AICORE`, `EVENT_WAIT`, ...)."),
            Column("stream_id", I64, "`stream_id`."),
            Column("task_id", I64, "`task_id`."),
            Column("dur_ns", I64, "`task_time(us)`."),
            Column("start_ns", I64, "`task_start(us)`, exact ns."),
            Column("end_ns", I64, "`task_stop(us)`, exact ns."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "memory_records",
            "Framework (PTA) and GE memory totals over time (memory_record.csv; profile_memory=True).",
            "ASCEND_PROFILER_OUTPUT/memory_record.csv",
            Column("component", STR, "`Component`: `PTA`, `GE`, `APP`, `PTA+GE`."),
            Column("ts_ns", I64, "`Timestamp(us)`, exact ns."),
            Column("total_allocated_mb", F64, "`Total Allocated(MB)`."),
            Column("total_reserved_mb", F64, "`Total Reserved(MB)`."),
            Column("total_active_mb", F64, "`Total Active(MB)`."),
            Column("stream_ptr", I64, "`Stream Ptr`."),
            Column("device_type", STR, "`Device Type`, e.g. `NPU:0`."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "op_memory",
            "Every tensor allocation by operator (operator_memory.csv; profile_memory=True).",
            "ASCEND_PROFILER_OUTPUT/operator_memory.csv",
            Column("name", STR, "`Name`: the allocating operator, e.g. `aten::empty_strided`."),
            Column("size_kb", F64, "`Size(KB)`."),
            Column("alloc_ns", I64, "`Allocation Time(us)`, exact ns."),
            Column(
                "release_ns",
                I64,
                "`Release Time(us)`, exact ns (null: not released in the profile).",
            ),
            Column("active_release_ns", I64, "`Active Release Time(us)`, exact ns."),
            Column("dur_ns", I64, "`Duration(us)`."),
            Column("active_dur_ns", I64, "`Active Duration(us)`."),
            Column("alloc_total_allocated_mb", F64, "`Allocation Total Allocated(MB)`."),
            Column("alloc_total_reserved_mb", F64, "`Allocation Total Reserved(MB)`."),
            Column("alloc_total_active_mb", F64, "`Allocation Total Active(MB)`."),
            Column("release_total_allocated_mb", F64, "`Release Total Allocated(MB)`."),
            Column("release_total_reserved_mb", F64, "`Release Total Reserved(MB)`."),
            Column("release_total_active_mb", F64, "`Release Total Active(MB)`."),
            Column("stream_ptr", I64, "`Stream Ptr`."),
            Column("device_type", STR, "`Device Type`, e.g. `NPU:0`."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "module_memory",
            "Device memory reserved per CANN component over time (npu_module_mem.csv).",
            "ASCEND_PROFILER_OUTPUT/npu_module_mem.csv",
            Column("device_id", I32, "`Device_id` (G3 and later)."),
            Column("component", STR, "`Component`: `SLOG`, `HCCL`, `RUNTIME`, `GE`, ..."),
            Column("ts_ns", I64, "`Timestamp(us)`, exact ns."),
            Column("total_reserved_mb", F64, "`Total Reserved(MB)`."),
            Column("device", STR, "`Device`, e.g. `NPU:0`."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "l2_cache",
            "L2 cache hit and victim rates per task (l2_cache.csv; l2_cache=True).",
            "ASCEND_PROFILER_OUTPUT/l2_cache.csv",
            Column("device_id", I32, "`Device_id` (G3 and later)."),
            Column("stream_id", I64, "`Stream Id`."),
            Column("task_id", I64, "`Task Id`."),
            Column("hit_rate", F64, "`Hit Rate` (null when `N/A`)."),
            Column("victim_rate", F64, "`Victim Rate`."),
            Column("op_name", STR, "`Op Name`."),
            Column("extra", STR, "Columns not listed here, as a JSON object string."),
        ),
        _table(
            "comm_ops",
            "Communication ops with time and bandwidth breakdown (communication.json).",
            "ASCEND_PROFILER_OUTPUT/communication.json",
            Column("step", STR, "Step key as written (`step50`, or `step`)."),
            Column("kind", STR, "`collective` or `p2p`."),
            Column("op_name", STR, "Op name, e.g. `hcom_allReduce__586_0_1`."),
            Column("group", STR, "Communication group hash (after `@`)."),
            Column("start_ns", I64, "`Start Timestamp(us)`."),
            Column("elapse_ns", I64, "`Elapse Time(ms)`."),
            Column("transit_ns", I64, "`Transit Time(ms)`."),
            Column("wait_ns", I64, "`Wait Time(ms)`."),
            Column("synchronization_ns", I64, "`Synchronization Time(ms)`."),
            Column("idle_ns", I64, "`Idle Time(ms)`."),
            Column("wait_ratio", F64, "`Wait Time Ratio`."),
            Column("synchronization_ratio", F64, "`Synchronization Time Ratio`."),
            Column("bandwidth", STR, "`Communication Bandwidth Info` as a JSON object string."),
        ),
        _table(
            "comm_links",
            "Per-link transfer figures (communication_matrix.json).",
            "ASCEND_PROFILER_OUTPUT/communication_matrix.json",
            Column("step", STR, "Step key as written."),
            Column("kind", STR, "`collective` or `p2p`."),
            Column("op_key", STR, "Aggregate key, e.g. `allreduce-top1`, `allreduce-total`."),
            Column("group", STR, "Communication group hash."),
            Column("src_rank", I64, "Source rank of the link."),
            Column("dst_rank", I64, "Destination rank of the link."),
            Column("transport_type", STR, "`HCCS`, `LOCAL`, `RDMA`, `PCIE`, `SIO`."),
            Column("transit_size_mb", F64, "`Transit Size(MB)`."),
            Column("transit_ns", I64, "`Transit Time(ms)`."),
            Column("bandwidth_gbps", F64, "`Bandwidth(GB/s)`."),
            Column("op_name", STR, "`Op Name` (absent on `-total` entries)."),
        ),
    )
}


# Where each column comes from in a Db export (parse/db/). The Text source is each column's
# own doc; this says the same for ascend_pytorch_profiler_{rank}.db ("profiler db") and
# analysis.db. `STRING_IDS` and `ENUM_*` tables turn the ids the Db stores into the text the
# Text export writes. "" under a table is the table's source; a table absent here has no Db
# table (it is filled from the Text file when one is beside the Db).
_SLICE_TABLES = "PYTORCH_API (Python), CANN_API (CANN), TASK (Ascend Hardware), COMMUNICATION_OP and COMMUNICATION_TASK_INFO + TASK (HCCL/Communication), OVERLAP_ANALYSIS"
DB_SOURCES: dict[str, dict[str, str]] = {
    "sessions": {
        "": "profiler_info*.json, the directory, and the profiler db's META_DATA, HOST_INFO, SESSION_TIME_INFO, NPU_INFO",
        "path": "The rank directory.",
        "start_ns": "First slice start (min startNs of the event tables).",
        "end_ns": "Last slice end (max endNs).",
        "profiler_level": "profiler_info.json.",
        "export_type": "profiler_info.json `_export_type`; else the formats present (`text`, `db`).",
        "torch_npu_version": "profiler_info.json.",
        "cann_version": "profiler_info.json.",
        "generation": "From the schema: `communication` in ENUM_API_TYPE (G3+), COMPUTE_TASK_INFO.blockNum (current).",
        "device_id": "TASK.deviceId, else RANK_DEVICE_MAP.deviceId.",
        "hostname": "The directory name, else HOST_INFO.hostName.",
        "os_pid": "The directory name, else PYTORCH_API.globalTid >> 32.",
        "metadata": "META_DATA's keys (torch_npu records profiler_metadata.json's there: ENV_VARIABLES, parallel_group_info, add_metadata keys; JSON decoded), plus `db.`-prefixed META_DATA (ENV_VARIABLES decoded, SCHEMA_VERSION), SESSION_TIME_INFO and NPU_INFO.",
        "config": "profiler_info.json `config`.",
        "files": "The ASCEND_PROFILER_OUTPUT listing.",
        "source_format": "`db`.",
    },
    "threads": {
        "": "Every (pid, tid) of the slices and counters, named as msprof names them in trace_view.json",
        "pid": "The Python process: PYTORCH_API.globalTid >> 32 (the OS pid); others msprof's `(os_pid << 10) | (sort_index << 5) | device`.",
        "tid": "globalTid & 0xffffffff (Python, CANN); TASK.streamId (Ascend Hardware); the group's op thread, then 1 + COMMUNICATION_TASK_INFO.planeId (HCCL); OVERLAP_ANALYSIS.type; 0 (counters).",
        "process": "By source table: `Python`, `CANN`, `Ascend Hardware`, `HCCL` (G2) / `Communication` (G3+), `Overlap Analysis`, and the counter processes.",
        "process_label": "`CPU` for Python and CANN, else `NPU` (`NPU <device>` from G3).",
        "process_sort_index": "msprof's sort index of the process in the session's generation.",
        "thread": "`Thread <tid>`, `Stream <streamId>`, `Group <n> Communication`, `Plane <planeId>`, the Overlap Analysis type names.",
        "thread_sort_index": "The tid (the dequeue thread: the largest Python tid + 1); null for counter and Overlap Analysis threads.",
    },
    "slices": {
        "": _SLICE_TABLES,
        "ph": "`X`.",
        "process": "By source table (see threads).",
        "thread": "See threads.",
        "pid": "See threads.",
        "tid": "See threads.",
        "name": "STRING_IDS of PYTORCH_API.name; `<layer>@` + CANN_API.name; COMPUTE_TASK_INFO.name, else TASK.taskType; COMMUNICATION_OP.opName; COMMUNICATION_TASK_INFO.taskType; the OVERLAP_ANALYSIS.type name.",
        "cat": "ENUM_API_TYPE of PYTORCH_API.type: `op` → `cpu_op`, `queue` → `enqueue`/`dequeue`, `trace` → `python_function`; null elsewhere.",
        "start_ns": "startNs (int64 ns as stored; PYTORCH_API's text digits cast exactly).",
        "dur_ns": "endNs - startNs.",
        "end_ns": "endNs.",
        "stream_id": "TASK.streamId.",
        "task_type": "COMPUTE_TASK_INFO.taskType or TASK.taskType, as the hardware queue type the trace writes (`AI_VECTOR_CORE` → `AI_CORE`, `EVENT_WAIT` → `EVENT_WAIT_SQE`, ...); COMMUNICATION_TASK_INFO.taskType on planes.",
        "task_id": "TASK.taskId.",
        "model_id": "TASK.modelId (null for 4294967295).",
        "connection_id": "CANN_API.connectionId, TASK.connectionId, COMMUNICATION_OP.connectionId.",
        "api_layer": "The trace's prefix of the ENUM_API_TYPE level of CANN_API.type (`acl` → `AscendCL`, `node` → `Node`, `hccl` → `Hccl`, ...).",
        "api_name": "STRING_IDS of CANN_API.name.",
        "api_level": "ENUM_API_TYPE of CANN_API.type.",
        "api_mode": "Not in a Db export (null).",
        "api_id": "STRING_IDS of CANN_API.name at the `acl` level, `0` below it (as the trace's `id`).",
        "memcpy_direction": "Not in a Db export (null).",
        "memcpy_size": "Not in a Db export (null).",
        "args": "The trace's args keys that the row's columns hold (`Sequence number`, `Input Dims`, `Call stack` from PYTORCH_CALLCHAINS, `correlation_id` from CONNECTION_IDS, `Task Type`, `Physic Stream Id`, `src rank`, `transport type`, ...).",
    },
    "counters": {
        "": "AICORE_FREQ, HBM, LLC, NPU_MEM, SOC_BANDWIDTH_LEVEL (Stars Soc Info), ACC_PMU (Acc PMU)",
        "process": "By source table.",
        "pid": "See threads.",
        "tid": "0.",
        "name": "As the trace names the C events: `AI Core Freq`, `HBM <hbmId>/Read`, `LLC <llcId> Read/Hit Rate`, `APP/HBM`, `Mata Bw Level`, `read_bandwidth`, ...",
        "series": "The trace's arg key: `MHz`, `Read(MB/s)`, `Hit Rate(%)`, `KB`, `value` and `acc_id`, ...",
        "ts_ns": "timestampNs.",
        "value": "In the trace's units: bandwidth and throughput B/s / 2^20, memory bytes / 1024, hit rate % / 100.",
    },
    "flows": {
        "": "connectionCats (the categories), CONNECTION_IDS (PYTORCH_API → connection ids) and the connection ids of CANN_API, TASK and COMMUNICATION_OP",
        "cat": "connectionCats.cat; without that table (torch_npu's connection step did not run), what it would hold: an op's connection to a device task is HostToDevice and async_npu, its other connections fwdbwd, a queue event's async_task_queue.",
        "name": "`HostToDevice<id>`, `torch_to_npu`, `enqueue_to_dequeue`, `fwdbwd`.",
        "flow_id": "The connection id (async_task_queue, fwdbwd; HostToDevice from an AscendCL call); a launch below AscendCL (Node, HCCL) carries the context, `(id << 32) + 4294967295` (`id << 32` in the current generation); the task's start ns (torch_to_npu).",
        "start_ns": "Start of the source slice.",
        "end_ns": "Start of the destination slice.",
        "src_process": "See threads.",
        "src_thread": "See threads.",
        "src_pid": "See threads.",
        "src_tid": "See threads.",
        "dst_process": "See threads.",
        "dst_thread": "See threads.",
        "dst_pid": "See threads.",
        "dst_tid": "See threads.",
    },
    "kernels": {
        "": "COMPUTE_TASK_INFO joined to TASK on globalTaskId, TASK_PMU_INFO, STEP_TIME",
        "step": "The last STEP_TIME id started at the task start (a task may run past its host step).",
        "device_id": "TASK.deviceId.",
        "model_id": "TASK.modelId (null for 4294967295).",
        "task_id": "TASK.taskId.",
        "stream_id": "TASK.streamId.",
        "name": "COMPUTE_TASK_INFO.name.",
        "type": "COMPUTE_TASK_INFO.opType.",
        "op_state": "COMPUTE_TASK_INFO.opState when the release writes it.",
        "accelerator_core": "COMPUTE_TASK_INFO.taskType.",
        "start_ns": "TASK.startNs.",
        "dur_ns": "TASK.endNs - TASK.startNs.",
        "wait_ns": "COMPUTE_TASK_INFO.waitNs.",
        "block_num": "COMPUTE_TASK_INFO.blockNum, else blockDim.",
        "mix_block_num": "COMPUTE_TASK_INFO.mixBlockNum, else mixBlockDim.",
        "hf32_eligible": "COMPUTE_TASK_INFO.hf32Eligible when the release writes it.",
        "input_shapes": "COMPUTE_TASK_INFO.inputShapes without the literal quotes.",
        "input_data_types": "COMPUTE_TASK_INFO.inputDataTypes.",
        "input_formats": "COMPUTE_TASK_INFO.inputFormats.",
        "output_shapes": "COMPUTE_TASK_INFO.outputShapes without the literal quotes.",
        "output_data_types": "COMPUTE_TASK_INFO.outputDataTypes.",
        "output_formats": "COMPUTE_TASK_INFO.outputFormats.",
        "context_id": "TASK.contextId (null for 4294967295).",
        "extra": "TASK_PMU_INFO metrics of the task, keyed as kernel_details.csv names them (`aiv_vec_time(us)`, ...).",
    },
    "api_stats": {
        "": "Computed from CANN_API, as msprof computes api_statistic.csv",
        "device_id": "`host` from G3 (null before).",
        "level": "ENUM_API_TYPE of CANN_API.type.",
        "api_name": "STRING_IDS of CANN_API.name.",
        "count": "Calls.",
        "total_us": "Sum of endNs - startNs, in µs.",
        "avg_us": "Mean duration.",
        "min_us": "Shortest call.",
        "max_us": "Longest call.",
        "variance": "Population variance of the durations (µs²).",
        "extra": "Null.",
    },
    "op_stats": {
        "": "Computed from COMPUTE_TASK_INFO + TASK, as msprof computes op_statistic.csv (none at Level0: no op types)",
        "device_id": "The device from G3 (null before).",
        "op_type": "COMPUTE_TASK_INFO.opType.",
        "core_type": "COMPUTE_TASK_INFO.taskType.",
        "count": "Tasks.",
        "total_us": "Sum of the task durations, in µs.",
        "min_us": "Shortest task.",
        "avg_us": "Mean task.",
        "max_us": "Longest task.",
        "ratio_pct": "Share of the compute tasks' total time.",
        "extra": "Null.",
    },
    "step_times": {
        "": "analysis.db StepTraceTime",
        "device_id": "StepTraceTime.deviceId when the release writes it.",
        "step": "step.",
        "computing_ns": "computing (µs → ns).",
        "communication_not_overlapped_ns": "communication_not_overlapped.",
        "overlapped_ns": "overlapped.",
        "communication_ns": "communication.",
        "free_ns": "free.",
        "stage_ns": "stage.",
        "bubble_ns": "bubble.",
        "communication_not_overlapped_exclude_receive_ns": "communication_not_overlapped_and_exclude_receive.",
        "preparing_ns": "preparing.",
        "extra": "Null.",
    },
    "memory_records": {
        "": "MEMORY_RECORD (PTA, GE), NPU_MEM rows of type `app` (APP)",
        "component": "STRING_IDS of MEMORY_RECORD.component; `APP` for NPU_MEM.",
        "ts_ns": "MEMORY_RECORD.timestamp, NPU_MEM.timestampNs.",
        "total_allocated_mb": "totalAllocated bytes / 2^20.",
        "total_reserved_mb": "totalReserved / 2^20; NPU_MEM ddr + hbm for APP.",
        "total_active_mb": "totalActive / 2^20.",
        "stream_ptr": "streamPtr.",
        "device_type": "`NPU:<deviceId>`.",
        "extra": "Null.",
    },
    "op_memory": {
        "": "OP_MEMORY",
        "name": "STRING_IDS of name.",
        "size_kb": "size bytes / 1024.",
        "alloc_ns": "allocationTime.",
        "release_ns": "releaseTime.",
        "active_release_ns": "activeReleaseTime.",
        "dur_ns": "duration.",
        "active_dur_ns": "activeDuration.",
        "alloc_total_allocated_mb": "allocationTotalAllocated / 2^20.",
        "alloc_total_reserved_mb": "allocationTotalReserved / 2^20.",
        "alloc_total_active_mb": "allocationTotalActive / 2^20.",
        "release_total_allocated_mb": "releaseTotalAllocated / 2^20.",
        "release_total_reserved_mb": "releaseTotalReserved / 2^20.",
        "release_total_active_mb": "releaseTotalActive / 2^20.",
        "stream_ptr": "streamPtr.",
        "device_type": "`NPU:<deviceId>`.",
        "extra": "Null.",
    },
    "module_memory": {
        "": "NPU_MODULE_MEM",
        "device_id": "deviceId.",
        "component": "ENUM_MODULE of moduleId.",
        "ts_ns": "timestampNs.",
        "total_reserved_mb": "totalReserved bytes / 2^20.",
        "device": "`NPU:<deviceId>`.",
        "extra": "Null.",
    },
    "comm_ops": {
        "": "analysis.db CommAnalyzerTime, CommAnalyzerBandwidth",
        "step": "step.",
        "kind": "type.",
        "op_name": "hccl_op_name.",
        "group": "group_name.",
        "start_ns": "start_timestamp (a REAL in µs: its shortest decimal, as communication.json prints it, to ns).",
        "elapse_ns": "elapse_time (ms → ns).",
        "transit_ns": "transit_time.",
        "wait_ns": "wait_time.",
        "synchronization_ns": "synchronization_time.",
        "idle_ns": "idle_time.",
        "wait_ratio": "wait / (wait + transit), rounded to 4 places as msprof does.",
        "synchronization_ratio": "synchronization / (synchronization + transit).",
        "bandwidth": "CommAnalyzerBandwidth rows of the op, keyed by transport type as communication.json keys them.",
    },
    "comm_links": {
        "": "analysis.db CommAnalyzerMatrix",
        "step": "step.",
        "kind": "type.",
        "op_key": "hccl_op_name (`allreduce-top1`, ...).",
        "group": "group_name.",
        "src_rank": "src_rank.",
        "dst_rank": "dst_rank.",
        "transport_type": "transport_type.",
        "transit_size_mb": "transit_size.",
        "transit_ns": "transit_time (ms → ns).",
        "bandwidth_gbps": "bandwidth.",
        "op_name": "op_name.",
    },
}


# Tables derived from the ingested ones after ingest (never parsed from files): the steps
# (`traceanalyzer/derived/`, before the rules, which read them) and the overview
# (`traceanalyzer/overview/`, after) write them per rank, and notebooks read them through
# `Store.table` like any other. Ingest neither writes nor checks them.
# what a step's graph replay ran at against its real batch (the `steps` table's, copied into
# summary_steps)
_GRAPH_SIZE_COLUMNS = (
    Column(
        "graph_size",
        I64,
        "The capture size a graph replay ran at: the token dim of the replayed kernels (null "
        "for an eager step, or without kernel_details.csv shapes).",
    ),
    Column(
        "batch",
        I64,
        "The real requests of the batch, from the strongest evidence: the annotation, the eager "
        "attention's shapes, or the sampler's argmax rows (outside the graph, on the real "
        "batch); null when nothing tells (no shapes: collect profiler_level=Level1).",
    ),
    Column(
        "batch_source",
        STR,
        "What told `batch`: `annotation`, `attention` or `sampler` (null with `batch`).",
    ),
    Column(
        "padded_tokens",
        I64,
        "Tokens the replay computed beyond the real ones: `graph_size` minus the batch's "
        "1 + k tokens per request (FULL), minus the eager attention's tokens (piecewise); 0 "
        "for an eager step; null when unknown.",
    ),
)
# the breakdown's components (summary_steps), declared in traceanalyzer.step_components
_COMPONENT_COLUMNS = tuple(Column(c.key, I64, c.doc) for c in COMPONENTS)
COMPONENT_NAMES: tuple[str, ...] = tuple(c.name for c in _COMPONENT_COLUMNS)  # notebooks read it

DERIVED_TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _table(
            "steps",
            "The engine iterations (steps) of each session, with the phase each served and the "
            "evidence for it; derived before the rules, which, like the overview and `diff`, "
            "read their steps from it (docs/serving.md).",
            "derived: slices (ProfilerStep#N, vLLM annotations and scopes, python functions, "
            "graph captures and replays, device tasks), kernels (attention input shapes)",
            Column(
                "step",
                I64,
                "`ProfilerStep#N`'s N, else the iteration's number in its session (from 1); "
                "null for an idle gap.",
            ),
            Column("start_ns", I64, "Window start."),
            Column("end_ns", I64, "Window end: the iteration's forward and its sampling."),
            Column("step_ns", I64, "Wall time of the window."),
            Column(
                "step_source",
                STR,
                "What marks the window: `profiler_step`, `annotation` (vLLM's step annotation), "
                "`scope` (the model runner's scopes), `python_function` (execute_model / "
                "sample_tokens / _dummy_run), `device_activity` (compute bursts), `session` "
                "(nothing: the whole session), `gap` (idle time between two iterations).",
            ),
            Column(
                "phase",
                STR,
                "`prefill`, `decode`, `mixed`, `spec_decode`, `dummy`, `warmup`, `idle` or "
                "`unknown`.",
            ),
            Column(
                "phase_source",
                STR,
                "What told the phase: `annotation` (host markers), `shapes` (attention input "
                "shapes), `kernels` (kernel signatures, graph replays) or `none`.",
            ),
            Column("phase_reason", STR, "The evidence in words, or why the phase is unknown."),
            Column(
                "tokens",
                I64,
                "New tokens in the batch, from the annotation or the eager attention query "
                "(null when unknown: a graph's shapes are its capture size's).",
            ),
            Column("requests", I64, "Requests in the batch (null when unknown)."),
            Column(
                "graph",
                STR,
                "How the forward ran: `full` (one graph replay), `piecewise` (graph pieces with "
                "eager attention), `eager`; null without compute.",
            ),
            *_GRAPH_SIZE_COLUMNS,
        ),
        _table(
            "launches",
            "Each device task with the host call that launched it (launch columns null when no "
            "link is found); derived before the rules, which, like the overview, read their "
            "launches from it.",
            "derived: slices (device tasks, CANN calls, torch ops), flows "
            "(`launch_links.host_launches`)",
            Column("stream", I64, "The task's device stream (the slices' `stream_id`)."),
            Column("start_ns", I64, "Task start."),
            Column("end_ns", I64, "Task end."),
            Column("name", STR, "Task name."),
            Column("task_type", STR, "Task type (`AI_CORE`, `EVENT_WAIT_SQE`, ...)."),
            Column("task_id", I64, "Task id."),
            Column("model_id", I64, "Captured graph's model id (null outside graphs)."),
            Column("connection_id", I64, "The task's `connection_id`."),
            Column("launch_name", STR, "The launching host call, e.g. `Node@launch`."),
            Column(
                "launch_op",
                STR,
                "The AscendCL op around a `Node@launch` (e.g. `AscendCL@aclnnMm`), else the call.",
            ),
            Column("launch_start_ns", I64, "Launching call's start."),
            Column("launch_end_ns", I64, "Launching call's end."),
            Column("launch_thread", STR, "Launching call's thread."),
            Column(
                "link",
                STR,
                "How the task was linked: `graph_replay`, `connection_id`, `HostToDevice`, "
                "`launch_flow` or `async_npu` (null: not linked).",
            ),
        ),
        _table(
            "exchanges",
            "Per step of an MoE rank that ran an expert-parallel (EP) exchange: which one, the "
            "time in it and what of it no compute hid; derived before the rules at the default "
            "patterns (`moe-load-imbalance`'s `mc2_ops`, `alltoall_ops`, `allgather_ops`), "
            "read by the rule and the overview.",
            "derived: slices (device tasks), steps (`derived/exchanges.py`)",
            Column("step", I64, "The step (the `steps` table's)."),
            Column("phase", STR, "The step's phase."),
            Column("tokens", I64, "The step's new tokens (null when unknown)."),
            Column(
                "path",
                STR,
                "`mc2` (MoeDistributeDispatch/Combine), `alltoall` or `allgather`: the most "
                "used when the step ran several.",
            ),
            Column("paths", STR, "Every path the step used, comma-separated."),
            Column("exchanges", I64, "Exchange ops in the step."),
            Column("exchange_ns", I64, "Time in them (overlaps counted once)."),
            Column("exposed_ns", I64, "Of it, the time no compute kernel ran on any stream."),
            Column(
                "fits",
                BOOL,
                "False when the path does not fit the step's size (vllm-ascend takes MC2 up to "
                "a token capacity, all-to-all above it); null when the tokens are unknown.",
            ),
        ),
        _table(
            "moe_layers",
            "Per MoE layer instance of an expert-parallel rank: the stretch of expert kernels "
            "before an EP exchange op that holds a grouped matmul, and when the rank arrived "
            "at the exchange; derived before the rules at the default patterns "
            "(`moe-load-imbalance`'s `expert_kernels`, `expert_core`, `mc2_ops`, "
            "`alltoall_ops`, `allgather_ops`, `token_inputs_dropped`), read by the rule.",
            "derived: slices (device tasks), kernels (grouped matmuls' input shapes) "
            "(`derived/moe_layers.py`)",
            Column("name", STR, "The exchange op after the expert kernels (the exchange back)."),
            Column("path", STR, "Its path: `mc2`, `alltoall` or `allgather`."),
            Column("expert_ns", I64, "Time in the layer's expert kernels."),
            Column(
                "tokens",
                I64,
                "Routed tokens (msprof-analyze ep_load_balance's count) when every grouped "
                "matmul of the layer has input shapes and is not a graph's replay; else null.",
            ),
            Column(
                "arrival_ns",
                I64,
                "When the rank was ready for the exchange: its start, or the last expert "
                "kernel's end if later.",
            ),
            Column("exchange_ns", I64, "From the arrival to the exchange's end."),
            Column("first_ns", I64, "The first expert kernel's start."),
        ),
        _table(
            "moe_dense",
            "Per step of a rank with MoE layers and kernel name: the time of the compute "
            "kernels that are neither expert kernels nor MC2 exchanges, what a rank's device "
            "speed is compared on; derived before the rules at the default patterns, read by "
            "`moe-load-imbalance`.",
            "derived: slices (device tasks), steps (`derived/moe_layers.py`)",
            Column("step", I64, "The step the kernels start in (the `steps` table's)."),
            Column("phase", STR, "The step's phase."),
            Column("name", STR, "Kernel name."),
            Column("dur_ns", I64, "Their time in the step."),
            Column("kernels", I64, "How many ran in the step."),
        ),
        _table(
            "kernel_layers",
            "Each device kernel (and communication op) of the sessions whose iterations run an "
            "attention kernel, with its step, decoder layer and module: the layers cut at the "
            "attention each layer runs once, eager or replayed alike (`derived/layers.py`, "
            "docs/serving.md); joins `kernels` and `slices` on rank, session, stream_id and "
            "start_ns.",
            "derived: slices (device tasks), steps (`derived/layers.py`)",
            Column("stream_id", I64, "The kernel's stream."),
            Column("start_ns", I64, "Kernel start."),
            Column("end_ns", I64, "Kernel end."),
            Column("name", STR, "Kernel name."),
            Column("step", I64, "The step it starts in (the `steps` table's)."),
            Column("phase", STR, "The step's phase."),
            Column(
                "layer",
                I64,
                "The decoder layer, from 0 in each iteration; null outside the repeated block "
                "(the embedding before it; the final norm, the LM head, the sampler and a "
                "drafter after it).",
            ),
            Column(
                "module",
                STR,
                "`attention` (with its KV-cache write and rope), `linear`, `moe_experts`, "
                "`moe_routing` (routing and the EP exchange), `norm`, `activation`, `tp_comm`, "
                "`sampling` (the sampler, and the final norm and LM head after the last layer), "
                "`other`.",
            ),
            Column(
                "attribution",
                STR,
                "What gave `layer` and `module`: `capture` (a replayed kernel mapped to the "
                "launch its graph's capture made, in a profile that holds the capture: the "
                "decoder-layer nn.Module around that launch; `module` by name, `sampling` after "
                "the last layer), `sequence` (the cut at the attention; `module` by name).",
            ),
            Column(
                "call_site",
                STR,
                "A replayed kernel mapped to its capture: the innermost Python frame around "
                "the launch (`file.py(line): function`); null otherwise.",
            ),
            Column(
                "host_op",
                STR,
                "A replayed kernel mapped to its capture: the torch op the launch ran in; null "
                "otherwise.",
            ),
            Column(
                "host_module",
                STR,
                "A replayed kernel mapped to its capture: the class of the innermost nn.Module "
                "around the launch (the Python tracer's `nn.Module: Class_id`); null otherwise.",
            ),
            Column(
                "capture_note",
                STR,
                "A replayed kernel not mapped to its capture: why (no capture in the profile, "
                "none of its size, a piecewise replay, the capture's count of kernels or a "
                "kernel's name differs from the replay's); null otherwise.",
            ),
        ),
        _table(
            "collectives",
            "Every collective of a rank (HCCL ops, MC2 exchange kernels) with its time split "
            "into what it waited for, what it moved and where nothing ran; the four parts sum "
            "to the op's time (`derived/collectives.py`, docs/overview.md); derived before the "
            "rules, read by them and the overview.",
            "derived: slices (HCCL / Communication ops and plane tasks; MC2 kernels), "
            "comm_ops (communication.json), steps",
            Column("step", I64, "The step it starts in (the `steps` table's; null outside)."),
            Column("phase", STR, "The step's phase."),
            Column(
                "group",
                STR,
                "Its group: the HCCL row (`Group 0 Communication`), communication.json's group "
                "hash for an op only it lists, `MC2` for an exchange kernel.",
            ),
            Column("name", STR, "Op name (`hcom_allReduce__586_0_1`, the MC2 kernel's)."),
            Column("kind", STR, "`allReduce`, `allGather`, ..., `MoeDistributeDispatch`."),
            Column("start_ns", I64, "Op start on this rank."),
            Column("end_ns", I64, "Op end."),
            Column(
                "arrival_ns",
                I64,
                "Waiting for the last rank to arrive: the waits before the op's first transfer, "
                "on any plane (null: nothing splits it, an MC2 kernel).",
            ),
            Column("transfer_ns", I64, "The transfers: the data moving (overlaps once)."),
            Column("other_ns", I64, "The rest of the protocol: waits and signals after it."),
            Column("idle_ns", I64, "Time inside the op in which none of its tasks ran."),
            Column(
                "export_idle_ns",
                I64,
                "communication.json's own Idle Time for the op (null: not listed there); it "
                "counts what the planes it does not read do as idle.",
            ),
            Column(
                "waited_for",
                I64,
                "The peer rank (`dst rank`) of the op's longest wait before its first transfer, "
                "when at least 50 µs (null: none, or not told).",
            ),
            Column(
                "source",
                STR,
                "What split it: `tasks` (the trace's plane tasks), `communication.json`, "
                "`kernel` (an MC2 kernel: not split) or `op` (nothing: not split).",
            ),
        ),
        _table(
            "summary_steps",
            "Where each step's time goes: its wall time split into components that sum to it.",
            "derived: slices (device tasks, ProfilerStep#N), kernels, flows; step_times to check",
            Column(
                "step",
                I64,
                "The step's number (the `steps` table's: `ProfilerStep#N`'s N, else the "
                "iteration's in its session; null for an idle gap).",
            ),
            Column("start_ns", I64, "Window start: the step's (the `steps` table)."),
            Column("end_ns", I64, "Window end."),
            Column("step_ns", I64, "Wall time of the window; the components below sum to it."),
            Column(
                "device_start_ns",
                I64,
                "First compute or communication task of the window (null when none).",
            ),
            Column("device_end_ns", I64, "Last compute or communication task end in the window."),
            *_COMPONENT_COLUMNS,
            Column("step_source", STR, "What marks the window (the `steps` table's column)."),
            Column("phase", STR, "The phase the step served (the `steps` table's column)."),
            Column("phase_source", STR, "What told the phase (the `steps` table's column)."),
            Column("phase_reason", STR, "The evidence in words (the `steps` table's column)."),
            Column("tokens", I64, "New tokens in the batch (null when unknown)."),
            Column("graph", STR, "`full`, `piecewise` or `eager` (null without compute)."),
            *_GRAPH_SIZE_COLUMNS,
            Column(
                "source",
                STR,
                "`events` (trace_view.json tasks) or `step_trace_time` (no device tasks: the "
                "CSV's Computing/Communication/Free, without the accelerator or idle split).",
            ),
            Column(
                "check_scope",
                STR,
                "What the check compared: `step` (a ProfilerStep with the export's row for it) "
                "or `session` (any other window: the session's total with the export's "
                "session row, the same value on every window of the session).",
            ),
            Column(
                "check_deviation",
                F64,
                "Largest difference between the events and the export's own step breakdown "
                "(step_trace_time.csv, or analysis.db's StepTraceTime) over Computing, "
                "Communication(Not Overlapped) and Overlapped, as a share of Stage; null when "
                "the export has no row for the step (or session).",
            ),
            Column(
                "check_component",
                STR,
                "Which of the three differs most (`Computing`, `Communication(Not Overlapped)`, "
                "`Overlapped`); null with check_deviation.",
            ),
            Column(
                "unmeasured",
                STR,
                "The components the step's data could not measure, comma-separated (null: "
                "none), their time being in another one: `compute_ai_vector_ns` when no "
                "compute task says AI Vector apart from AI Core (a Level0 export's "
                "kernel_details.csv writes N/A, and a G2 trace says AI_CORE for both: the "
                "time is in compute_ai_core_ns), `idle_sync_ns` when the session recorded no "
                "CANN call (a Level0 Text export: the time is in idle_host_ns).",
            ),
            Column(
                "ep_path",
                STR,
                "The expert-parallel exchange the step of an MoE model used: `mc2` (MC2 "
                "dispatch/combine), `alltoall` or `allgather` (the most used, when several); "
                "null without expert kernels or without an exchange.",
            ),
            Column("ep_exchange_ns", I64, "Time in the step's EP exchanges (overlaps once)."),
            Column(
                "ep_exposed_ns",
                I64,
                "Of it, the time no compute kernel ran on any stream of the rank.",
            ),
            Column(
                "ep_fits",
                BOOL,
                "False when the path does not fit the step's size (vllm-ascend picks MC2 up "
                "to a token capacity, all-to-all above it): information, not an error; null "
                "when the step's tokens are unknown.",
            ),
        ),
        _table(
            "summary_kernels",
            "Top device kernels by total device time (N: `run --top-kernels`), over the session "
            "and per phase (a kernel is in the phase of the step it starts in).",
            "derived: slices (Ascend Hardware compute tasks), kernels (accelerator)",
            Column(
                "phase",
                STR,
                "The phase of the steps it covers (`prefill`, `decode`, ...), or `all`: every "
                "row of the session, in a step or not.",
            ),
            Column("name", STR, "Kernel name."),
            Column("accelerator", STR, "`AI_CORE`, `AI_VECTOR_CORE`, `MIX_AIC`, `AI_CPU`, ..."),
            Column("count", I64, "Launches."),
            Column("total_ns", I64, "Total device time."),
            Column("mean_ns", I64, "Mean duration."),
            Column("p95_ns", I64, "95th percentile duration."),
            Column("share", F64, "Share of all compute-task time of the session (phase)."),
        ),
        _table(
            "summary_host_apis",
            "Top host APIs by total (inclusive) time: CANN APIs and Python ops (`--top-apis`), "
            "over the session and per phase.",
            "derived: slices (CANN process; Python `cpu_op` events)",
            Column(
                "phase",
                STR,
                "The phase of the steps it covers (`prefill`, `decode`, ...), or `all`: every "
                "row of the session, in a step or not.",
            ),
            Column("kind", STR, "`CANN` or `Python`."),
            Column("name", STR, "API or op name (`AscendCL@aclrtMemcpy`, `aten::mm`)."),
            Column("count", I64, "Calls."),
            Column("total_ns", I64, "Total time (inclusive of nested calls)."),
            Column("mean_ns", I64, "Mean duration."),
            Column("p95_ns", I64, "95th percentile duration."),
            Column("share", F64, "Share of the session's steps' time (the phase's steps)."),
        ),
        _table(
            "summary_collectives",
            "Top collectives by total time, with wait vs transit (`--top-collectives`).",
            "derived: comm_ops (communication.json), else slices (HCCL / Communication ops)",
            Column("name", STR, "Collective kind, e.g. `allReduce`, `broadcast`."),
            Column("count", I64, "Ops."),
            Column("total_ns", I64, "Total elapsed time."),
            Column("wait_ns", I64, "Of which waiting for peers (null: only events were there)."),
            Column("transit_ns", I64, "Of which transferring data (null: events only)."),
            Column("wait_share", F64, "wait / total (null: events only)."),
            Column("source", STR, "`communication.json` or `events`."),
        ),
        _table(
            "summary_ranks",
            "The cluster view: one row per rank (session is `all`), outliers flagged with the "
            "rules' robust z-score (traceanalyzer.stats).",
            "derived: summary_steps, summary_kernels",
            Column("steps", I64, "Steps (windows) measured."),
            Column("step_ns", F64, "Mean step time."),
            Column("compute_ns", F64, "Mean compute per step (every accelerator, + overlapped)."),
            Column("comm_wait_ns", F64, "Mean exposed communication per step."),
            Column("idle_ns", F64, "Mean device idle per step (host, stream waits, other)."),
            Column("top_kernel", STR, "The kernel with the most device time."),
            Column("top_kernel_ns", I64, "Its total device time."),
            Column(
                "step_z",
                F64,
                "Robust z-score of step_ns among the ranks, against a spread of at least "
                "10%/3.5 of the median (null: < 3 ranks).",
            ),
            Column(
                "outlier",
                BOOL,
                "step_z above the outlier threshold (3.5) and 10% above the median.",
            ),
        ),
        _table(
            "summary_memory",
            "Device memory per component (profile_memory=True): the peaks of torch's allocator "
            "(PTA), GE's, their sum and the process's (APP), exactly as recorded, and each CANN "
            "module's (docs/overview.md).",
            "derived: memory_records, module_memory (`traceanalyzer/memory.py`)",
            Column(
                "source",
                STR,
                "`memory_record` (memory_record.csv, Db MEMORY_RECORD / NPU_MEM) or "
                "`npu_module_mem` (npu_module_mem.csv, NPU_MODULE_MEM: modules that held any).",
            ),
            Column("component", STR, "`PTA`, `GE`, `PTA+GE`, `APP`; or the module (`HCCL`, ...)."),
            Column("samples", I64, "Records of the component (null for a module)."),
            Column("first_ns", I64, "First record."),
            Column("last_ns", I64, "Last record."),
            Column("peak_allocated_mb", F64, "Highest Total Allocated(MB) (null for APP)."),
            Column("peak_allocated_ns", I64, "When it was first reached."),
            Column(
                "reserved_at_peak_allocated_mb",
                F64,
                "Total Reserved(MB) then: reserved - allocated is what the cache held unused.",
            ),
            Column("peak_reserved_mb", F64, "Highest Total Reserved(MB) (a module's reserved)."),
            Column("peak_reserved_ns", I64, "When it was first reached."),
            Column("first_allocated_mb", F64, "Allocated at the first record."),
            Column("last_allocated_mb", F64, "Allocated at the last record."),
            Column("first_reserved_mb", F64, "Reserved at the first record."),
            Column("last_reserved_mb", F64, "Reserved at the last record."),
            Column(
                "outside_torch_mb",
                F64,
                "APP's row: APP - PTA reserved at APP's peak (HCCL buffers, workspaces, GE).",
            ),
        ),
        _table(
            "summary_memory_steps",
            "Device memory per step window (the `steps` table's) and series: the lowest value "
            "held in it (the baseline memory-growth trends) and the highest.",
            "derived: memory_records, steps (`traceanalyzer/memory.py`)",
            Column("step", I64, "The step (null for an idle gap)."),
            Column("start_ns", I64, "Window start."),
            Column("end_ns", I64, "Window end."),
            Column("phase", STR, "The step's phase."),
            Column("tokens", I64, "The step's new tokens (null when unknown)."),
            Column(
                "series",
                STR,
                "`PTA` and `GE` (allocated), `APP` (APP - PTA reserved - GE reserved: outside both).",
            ),
            Column(
                "baseline_mb",
                F64,
                "Lowest value held in the window (the one held at its start included).",
            ),
            Column("peak_mb", F64, "Highest value."),
            Column("reserved_peak_mb", F64, "PTA: highest reserved in the window."),
            Column(
                "gap_at_peak_mb", F64, "PTA: reserved - allocated at the window's allocated peak."
            ),
            Column(
                "segment_allocs", I64, "PTA: records whose reserved memory rose (new segments)."
            ),
            Column("segment_frees", I64, "PTA: records whose reserved memory fell (handed back)."),
        ),
        _table(
            "summary_memory_timeline",
            "Device memory over time for the report's figure: each line's lowest and highest "
            "value in at most 400 equal slots of the rank's recorded time.",
            "derived: memory_records (`traceanalyzer/memory.py`)",
            Column("line", STR, "`PTA allocated`, `PTA reserved`, `GE allocated`, `APP`."),
            Column("ts_ns", I64, "Slot start."),
            Column("min_mb", F64, "Lowest value held in the slot."),
            Column("max_mb", F64, "Highest value held in the slot."),
        ),
        _table(
            "summary_memory_static",
            "The allocations never freed in the profile (a KV-cache pool made at start-up, a "
            "leak), by what allocated them, the most memory first (5 per session): "
            "operator_memory.csv's, or the rises of PTA's allocated memory that never came back "
            "(without operator_memory).",
            "derived: op_memory, memory_records (`traceanalyzer/memory.py`)",
            Column("name", STR, "The allocating operator (`aten::zeros`), or `N MB held`."),
            Column("count", I64, "Its allocations never freed."),
            Column("size_mb", F64, "Their size in all."),
            Column("largest_mb", F64, "The largest of them."),
            Column("alloc_ns", I64, "When the first was allocated."),
            Column("source", STR, "`operator_memory` or `memory_record`."),
        ),
    )
}


def render_markdown() -> str:
    """Render the schema documentation page (docs/schema.md)."""
    out = [
        "# Store schema",
        "",
        "<!-- Generated by `python -m traceanalyzer.schema > docs/schema.md`; do not edit. -->",
        "",
        (__doc__ or "").split("\n\n", 1)[1].strip(),
        "",
        "Layout: `OUT/tables/<table>/rank=<rank>/session=<session>/part-0.parquet` (Hive partitions);",
        "a collection of many small ranks stores them in rank groups instead,",
        "`OUT/tables/<table>/group=<lo>-<hi>/part-0.parquet`, with `rank` and `session` as columns",
        "(read those files with `hive_partitioning=False`; `open_store` and `query` read both).",
        "Query with `pl.scan_parquet('OUT/tables/slices/**/*.parquet', hive_partitioning=True)`,",
        "DuckDB `read_parquet('OUT/tables/slices/**/*.parquet', hive_partitioning=true)`,",
        "`traceanalyzer.open_store('OUT').table('slices')`, or in SQL from the shell:",
        '`traceanalyzer query OUT "SELECT ... FROM slices"` (every table a view named like it,',
        "read-only; `--list` lists the tables and columns).",
        "",
    ]
    for table in TABLES.values():
        db = DB_SOURCES.get(table.name, {})
        db_source = db.get("") or "none (filled from the Text file when one is beside the Db)"
        out += [f"## `{table.name}`", "", table.doc, "", f"Source (Text export): {table.source}"]
        out += ["", f"Source (Db export): {db_source}", ""]
        out += ["| column | type | meaning (Text export) | Db export |", "|---|---|---|---|"]
        for c in table.columns:
            where = db.get(c.name, "Partition key." if c.name in ("rank", "session") else "—")
            cells = [f"`{c.name}`", str(c.type), c.doc, where]
            out.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
        out.append("")
    out += [
        "## Derived tables",
        "",
        "Written after ingest by the declared stages (`traceanalyzer/stages.py`: the steps' "
        "before the rules, the overview's after them, per rank like the rules), never parsed "
        "from files, the same for both formats; same layout and `Store.table` access. See "
        "[serving.md](serving.md), [overview.md](overview.md) and "
        "[architecture.md](architecture.md#adding-a-stage).",
        "",
    ]
    for table in DERIVED_TABLES.values():
        out += [f"## `{table.name}`", "", table.doc, "", f"Source: {table.source}", ""]
        out += ["| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.doc.replace('|', '/')} |" for c in table.columns]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
