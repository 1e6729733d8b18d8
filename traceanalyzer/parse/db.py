"""Db exports (``ascend_pytorch_profiler_{rank}.db``, ``analysis.db``) → the canonical tables.

torch_npu's ``export_type=Db`` writes the data of a Text export as SQLite: events as rows with
int64 ns times, names as ids into ``STRING_IDS``, codes named by ``ENUM_*`` tables, flows as
connection ids. This reader fills the tables the Text readers fill, with the process, thread
and stream naming a Text export of the same session has (``Python``, ``CANN``, ``Ascend
Hardware``, ``HCCL``/``Communication``; ``Thread <tid>``, ``Stream <id>``, ``Plane <n>``; msprof's
pids ``(os_pid << 10) | (sort_index << 5) | device``) and the args keys its events carry, so
rules, reports and ``diff`` cannot tell which format a rank came from. ``docs/schema.md`` says,
for every column, where it comes from in both formats.

The database is opened strictly read-only (``mode=ro&immutable=1``): SQLite takes no lock and
writes no journal, WAL or shared-memory file next to it. A ``-wal`` or ``-journal`` file beside
the database means a writer is (or was, when it crashed) mid-transaction: the file is refused
as locked rather than read half-written.

Speed: each table is one plain scan of the columns needed, read through the ADBC SQLite driver
as Arrow columns (no Python object per value) that polars adopts; ids become names through
``STRING_IDS`` and the ``ENUM_*`` tables as vectorised replacements, and joins (task infos,
call stacks, flows) are polars hash joins.

Tolerance: an absent table is "not collected" (its canonical table stays empty), an absent
column becomes nulls, unknown columns are ignored; a file that is not SQLite, is damaged, or
whose ``META_DATA`` schema major version is newer than the ones known here is refused with the
reason (:class:`DbUnreadable`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import adbc_driver_manager
import adbc_driver_sqlite
import polars as pl
import pyarrow as pa

from traceanalyzer.parse.rows import ROW_GROUP_ROWS, made_ahead, stable_order
from traceanalyzer.parse.sink import TableSink, arrow_table, body_columns
from traceanalyzer.parse.trace_shared import CURRENT_SORT_INDEX, G2_SORT_INDEX, SENTINELS
from traceanalyzer.timeutil import float_ms_to_ns, float_us_to_ns, us_expr_to_ns
from traceanalyzer.vocabulary import CORE_TASK_TYPE

# META_DATA SCHEMA_VERSION majors this reader knows (1.x: torch_npu 2.1 .. 2.8).
KNOWN_SCHEMA_MAJORS = (1,)
# Without these the file is not a torch_npu profiler database, whatever its name.
_REQUIRED_TABLES = ("STRING_IDS",)
_EVENT_TABLES = ("PYTORCH_API", "CANN_API", "TASK")

_CURRENT_HOST_DEVICE = 31  # current msprof writes the host layers' pids with device bits 31

# CANN_API levels (ENUM_API_TYPE names) → the name prefix of the Text export's CANN events.
_LAYER = {
    "acl": "AscendCL",
    "model": "Model",
    "node": "Node",
    "runtime": "Runtime",
    "hccl": "Hccl",
    "communication": "Communication",
}
# PYTORCH_API types (ENUM_API_TYPE names) → chrome-trace category of the Text export.
_PYTORCH_CAT = {"op": "cpu_op", "trace": "python_function", "mstx": "mstx"}
# TASK.taskType is the runtime's task type; the Text export's `Task Type` is the hardware
# queue's (SQE) type. Compute tasks take theirs from COMPUTE_TASK_INFO (AI_CORE, MIX_AIV, ...).
_SQE_TYPE = {
    "KERNEL_AICORE": "AI_CORE",
    "KERNEL_AIVEC": "AI_CORE",
    "KERNEL_MIX_AIC": "MIX_AIC",
    "KERNEL_MIX_AIV": "MIX_AIV",
    "EVENT_RECORD": "EVENT_RECORD_SQE",
    "EVENT_WAIT": "EVENT_WAIT_SQE",
    "EVENT_RESET": "EVENT_RESET_SQE",
    "NOTIFY_RECORD": "NOTIFY_RECORD_SQE",
    "NOTIFY_WAIT": "NOTIFY_WAIT_SQE",
    "MEMCPY_ASYNC": "PCIE_DMA_SQE",
    "PROFILING_ENABLE": "PLACE_HOLDER_SQE",
    "PROFILING_DISABLE": "PLACE_HOLDER_SQE",
    "STARS_COMMON": "DSA_SQE",
}
# COMPUTE_TASK_INFO.taskType (the op's core) → `Task Type` of the Text export's device task.
_COMPUTE_SQE = CORE_TASK_TYPE
OVERLAP_THREADS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
_MB = float(1 << 20)
# TASK_PMU_INFO metric names → kernel_details.csv column names (the `extra` keys); other
# `*_time` metrics get a `(us)` suffix, as the CSV's do.
_PMU_RENAMED = {"aic_total_time": "aicore_time(us)", "aiv_total_time": "aiv_time(us)"}
I32, I64, F64, STR, CAT = pl.Int32(), pl.Int64(), pl.Float64(), pl.String(), pl.Categorical()
_SQL_TYPES = {I64: "INTEGER", F64: "REAL", STR: "TEXT"}
_POLARS = {"int32": I32, "int64": I64, "double": F64}
_SMALL_ROWS = 1 << 16  # at least the rows of a query that is not a table scan


def _schema(table: str, **work: pl.DataType) -> dict[str, pl.DataType]:
    """The polars types of a canonical table's body columns, plus working columns."""
    return {n: _POLARS.get(str(t), STR) for n, t in body_columns(table)} | work


class DbUnreadable(Exception):
    """The database cannot be read: not SQLite, damaged, being written, or an unknown schema."""


@dataclass
class DbResult:
    """What the Db reader found, for the session row and the outcome."""

    rows: dict[str, int] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    processes: list[str] = field(default_factory=list)
    schema_version: str | None = None
    generation: str = "g2"
    device_id: int | None = None
    hostname: str | None = None
    os_pid: int | None = None
    # META_DATA (ENV_VARIABLES decoded), SESSION_TIME_INFO and NPU_INFO, for the sessions row.
    metadata: dict[str, Any] = field(default_factory=dict)
    # The META_DATA keys a Text export writes to profiler_metadata.json (ENV_VARIABLES,
    # parallel_group_info, prof.add_metadata keys), decoded.
    profiler_metadata: dict[str, Any] = field(default_factory=dict)
    # Db tables absent from the file: what they would fill was not collected.
    not_collected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Files read in part or not at all, as "file (why)": analysis.db when it is unreadable.
    incomplete: list[str] = field(default_factory=list)
    reader: str = "db"


class _Connection:
    """A read-only ADBC connection to one SQLite file: queries come back as Arrow tables, built
    in C without a Python object per value (Python's sqlite3 builds one per value: 2-5x the
    time of a whole scan here)."""

    def __init__(self, path: Path):
        self.path = path
        uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
        self._database = adbc_driver_sqlite.connect(uri)
        try:
            self._connection = adbc_driver_manager.AdbcConnection(self._database)
        except adbc_driver_manager.Error:
            self._database.close()
            raise

    def arrow(self, sql: str, rows: int | None = None) -> pa.Table:
        """The result of ``sql``. The driver types each column from the first batch it reads;
        ``rows`` (at least the result's row count) makes that batch the whole result, so a
        column null in its first rows and a number later is still typed by its values."""
        statement = adbc_driver_manager.AdbcStatement(self._connection)
        try:
            if rows is not None:
                statement.set_options(**{"adbc.sqlite.query.batch_rows": str(max(rows, 1))})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            return pa.RecordBatchReader._import_from_c(stream.address).read_all()
        except (adbc_driver_manager.Error, pa.ArrowException, OSError) as exc:
            # A page that fails mid-scan surfaces from the stream: as the driver's error or
            # Arrow's (its I/O error is an OSError).
            raise DbUnreadable(f"{self.path}: {_what(exc)} ({_reason(exc)})") from exc
        finally:
            statement.close()

    def close(self) -> None:
        self._connection.close()
        self._database.close()


def _reason(exc: Exception) -> str:
    """The driver's message without its status prefix and the query it appends."""
    text = str(exc).split("\nquery:")[0]
    return text.split("[SQLite] ", 1)[-1]


def _what(exc: Exception) -> str:
    """What an error says of the file: SQLite's own pages "malformed" are damaged (a truncated
    or torn copy); anything else ("file is not a database") is not SQLite at all."""
    return "damaged database" if "malformed" in str(exc) else "not a readable SQLite database"


