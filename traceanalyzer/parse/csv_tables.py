"""The CSV summaries (kernel_details, api_statistic, op_statistic, step_trace_time, operator_details,
task_time, memory_record, operator_memory, npu_module_mem, l2_cache) → canonical tables.

All generations are accepted: with or without ``Device_id``, ``Block Dim`` or ``Block Num``,
CRLF or LF, trailing TABs after absolute times, quoted times (G1), triple-quoted shapes,
multi-line call stacks, ``N/A`` and the 4294967295 / 18446744073709551615 sentinels.
A malformed row is skipped and its line number reported; unknown columns go to ``extra``.

Two readers, one conversion: Arrow's CSV reader takes every well-formed file (it is in the
library every run loads, and reads a file in about a millisecond); a file it refuses goes to
DuckDB's, which salvages it row by row. tests/test_csv_readers.py holds the two equal.
"""

from __future__ import annotations

import csv
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.sink import TableSink, arrow_table
from traceanalyzer.timeutil import us_expr_to_ns, us_series_to_ns

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
# longest line accepted) lowers the peak of a large kernel_details.csv.
_READ_CSV = (
    "SELECT * FROM read_csv($path, header = true, all_varchar = true, delim = ',', quote = '\"', "
    "escape = '\"', store_rejects = true, max_line_size = 16777216, buffer_size = 33554432{options})"
)


def _null_text(values: pl.Expr) -> pl.Expr:
    """A raw CSV field stripped, and null when it is a null word or sentinel."""
    text = values.str.strip_chars("\t \r\n")
    return pl.when(text.is_in(_NULLS)).then(None).otherwise(text)


def canonical_text(values: pl.Expr, kind: str) -> pl.Expr:
    """One raw CSV column (strings) to its canonical value (``kind``: a :class:`Col` kind); the
    Db reader gives the texts it derives a CSV column from the same treatment."""
    text = _null_text(values)
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


class CsvDatabase:
    """The DuckDB database the CSV files of one session share, opened on first use: most
    sessions never need it (:func:`parse_csv` reads well-formed files with Arrow), and opening
    one costs the DuckDB import and about 30 ms. Thread-safe; each file reads through its own
    cursor, so rejected rows never mix. ``scratch``: where a file's private copy is written
    (the system's temporary folder when None)."""

    def __init__(self, scratch: Path | None = None) -> None:
        self.scratch = scratch
        self._con: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        from traceanalyzer.parse.duckdb_connect import connect_duckdb, quiet

        with self._lock:
            if self._con is None:
                config = {"threads": 1, "memory_limit": f"{CSV_MEMORY_MB}MB"}
                self._con = connect_duckdb(config)
            return quiet(self._con.cursor())

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


class _NotPlain(Exception):
    """The file is not one Arrow's reader takes as it is (a malformed row, bytes that are not
    UTF-8, a row longer than a block): DuckDB reads it, reporting what it rejects by line."""


# Arrow reads this much per step: the longest row it takes (a longer one goes to DuckDB).
_ARROW_BLOCK_BYTES = 4 << 20
# More columns than any export writes (kernel_details.csv with every PMU metric has about a
# hundred), and a longer header line: a header of 100,001 columns aborted DuckDB's reader
# (std::bad_alloc, exit 134) and took Arrow's to 1.4 GB for a 2 MB file. Such a file is not read.
MAX_COLUMNS = 2048
_MAX_HEADER_BYTES = 1 << 20


class CsvRefused(ValueError):
    """The file is not read at all: the message says why."""


def _check_header(path: Path) -> None:
    """Raise :class:`CsvRefused` when the header line of ``path`` is longer than
    :data:`_MAX_HEADER_BYTES` or names more than :data:`MAX_COLUMNS` columns (read from a
    bounded head of the file, before any reader sees it)."""
    with open(path, "rb") as fh:
        head = fh.read(_MAX_HEADER_BYTES + 1)
    line, ended, _ = head.partition(b"\n")
    if not ended and len(head) > _MAX_HEADER_BYTES:
        raise CsvRefused(f"its header line is longer than {_MAX_HEADER_BYTES >> 20} MB: not read")
    columns = len(next(csv.reader([line.decode("utf-8", errors="replace")]), []))
    if columns > MAX_COLUMNS:
        raise CsvRefused(
            f"{columns:,} columns in its header, more than the {MAX_COLUMNS:,} any export "
            "writes: not read"
        )


