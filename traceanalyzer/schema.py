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
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pyarrow as pa


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
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


I32, I64, F64, STR = pa.int32(), pa.int64(), pa.float64(), pa.string()

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
            "Complete (X) and instant (i/I) events from trace_view.json, with well-known args flattened.",
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
                "The event's args object verbatim, as a JSON string (null when none); the well-known "
                "keys are also in their own columns.",
            ),
        ),
        _table(
            "counters",
            "Counter (C) events: one row per (event, series).",
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


def render_markdown() -> str:
    """Render the schema documentation page (docs/schema.md)."""
    out = [
        "# Store schema",
        "",
        "<!-- Generated by `python -m traceanalyzer.schema > docs/schema.md`; do not edit. -->",
        "",
        (__doc__ or "").split("\n\n", 1)[1].strip(),
        "",
        "Layout: `OUT/tables/<table>/rank=<rank>/session=<session>/part-0.parquet` (Hive partitions).",
        "Query with `pl.scan_parquet('OUT/tables/slices/**/*.parquet', hive_partitioning=True)`,",
        "DuckDB `read_parquet('OUT/tables/slices/**/*.parquet', hive_partitioning=true)`, or",
        "`traceanalyzer.open_store('OUT').table('slices')`.",
        "",
    ]
    for table in TABLES.values():
        out += [f"## `{table.name}`", "", table.doc, "", f"Source: {table.source}", ""]
        out += ["| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.doc.replace('|', '/')} |" for c in table.columns]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