def connect_readonly(path: Path) -> _Connection:
    """Open ``path`` read-only, without locks or side files; raise DbUnreadable with the reason."""
    for suffix in ("-wal", "-journal"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            raise DbUnreadable(
                f"{path}: locked: {side.name} beside it means a writer is (or crashed) "
                "mid-transaction; re-run once the profiler's export has finished"
            )
    try:
        con = _Connection(path)
    except adbc_driver_manager.Error as exc:
        raise DbUnreadable(f"{path}: {_what(exc)} ({_reason(exc)})") from exc
    try:
        con.arrow("PRAGMA query_only = 1")
        con.arrow("SELECT count(*) FROM sqlite_master")
    except DbUnreadable:
        con.close()
        raise
    return con


class _Db:
    """One open database: its tables and columns, typed scans, and the names of its ids."""

    def __init__(self, path: Path):
        self.path = path
        self.con = connect_readonly(path)
        try:
            listing = self.con.arrow(
                "SELECT m.name AS tbl, CAST(c.name AS TEXT) AS col FROM sqlite_master AS m "
                "LEFT JOIN pragma_table_info(m.name) AS c WHERE m.type IN ('table', 'view')",
                rows=_SMALL_ROWS,
            )
        except DbUnreadable:
            self.con.close()
            raise
        self.columns: dict[str, set[str]] = {}
        for table, column in zip(
            listing["tbl"].to_pylist(), listing["col"].to_pylist(), strict=True
        ):
            names = self.columns.setdefault(table, set())
            if column is not None:
                names.add(column)

    def has(self, table: str) -> bool:
        return table in self.columns

    def has_column(self, table: str, column: str) -> bool:
        return column in self.columns.get(table, ())

    def scan(self, table: str, **columns: tuple[str, pl.DataType]) -> pl.DataFrame:
        """``alias=(column, type)`` of every row of ``table``, in rowid order. A column the
        table lacks (another release) is null; values are cast in SQLite (PYTORCH_API keeps
        its times as text), so a column always has its type."""
        exprs = []
        for alias, (column, dtype) in columns.items():
            if column != "rowid" and not self.has_column(table, column):
                exprs.append(f'NULL AS "{alias}"')
                continue
            source = "rowid" if column == "rowid" else f'"{column}"'
            exprs.append(f'CAST({source} AS {_SQL_TYPES[dtype]}) AS "{alias}"')
        rows = self.value(f'SELECT count(*) FROM "{table}"')
        data = self.con.arrow(f'SELECT {", ".join(exprs)} FROM "{table}" ORDER BY rowid', rows)
        return pl.DataFrame(data).cast({alias: dtype for alias, (_, dtype) in columns.items()})

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of a small query (a few rows: probes, META_DATA), as Python values."""
        data = self.con.arrow(sql, rows=_SMALL_ROWS)
        return list(
            zip(*(data.column(i).to_pylist() for i in range(data.num_columns)), strict=True)
        )

    def value(self, sql: str) -> Any:
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    @cached_property
    def _strings(self) -> pl.DataFrame:
        strings = self.scan("STRING_IDS", id=("id", I64), value=("value", STR))
        return strings.with_columns(_json_text(pl.col("value")).alias("json"))

    def text(self, ids: pl.Expr) -> pl.Expr:
        """The STRING_IDS text of an id column."""
        return ids.replace_strict(
            self._strings["id"], self._strings["value"], default=None, return_dtype=STR
        )

    def quoted(self, ids: pl.Expr) -> pl.Expr:
        """The STRING_IDS text of an id column as a JSON string literal."""
        return ids.replace_strict(
            self._strings["id"], self._strings["json"], default=None, return_dtype=STR
        )

    def enum(self, table: str, codes: pl.Expr) -> pl.Expr:
        """The name an ``ENUM_*`` table gives a code column (the code as text without one)."""
        if not self.has(table):
            return codes.cast(STR)
        names = self.scan(table, id=("id", I64), name=("name", STR))
        return codes.replace_strict(names["id"], names["name"], default=None, return_dtype=STR)

    @cached_property
    def task_rows(self) -> pl.DataFrame:
        """TASK, read once for the device slices, the communication planes and the kernels."""
        columns = {
            "global_task_id": ("globalTaskId", I64),
            "start_ns": ("startNs", I64),
            "end_ns": ("endNs", I64),
            "device_id": ("deviceId", I64),
            "raw_connection_id": ("connectionId", I64),
            "stream_id": ("streamId", I64),
            "task_id": ("taskId", I64),
            "raw_model_id": ("modelId", I64),
            "context_id": ("contextId", I64),
            "runtime_type_id": ("taskType", I64),
        }
        if not self.has("TASK"):
            return pl.DataFrame(schema={alias: dtype for alias, (_, dtype) in columns.items()})
        return self.scan("TASK", **columns)

    @cached_property
    def compute(self) -> pl.DataFrame | None:
        """COMPUTE_TASK_INFO (None when the table is absent)."""
        if not self.has("COMPUTE_TASK_INFO"):
            return None
        return self.scan("COMPUTE_TASK_INFO", **_COMPUTE_COLUMNS)

    @cached_property
    def tasks(self) -> pl.DataFrame:
        """TASK with its COMPUTE_TASK_INFO (null for the tasks without)."""
        if self.compute is None:
            return self.task_rows
        return self.task_rows.join(
            self.compute, on="global_task_id", how="left", maintain_order="left"
        )

    @cached_property
    def comm_groups(self) -> pl.DataFrame:
        """The communication groups (:func:`_comm_groups`), made once for the op and plane
        slices."""
        return _comm_groups(self)

    def close(self) -> None:
        self.con.close()


# COMPUTE_TASK_INFO columns (ids of STRING_IDS unless a number), under the kernels names.
_COMPUTE_COLUMNS: dict[str, tuple[str, pl.DataType]] = {
    "global_task_id": ("globalTaskId", I64),
    "name_id": ("name", I64),
    "type_id": ("opType", I64),
    "compute_type_id": ("taskType", I64),
    "block_dim": ("blockDim", I64),
    "block_num": ("blockNum", I64),
    "mix_block_dim": ("mixBlockDim", I64),
    "mix_block_num": ("mixBlockNum", I64),
    "wait_ns": ("waitNs", I64),
    "op_state_id": ("opState", I64),
    "hf32_eligible_id": ("hf32Eligible", I64),
    "input_shapes_id": ("inputShapes", I64),
    "input_data_types_id": ("inputDataTypes", I64),
    "input_formats_id": ("inputFormats", I64),
    "output_shapes_id": ("outputShapes", I64),
    "output_data_types_id": ("outputDataTypes", I64),
    "output_formats_id": ("outputFormats", I64),
}


@dataclass
class _Layout:
    """Pids and names of the processes, as the Text export of the session numbers them."""

    os_pid: int
    device: int
    generation: str
    comm_process: str

    def sort_index(self, process: str) -> int:
        table = CURRENT_SORT_INDEX if self.generation == "current" else G2_SORT_INDEX
        return table[process]

    def pid(self, process: str) -> int:
        if process == "Python":
            return self.os_pid
        dev = self.device
        if process == "CANN" and self.generation == "current":
            dev = _CURRENT_HOST_DEVICE
        return (self.os_pid << 10) | (self.sort_index(process) << 5) | dev

    def label(self, process: str) -> str:
        if process in ("Python", "CANN"):
            return "CPU"
        return f"NPU {self.device}" if self.generation in ("g3", "current") else "NPU"


def _schema_version(db: _Db) -> str | None:
    if not (db.has_column("META_DATA", "name") and db.has_column("META_DATA", "value")):
        return None
    return db.value("SELECT value FROM META_DATA WHERE name = 'SCHEMA_VERSION'")


def _check_schema(db: _Db, version: str | None) -> None:
    missing = [t for t in _REQUIRED_TABLES if not db.has(t)]
    if missing or not any(db.has(t) for t in _EVENT_TABLES):
        raise DbUnreadable(
            f"{db.path}: unknown schema: no {', '.join(missing or _EVENT_TABLES)} table "
            "(not a torch_npu profiler database?)"
        )
    major = (version or "").split(".")[0]
    if major.isdigit() and int(major) not in KNOWN_SCHEMA_MAJORS:
        raise DbUnreadable(
            f"{db.path}: unknown schema version {version} (this traceanalyzer reads "
            f"{', '.join(f'{m}.x' for m in KNOWN_SCHEMA_MAJORS)}); upgrade traceanalyzer or "
            "re-export as text"
        )


def _generation(db: _Db) -> str:
    """Name the generation from the schema: `communication` level and `blockNum` came later."""
    if db.has_column("COMPUTE_TASK_INFO", "blockNum"):
        return "current"
    levels = set()
    if db.has_column("ENUM_API_TYPE", "name"):
        levels = {r[0] for r in db.rows("SELECT CAST(name AS TEXT) FROM ENUM_API_TYPE")}
    return "g3" if "communication" in levels else "g2"


def _layout(db: _Db, generation: str) -> _Layout:
    os_pid = None
    for table, column, shift in (
        ("PYTORCH_API", "globalTid", 32),
        ("CANN_API", "globalTid", 32),
        ("TASK", "globalPid", 0),
    ):
        if os_pid is None and db.has_column(table, column):
            os_pid = db.value(f"SELECT {column} >> {shift} FROM {table} LIMIT 1")
    device = None
    if db.has_column("TASK", "deviceId"):
        device = db.value("SELECT deviceId FROM TASK LIMIT 1")
    if device is None and db.has_column("RANK_DEVICE_MAP", "deviceId"):
        device = db.value("SELECT deviceId FROM RANK_DEVICE_MAP LIMIT 1")
    comm = "Communication" if generation in ("g3", "current") else "HCCL"
    return _Layout(int(os_pid or 0), int(device or 0), generation, comm)


def parse_db(
    profiler_db: Path | None, analysis_db: Path | None, sink: TableSink, threads: int = 1
) -> DbResult:
    """Fill every canonical table a Db export has data for (except ``sessions``) into ``sink``,
    reading on up to ``threads`` connections at once.

    Raises DbUnreadable when the profiler database cannot be read at all; a damaged
    ``analysis.db`` only leaves its tables empty, with a warning.
    """
    result = DbResult()
    if profiler_db is not None:
        db = _Db(profiler_db)
        try:
            result.schema_version = _schema_version(db)
            _check_schema(db, result.schema_version)
            result.generation = _generation(db)
            layout = _layout(db, result.generation)
            result.device_id, result.os_pid = layout.device, layout.os_pid or None
            _session_facts(db, result)
        finally:
            db.close()
        _profiler_tables(profiler_db, layout, sink, result, threads)
        result.not_collected.sort()  # the readers ran side by side
    if analysis_db is not None:
        try:
            adb = _Db(analysis_db)
            try:
                _analysis_tables(adb, sink, result)
            finally:
                adb.close()
        except DbUnreadable as exc:
            result.warnings.append(f"{exc}; its step and communication tables are empty")
            result.incomplete.append(f"{analysis_db.name} (unreadable)")
    return result


def _session_facts(db: _Db, result: DbResult) -> None:
    """The host and the session's own records (META_DATA, SESSION_TIME_INFO, NPU_INFO); the
    rank is discovery's (RANK_DEVICE_MAP when nothing else tells it)."""
    if db.has_column("HOST_INFO", "hostName"):
        result.hostname = db.value("SELECT hostName FROM HOST_INFO LIMIT 1")
    if db.has_column("META_DATA", "name") and db.has_column("META_DATA", "value"):
        meta = "SELECT CAST(name AS TEXT), CAST(value AS TEXT) FROM META_DATA"
        for name, value in db.rows(meta):
            if str(name).startswith("SCHEMA_VERSION"):
                continue
            try:
                result.metadata[name] = json.loads(value) if name == "ENV_VARIABLES" else value
                # torch_npu keeps each profiler_metadata.json key here, its value as JSON.
                result.profiler_metadata[name] = json.loads(value)
            except ValueError:
                result.metadata[name] = value
    if db.has("SESSION_TIME_INFO"):
        rows = db.con.arrow("SELECT * FROM SESSION_TIME_INFO LIMIT 1").to_pylist()
        result.metadata |= {f"SESSION_TIME_INFO.{n}": v for n, v in (rows or [{}])[0].items()}
    if db.has_column("NPU_INFO", "name"):
        result.metadata["NPU_INFO"] = db.value("SELECT name FROM NPU_INFO LIMIT 1")


def _profiler_tables(
    path: Path, layout: _Layout, sink: TableSink, result: DbResult, threads: int
) -> None:
    # Three readers side by side, each on its own connection: the driver steps SQLite and
    # polars computes without the GIL. The device reader keeps TASK for all its tables. A table
    # nothing else needs is written where it is made, so that it is not held until the end.
    def device(db: _Db) -> list[pl.DataFrame | None]:
        kernels = _kernels(db, result)
        if kernels is not None:
            made = {"kernels": kernels}
            if kernels["type"].is_not_null().any():  # Level0 records no op types: no statistic
                made["op_stats"] = _op_stats(kernels, layout)
            _store(sink, result, made)
        return [
            _cann_slices(db, layout, result),
            _task_slices(db, layout, result),
            _comm_op_slices(db, layout),
            _plane_slices(db, layout),
            _overlap_slices(db, layout, result),
        ]

    def rest(db: _Db) -> tuple[pl.DataFrame, pl.DataFrame | None, pl.DataFrame]:
        counters = _counters(db, layout, result)
        memory = {
            "memory_records": _memory_records(db, result),
            "op_memory": _op_memory(db, result),
            "module_memory": _module_memory(db, result),
        }
        result.rows["counters"] = _write(sink, "counters", counters, _counter_order(counters))
        _store(sink, result, memory)
        counter_threads = counters.select("process", "pid", "tid").unique()
        counter_threads = counter_threads.with_columns(pl.col("process").cast(STR))
        return counter_threads, _connection_cats_table(db), _connection_ids(db)

    python, device_slices, (counter_threads, cats, connection_ids) = _in_parallel(
        path, threads, (lambda db: [_python_slices(db, layout, result)], device, rest)
    )
    slices = _slices([*python, *device_slices])
    del python, device_slices  # the parts, now chunks of the slices
    links = _python_links(slices, connection_ids)
    if slices.height:
        result.start_ns = slices["start_ns"].min()
        result.end_ns = slices["end_ns"].max()
    processes = pl.concat([slices["process"].cast(STR), counter_threads["process"]]).unique()
    result.processes = sorted(processes.to_list())
    tables: dict[str, pl.DataFrame | None] = {
        "flows": _flows(layout, slices, links, cats),
        "threads": _threads(layout, slices, counter_threads),
    }
    if (slices["process"] == "CANN").any():
        tables["api_stats"] = _api_stats(slices, layout)
    _store(sink, result, tables)
    # The slices last, alone: their row groups' gathers beside the joins above would add up at
    # the peak (about 25 MB on the benchmark's Db twin), for no time saved on a busy machine.
    result.rows["slices"] = _write(sink, "slices", slices, _slice_order(slices))


def _store(sink: TableSink, result: DbResult, tables: dict[str, pl.DataFrame | None]) -> None:
    """Write each of ``tables`` (in file order) that was read, and count its rows."""
    for name, frame in tables.items():
        if frame is not None:
            result.rows[name] = _write(sink, name, frame, None)


_ARGS_ROWS = 1 << 15  # Python slices whose args are built at once


def _write(sink: TableSink, table: str, frame: pl.DataFrame, order: pl.Series | None) -> int:
    """Store ``frame`` (in ``order``, a permutation of its rows, when given), gathered and
    converted to Arrow a row group at a time: a sorted copy of a large table, or its Arrow
    copy (text columns are converted), would double its memory. The reader's working columns
    (not in the table's schema) are not gathered."""
    canonical = {name for name, _ in body_columns(table)}
    frame = frame.select(c for c in frame.columns if c in canonical)
    if order is None and frame.height <= ROW_GROUP_ROWS:
        return sink.arrow(table, arrow_table(frame))

    def part(start: int) -> pa.Table:
        if order is None:
            return arrow_table(frame.slice(start, ROW_GROUP_ROWS))
        return arrow_table(frame[order.slice(start, ROW_GROUP_ROWS)])

    makers = (partial(part, start) for start in range(0, frame.height, ROW_GROUP_ROWS))
    return sink.batches(table, made_ahead(makers))


def _in_parallel(path: Path, threads: int, jobs: tuple[Callable[[_Db], Any], ...]) -> list[Any]:
    """Each job's result, each run on its own connection to ``path``."""

    def run(job: Callable[[_Db], Any]) -> Any:
        db = _Db(path)
        try:
            return job(db)
        finally:
            db.close()

    if threads <= 1:
        return [run(job) for job in jobs]
    with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
        return list(pool.map(run, jobs))


def _collected(db: _Db, result: DbResult, *tables: str) -> bool:
    """True when every one of ``tables`` is in the database; else it is noted as not collected."""
    absent = [t for t in tables if not db.has(t)]
    result.not_collected += [f"{t} (table absent from {db.path.name})" for t in absent]
    return not absent


_INT64_SENTINELS = [v for v in SENTINELS if v < 1 << 63]


def _no_sentinel(value: pl.Expr) -> pl.Expr:
    """msprof's "none" (4294967295) as null."""
    return pl.when(value.is_in(_INT64_SENTINELS)).then(None).otherwise(value)


# --------------------------------------------------------------------------- slices

# Slices keep the PYTORCH_API rowid and connectionId of their row (flows attach by them); the
# sink drops them. Their names are dictionary-encoded (Categorical): each held once, not once
# per row, and written to Parquet as the dictionary they are (as the Text reader writes them).
_SLICE_NAMES = ("ph", "process", "thread", "name", "cat")
_SLICES = _schema("slices", api_row=I64, link_id=I64) | dict.fromkeys(_SLICE_NAMES, CAT)


def _slices(parts: list[pl.DataFrame | None]) -> pl.DataFrame:
    """Every slice, in reading order: the parts' chunks, not copied (sorted as they are written)."""
    frames = [pl.DataFrame(schema=_SLICES), *(p for p in parts if p is not None)]
    return pl.concat(frames, rechunk=False)


def _slice_order(slices: pl.DataFrame) -> pl.Series:
    """trace_view.json's order: by time, parents (longer) before children."""
    return stable_order(
        slices, ["start_ns", "dur_ns", "pid", "tid", "name"], [False, True, False, False, False]
    )


def _conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return frame.select(
        pl.col(n).cast(t) if n in frame.columns else pl.lit(None, dtype=t).alias(n)
        for n, t in schema.items()
    )


def _with_names(
    frame: pl.DataFrame, layout: _Layout, process: str, thread: pl.Expr
) -> pl.DataFrame:
    """The slices of one process, named, without the reader's working columns."""
    named = frame.with_columns(
        pl.lit("X").alias("ph"),
        pl.lit(process).alias("process"),
        pl.lit(layout.pid(process), dtype=I64).alias("pid"),
        thread.alias("thread"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
    )
    return _conform(named, _SLICES)


def _json_text(value: pl.Expr) -> pl.Expr:
    """``value`` as a JSON string literal (quoted and escaped)."""
    return pl.struct(value.alias("v")).struct.json_encode().str.slice(5).str.head(-1)


def _json_args(*pairs: tuple[str, pl.Expr, bool | None]) -> pl.Expr:
    """The args object of each row, as trace_view.json spells it: (key, value, is_text) in the
    Text export's key order, null values left out, null when none is left. ``is_text`` None:
    the value is JSON already (STRING_IDS texts are escaped once, :meth:`_Db.quoted`)."""
    parts = []
    for key, value, is_text in pairs:
        if is_text:
            value = pl.when(value.is_not_null()).then(_json_text(value))
        elif is_text is not None:
            value = value.cast(STR)
        parts.append(pl.lit(f'"{key}": ') + value)  # a null value leaves its pair out
    body = pl.concat_str(parts, separator=", ", ignore_nulls=True)
    return pl.when(body != "").then(pl.lit("{") + body + pl.lit("}"))


def _python_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "PYTORCH_API"):
        return None
    shapes, dtypes = "inputShapes", "inputDtypes"
    if _shapes_swapped(db):
        shapes, dtypes = dtypes, shapes
    frame = db.scan(
        "PYTORCH_API",
        api_row=("rowid", I64),
        start_ns=("startNs", I64),
        end_ns=("endNs", I64),
        global_tid=("globalTid", I64),
        name_id=("name", I64),
        kind_id=("type", I64),
        seq=("sequenceNumber", I64),
        fwd=("fwdThreadId", I64),
        dims_id=(shapes, I64),
        types_id=(dtypes, I64),
        callchain=("callchainId", I64),
        link_id=("connectionId", I64),
    )
    frame = frame.join(_call_stacks(db), on="callchain", how="left", maintain_order="left")
    frame = frame.join(_correlations(db), on="link_id", how="left", maintain_order="left")
    frame = frame.with_columns(
        db.text(pl.col("name_id")).alias("name"),
        db.enum("ENUM_API_TYPE", pl.col("kind_id")).alias("kind"),
        (pl.col("global_tid") & 0xFFFFFFFF).alias("tid"),
    )
    op_args = _json_args(
        ("Sequence number", pl.col("seq").fill_null(-1), False),
        ("Fwd thread id", pl.col("fwd").fill_null(0), False),
        ("Input Dims", db.quoted(pl.col("dims_id")), None),
        ("Input type", db.quoted(pl.col("types_id")), None),
        ("Call stack", pl.col("stack"), None),
    )
    queue_args = _json_args(("correlation_id", pl.col("correlation"), False))
    is_op, is_queue = pl.col("kind") == "op", pl.col("kind") == "queue"
    enqueue = (
        pl.when(pl.col("name") == "Enqueue").then(pl.lit("enqueue")).otherwise(pl.lit("dequeue"))
    )
    cat = (
        pl.when(is_queue)
        .then(enqueue)
        .otherwise(pl.col("kind").replace_strict(_PYTORCH_CAT, default=pl.col("kind")))
    )
    frame = frame.with_columns(cat.alias("cat"))
    # The args of each kind built on its rows only (python_function events have none), a
    # block of rows at a time: the JSON fragments of all rows at once (call stacks are long)
    # would take twice the memory of the result.
    thread = pl.format("Thread {}", pl.col("tid"))
    blocks = []
    for block in frame.iter_slices(_ARGS_ROWS):
        ops = block.filter(is_op).with_columns(op_args.alias("args"))
        queues = block.filter(is_queue).with_columns(queue_args.alias("args"))
        rest = block.filter(~is_op & ~is_queue).with_columns(pl.lit(None, dtype=STR).alias("args"))
        named = [_with_names(part, layout, "Python", thread) for part in (ops, queues, rest)]
        blocks.append(pl.concat(named).sort("api_row"))
    return pl.concat([pl.DataFrame(schema=_SLICES), *blocks], rechunk=False)


def _call_stacks(db: _Db) -> pl.DataFrame:
    """callchain id → its frames, joined as trace_view.json's `Call stack` joins them, as a
    JSON string literal (each frame's text is escaped once, in STRING_IDS)."""
    if not db.has("PYTORCH_CALLCHAINS"):
        return pl.DataFrame(schema={"callchain": I64, "stack": STR})
    frames = db.scan(
        "PYTORCH_CALLCHAINS",
        callchain=("id", I64),
        frame_id=("stack", I64),
        depth=("stackDepth", I64),
    )
    return (
        frames.sort("callchain", "depth", maintain_order=True)
        .group_by("callchain", maintain_order=True)
        .agg(db.quoted(pl.col("frame_id")).str.slice(1).str.head(-1).str.join(r";\r\n"))
        .select("callchain", (pl.lit('"') + pl.col("frame_id") + pl.lit('"')).alias("stack"))
    )


def _correlations(db: _Db) -> pl.DataFrame:
    """CONNECTION_IDS id → the first connection id it lists (an enqueue's correlation id)."""
    if not db.has("CONNECTION_IDS"):
        return pl.DataFrame(schema={"link_id": I64, "correlation": I64})
    links = db.scan("CONNECTION_IDS", link_id=("id", I64), correlation=("connectionId", I64))
    return links.unique("link_id", keep="first", maintain_order=True)


def _shapes_swapped(db: _Db) -> bool:
    """torch_npu 2.1-2.5 write the type list into inputShapes and the dims into inputDtypes; a
    shape never holds a letter, so one that does tells the columns are swapped."""
    if not (
        db.has_column("PYTORCH_API", "inputShapes") and db.has_column("PYTORCH_API", "inputDtypes")
    ):
        return False
    return bool(
        db.value(
            "SELECT EXISTS (SELECT 1 FROM STRING_IDS WHERE value GLOB '*[A-Za-z]*' AND id IN "
            "(SELECT inputShapes FROM PYTORCH_API WHERE inputShapes IS NOT NULL LIMIT 1000))"
        )
    )


def _cann_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "CANN_API"):
        return None
    frame = db.scan(
        "CANN_API",
        start_ns=("startNs", I64),
        end_ns=("endNs", I64),
        global_tid=("globalTid", I64),
        name_id=("name", I64),
        level_id=("type", I64),
        connection_id=("connectionId", I64),
    )
    layer = pl.col("api_level").replace_strict(_LAYER, default=pl.col("api_level"))
    # The Text export's `id`: the API's name at the AscendCL level, "0" below it.
    api_id = pl.when(pl.col("api_level") == "acl").then(pl.col("api_name")).otherwise(pl.lit("0"))
    frame = frame.with_columns(
        db.text(pl.col("name_id")).alias("api_name"),
        db.enum("ENUM_API_TYPE", pl.col("level_id")).alias("api_level"),
        (pl.col("global_tid") & 0xFFFFFFFF).alias("tid"),
    ).with_columns(
        layer.alias("api_layer"),
        pl.format("{}@{}", layer, pl.col("api_name")).alias("name"),
        api_id.alias("api_id"),
        _json_args(
            ("Thread Id", pl.col("tid"), False),
            ("level", pl.col("api_level"), True),
            ("id", api_id, True),
            ("connection_id", pl.col("connection_id"), False),
        ).alias("args"),
    )
    return _with_names(frame, layout, "CANN", pl.format("Thread {}", pl.col("tid")))