def parse_csv(
    path: Path, spec: CsvSpec, sink: TableSink, db: CsvDatabase | None = None
) -> CsvResult:
    """Parse one CSV summary file into ``spec.table``.

    The file streams in Arrow batches, polars converts each batch and the sink appends it to
    the Parquet partition: a kernel_details.csv of hundreds of MB costs one batch of memory,
    never a Python object per cell. A well-formed file is read by Arrow's CSV reader (in the
    library every run has loaded); any other is read again by DuckDB's, which skips the rows
    with the wrong number of fields and reports them by line (the partition is written once,
    from one reader). ``db`` is the session's :class:`CsvDatabase`.
    """
    if path.stat().st_size == 0:
        return CsvResult(warnings=[f"{path}: empty file"])
    _check_header(path)
    try:
        return _parse_plain(path, spec, sink)
    except _NotPlain:
        pass
    own = db is None
    db = db or CsvDatabase()
    try:
        return _parse_salvaging(path, spec, sink, db)
    finally:
        if own:
            db.close()


def _parse_plain(path: Path, spec: CsvSpec, sink: TableSink) -> CsvResult:
    """``path`` read by Arrow, or :class:`_NotPlain`. Every field is read as text (empty ones as
    null, as DuckDB reads them); the header is the first row."""
    import pyarrow.csv as pacsv

    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            header = next(csv.reader(fh), None)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise _NotPlain from exc
    if not header:
        raise _NotPlain
    names = [f"f{i}" for i in range(len(header))]
    # opened by its bytes: pyarrow takes a name as UTF-8 text, which a folder's need not be
    with pa.OSFile(os.fsencode(path)) as source:
        try:
            reader = pacsv.open_csv(
                source,
                read_options=pacsv.ReadOptions(
                    block_size=_ARROW_BLOCK_BYTES, autogenerate_column_names=True, use_threads=False
                ),
                # no invalid_row_handler: a malformed row stops the read (the file goes to
                # DuckDB); a handler would be given the row decoded as text, which bytes that
                # are not UTF-8 make raise inside Arrow ("Exception ignored ...")
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(
                    column_types=dict.fromkeys(names, pa.string()),
                    null_values=[""],
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                ),
            )
        except pa.ArrowInvalid as exc:
            raise _NotPlain from exc
        result, exprs = _plan(path, spec, header)
        if not exprs.columns:
            return result

        def batches() -> Iterator[pa.Table]:
            first = True
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except pa.ArrowInvalid as exc:
                    raise _NotPlain from exc
                if first:  # the header row
                    batch, first = batch.slice(1), False
                yield _converted(batch, exprs)

        result.rows = sink.batches(spec.table, batches())
    return result


def _parse_salvaging(path: Path, spec: CsvSpec, sink: TableSink, db: CsvDatabase) -> CsvResult:
    """``path`` read by DuckDB: malformed rows are skipped and reported by line."""
    from traceanalyzer.parse.duckdb_connect import duckdb_name

    copies: list[Path] = []
    try:
        long, source = _without_long_lines(path, db.scratch)
        copies.append(source)
        wide, source = _without_wide_rows(source, db.scratch)
        copies.append(source)
        rejected = [(line, "line size over maximum") for line in long]
        rejected += [(line, "too many columns") for line in wide]
        with duckdb_name(source) as name:
            return _read_salvaging(path, name, spec, sink, db, rejected)
    finally:
        for copy in copies:
            if copy != path:
                copy.unlink(missing_ok=True)


