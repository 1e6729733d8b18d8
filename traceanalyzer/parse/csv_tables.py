"""The CSV summaries (kernel_details, api_statistic, op_statistic, step_trace_time, operator_details,
task_time, memory_record, operator_memory, npu_module_mem, l2_cache) → canonical tables.

All generations are accepted: with or without ``Device_id``, ``Block Dim`` or ``Block Num``,
CRLF or LF, trailing TABs after absolute times, quoted times (G1), triple-quoted shapes,
multi-line call stacks, ``N/A`` and the 4294967295 / 18446744073709551615 sentinels.
A malformed row is skipped and its line number reported; unknown columns go to ``extra``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.sink import TableSink
from traceanalyzer.timeutil import us_expr_to_ns

if TYPE_CHECKING:  # DuckDB is imported when a CSV is read, not with the specs
    import duckdb

_NULLS = ["", "N/A", "NA", "n/a", "null", "None", "-", "4294967295", "18446744073709551615"]


@dataclass(frozen=True)
class Col:
    """How one canonical column is read: source header names (first present wins) and a kind."""

    name: str
    sources: tuple[str, ...]
    kind: str = "str"  # str | int | float | us (absolute or duration µs -> ns) | shape | stack


@dataclass(frozen=True)
class CsvSpec:
    file: str
    table: str
    columns: tuple[Col, ...]
    # What writes the file when not every export has it (a profiler option, a release): its
    # absence then means "not collected", not "missing".
    collected_with: str = ""
    # The first generation (vocabulary.GENERATIONS) that writes the file: in older exports its
    # absence is a fact of the generation, said once per run rather than per rank.
    written_from: str | None = None


def _c(name: str, *sources: str, kind: str = "str") -> Col:
    return Col(name, sources, kind)


SPECS: tuple[CsvSpec, ...] = (
    CsvSpec(
        "kernel_details.csv",
        "kernels",
        (
            _c("step", "Step Id", kind="int"),
            _c("device_id", "Device_id", kind="int"),
            _c("model_id", "Model ID", kind="int"),
            _c("task_id", "Task ID", kind="int"),
            _c("stream_id", "Stream ID", "Physic Stream Id", "Stream Id", kind="int"),
            _c("name", "Name", "Op Name"),
            _c("type", "Type", "OP Type"),
            _c("op_state", "OP State"),
            _c("accelerator_core", "Accelerator Core", "Task Type"),
            _c("start_ns", "Start Time(us)", "Task Start Time(us)", kind="us"),
            _c("dur_ns", "Duration(us)", "Task Duration(us)", kind="us"),
            _c("wait_ns", "Wait Time(us)", "Task Wait Time(us)", kind="us"),
            _c("block_num", "Block Num", "Block Dim", kind="int"),
            _c("mix_block_num", "Mix Block Num", "Mix Block Dim", kind="int"),
            _c("hf32_eligible", "HF32 Eligible"),
            _c("input_shapes", "Input Shapes", kind="shape"),
            _c("input_data_types", "Input Data Types"),
            _c("input_formats", "Input Formats"),
            _c("output_shapes", "Output Shapes", kind="shape"),
            _c("output_data_types", "Output Data Types"),
            _c("output_formats", "Output Formats"),
            _c("context_id", "Context ID", kind="int"),
        ),
    ),
    CsvSpec(
        "api_statistic.csv",
        "api_stats",
        (
            _c("device_id", "Device_id"),
            _c("level", "Level"),
            _c("api_name", "API Name"),
            _c("count", "Count", kind="int"),
            _c("total_us", "Time(us)", kind="float"),
            _c("avg_us", "Avg(us)", kind="float"),
            _c("min_us", "Min(us)", kind="float"),
            _c("max_us", "Max(us)", kind="float"),
            _c("variance", "Variance", kind="float"),
        ),
    ),
    CsvSpec(
        "op_statistic.csv",
        "op_stats",
        (
            _c("device_id", "Device_id"),
            _c("op_type", "OP Type"),
            _c("core_type", "Core Type"),
            _c("count", "Count", kind="int"),
            _c("total_us", "Total Time(us)", kind="float"),
            _c("min_us", "Min Time(us)", kind="float"),
            _c("avg_us", "Avg Time(us)", kind="float"),
            _c("max_us", "Max Time(us)", kind="float"),
            _c("ratio_pct", "Ratio(%)", kind="float"),
        ),
    ),
    CsvSpec(
        "step_trace_time.csv",
        "step_times",
        (
            _c("device_id", "Device_id", kind="int"),
            _c("step", "Step", kind="int"),
            _c("computing_ns", "Computing", kind="us"),
            _c("communication_not_overlapped_ns", "Communication(Not Overlapped)", kind="us"),
            _c("overlapped_ns", "Overlapped", kind="us"),
            _c("communication_ns", "Communication", kind="us"),
            _c("free_ns", "Free", kind="us"),
            _c("stage_ns", "Stage", kind="us"),
            _c("bubble_ns", "Bubble", kind="us"),
            _c(
                "communication_not_overlapped_exclude_receive_ns",
                "Communication(Not Overlapped and Exclude Receive)",
                kind="us",
            ),
            _c("preparing_ns", "Preparing", kind="us"),
        ),
    ),
    CsvSpec(
        "operator_details.csv",
        "operators",
        (
            _c("name", "Name"),
            _c("input_shapes", "Input Shapes"),
            _c("call_stack", "Call Stack", kind="stack"),
            _c("host_self_ns", "Host Self Duration(us)", kind="us"),
            _c("host_total_ns", "Host Total Duration(us)", kind="us"),
            _c("device_self_ns", "Device Self Duration(us)", kind="us"),
            _c("device_total_ns", "Device Total Duration(us)", kind="us"),
            _c("device_self_aicore_ns", "Device Self Duration With AICore(us)", kind="us"),
            _c("device_total_aicore_ns", "Device Total Duration With AICore(us)", kind="us"),
        ),
    ),
    CsvSpec(
        "task_time.csv",
        "task_times",
        (
            _c("device_id", "Device_id", kind="int"),
            _c("kernel_name", "kernel_name"),
            _c("kernel_type", "kernel_type"),
            _c("stream_id", "stream_id", kind="int"),
            _c("task_id", "task_id", kind="int"),
            _c("dur_ns", "task_time(us)", kind="us"),
            _c("start_ns", "task_start(us)", kind="us"),
            _c("end_ns", "task_stop(us)", kind="us"),
        ),
        collected_with="torch_npu after G3; G1-G3 never write it",
        written_from="current",
    ),
    CsvSpec(
        "memory_record.csv",
        "memory_records",
        (
            _c("component", "Component"),
            _c("ts_ns", "Timestamp(us)", kind="us"),
            _c("total_allocated_mb", "Total Allocated(MB)", kind="float"),
            _c("total_reserved_mb", "Total Reserved(MB)", kind="float"),
            _c("total_active_mb", "Total Active(MB)", kind="float"),
            _c("stream_ptr", "Stream Ptr", kind="int"),
            _c("device_type", "Device Type"),
        ),
        collected_with="profile_memory=True",
    ),
    CsvSpec(
        "operator_memory.csv",
        "op_memory",
        (
            _c("name", "Name"),
            _c("size_kb", "Size(KB)", kind="float"),
            _c("alloc_ns", "Allocation Time(us)", kind="us"),
            _c("release_ns", "Release Time(us)", kind="us"),
            _c("active_release_ns", "Active Release Time(us)", kind="us"),
            _c("dur_ns", "Duration(us)", kind="us"),
            _c("active_dur_ns", "Active Duration(us)", kind="us"),
            _c("alloc_total_allocated_mb", "Allocation Total Allocated(MB)", kind="float"),
            _c("alloc_total_reserved_mb", "Allocation Total Reserved(MB)", kind="float"),
            _c("alloc_total_active_mb", "Allocation Total Active(MB)", kind="float"),
            _c("release_total_allocated_mb", "Release Total Allocated(MB)", kind="float"),
            _c("release_total_reserved_mb", "Release Total Reserved(MB)", kind="float"),
            _c("release_total_active_mb", "Release Total Active(MB)", kind="float"),
            _c("stream_ptr", "Stream Ptr", kind="int"),
            _c("device_type", "Device Type"),
        ),
        collected_with="profile_memory=True",
    ),
    CsvSpec(
        "npu_module_mem.csv",
        "module_memory",
        (
            _c("device_id", "Device_id", kind="int"),
            _c("component", "Component"),
            _c("ts_ns", "Timestamp(us)", kind="us"),
            _c("total_reserved_mb", "Total Reserved(MB)", kind="float"),
            _c("device", "Device"),
        ),
    ),
    CsvSpec(
        "l2_cache.csv",
        "l2_cache",
        (
            _c("device_id", "Device_id", kind="int"),
            _c("stream_id", "Stream Id", kind="int"),
            _c("task_id", "Task Id", kind="int"),
            _c("hit_rate", "Hit Rate", kind="float"),
            _c("victim_rate", "Victim Rate", kind="float"),
            _c("op_name", "Op Name"),
        ),
        collected_with="l2_cache=True",
    ),
)


@dataclass
class CsvResult:
    rows: int = 0
    header: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


_BATCH_ROWS = 1 << 14
# DuckDB's reject error types, in words.
_REJECT_REASONS = {
    "missing columns": "wrong number of fields: too few",
    "too many columns": "wrong number of fields: too many",
    "invalid encoding": "not UTF-8 text",
    "invalid unicode": "not UTF-8 text",
    "unquoted value": "a quote inside an unquoted field",
    "line size over maximum": "line longer than 16 MB",
}
# buffer_size: by default DuckDB reads a file of up to 256 MB in one buffer; 32 MB (twice the
# longest line accepted) keeps a large kernel_details.csv at about 400 MB peak instead of 540.
_READ_CSV = (
    "SELECT * FROM read_csv($path, header = true, all_varchar = true, delim = ',', quote = '\"', "
    "escape = '\"', store_rejects = true, max_line_size = 16777216, buffer_size = 33554432)"
)


def _convert(values: pl.Expr, kind: str) -> pl.Expr:
    """One raw CSV column (strings) to its canonical value."""
    text = values.str.strip_chars("\t \r\n")
    text = pl.when(text.is_in(_NULLS)).then(None).otherwise(text)
    if kind == "int":
        number = text.str.strip_chars('"').cast(pl.Float64, strict=False)
        return number.round(0).cast(pl.Int64, strict=False)
    if kind == "float":
        return text.cast(pl.Float64, strict=False)
    if kind == "us":
        return us_expr_to_ns(text)
    if kind == "shape":
        return text.str.strip_chars('"')
    if kind == "stack":
        return text.str.replace_all(r";?\r?\n", "\n")
    return text


def _batches(relation: duckdb.DuckDBPyRelation) -> pa.RecordBatchReader:
    reader = (
        getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader
    )  # duckdb 2 / 1
    return reader(_BATCH_ROWS)


_LINES_LISTED = 10  # per reason: a broken file must not flood the summary


def _rejected_rows(path: Path, rejected: list[tuple[int, str]]) -> list[str]:
    """One warning per reason, naming the first lines and counting the rest."""
    by_reason: dict[str, list[int]] = {}
    for line, kind in rejected:
        by_reason.setdefault(_REJECT_REASONS.get(kind, kind), []).append(line)
    warnings = []
    for reason, lines in by_reason.items():
        listed = ", ".join(str(n) for n in lines[:_LINES_LISTED])
        more = f" and {len(lines) - _LINES_LISTED:,} more" if len(lines) > _LINES_LISTED else ""
        plural = "s" if len(lines) > 1 else ""
        warnings.append(
            f"{path}: line{plural} {listed}{more}: malformed row{plural} skipped ({reason})"
        )
    return warnings


CSV_MEMORY_MB = 256  # DuckDB's budget for the CSV files: they stream, whatever their size


def csv_database() -> duckdb.DuckDBPyConnection:
    """A DuckDB database for the CSV files of one session, to pass to :func:`parse_csv`.

    Opening a database costs about 30 ms and a cursor on it almost nothing; a session has up to
    ten CSV files.
    """
    from traceanalyzer.parse.duckdb_connect import connect_duckdb

    return connect_duckdb({"threads": 1, "memory_limit": f"{CSV_MEMORY_MB}MB"})


def parse_csv(
    path: Path, spec: CsvSpec, sink: TableSink, db: duckdb.DuckDBPyConnection | None = None
) -> CsvResult:
    """Parse one CSV summary file into ``spec.table``.

    DuckDB's native reader streams the file in Arrow batches, polars converts each batch and the
    sink appends it to the Parquet partition: a kernel_details.csv of hundreds of MB costs one
    batch of memory, never a Python object per cell. Rows with the wrong number of fields are
    rejected and reported by line. ``db`` (from :func:`csv_database`) is shared by the files of
    a session; each file reads through its own cursor, so rejected rows never mix.
    """
    import duckdb

    from traceanalyzer.parse.duckdb_connect import quiet

    result = CsvResult()
    if path.stat().st_size == 0:
        result.warnings.append(f"{path}: empty file")
        return result
    con = quiet(db.cursor()) if db is not None else csv_database()
    try:
        relation = con.sql(_READ_CSV, params={"path": str(path)})
        columns = list(relation.columns)
        # A trailing comma on the header line names an empty last column `columnN`: not data.
        while len(columns) > 1 and re.fullmatch(r"column\d+", columns[-1]):
            columns.pop()
        result.header = [c.strip() for c in columns]
        position = {name: i for i, name in reversed(list(enumerate(result.header)))}
        used: set[int] = set()
        exprs: list[pl.Expr] = []
        for col in spec.columns:
            source = next((s for s in col.sources if s in position), None)
            if source is not None:
                used.add(position[source])
                exprs.append(_convert(pl.col(columns[position[source]]), col.kind).alias(col.name))
        # Unknown columns (PMU metrics, newer fields) are kept, as a JSON object in `extra`.
        unknown = [i for i in range(len(columns)) if i not in used and result.header[i]]
        if unknown:
            fields = [
                pl.col(columns[i]).str.strip_chars("\t ").alias(result.header[i]) for i in unknown
            ]
            exprs.append(pl.struct(fields).struct.json_encode().alias("extra"))
        if not used:  # not the file we expect (another tool's CSV, a wrong name): say so
            result.warnings.append(
                f"{path}: none of the expected columns found (header: {', '.join(result.header)[:200]})"
            )
        if not exprs:
            return result
        converted = (pl.from_arrow(batch).select(exprs).to_arrow() for batch in _batches(relation))
        result.rows = sink.batches(spec.table, converted)
        try:
            rejected = con.execute(
                "SELECT line, min(lower(CAST(error_type AS VARCHAR))) FROM reject_errors "
                "GROUP BY line ORDER BY line"
            ).fetchall()
        except duckdb.CatalogException:  # the reader never ran
            rejected = []
        result.warnings += _rejected_rows(path, rejected)
    finally:
        con.close()
    return result