def _task_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "TASK"):
        return None
    runtime_type = db.text(pl.col("runtime_type_id"))
    compute_type = pl.lit(None, dtype=STR)
    if "compute_type_id" in db.tasks.columns:
        compute_type = db.text(pl.col("compute_type_id"))
    sqe = (
        pl.when(compute_type.is_not_null())
        .then(compute_type.replace(_COMPUTE_SQE))
        .otherwise(runtime_type.replace(_SQE_TYPE))
    )
    name = runtime_type
    if "name_id" in db.tasks.columns:
        name = pl.coalesce(db.text(pl.col("name_id")), runtime_type)
    frame = db.tasks.with_columns(
        name.alias("name"),
        sqe.alias("task_type"),
        pl.col("stream_id").alias("tid"),
        _no_sentinel(pl.col("raw_model_id")).alias("model_id"),
        _no_sentinel(pl.col("raw_connection_id")).alias("connection_id"),
    ).with_columns(
        _json_args(
            ("Model Id", pl.col("raw_model_id"), False),
            ("Task Type", pl.col("task_type"), True),
            ("Physic Stream Id", pl.col("stream_id"), False),
            ("Task Id", pl.col("task_id"), False),
            ("Subtask Id", pl.col("context_id"), False),
            ("connection_id", pl.col("raw_connection_id"), False),
        ).alias("args")
    )
    return _with_names(frame, layout, "Ascend Hardware", pl.format("Stream {}", pl.col("tid")))