def _read_salvaging(
    path: Path,
    name: str,
    spec: CsvSpec,
    sink: TableSink,
    db: CsvDatabase,
    blanked: list[tuple[int, str]],
) -> CsvResult:
    """The file DuckDB opens as ``name`` (``path``, or its copy with the ``blanked`` lines
    empty: (line, why)) read by DuckDB."""
    import duckdb

    from traceanalyzer.parse.duckdb_connect import duckdb_reason

    con = db.cursor()
    try:
        try:
            relation = con.sql(_READ_CSV.format(options=""), params={"path": name})
        except duckdb.InvalidInputException:
            # the dialect sniffer gives up on some rows (bytes that are not UTF-8 in a row
            # with extra fields): without strict mode it reads them, and still rejects the
            # malformed ones by line; a file with none of our columns is no CSV of ours
            lenient = _READ_CSV.format(options=", strict_mode = false")
            relation = con.sql(lenient, params={"path": name})
            known = {source for col in spec.columns for source in col.sources}
            if not known & {c.strip() for c in relation.columns}:
                raise
        result, exprs = _plan(path, spec, list(relation.columns), generated=r"column\d+")
        if not exprs.columns:
            return result
        converted = (_converted(batch, exprs) for batch in _batches(relation))
        result.rows = sink.batches(spec.table, converted)
        try:
            rejected = con.execute(
                "SELECT line, min(lower(CAST(error_type AS VARCHAR))) FROM reject_errors "
                "GROUP BY line ORDER BY line"
            ).fetchall()
        except duckdb.CatalogException:  # the reader never ran
            rejected = []
        result.warnings += _rejected_rows(path, sorted(rejected + blanked))
    except duckdb.Error as exc:
        raise CsvRefused(f"DuckDB's CSV reader: {duckdb_reason(exc, 200)}") from exc
    finally:
        con.close()
    return result


_MAX_FIELD_BYTES = 16 << 20  # DuckDB's max_line_size above: a longer field fails there anyway
_SCAN_BYTES = 4 << 20  # less than _MAX_FIELD_BYTES: a chunk's inner lines are never too long


def _without_long_lines(path: Path, scratch: Path | None) -> tuple[list[int], Path]:
    """The lines longer than DuckDB takes, and the file to read on: a private copy with those
    lines blank (the line numbers kept), or ``path`` when there are none.

    Scanned a chunk at a time, never holding a line: such a line is most often no row at all
    but a file's tail that was never written (zeros where a crashed writer had reserved the
    space). DuckDB rejects a line of 17 MB in seconds, and one of 40 MB, more than its buffer,
    fails the whole file: the rows before it would be lost."""
    long: list[int] = []
    number, length = 1, 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_SCAN_BYTES):
            newlines = chunk.count(b"\n")
            if not newlines:
                length += len(chunk)
                continue
            if length + chunk.index(b"\n") > _MAX_FIELD_BYTES:
                long.append(number)
            number += newlines
            length = len(chunk) - chunk.rindex(b"\n") - 1
    if length > _MAX_FIELD_BYTES:
        long.append(number)
    if not long:
        return [], path
    return long, _copy_blanking(path, set(long), scratch)


def _copy_blanking(path: Path, lines: set[int], scratch: Path | None) -> Path:
    """A private copy of ``path`` with ``lines`` empty, written a chunk at a time."""
    fd, name = tempfile.mkstemp(suffix=".csv", dir=scratch)
    number = 1
    with open(path, "rb") as source, os.fdopen(fd, "wb") as copy:
        while chunk := source.read(_SCAN_BYTES):
            pieces = chunk.split(b"\n")
            for i, piece in enumerate(pieces):
                if number not in lines:
                    copy.write(piece)
                if i < len(pieces) - 1:
                    copy.write(b"\n")
                    number += 1
    return Path(name)