def _comm_groups(db: _Db) -> pl.DataFrame:
    """Group id → its index and the tid of its op thread: one `Group <i> Communication` thread
    per group, in order of first op, followed by its `Plane <n>` threads (op thread + 1 + n)."""
    schema = {"group_id": I64, "group_index": I64, "group_tid": I64}
    if not db.has("COMMUNICATION_OP"):
        return pl.DataFrame(schema=schema)
    ops = db.scan("COMMUNICATION_OP", group_id=("groupName", I64), start_ns=("startNs", I64))
    groups = ops.group_by("group_id").agg(pl.col("start_ns").min()).sort("start_ns", "group_id")
    planes = pl.DataFrame(schema={"group_id": I64, "planes": I64})
    if db.has("COMMUNICATION_TASK_INFO"):
        info = db.scan(
            "COMMUNICATION_TASK_INFO", group_id=("groupName", I64), plane=("planeId", I64)
        )
        planes = info.group_by("group_id").agg((pl.col("plane").max() + 1).alias("planes"))
    groups = groups.join(planes, on="group_id", how="left", maintain_order="left")
    width = 1 + groups["planes"].fill_null(0)  # the op thread and its planes
    return groups.select(
        "group_id",
        pl.int_range(pl.len(), dtype=I64).alias("group_index"),
        (width.cum_sum() - width).alias("group_tid"),
    )


def _comm_op_slices(db: _Db, layout: _Layout) -> pl.DataFrame | None:
    if not db.has("COMMUNICATION_OP"):
        return None
    frame = db.scan(
        "COMMUNICATION_OP",
        start_ns=("startNs", I64),
        end_ns=("endNs", I64),
        group_id=("groupName", I64),
        name_id=("opName", I64),
        raw_connection_id=("connectionId", I64),
        data_type_id=("dataType", I64),
        alg_type_id=("algType", I64),
        count=("count", I64),
    )
    frame = frame.join(db.comm_groups, on="group_id", how="left", maintain_order="left")
    frame = frame.with_columns(
        db.text(pl.col("name_id")).alias("name"),
        pl.col("group_tid").alias("tid"),
        _no_sentinel(pl.col("raw_connection_id")).alias("connection_id"),
        _json_args(
            ("connection_id", pl.col("raw_connection_id"), False),
            ("data_type", db.enum("ENUM_HCCL_DATA_TYPE", pl.col("data_type_id")), True),
            ("alg_type", db.text(pl.col("alg_type_id")), True),
            ("count", pl.col("count"), False),
        ).alias("args"),
    )
    thread = pl.format("Group {} Communication", pl.col("group_index"))
    return _with_names(frame, layout, layout.comm_process, thread)


def _plane_slices(db: _Db, layout: _Layout) -> pl.DataFrame | None:
    """One slice per COMMUNICATION_TASK_INFO row on its plane's thread, timed by its TASK."""
    if not (db.has("COMMUNICATION_TASK_INFO") and db.has("TASK")):
        return None
    info = db.scan(
        "COMMUNICATION_TASK_INFO",
        global_task_id=("globalTaskId", I64),
        group_id=("groupName", I64),
        plane=("planeId", I64),
        type_id=("taskType", I64),
        notify_id=("notifyId", STR),
        src=("srcRank", I64),
        dst=("dstRank", I64),
        size=("size", I64),
        transport_id=("transportType", I64),
        data_type_id=("dataType", I64),
        link_id=("linkType", I64),
    )
    tasks = db.tasks.select(
        "global_task_id", "start_ns", "end_ns", "stream_id", "task_id", "raw_model_id", "context_id"
    )
    frame = info.join(tasks, on="global_task_id", how="inner", maintain_order="left")
    frame = frame.join(db.comm_groups, on="group_id", how="left", maintain_order="left")
    frame = frame.with_columns(
        db.text(pl.col("type_id")).alias("name"),
        (pl.col("group_tid").fill_null(0) + 1 + pl.col("plane")).alias("tid"),
        _no_sentinel(pl.col("raw_model_id")).alias("model_id"),
    ).with_columns(
        pl.col("name").alias("task_type"),
        _json_args(
            ("notify_id", pl.col("notify_id"), True),
            ("stream id", pl.col("stream_id"), False),
            ("task id", pl.col("task_id"), False),
            ("context id", pl.col("context_id"), False),
            ("task type", pl.col("name"), True),
            ("src rank", pl.col("src"), False),
            ("dst rank", pl.col("dst"), False),
            ("transport type", db.enum("ENUM_HCCL_TRANSPORT_TYPE", pl.col("transport_id")), True),
            ("size(Byte)", pl.col("size"), False),
            ("data type", db.enum("ENUM_HCCL_DATA_TYPE", pl.col("data_type_id")), True),
            ("link type", db.enum("ENUM_HCCL_LINK_TYPE", pl.col("link_id")), True),
            ("model id", pl.col("raw_model_id"), False),
        ).alias("args"),
    )
    return _with_names(frame, layout, layout.comm_process, pl.format("Plane {}", pl.col("plane")))


def _overlap_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "OVERLAP_ANALYSIS"):
        return None
    frame = db.scan(
        "OVERLAP_ANALYSIS", start_ns=("startNs", I64), end_ns=("endNs", I64), tid=("type", I64)
    )
    names = pl.col("tid").replace_strict(
        dict(enumerate(OVERLAP_THREADS)), default=None, return_dtype=STR
    )
    frame = frame.with_columns(names.alias("name"))
    return _with_names(frame, layout, "Overlap Analysis", pl.col("name"))


# --------------------------------------------------------------------------- counters


def _sample(name: pl.Expr, series: pl.Expr, value: pl.Expr) -> list[pl.Expr]:
    return [pl.col("ts_ns"), name.alias("name"), series.alias("series"), value.alias("value")]


def _capitalised(value: pl.Expr) -> pl.Expr:
    return value.str.slice(0, 1).str.to_uppercase() + value.str.slice(1)