def _without_wide_rows(path: Path, scratch: Path | None) -> tuple[list[int], Path]:
    """The lines where rows of more fields than the header start, and the file to read: a
    private copy with those rows blank (their lines kept, so DuckDB's line numbers stay the
    file's), or ``path`` when there are none (or it is no CSV Python's reader can follow).

    DuckDB records one reject per extra field, in time that grows faster than their number
    (minutes and gigabytes for a row of 100,000). Such rows are malformed whatever their fields say, and counted as DuckDB would count them."""
    wide: list[tuple[int, int]] = []
    limit = csv.field_size_limit(_MAX_FIELD_BYTES)
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            rows = csv.reader(fh)
            width = len(next(rows, []))
            end = rows.line_num
            for row in rows:
                if len(row) > width:
                    wide.append((end + 1, rows.line_num))
                end = rows.line_num
    except csv.Error:
        return [], path  # DuckDB says what is wrong with it
    finally:
        csv.field_size_limit(limit)
    if not wide:
        return [], path
    blank = {line for first, last in wide for line in range(first, last + 1)}
    return [first for first, _ in wide], _copy_blanking(path, blank, scratch)


@dataclass
class _Conversion:
    """How a batch of a file (columns named ``f<position>``) becomes ``spec``'s columns: the
    expressions, and the µs columns (name, source), converted together (see :func:`_converted`)."""

    exprs: list[pl.Expr] = field(default_factory=list)
    us: list[tuple[str, str]] = field(default_factory=list)

    @property
    def columns(self) -> int:
        return len(self.exprs) + len(self.us)


def _plan(
    path: Path, spec: CsvSpec, columns: list[str], generated: str = ""
) -> tuple[CsvResult, _Conversion]:
    """The file's header, and how its columns (named ``f<position>``) become ``spec``'s.
    ``generated``: how the reader names a column whose header is empty."""
    columns = [c.strip() for c in columns]
    # A trailing comma on the header line names an empty last column: not data.
    while len(columns) > 1 and (
        not columns[-1] or (generated and re.fullmatch(generated, columns[-1]))
    ):
        columns.pop()
    result = CsvResult(header=columns)
    position = {name: i for i, name in reversed(list(enumerate(columns)))}
    used: set[int] = set()
    plan = _Conversion()
    exprs = plan.exprs
    for col in spec.columns:
        source = next((s for s in col.sources if s in position), None)
        if source is None:
            continue
        used.add(position[source])
        if col.kind == "us":
            plan.us.append((col.name, f"f{position[source]}"))
        else:
            exprs.append(canonical_text(pl.col(f"f{position[source]}"), col.kind).alias(col.name))
    # Unknown columns (PMU metrics, newer fields) are kept, as a JSON object in `extra`.
    unknown = [i for i in range(len(columns)) if i not in used and columns[i]]
    if unknown:
        keys = _unique([columns[i] for i in unknown])
        fields = [
            pl.col(f"f{i}").str.strip_chars("\t ").alias(key)
            for i, key in zip(unknown, keys, strict=True)
        ]
        exprs.append(pl.struct(fields).struct.json_encode().alias("extra"))
    if not used:  # not the file we expect (another tool's CSV, a wrong name): say so
        result.warnings.append(
            f"{path}: none of the expected columns found (header: {', '.join(columns)[:200]})"
        )
    return result, plan


def _unique(names: list[str]) -> list[str]:
    """``names`` with a repeated one suffixed ``_1``, ``_2`` ... (as DuckDB names them)."""
    seen: set[str] = set()
    unique = []
    for name in names:
        key, n = name, 0
        while key in seen:
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        unique.append(key)
    return unique


def _converted(batch: pa.RecordBatch, plan: _Conversion) -> pa.Table:
    """One batch of the file (columns by position) in the table's columns. The µs columns are
    converted as one series (their texts end to end): the conversion's cost is mostly per
    call, and a file has up to eight of them."""
    named = batch.rename_columns([f"f{i}" for i in range(batch.num_columns)])
    frame = pl.from_arrow(named)
    out = frame.select(plan.exprs) if plan.exprs else pl.DataFrame(height=frame.height)
    if plan.us:
        texts = frame.select(_null_text(pl.col(source)).alias(name) for name, source in plan.us)
        ns = us_series_to_ns(pl.concat(texts.get_columns(), rechunk=True))
        out = out.with_columns(
            ns.slice(i * frame.height, frame.height).alias(name)
            for i, (name, _) in enumerate(plan.us)
        )
    return arrow_table(out)