def _counter_samples(db: _Db) -> list[tuple[str, str, Callable[[], list[pl.DataFrame]]]]:
    """(Db table, the trace's process, its samples as the trace's C events name them)."""

    def freq() -> list[pl.DataFrame]:
        f = db.scan("AICORE_FREQ", ts_ns=("timestampNs", I64), freq=("freq", F64))
        return [f.select(_sample(pl.lit("AI Core Freq"), pl.lit("MHz"), pl.col("freq")))]

    def hbm() -> list[pl.DataFrame]:
        f = db.scan(
            "HBM",
            ts_ns=("timestampNs", I64),
            hbm=("hbmId", I64),
            kind=("type", I64),
            bandwidth=("bandwidth", F64),
        )
        way = _capitalised(db.text(pl.col("kind")))  # read → Read
        name = pl.format("HBM {}/{}", pl.col("hbm"), way)
        return [f.select(_sample(name, way + "(MB/s)", pl.col("bandwidth") / _MB))]

    def llc() -> list[pl.DataFrame]:
        f = db.scan(
            "LLC",
            ts_ns=("timestampNs", I64),
            llc=("llcId", I64),
            mode=("mode", I64),
            hit=("hitRate", F64),
            throughput=("throughput", F64),
        )
        prefix = pl.format("LLC {} {}", pl.col("llc"), _capitalised(db.text(pl.col("mode"))))
        # msprof stored the trace's 3-decimal MB/s times 2^20: rounding gives it back.
        throughput = (pl.col("throughput") / _MB).round(3)
        return [
            f.select(_sample(prefix + "/Throughput", pl.lit("Throughput(MB/s)"), throughput)),
            f.select(_sample(prefix + "/Hit Rate", pl.lit("Hit Rate(%)"), pl.col("hit") / 100)),
        ]

    def npu_mem() -> list[pl.DataFrame]:
        f = db.scan(
            "NPU_MEM",
            ts_ns=("timestampNs", I64),
            kind=("type", I64),
            ddr=("ddr", F64),
            hbm=("hbm", F64),
        )
        kind = db.text(pl.col("kind"))
        who = pl.when(kind == "app").then(pl.lit("APP")).otherwise(_capitalised(kind))
        return [
            f.select(_sample(who + f"/{label}", pl.lit("KB"), value / 1024))
            for label, value in (
                ("DDR", pl.col("ddr")),
                ("HBM", pl.col("hbm")),
                ("Memory", pl.col("ddr") + pl.col("hbm")),
            )
        ]

    def soc() -> list[pl.DataFrame]:
        f = db.scan(
            "SOC_BANDWIDTH_LEVEL",
            ts_ns=("timestampNs", I64),
            mata=("mataBwLevel", F64),
            l2=("l2BufferBwLevel", F64),
        )
        return [
            f.select(_sample(pl.lit(label), pl.lit(label), pl.col(column)))
            for label, column in (("Mata Bw Level", "mata"), ("L2 Buffer Bw Level", "l2"))
        ]

    def acc_pmu() -> list[pl.DataFrame]:
        levels = {
            "read_bandwidth": "readBwLevel",
            "write_band_width": "writeBwLevel",
            "read_ost": "readOstLevel",
            "write_ost": "writeOstLevel",
        }
        f = db.scan(
            "ACC_PMU",
            ts_ns=("timestampNs", I64),
            acc=("accId", F64),
            **{name: (column, F64) for name, column in levels.items()},
        )
        # Each sample has two series in the trace: the level (`value`) and the accelerator.
        return [
            f.select(_sample(pl.lit(name), pl.lit(series), pl.col(column)))
            for name in levels
            for series, column in (("value", name), ("acc_id", "acc"))
        ]

    return [
        ("AICORE_FREQ", "AI Core Freq", freq),
        ("HBM", "HBM", hbm),
        ("LLC", "LLC", llc),
        ("NPU_MEM", "NPU MEM", npu_mem),
        ("SOC_BANDWIDTH_LEVEL", "Stars Soc Info", soc),
        ("ACC_PMU", "Acc PMU", acc_pmu),
    ]


# Counter names are dictionary-encoded, as the slices' are.
_COUNTERS = _schema("counters") | dict.fromkeys(("name", "series", "process"), CAT)


def _counters(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame:
    """One row per (sample, series), named as trace_view.json's C events name them, in
    reading order (:func:`_counter_order` is the trace's)."""
    schema = _COUNTERS
    frames = []
    for table, process, samples in _counter_samples(db):
        if not _collected(db, result, table):
            continue
        for frame in samples():
            frames.append(
                frame.with_columns(
                    pl.lit(process).alias("process"),
                    pl.lit(layout.pid(process), dtype=I64).alias("pid"),
                    pl.lit(0, dtype=I64).alias("tid"),
                )
            )
    return pl.concat(
        [pl.DataFrame(schema=schema), *(_conform(f, schema) for f in frames)], rechunk=False
    )


def _counter_order(counters: pl.DataFrame) -> pl.Series:
    return stable_order(counters, ["ts_ns", "name", "series", "pid"])


# --------------------------------------------------------------------------- flows

_ENDS = ("process", "thread", "pid", "tid")


def _pair(frame: pl.DataFrame, cat: str, name: pl.Expr, flow_id: pl.Expr) -> pl.DataFrame:
    """A flows frame from source columns and ``*_dst`` destination columns."""
    return frame.select(
        pl.lit(cat).alias("cat"),
        name.alias("name"),
        flow_id.cast(STR).alias("flow_id"),
        pl.col("start_ns"),
        pl.col("start_ns_dst").alias("end_ns"),
        *(pl.col(c).alias(f"src_{c}") for c in _ENDS),
        *(pl.col(f"{c}_dst").alias(f"dst_{c}") for c in _ENDS),
    )


def _flows(
    layout: _Layout, slices: pl.DataFrame, links: pl.DataFrame, cats: pl.DataFrame | None
) -> pl.DataFrame:
    """Flows as trace_view.json pairs them: host launch → device task (``HostToDevice``, id =
    connection id; ``async_npu``, id = the task's start ns), enqueue → dequeue
    (``async_task_queue``, id = correlation id) and forward → backward (``fwdbwd``)."""
    schema = _schema("flows")
    ends = slices.select(*_ENDS, "start_ns", "connection_id", "cat", "api_row", "api_level")
    comm = layout.comm_process
    device = ends.filter(
        pl.col("process").is_in(["Ascend Hardware", comm])
        & pl.col("connection_id").is_not_null()
        & ~pl.col("thread").cat.starts_with("Plane ")
    )
    # The device tasks of a communication op get their flows at the op (its Group thread).
    comm_links = device.filter(pl.col("process") == comm)["connection_id"].implode()
    device = device.filter((pl.col("process") == comm) | ~pl.col("connection_id").is_in(comm_links))
    python = ends.filter(pl.col("process") == "Python").select(*_ENDS, "start_ns", "cat", "api_row")
    linked = links.join(python, on="api_row", maintain_order="left")
    cats = _connection_cats(cats, linked, device)
    linked = linked.join(cats, on="link", maintain_order="left")
    cann = ends.filter(pl.col("process") == "CANN").join(
        cats.filter(pl.col("flow_cat") == "HostToDevice"),
        left_on="connection_id",
        right_on="link",
        how="semi",
    )
    # A launch's flow id (a Node-level kernel launch, an HCCL op) carries a context in its
    # low 32 bits (4294967295, none, before the current generation, which writes 0); an
    # AscendCL call's (a memcpy, an event) is the connection id itself.
    context = 0 if layout.generation == "current" else 4294967295
    h2d_id = (
        pl.when(pl.col("api_level") != "acl")
        .then(pl.col("connection_id") * (1 << 32) + context)
        .otherwise(pl.col("connection_id"))
    )
    h2d = cann.join(device, on="connection_id", suffix="_dst").with_columns(h2d_id.alias("h2d"))
    frames = [_pair(h2d, "HostToDevice", pl.format("HostToDevice{}", pl.col("h2d")), pl.col("h2d"))]
    to_npu = linked.filter(pl.col("flow_cat") == "async_npu").join(
        device, left_on="link", right_on="connection_id", suffix="_dst"
    )
    frames.append(_pair(to_npu, "async_npu", pl.lit("torch_to_npu"), pl.col("start_ns_dst")))
    queue = linked.filter(pl.col("flow_cat") == "async_task_queue")
    enqueue, dequeue = (queue.filter(pl.col("cat") == c) for c in ("enqueue", "dequeue"))
    fwdbwd = linked.filter(pl.col("flow_cat") == "fwdbwd")
    first = pl.col("start_ns") == pl.col("start_ns").min().over("link")  # the forward op
    for cat, name, src, dst in (
        ("async_task_queue", "enqueue_to_dequeue", enqueue, dequeue),
        ("fwdbwd", "fwdbwd", fwdbwd.filter(first), fwdbwd.filter(~first)),
    ):
        joined = src.join(dst, on="link", how="full", suffix="_dst", coalesce=True)
        frames.append(_pair(joined, cat, pl.lit(name), pl.col("link")))
    flows = pl.concat([pl.DataFrame(schema=schema), *(_conform(f, schema) for f in frames)])
    order = pl.coalesce("start_ns", "end_ns")
    return flows.sort(order, "end_ns", "cat", "flow_id", nulls_last=True, maintain_order=True)


def _connection_ids(db: _Db) -> pl.DataFrame:
    """CONNECTION_IDS: the connection ids a PYTORCH_API row's connectionId stands for."""
    if not db.has("CONNECTION_IDS"):
        return pl.DataFrame(schema={"link_id": I64, "link": I64})
    return db.scan("CONNECTION_IDS", link_id=("id", I64), link=("connectionId", I64))


def _python_links(slices: pl.DataFrame, connection_ids: pl.DataFrame) -> pl.DataFrame:
    """(PYTORCH_API rowid, each connection id CONNECTION_IDS lists for its connectionId)."""
    apis = slices.select("api_row", "link_id").filter(pl.col("link_id").is_not_null())
    return apis.join(connection_ids, on="link_id", maintain_order="left").select("api_row", "link")


def _connection_cats_table(db: _Db) -> pl.DataFrame | None:
    """connectionCats: the flow categories torch_npu drew for each connection id."""
    if not db.has("connectionCats"):
        return None
    cats = db.scan("connectionCats", link=("connectionId", I64), flow_cat=("cat", STR))
    return cats.unique(maintain_order=True)


def _connection_cats(
    table: pl.DataFrame | None, linked: pl.DataFrame, device: pl.DataFrame
) -> pl.DataFrame:
    """The flow categories of each connection id: connectionCats, or, where torch_npu did not
    write it (its connection step did not run), what it would hold: an op's connection to a
    device task is HostToDevice and async_npu, an op's other connection fwdbwd, a queue
    event's async_task_queue (the rule reproduces connectionCats where it exists)."""
    if table is not None:
        return table
    to_device = pl.col("link").is_in(device["connection_id"].implode())
    op, queue = pl.col("cat") == "cpu_op", pl.col("cat").is_in(["enqueue", "dequeue"])
    inferred = linked.select(
        "link",
        pl.when(op & to_device)
        .then(pl.lit(["HostToDevice", "async_npu"]))
        .when(op)
        .then(pl.lit(["fwdbwd"]))
        .when(queue)
        .then(pl.lit(["async_task_queue"]))
        .alias("flow_cat"),
    )
    return inferred.explode("flow_cat").drop_nulls().unique(maintain_order=True)


# --------------------------------------------------------------------------- threads


def _threads(layout: _Layout, slices: pl.DataFrame, counter_threads: pl.DataFrame) -> pl.DataFrame:
    """Every (pid, tid) with events (``counter_threads``: the counters' process, pid and tid),
    named and sorted as the Text export's M events name them."""
    used = pl.concat(
        [
            slices.select(
                "process", "pid", "tid", "thread", (pl.col("cat") == "dequeue").alias("dequeue")
            )
            .unique()
            .with_columns(pl.col("process", "thread").cast(STR)),
            counter_threads.select("process", "pid", "tid")
            .unique()
            .with_columns(
                pl.format("Thread {}", pl.col("tid")).alias("thread"),
                pl.lit(False).alias("dequeue"),
            ),
        ]
    )
    threads = used.group_by("process", "pid", "tid", "thread").agg(pl.col("dequeue").any())
    processes = threads["process"].unique().to_list()
    # The dequeue thread sorts after the other Python threads (torch_npu gives it max tid + 1).
    python_top = threads.filter(pl.col("process") == "Python")["tid"].max()
    named = ("Python", "CANN", "Ascend Hardware", layout.comm_process)
    thread_sort = (
        pl.when((pl.col("process") == "Python") & pl.col("dequeue") & (python_top is not None))
        .then(pl.lit(python_top or 0) + 1)
        .when(pl.col("process").is_in(named))
        .then(pl.col("tid"))
    )
    sort = {p: 0 if p == "Python" else layout.sort_index(p) for p in processes}
    threads = threads.with_columns(
        pl.col("process")
        .replace_strict({p: layout.label(p) for p in processes})
        .alias("process_label"),
        pl.col("process").replace_strict(sort, return_dtype=I64).alias("process_sort_index"),
        thread_sort.cast(I64).alias("thread_sort_index"),
    )
    return _conform(threads, _schema("threads")).sort(
        "process_sort_index", "process", "thread_sort_index", "tid", nulls_last=False
    )


# --------------------------------------------------------------------------- device tables


def _kernels(db: _Db, result: DbResult) -> pl.DataFrame | None:
    """kernel_details.csv's rows: one per compute task (TASK + COMPUTE_TASK_INFO)."""
    if not _collected(db, result, "COMPUTE_TASK_INFO") or db.compute is None:
        return None
    # One row per COMPUTE_TASK_INFO row, timed by its TASK (a row without one keeps nulls).
    tasks = db.compute.join(db.task_rows, on="global_task_id", how="left", maintain_order="left")
    texts = {
        "name": "name_id",
        "type": "type_id",
        "accelerator_core": "compute_type_id",
        "op_state": "op_state_id",
        "hf32_eligible": "hf32_eligible_id",
        "input_shapes": "input_shapes_id",
        "input_data_types": "input_data_types_id",
        "input_formats": "input_formats_id",
        "output_shapes": "output_shapes_id",
        "output_data_types": "output_data_types_id",
        "output_formats": "output_formats_id",
    }
    kernels = tasks.with_columns(
        *(db.text(pl.col(source)).alias(name) for name, source in texts.items()),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        _no_sentinel(pl.col("raw_model_id")).alias("model_id"),
        _no_sentinel(pl.col("context_id")).alias("context_id"),
        pl.coalesce("block_num", "block_dim").alias("block_num"),
        pl.coalesce("mix_block_num", "mix_block_dim").alias("mix_block_num"),
    ).with_columns(pl.col("input_shapes", "output_shapes").str.strip_chars('"'))
    order = ("start_ns", "stream_id", "task_id")
    kernels = _with_step(db, kernels.sort(*order, nulls_last=True, maintain_order=True))
    kernels = kernels.join(_pmu_extra(db), on="global_task_id", how="left", maintain_order="left")
    return _conform(kernels, _schema("kernels"))


def _with_step(db: _Db, tasks: pl.DataFrame) -> pl.DataFrame:
    """The last STEP_TIME id started at each task's start (tasks sorted by start). STEP_TIME
    holds the host's ProfilerStep windows; a task the step launched can start on the device
    after its window closed, and kernel_details.csv still counts it in that step."""
    if not db.has("STEP_TIME"):
        return tasks.with_columns(pl.lit(None, dtype=I64).alias("step"))
    steps = db.scan("STEP_TIME", step=("id", I64), step_start=("startNs", I64))
    steps = steps.drop_nulls("step_start").sort("step_start")
    timed = tasks.filter(pl.col("start_ns").is_not_null())
    joined = timed.join_asof(steps, left_on="start_ns", right_on="step_start", strategy="backward")
    untimed = tasks.filter(pl.col("start_ns").is_null())  # no TASK row: no step either
    return pl.concat([joined, untimed], how="diagonal_relaxed")


def _pmu_extra(db: _Db) -> pl.DataFrame:
    """TASK_PMU_INFO metrics of each task as a JSON object, keyed as kernel_details.csv is."""
    empty = pl.DataFrame(schema={"global_task_id": I64, "extra": STR})
    if not db.has("TASK_PMU_INFO"):
        return empty
    pmu = db.scan(
        "TASK_PMU_INFO",
        global_task_id=("globalTaskId", I64),
        metric_id=("name", I64),
        value=("value", F64),
    )
    metric = db.text(pl.col("metric_id"))
    metric = (
        pl.when(metric.is_in(list(_PMU_RENAMED)))
        .then(metric.replace(_PMU_RENAMED))
        .when(metric.str.ends_with("_time"))
        .then(metric + "(us)")
        .otherwise(metric)
    )
    if pmu.is_empty():
        return empty
    wide = pmu.with_columns(metric.alias("metric")).pivot(
        on="metric", index="global_task_id", values="value", aggregate_function="first"
    )
    metrics = pl.struct(pl.exclude("global_task_id")).struct.json_encode()
    return wide.select("global_task_id", metrics.alias("extra"))


def _stats_device(layout: _Layout, host: bool) -> pl.Expr:
    """The statistics' `Device_id` column, which G3+ CSVs lead with (`host` for the APIs)."""
    device = (
        ("host" if host else str(layout.device)) if layout.generation in ("g3", "current") else None
    )
    return pl.lit(device, dtype=STR).alias("device_id")


def _api_stats(slices: pl.DataFrame, layout: _Layout) -> pl.DataFrame:
    """api_statistic.csv's figures, from the CANN API events (µs, population variance)."""
    cann = slices.select("process", "api_level", "api_name", "dur_ns").filter(
        pl.col("process") == "CANN"
    )
    cann = cann.with_columns(us=pl.col("dur_ns") / 1000)
    stats = cann.group_by(pl.col("api_level").alias("level"), "api_name").agg(
        pl.len().cast(I64).alias("count"),
        pl.col("us").sum().alias("total_us"),
        pl.col("us").mean().alias("avg_us"),
        pl.col("us").min().alias("min_us"),
        pl.col("us").max().alias("max_us"),
        pl.col("us").var(ddof=0).alias("variance"),
    )
    stats = stats.with_columns(_stats_device(layout, host=True))
    return stats.sort("total_us", "level", "api_name", descending=[True, False, False])


def _op_stats(kernels: pl.DataFrame, layout: _Layout) -> pl.DataFrame:
    """op_statistic.csv's figures, from the compute tasks (µs; share of the total task time)."""
    # Sums of integer ns: the same in any order (the groups come in no fixed order, and float
    # sums of them differed in their last bits from run to run).
    total_ns = pl.col("dur_ns").sum()
    stats = kernels.group_by(
        pl.col("type").alias("op_type"), pl.col("accelerator_core").alias("core_type")
    ).agg(
        pl.len().cast(I64).alias("count"),
        (total_ns / 1000).alias("total_us"),
        (pl.col("dur_ns").min() / 1000).alias("min_us"),
        (total_ns / pl.col("dur_ns").count() / 1000).alias("avg_us"),
        (pl.col("dur_ns").max() / 1000).alias("max_us"),
        total_ns.alias("_total_ns"),
    )
    ratio = pl.col("_total_ns") / pl.col("_total_ns").sum() * 100
    return (
        stats.with_columns(ratio.alias("ratio_pct"), _stats_device(layout, host=False))
        .drop("_total_ns")
        .sort("total_us", "op_type", descending=[True, False])
    )


def _device_type(device: pl.Expr) -> pl.Expr:
    return pl.format("NPU:{}", device)


def _memory_records(db: _Db, result: DbResult) -> pl.DataFrame | None:
    """memory_record.csv's rows: PTA/GE totals from MEMORY_RECORD, APP from NPU_MEM."""
    frames = []
    if db.has("MEMORY_RECORD"):
        f = db.scan(
            "MEMORY_RECORD",
            component_id=("component", I64),
            ts_ns=("timestamp", I64),
            allocated=("totalAllocated", F64),
            reserved=("totalReserved", F64),
            active=("totalActive", F64),
            stream_ptr=("streamPtr", I64),
            device=("deviceId", I64),
        )
        frames.append(
            f.select(
                db.text(pl.col("component_id")).alias("component"),
                pl.col("ts_ns"),
                (pl.col("allocated") / _MB).alias("total_allocated_mb"),
                (pl.col("reserved") / _MB).alias("total_reserved_mb"),
                (pl.col("active") / _MB).alias("total_active_mb"),
                pl.col("stream_ptr"),
                _device_type(pl.col("device")).alias("device_type"),
            )
        )
    if db.has("NPU_MEM"):
        f = db.scan(
            "NPU_MEM",
            kind=("type", I64),
            ts_ns=("timestampNs", I64),
            ddr=("ddr", F64),
            hbm=("hbm", F64),
            device=("deviceId", I64),
        )
        frames.append(
            f.filter(db.text(pl.col("kind")) == "app").select(
                pl.lit("APP").alias("component"),
                pl.col("ts_ns"),
                ((pl.col("ddr") + pl.col("hbm")) / _MB).alias("total_reserved_mb"),
                _device_type(pl.col("device")).alias("device_type"),
            )
        )
    if not frames:
        _collected(db, result, "MEMORY_RECORD")
        return None
    schema = _schema("memory_records")
    records = pl.concat([_conform(f, schema) for f in frames])
    return records.sort("ts_ns", maintain_order=True)


def _op_memory(db: _Db, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "OP_MEMORY"):
        return None
    bytes_columns = {
        "alloc_total_allocated_mb": "allocationTotalAllocated",
        "alloc_total_reserved_mb": "allocationTotalReserved",
        "alloc_total_active_mb": "allocationTotalActive",
        "release_total_allocated_mb": "releaseTotalAllocated",
        "release_total_reserved_mb": "releaseTotalReserved",
        "release_total_active_mb": "releaseTotalActive",
    }
    f = db.scan(
        "OP_MEMORY",
        name_id=("name", I64),
        size=("size", F64),
        alloc_ns=("allocationTime", I64),
        release_ns=("releaseTime", I64),
        active_release_ns=("activeReleaseTime", I64),
        dur_ns=("duration", I64),
        active_dur_ns=("activeDuration", I64),
        stream_ptr=("streamPtr", I64),
        device=("deviceId", I64),
        **{name: (column, F64) for name, column in bytes_columns.items()},
    )
    f = f.with_columns(
        db.text(pl.col("name_id")).alias("name"),
        (pl.col("size") / 1024).alias("size_kb"),
        *((pl.col(name) / _MB) for name in bytes_columns),
        _device_type(pl.col("device")).alias("device_type"),
    )
    return _conform(f, _schema("op_memory")).sort("alloc_ns", maintain_order=True)


def _module_memory(db: _Db, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "NPU_MODULE_MEM"):
        return None
    f = db.scan(
        "NPU_MODULE_MEM",
        module=("moduleId", I64),
        ts_ns=("timestampNs", I64),
        reserved=("totalReserved", F64),
        device_id=("deviceId", I64),
    )
    f = f.with_columns(
        db.enum("ENUM_MODULE", pl.col("module")).alias("component"),
        (pl.col("reserved") / _MB).alias("total_reserved_mb"),
        _device_type(pl.col("device_id")).alias("device"),
    )
    return _conform(f.sort("ts_ns", "module", maintain_order=True), _schema("module_memory"))


# --------------------------------------------------------------------------- analysis.db


def _analysis_tables(db: _Db, sink: TableSink, result: DbResult) -> None:
    for table, source, build in (
        ("step_times", "StepTraceTime", _step_times),
        ("comm_ops", "CommAnalyzerTime", _comm_ops),
        ("comm_links", "CommAnalyzerMatrix", _comm_links),
    ):
        if _collected(db, result, source):
            result.rows[table] = sink.arrow(table, arrow_table(build(db)))


_STEP_COLUMNS = {
    "computing_ns": "computing",
    "communication_not_overlapped_ns": "communication_not_overlapped",
    "overlapped_ns": "overlapped",
    "communication_ns": "communication",
    "free_ns": "free",
    "stage_ns": "stage",
    "bubble_ns": "bubble",
    "communication_not_overlapped_exclude_receive_ns": "communication_not_overlapped_and_exclude_receive",
    "preparing_ns": "preparing",
}


def _step_times(db: _Db) -> pl.DataFrame:
    f = db.scan(
        "StepTraceTime",
        device_id=("deviceId", I64),
        step=("step", I64),
        **{name: (column, F64) for name, column in _STEP_COLUMNS.items()},
    )
    return _conform(
        f.with_columns(float_us_to_ns(pl.col(name)).alias(name) for name in _STEP_COLUMNS),
        _schema("step_times"),
    )


def _comm_ops(db: _Db) -> pl.DataFrame:
    times = ("elapse_time", "transit_time", "wait_time", "synchronization_time", "idle_time")
    f = db.scan(
        "CommAnalyzerTime",
        step=("step", STR),
        kind=("type", STR),
        op_name=("hccl_op_name", STR),
        group=("group_name", STR),
        start=("start_timestamp", F64),
        **{column: (column, F64) for column in times},
    )
    wait, sync, transit = (
        pl.col("wait_time"),
        pl.col("synchronization_time"),
        pl.col("transit_time"),
    )
    f = f.with_columns(
        # µs as a REAL: its shortest decimal, as communication.json prints it, to ns exactly.
        us_expr_to_ns(pl.col("start")).alias("start_ns"),
        *(float_ms_to_ns(pl.col(c)).alias(c.replace("_time", "_ns")) for c in times),
        # msprof's ratios, rounded as communication.json writes them.
        (wait / (wait + transit)).round(4).fill_nan(0).alias("wait_ratio"),
        (sync / (sync + transit)).round(4).fill_nan(0).alias("synchronization_ratio"),
    )
    f = f.join(
        _bandwidth(db), on=["step", "kind", "op_name", "group"], how="left", maintain_order="left"
    )
    return _conform(f, _schema("comm_ops"))


def _bandwidth(db: _Db) -> pl.DataFrame:
    """communication.json's `Communication Bandwidth Info` per op, from CommAnalyzerBandwidth:
    one object per transport type, with its packet size distribution."""
    keys = {"step": STR, "kind": STR, "op_name": STR, "group": STR}
    if not db.has("CommAnalyzerBandwidth"):
        return pl.DataFrame(schema=keys | {"bandwidth": STR})
    rows = db.scan(
        "CommAnalyzerBandwidth",
        step=("step", STR),
        kind=("type", STR),
        op_name=("hccl_op_name", STR),
        group=("group_name", STR),
        transport=("transport_type", STR),
        size=("transit_size", F64),
        time=("transit_time", F64),
        bandwidth=("bandwidth", F64),
        large=("large_packet_ratio", F64),
        package=("package_size", F64),
        count=("count", F64),
        total=("total_duration", F64),
    )
    ops: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in rows.iter_rows(named=True):
        key = (r["step"], r["kind"], r["op_name"], r["group"])
        info = ops.setdefault(key, {}).setdefault(
            r["transport"],
            {
                "Transit Size(MB)": r["size"],
                "Transit Time(ms)": r["time"],
                "Bandwidth(GB/s)": r["bandwidth"],
                "Large Packet Ratio": r["large"],
                "Size Distribution": {},
            },
        )
        if r["count"]:
            info["Size Distribution"][repr(r["package"])] = [r["count"], r["total"]]
    return pl.DataFrame(
        [(*key, json.dumps(value, sort_keys=True)) for key, value in ops.items()],
        schema=keys | {"bandwidth": STR},
        orient="row",
    )


def _comm_links(db: _Db) -> pl.DataFrame:
    f = db.scan(
        "CommAnalyzerMatrix",
        step=("step", STR),
        kind=("type", STR),
        op_key=("hccl_op_name", STR),
        group=("group_name", STR),
        src_rank=("src_rank", I64),
        dst_rank=("dst_rank", I64),
        transport_type=("transport_type", STR),
        transit_size_mb=("transit_size", F64),
        transit=("transit_time", F64),
        bandwidth_gbps=("bandwidth", F64),
        op_name=("op_name", STR),
    )
    return _conform(
        f.with_columns(float_ms_to_ns(pl.col("transit")).alias("transit_ns")), _schema("comm_links")
    )
