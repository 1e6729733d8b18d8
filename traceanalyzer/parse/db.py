"""Db exports (``ascend_pytorch_profiler_{rank}.db``, ``analysis.db``) → the canonical tables.

torch_npu's ``export_type=Db`` writes the data of a Text export as SQLite: events as rows with
int64 ns times, names as ids into ``STRING_IDS``, codes named by ``ENUM_*`` tables, flows as
connection ids. This reader fills the tables the Text readers fill, with the same process,
thread and stream naming a Text export of the same session would have (``Python``, ``CANN``,
``Ascend Hardware``, ``HCCL``/``Communication``; ``Thread <tid>``, ``Stream <id>``, ``Plane <n>``;
msprof's pids ``(os_pid << 10) | (sort_index << 5) | device``), so rules, reports and ``diff``
cannot tell which format a rank came from. ``docs/schema.md`` says, for every column, where it
comes from in both formats.

The database is opened strictly read-only (``mode=ro&immutable=1``): SQLite takes no lock and
writes no journal, WAL or shared-memory file next to it. A ``-wal`` or ``-journal`` file beside
the database means a writer is (or was, when it crashed) in the middle of a transaction: the
file is then refused as locked rather than read half-written. Every query is set-based (joins
and lookups run inside SQLite); each table's rows become polars columns in one fetch.

Tolerance: an absent table is "not collected" (its canonical table is empty), absent columns
become nulls, unknown extra columns are ignored; a file that is not SQLite, or whose
``META_DATA`` schema major version is newer than the ones known here, is refused with the reason.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer.parse.sink import TableSink, body_columns
from traceanalyzer.parse.trace_shared import SENTINELS

# META_DATA SCHEMA_VERSION majors this reader knows (1.x: torch_npu 2.1 .. 2.8).
KNOWN_SCHEMA_MAJORS = (1,)
# Without these the file is not a torch_npu profiler database, whatever its name.
_REQUIRED_TABLES = ("STRING_IDS",)
_EVENT_TABLES = ("PYTORCH_API", "CANN_API", "TASK")

# msprof's process_sort_index per process, per generation (pid = (os_pid<<10)|(sort<<5)|dev).
_G2_SORT = {
    "CANN": 7,
    "Ascend Hardware": 13,
    "AI Core Freq": 14,
    "HCCL": 15,
    "Communication": 15,
    "HBM": 17,
    "LLC": 18,
    "NPU MEM": 19,
    "Stars Soc Info": 20,
    "Acc PMU": 21,
    "QoS": 22,
    "Overlap Analysis": 23,
}
_CURRENT_SORT = {
    **_G2_SORT,
    "Ascend Hardware": 14,
    "AI Core Freq": 15,
    "HCCL": 16,
    "Communication": 16,
    "NPU MEM": 17,
    "Overlap Analysis": 31,
}
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
_COMPUTE_SQE = {"AI_VECTOR_CORE": "AI_CORE", "AI_CPU": "AI_CPU_SQE"}
OVERLAP_THREADS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
_MB = 1 << 20
_SQL_SENTINELS = "(" + ", ".join(str(v) for v in SENTINELS if v < 1 << 63) + ")"
# TASK_PMU_INFO metric names → kernel_details.csv column names (the `extra` keys).
_PMU_RENAMED = {"aic_total_time": "aicore_time(us)", "aiv_total_time": "aiv_time(us)"}


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
    rank: int | None = None
    hostname: str | None = None
    os_pid: int | None = None
    # META_DATA (ENV_VARIABLES decoded), SESSION_TIME_INFO and NPU_INFO, for the sessions row.
    metadata: dict[str, Any] = field(default_factory=dict)
    # Db tables whose canonical table stays empty because the profile did not collect them.
    not_collected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reader: str = "db"


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open ``path`` read-only, without locks or side files; raise DbUnreadable with the reason."""
    for suffix in ("-wal", "-journal"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            raise DbUnreadable(
                f"{path}: locked: {side.name} beside it means a writer is (or crashed) "
                "mid-transaction; re-run once the profiler's export has finished"
            )
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.execute("PRAGMA query_only = 1")
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        # "malformed": SQLite's own pages are damaged (a truncated or torn copy); anything else
        # ("file is not a database") is not SQLite at all.
        what = "damaged database" if "malformed" in str(exc) else "not a readable SQLite database"
        raise DbUnreadable(f"{path}: {what} ({exc})") from exc
    return con


class _Db:
    """One open database: which tables and columns it has, and typed fetches."""

    def __init__(self, path: Path):
        self.path = path
        self.con = connect_readonly(path)
        try:
            names = [
                r[0]
                for r in self.con.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            ]
            self.columns = {
                name: {r[1] for r in self.con.execute(f'PRAGMA table_info("{name}")')}
                for name in names
            }
        except sqlite3.Error as exc:
            self.con.close()
            raise DbUnreadable(f"{path}: damaged database ({exc})") from exc

    def has(self, table: str) -> bool:
        return table in self.columns

    def col(self, table: str, column: str, alias: str = "") -> str:
        """``alias.column`` when the table has it, else NULL (a column of another release)."""
        if column not in self.columns.get(table, ()):
            return "NULL"
        return f'{alias + "." if alias else ""}"{column}"'

    def frame(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        try:
            cur = self.con.execute(sql)
            rows = cur.fetchall()
        except sqlite3.Error as exc:
            raise DbUnreadable(f"{self.path}: damaged database ({exc})") from exc
        names = [d[0] for d in cur.description]
        return pl.DataFrame(rows, schema=[(n, schema[n]) for n in names], orient="row")

    def value(self, sql: str) -> Any:
        try:
            row = self.con.execute(sql).fetchone()
        except sqlite3.Error as exc:
            raise DbUnreadable(f"{self.path}: damaged database ({exc})") from exc
        return row[0] if row else None

    def close(self) -> None:
        self.con.close()


def _s(expr: str) -> str:
    """The STRING_IDS text of an id column."""
    return f"(SELECT value FROM STRING_IDS WHERE id = {expr})"


def _enum(table: str, expr: str) -> str:
    return f"(SELECT name FROM {table} WHERE id = {expr})"


def _id(expr: str) -> str:
    """An id whose msprof "none" sentinel becomes NULL."""
    return f"(CASE WHEN {expr} IN {_SQL_SENTINELS} THEN NULL ELSE {expr} END)"


def _args(*pairs: tuple[str, str]) -> str:
    """A JSON object of the non-null values, keys in the Text export's order (json_patch drops
    nulls)."""
    inner = ", ".join(f"'{k}', {v}" for k, v in pairs)
    return f"nullif(json_patch('{{}}', json_object({inner})), '{{}}')"


I64, F64, STR = pl.Int64(), pl.Float64(), pl.String()
_SLICE_SCHEMA: dict[str, pl.DataType] = {
    name: {"int32": pl.Int32(), "int64": I64, "double": F64}.get(str(typ), STR)
    for name, typ in body_columns("slices")
}
# Slices keep the PYTORCH_API rowid of their row (flows attach by it); the sink drops it.
_SLICE_WORK_SCHEMA = {**_SLICE_SCHEMA, "api_row": I64}


# --------------------------------------------------------------------------- the session


@dataclass
class _Layout:
    """Pids and names of the processes, as the Text export of the session numbers them."""

    os_pid: int
    device: int
    generation: str
    comm_process: str

    def sort_index(self, process: str) -> int:
        table = _CURRENT_SORT if self.generation == "current" else _G2_SORT
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
    if not db.has("META_DATA"):
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
    levels = set()
    if db.has("ENUM_API_TYPE"):
        levels = {r[0] for r in db.con.execute("SELECT name FROM ENUM_API_TYPE")}
    if "blockNum" in db.columns.get("COMPUTE_TASK_INFO", ()):
        return "current"
    return "g3" if "communication" in levels else "g2"


def _layout(db: _Db, generation: str) -> _Layout:
    os_pid = None
    for table, expr in (
        ("PYTORCH_API", "globalTid >> 32"),
        ("CANN_API", "globalTid >> 32"),
        ("TASK", "globalPid"),
    ):
        if db.has(table) and os_pid is None:
            os_pid = db.value(f"SELECT {expr} FROM {table} LIMIT 1")
    device = None
    if db.has("TASK"):
        device = db.value(f"SELECT {db.col('TASK', 'deviceId')} FROM TASK LIMIT 1")
    if device is None and db.has("RANK_DEVICE_MAP"):
        device = db.value("SELECT deviceId FROM RANK_DEVICE_MAP LIMIT 1")
    comm = "Communication" if generation in ("g3", "current") else "HCCL"
    return _Layout(int(os_pid or 0), int(device or 0), generation, comm)


def parse_db(profiler_db: Path | None, analysis_db: Path | None, sink: TableSink) -> DbResult:
    """Fill every canonical table a Db export has data for (except ``sessions``) into ``sink``.

    Raises DbUnreadable when the profiler database cannot be read at all; a damaged or absent
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
            _profiler_tables(db, layout, sink, result)
        finally:
            db.close()
    if analysis_db is not None:
        try:
            adb = _Db(analysis_db)
        except DbUnreadable as exc:
            result.warnings.append(str(exc))
        else:
            try:
                _analysis_tables(adb, sink, result)
            except DbUnreadable as exc:
                result.warnings.append(str(exc))
            finally:
                adb.close()
    return result


def _session_facts(db: _Db, result: DbResult) -> None:
    """Rank, host and the session's own records (META_DATA, SESSION_TIME_INFO, NPU_INFO)."""
    if db.has("RANK_DEVICE_MAP"):
        result.rank = db.value("SELECT rankId FROM RANK_DEVICE_MAP LIMIT 1")
    if db.has("HOST_INFO"):
        result.hostname = db.value(
            f"SELECT {db.col('HOST_INFO', 'hostName')} FROM HOST_INFO LIMIT 1"
        )
    if db.has("META_DATA"):
        for name, value in db.con.execute("SELECT name, value FROM META_DATA").fetchall():
            if str(name).startswith("SCHEMA_VERSION"):
                continue
            try:
                result.metadata[name] = json.loads(value) if name == "ENV_VARIABLES" else value
            except ValueError:
                result.metadata[name] = value
    if db.has("SESSION_TIME_INFO"):
        row = db.con.execute("SELECT * FROM SESSION_TIME_INFO LIMIT 1").fetchone()
        names = [
            d[0] for d in db.con.execute("SELECT * FROM SESSION_TIME_INFO LIMIT 0").description
        ]
        result.metadata.update(
            {f"SESSION_TIME_INFO.{n}": v for n, v in zip(names, row or (), strict=False)}
        )
    if db.has("NPU_INFO"):
        result.metadata["NPU_INFO"] = db.value(
            f"SELECT {db.col('NPU_INFO', 'name')} FROM NPU_INFO LIMIT 1"
        )


def _profiler_tables(db: _Db, layout: _Layout, sink: TableSink, result: DbResult) -> None:
    slices = _slices(db, layout, result)
    result.rows["slices"] = sink.arrow("slices", slices.to_arrow())
    if slices.height:
        result.start_ns = slices["start_ns"].min()
        result.end_ns = slices["end_ns"].max()
    result.processes = sorted(set(slices["process"].unique().to_list()))
    counters = _counters(db, layout, result)
    result.rows["counters"] = sink.arrow("counters", counters.to_arrow())
    result.processes = sorted(set(result.processes) | set(counters["process"].unique().to_list()))
    result.rows["flows"] = sink.arrow("flows", _flows(db, layout, slices).to_arrow())
    result.rows["threads"] = sink.arrow("threads", _threads(layout, slices, counters).to_arrow())
    for table, build in (
        ("kernels", _kernels),
        ("memory_records", _memory_records),
        ("op_memory", _op_memory),
        ("module_memory", _module_memory),
    ):
        frame = build(db, layout, result)
        if frame is not None:
            result.rows[table] = sink.arrow(table, frame.to_arrow())
    if db.has("CANN_API"):
        result.rows["api_stats"] = sink.arrow("api_stats", _api_stats(slices).to_arrow())
    if "kernels" in result.rows:
        result.rows["op_stats"] = sink.arrow("op_stats", _op_stats(db, layout, result).to_arrow())


def _collected(db: _Db, result: DbResult, *tables: str) -> bool:
    """True when every one of ``tables`` is in the database; else it is noted as not collected."""
    absent = [t for t in tables if not db.has(t)]
    result.not_collected += [f"{t} (table absent from {db.path.name})" for t in absent]
    return not absent


# --------------------------------------------------------------------------- slices


def _slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame:
    parts = [
        part
        for part in (
            _python_slices(db, layout, result),
            _cann_slices(db, layout, result),
            _task_slices(db, layout, result),
            _comm_op_slices(db, layout),
            _plane_slices(db, layout),
            _overlap_slices(db, layout),
        )
        if part is not None
    ]
    frames = [_conform(p, _SLICE_WORK_SCHEMA) for p in parts]
    empty = pl.DataFrame(schema=_SLICE_WORK_SCHEMA)
    slices = pl.concat([empty, *frames], how="vertical") if frames else empty
    return slices.sort(
        ["start_ns", "dur_ns", "pid", "tid", "name"],
        descending=[False, True, False, False, False],
        nulls_last=True,
        maintain_order=True,
    )


def _conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return frame.select(
        [
            pl.col(n).cast(t) if n in frame.columns else pl.lit(None, dtype=t).alias(n)
            for n, t in schema.items()
        ]
    )


def _with_names(
    frame: pl.DataFrame, layout: _Layout, process: str, thread: Callable[[pl.Expr], pl.Expr]
) -> pl.DataFrame:
    return frame.with_columns(
        pl.lit(process).alias("process"),
        pl.lit(layout.pid(process), dtype=I64).alias("pid"),
        thread(pl.col("tid")).alias("thread"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
    )


def _thread_name(tid: pl.Expr) -> pl.Expr:
    return pl.format("Thread {}", tid)


def _stream_name(tid: pl.Expr) -> pl.Expr:
    return pl.format("Stream {}", tid)


def _python_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "PYTORCH_API"):
        return None
    t = "PYTORCH_API"
    kind = _enum("ENUM_API_TYPE", db.col(t, "type", "p")) if db.has("ENUM_API_TYPE") else "NULL"
    shapes, dtypes = _s(db.col(t, "inputShapes", "p")), _s(db.col(t, "inputDtypes", "p"))
    if _shapes_swapped(db):
        shapes, dtypes = dtypes, shapes
    stack = "NULL"
    if db.has("PYTORCH_CALLCHAINS") and db.col(t, "callchainId") != "NULL":
        # Frames joined the way trace_view.json's `Call stack` joins them, innermost first.
        stack = (
            "(SELECT group_concat(v, ';\r\n') FROM (SELECT s.value AS v FROM PYTORCH_CALLCHAINS c "
            "JOIN STRING_IDS s ON s.id = c.stack WHERE c.id = p.callchainId ORDER BY c.stackDepth))"
        )
    correlation = (
        "(SELECT connectionId FROM CONNECTION_IDS WHERE id = p.connectionId LIMIT 1)"
        if db.has("CONNECTION_IDS")
        else "NULL"
    )
    sql = f"""
        SELECT CAST(p.startNs AS INTEGER) AS start_ns,
               CAST(p.endNs AS INTEGER) - CAST(p.startNs AS INTEGER) AS dur_ns,
               p.globalTid & 4294967295 AS tid, {_s("p.name")} AS name, {kind} AS kind,
               CASE WHEN {kind} = 'op' THEN {
        _args(
            ("Sequence number", f"coalesce({db.col(t, 'sequenceNumber', 'p')}, -1)"),
            ("Fwd thread id", f"coalesce({db.col(t, 'fwdThreadId', 'p')}, 0)"),
            ("Input Dims", shapes),
            ("Input type", dtypes),
            ("Call stack", stack),
        )
    }
               WHEN {kind} = 'queue' THEN {_args(("correlation_id", correlation))}
               END AS args
               , p.rowid AS api_row
        FROM PYTORCH_API p"""
    frame = db.frame(
        sql,
        {
            "start_ns": I64,
            "dur_ns": I64,
            "tid": I64,
            "name": STR,
            "kind": STR,
            "args": STR,
            "api_row": I64,
        },
    )
    cat = (
        pl.when(pl.col("kind") == "queue")
        .then(
            pl.when(pl.col("name") == "Enqueue")
            .then(pl.lit("enqueue"))
            .otherwise(pl.lit("dequeue"))
        )
        .otherwise(pl.col("kind").replace_strict(_PYTORCH_CAT, default=pl.col("kind")))
    )
    frame = frame.with_columns(pl.lit("X").alias("ph"), cat.alias("cat"))
    return _with_names(frame, layout, "Python", _thread_name)


def _shapes_swapped(db: _Db) -> bool:
    """torch_npu 2.1-2.5 write the type list into inputShapes and the dims into inputDtypes; a
    shape never holds a letter, so one that does tells the columns are swapped."""
    t = "PYTORCH_API"
    if db.col(t, "inputShapes") == "NULL" or db.col(t, "inputDtypes") == "NULL":
        return False
    return bool(
        db.value(
            "SELECT EXISTS (SELECT 1 FROM PYTORCH_API p JOIN STRING_IDS s ON s.id = p.inputShapes "
            "WHERE s.value GLOB '*[A-Za-z]*' LIMIT 1)"
        )
    )


def _cann_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "CANN_API"):
        return None
    level = _enum("ENUM_API_TYPE", "c.type") if db.has("ENUM_API_TYPE") else "NULL"
    sql = f"""
        SELECT c.startNs AS start_ns, c.endNs - c.startNs AS dur_ns,
               c.globalTid & 4294967295 AS tid, {_s("c.name")} AS api_name, {level} AS api_level,
               c.connectionId AS connection_id
        FROM CANN_API c"""
    frame = db.frame(
        sql,
        {
            "start_ns": I64,
            "dur_ns": I64,
            "tid": I64,
            "api_name": STR,
            "api_level": STR,
            "connection_id": I64,
        },
    )
    layer = pl.col("api_level").replace_strict(_LAYER, default=pl.col("api_level"))
    frame = frame.with_columns(
        pl.lit("X").alias("ph"),
        layer.alias("api_layer"),
        pl.format("{}@{}", layer, pl.col("api_name")).alias("name"),
        pl.col("api_name").alias("api_id"),
        pl.struct(
            pl.col("tid").alias("Thread Id"),
            pl.col("api_level").alias("level"),
            pl.col("api_name").alias("id"),
            pl.col("connection_id"),
        )
        .struct.json_encode()
        .alias("args"),
    )
    return _with_names(frame, layout, "CANN", _thread_name)


def _task_slices(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "TASK"):
        return None
    has_compute = db.has("COMPUTE_TASK_INFO")
    compute_name = _s("ci.name") if has_compute else "NULL"
    compute_type = _s("ci.taskType") if has_compute else "NULL"
    join = (
        "LEFT JOIN COMPUTE_TASK_INFO ci ON ci.globalTaskId = t.globalTaskId" if has_compute else ""
    )
    sql = f"""
        SELECT t.startNs AS start_ns, t.endNs - t.startNs AS dur_ns, t.streamId AS tid,
               coalesce({compute_name}, {_s("t.taskType")}) AS name,
               {_s("t.taskType")} AS runtime_type, {compute_type} AS compute_type,
               t.taskId AS task_id, {_id(db.col("TASK", "modelId", "t"))} AS model_id,
               {db.col("TASK", "modelId", "t")} AS raw_model_id,
               {db.col("TASK", "contextId", "t")} AS context_id,
               {_id(db.col("TASK", "connectionId", "t"))} AS connection_id
        FROM TASK t {join}"""
    frame = db.frame(
        sql,
        {
            "start_ns": I64,
            "dur_ns": I64,
            "tid": I64,
            "name": STR,
            "runtime_type": STR,
            "compute_type": STR,
            "task_id": I64,
            "model_id": I64,
            "raw_model_id": I64,
            "context_id": I64,
            "connection_id": I64,
        },
    )
    sqe = (
        pl.when(pl.col("compute_type").is_not_null())
        .then(pl.col("compute_type").replace(_COMPUTE_SQE))
        .otherwise(pl.col("runtime_type").replace(_SQE_TYPE))
    )
    frame = frame.with_columns(
        pl.lit("X").alias("ph"), sqe.alias("task_type"), pl.col("tid").alias("stream_id")
    ).with_columns(
        pl.struct(
            pl.col("raw_model_id").alias("Model Id"),
            pl.col("task_type").alias("Task Type"),
            pl.col("tid").alias("Physic Stream Id"),
            pl.col("task_id").alias("Task Id"),
            pl.col("context_id").alias("Subtask Id"),
            pl.col("connection_id"),
        )
        .struct.json_encode()
        .alias("args"),
    )
    return _with_names(frame, layout, "Ascend Hardware", _stream_name)


def _comm_groups(db: _Db) -> dict[str, tuple[int, int]]:
    """Group name → (its index, the tid of its op thread): one `Group <i> Communication` thread
    per group, followed by its `Plane <n>` threads (tid = op thread + 1 + plane)."""
    if not db.has("COMMUNICATION_OP"):
        return {}
    groups = db.con.execute(
        "SELECT groupName, min(startNs) FROM COMMUNICATION_OP GROUP BY groupName ORDER BY 2"
    ).fetchall()
    planes = {}
    if db.has("COMMUNICATION_TASK_INFO"):
        planes = dict(
            db.con.execute(
                "SELECT groupName, max(planeId) FROM COMMUNICATION_TASK_INFO GROUP BY 1"
            ).fetchall()
        )
    out, tid = {}, 0
    for index, (group, _) in enumerate(groups):
        out[group] = (index, tid)
        tid += 2 + int(planes.get(group) or 0)
    return out


def _group_tid(db: _Db) -> pl.DataFrame:
    groups = _comm_groups(db)
    return pl.DataFrame(
        {
            "group_id": list(groups),
            "group_index": [g[0] for g in groups.values()],
            "group_tid": [g[1] for g in groups.values()],
        },
        schema={"group_id": I64, "group_index": I64, "group_tid": I64},
    )


def _comm_op_slices(db: _Db, layout: _Layout) -> pl.DataFrame | None:
    if not db.has("COMMUNICATION_OP"):
        return None
    t = "COMMUNICATION_OP"
    data_type = (
        _enum("ENUM_HCCL_DATA_TYPE", db.col(t, "dataType", "o"))
        if db.has("ENUM_HCCL_DATA_TYPE")
        else "NULL"
    )
    sql = f"""
        SELECT o.startNs AS start_ns, o.endNs - o.startNs AS dur_ns, o.groupName AS group_id,
               {_s("o.opName")} AS name, {_id(db.col(t, "connectionId", "o"))} AS connection_id,
               {
        _args(
            ("connection_id", db.col(t, "connectionId", "o")),
            ("data_type", data_type),
            ("alg_type", _s(db.col(t, "algType", "o"))),
            ("count", db.col(t, "count", "o")),
        )
    } AS args
        FROM COMMUNICATION_OP o"""
    frame = db.frame(
        sql,
        {
            "start_ns": I64,
            "dur_ns": I64,
            "group_id": I64,
            "name": STR,
            "connection_id": I64,
            "args": STR,
        },
    )
    frame = frame.join(_group_tid(db), on="group_id", how="left").with_columns(
        pl.lit("X").alias("ph"), pl.col("group_tid").alias("tid")
    )
    names = pl.format("Group {} Communication", pl.col("group_index"))
    return _with_names(frame, layout, layout.comm_process, lambda _tid: names)


def _plane_slices(db: _Db, layout: _Layout) -> pl.DataFrame | None:
    if not (db.has("COMMUNICATION_TASK_INFO") and db.has("TASK")):
        return None
    t = "COMMUNICATION_TASK_INFO"

    def enum(table: str, column: str) -> str:
        return _enum(table, db.col(t, column, "c")) if db.has(table) else "NULL"

    task_type = _s(db.col(t, "taskType", "c"))
    sql = f"""
        SELECT k.startNs AS start_ns, k.endNs - k.startNs AS dur_ns, c.groupName AS group_id,
               {db.col(t, "planeId", "c")} AS plane, {task_type} AS name, {task_type} AS task_type,
               k.streamId AS stream_id, k.taskId AS task_id, {
        _id(db.col("TASK", "modelId", "k"))
    } AS model_id,
               {
        _args(
            ("notify_id", f"CAST({db.col(t, 'notifyId', 'c')} AS TEXT)"),
            ("stream id", "k.streamId"),
            ("task id", "k.taskId"),
            ("context id", db.col("TASK", "contextId", "k")),
            ("task type", task_type),
            ("src rank", db.col(t, "srcRank", "c")),
            ("dst rank", db.col(t, "dstRank", "c")),
            ("transport type", enum("ENUM_HCCL_TRANSPORT_TYPE", "transportType")),
            ("size(Byte)", db.col(t, "size", "c")),
            ("data type", enum("ENUM_HCCL_DATA_TYPE", "dataType")),
            ("link type", enum("ENUM_HCCL_LINK_TYPE", "linkType")),
            ("model id", db.col("TASK", "modelId", "k")),
        )
    } AS args
        FROM COMMUNICATION_TASK_INFO c JOIN TASK k ON k.globalTaskId = c.globalTaskId"""
    frame = db.frame(
        sql,
        {
            "start_ns": I64,
            "dur_ns": I64,
            "group_id": I64,
            "plane": I64,
            "name": STR,
            "task_type": STR,
            "stream_id": I64,
            "task_id": I64,
            "model_id": I64,
            "args": STR,
        },
    )
    frame = frame.join(_group_tid(db), on="group_id", how="left").with_columns(
        pl.lit("X").alias("ph"),
        (pl.col("group_tid").fill_null(0) + 1 + pl.col("plane")).alias("tid"),
    )
    names = pl.format("Plane {}", pl.col("plane"))
    return _with_names(frame, layout, layout.comm_process, lambda _tid: names)


def _overlap_slices(db: _Db, layout: _Layout) -> pl.DataFrame | None:
    if not db.has("OVERLAP_ANALYSIS"):
        return None
    frame = db.frame(
        "SELECT startNs AS start_ns, endNs - startNs AS dur_ns, type AS tid FROM OVERLAP_ANALYSIS",
        {"start_ns": I64, "dur_ns": I64, "tid": I64},
    )
    names = pl.col("tid").replace_strict(
        dict(enumerate(OVERLAP_THREADS)), default=None, return_dtype=STR
    )
    frame = frame.with_columns(pl.lit("X").alias("ph"), names.alias("name"))
    return _with_names(frame, layout, "Overlap Analysis", lambda _tid: pl.col("name"))


# --------------------------------------------------------------------------- counters

_COUNTER_SCHEMA = {"ts_ns": I64, "name": STR, "series": STR, "value": F64}


def _counters(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame:
    """One row per (sample, series), named as trace_view.json's C events name them."""
    hbm_dir = "(CASE WHEN {} = 'read' THEN 'Read' ELSE 'Write' END)"
    sources: list[tuple[str, str, list[str]]] = [
        (
            "AICORE_FREQ",
            "AI Core Freq",
            [
                "SELECT timestampNs AS ts_ns, 'AI Core Freq' AS name, 'MHz' AS series, freq AS value FROM AICORE_FREQ"
            ],
        ),
        (
            "HBM",
            "HBM",
            [
                f"SELECT timestampNs AS ts_ns, 'HBM ' || hbmId || '/' || {hbm_dir.format(_s('type'))} AS name, "
                f"{hbm_dir.format(_s('type'))} || '(MB/s)' AS series, bandwidth / {_MB}.0 AS value FROM HBM"
            ],
        ),
        (
            "LLC",
            "LLC",
            [
                f"SELECT timestampNs AS ts_ns, 'LLC ' || llcId || ' ' || {_cap(_s('mode'))} || '/Throughput' AS name, "
                # msprof stored the trace's 3-decimal MB/s times 2^20: rounding gives it back
                f"'Throughput(MB/s)' AS series, round(throughput / {_MB}.0, 3) AS value FROM LLC",
                f"SELECT timestampNs AS ts_ns, 'LLC ' || llcId || ' ' || {_cap(_s('mode'))} || '/Hit Rate' AS name, "
                "'Hit Rate(%)' AS series, hitRate / 100.0 AS value FROM LLC",
            ],
        ),
        (
            "NPU_MEM",
            "NPU MEM",
            [
                f"SELECT timestampNs AS ts_ns, {_who('type')} || '/' || kind AS name, 'KB' AS series, "
                "value / 1024.0 AS value FROM (SELECT timestampNs, type, 'DDR' AS kind, ddr AS value FROM NPU_MEM "
                "UNION ALL SELECT timestampNs, type, 'HBM', hbm FROM NPU_MEM "
                "UNION ALL SELECT timestampNs, type, 'Memory', ddr + hbm FROM NPU_MEM)"
            ],
        ),
        (
            "SOC_BANDWIDTH_LEVEL",
            "Stars Soc Info",
            [
                "SELECT timestampNs AS ts_ns, 'Mata Bw Level' AS name, 'Mata Bw Level' AS series, "
                "mataBwLevel AS value FROM SOC_BANDWIDTH_LEVEL",
                "SELECT timestampNs AS ts_ns, 'L2 Buffer Bw Level' AS name, 'L2 Buffer Bw Level' AS series, "
                "l2BufferBwLevel AS value FROM SOC_BANDWIDTH_LEVEL",
            ],
        ),
        (
            "ACC_PMU",
            "Acc PMU",
            [
                f"SELECT timestampNs AS ts_ns, '{name}' AS name, series, CASE series WHEN 'value' THEN {column} "
                "ELSE accId END AS value FROM ACC_PMU, (SELECT 'value' AS series UNION ALL SELECT 'acc_id')"
                for name, column in (
                    ("read_bandwidth", "readBwLevel"),
                    ("write_band_width", "writeBwLevel"),
                    ("read_ost", "readOstLevel"),
                    ("write_ost", "writeOstLevel"),
                )
            ],
        ),
    ]
    frames = []
    for table, process, queries in sources:
        if not _collected(db, result, table):
            continue
        try:
            frame = pl.concat([db.frame(q, _COUNTER_SCHEMA) for q in queries])
        except DbUnreadable as exc:  # a release with other columns: this counter only is lost
            result.warnings.append(f"{table}: not read ({exc})")
            continue
        frames.append(
            frame.with_columns(
                pl.lit(process).alias("process"),
                pl.lit(layout.pid(process), dtype=I64).alias("pid"),
                pl.lit(0, dtype=I64).alias("tid"),
            )
        )
    schema = {n: _SLICE_SCHEMA.get(n, F64) for n, _ in body_columns("counters")}
    schema.update(_COUNTER_SCHEMA)
    counters = pl.concat([pl.DataFrame(schema=schema), *[_conform(f, schema) for f in frames]])
    return counters.sort(["ts_ns", "name", "series", "pid"], maintain_order=True)


def _cap(expr: str) -> str:
    """`read` → `Read`."""
    return f"(upper(substr({expr}, 1, 1)) || substr({expr}, 2))"


def _who(expr: str) -> str:
    """NPU_MEM.type (`app`, `device`) → `APP`, `Device`, as the NPU MEM counter names say."""
    value = _s(expr)
    return f"(CASE WHEN {value} = 'app' THEN 'APP' ELSE {_cap(value)} END)"


# --------------------------------------------------------------------------- flows


def _flows(db: _Db, layout: _Layout, slices: pl.DataFrame) -> pl.DataFrame:
    """Flows as trace_view.json pairs them: host launch → device task (``HostToDevice``, id =
    connection id; ``async_npu``, id = the task's start ns), enqueue → dequeue
    (``async_task_queue``, id = correlation id) and forward → backward (``fwdbwd``)."""
    schema = {name: _SLICE_SCHEMA.get(name, STR) for name, _ in body_columns("flows")}
    schema["flow_id"] = STR
    ends = slices.select(
        "process", "thread", "pid", "tid", "start_ns", "connection_id", "cat", "api_row"
    )
    frames = []
    device = ends.filter(
        pl.col("process").is_in(["Ascend Hardware", layout.comm_process])
        & pl.col("connection_id").is_not_null()
        & ~(pl.col("thread").str.starts_with("Plane "))
    )
    # Device tasks of a communication op get their flows at the op (its Group thread), not each.
    comm_conns = device.filter(pl.col("process") == layout.comm_process)["connection_id"]
    device = device.filter(
        (pl.col("process") == layout.comm_process)
        | ~pl.col("connection_id").is_in(comm_conns.implode())
    )
    cann = ends.filter((pl.col("process") == "CANN") & pl.col("connection_id").is_not_null())
    if db.has("connectionCats"):  # only the connections torch_npu drew a HostToDevice flow for
        drawn = db.frame(
            "SELECT DISTINCT connectionId AS connection_id FROM connectionCats WHERE cat = 'HostToDevice'",
            {"connection_id": I64},
        )
        cann = cann.join(drawn, on="connection_id", how="semi")
    h2d = cann.join(device, on="connection_id", how="inner", suffix="_dst")
    # A communication op's flow id carries a context in its low 32 bits (-1 before the current
    # generation, which writes none); a device task's is the connection id itself.
    context = 0 if layout.generation == "current" else -1
    flow_id = (
        pl.when(pl.col("process_dst") == layout.comm_process)
        .then((pl.col("connection_id") * (1 << 32)) + context)
        .otherwise(pl.col("connection_id"))
        .cast(STR)
    )
    frames.append(
        h2d.with_columns(flow_id.alias("flow_id")).select(
            pl.lit("HostToDevice").alias("cat"),
            pl.format("HostToDevice{}", pl.col("flow_id")).alias("name"),
            pl.col("flow_id"),
            pl.col("start_ns"),
            pl.col("start_ns_dst").alias("end_ns"),
            *_ends("", "src_"),
            *_ends("_dst", "dst_"),
        )
    )
    links = _python_links(db)
    if links is not None:
        python = ends.filter(pl.col("process") == "Python")
        npu = links.filter(pl.col("cat") == "async_npu").join(
            python.select("api_row", "process", "thread", "pid", "tid", "start_ns"), on="api_row"
        )
        to_npu = npu.join(
            device, left_on="link", right_on="connection_id", how="inner", suffix="_dst"
        )
        frames.append(
            to_npu.select(
                pl.lit("async_npu").alias("cat"),
                pl.lit("torch_to_npu").alias("name"),
                pl.col("start_ns_dst").cast(STR).alias("flow_id"),
                pl.col("start_ns"),
                pl.col("start_ns_dst").alias("end_ns"),
                *_ends("", "src_"),
                *_ends("_dst", "dst_"),
            )
        )
        for cat, name, src_filter in (
            ("async_task_queue", "enqueue_to_dequeue", pl.col("cat_api") == "enqueue"),
            ("fwdbwd", "fwdbwd", None),
        ):
            pair = links.filter(pl.col("cat") == cat).join(
                python.select(
                    "api_row",
                    "process",
                    "thread",
                    "pid",
                    "tid",
                    "start_ns",
                    pl.col("cat").alias("cat_api"),
                ),
                on="api_row",
            )
            if src_filter is None:  # the forward op starts first
                src_filter = pl.col("start_ns") == pl.col("start_ns").min().over("link")
            src = pair.filter(src_filter)
            dst = (
                pair.filter(~src_filter)
                if cat == "fwdbwd"
                else pair.filter(pl.col("cat_api") == "dequeue")
            )
            joined = src.join(dst, on="link", how="full", suffix="_dst", coalesce=True)
            frames.append(
                joined.select(
                    pl.lit(cat).alias("cat"),
                    pl.lit(name).alias("name"),
                    pl.col("link").cast(STR).alias("flow_id"),
                    pl.col("start_ns"),
                    pl.col("start_ns_dst").alias("end_ns"),
                    *_ends("", "src_"),
                    *_ends("_dst", "dst_"),
                )
            )
    flows = pl.concat([pl.DataFrame(schema=schema), *[_conform(f, schema) for f in frames]])
    return (
        flows.with_columns(pl.coalesce("start_ns", "end_ns").alias("_order"))
        .sort(["_order", "end_ns", "cat", "flow_id"], nulls_last=True, maintain_order=True)
        .drop("_order")
    )


def _ends(suffix: str, prefix: str) -> list[pl.Expr]:
    return [
        pl.col(f"{c}{suffix}").alias(f"{prefix}{c}") for c in ("process", "thread", "pid", "tid")
    ]


def _python_links(db: _Db) -> pl.DataFrame | None:
    """(PYTORCH_API rowid, a connection id it is linked by, the flow's category)."""
    if not (db.has("PYTORCH_API") and db.has("CONNECTION_IDS") and db.has("connectionCats")):
        return None
    return db.frame(
        """SELECT p.rowid AS api_row, i.connectionId AS link, c.cat AS cat
           FROM PYTORCH_API p
           JOIN CONNECTION_IDS i ON i.id = p.connectionId
           JOIN connectionCats c ON c.connectionId = i.connectionId""",
        {"api_row": I64, "link": I64, "cat": STR},
    )


# --------------------------------------------------------------------------- threads


def _threads(layout: _Layout, slices: pl.DataFrame, counters: pl.DataFrame) -> pl.DataFrame:
    """Every (pid, tid) with events, named and sorted as the Text export's M events name them."""
    used = pl.concat(
        [
            slices.select("process", "pid", "tid", "thread", "cat"),
            counters.select(
                "process",
                "pid",
                "tid",
                pl.format("Thread {}", pl.col("tid")).alias("thread"),
                pl.lit(None, dtype=STR).alias("cat"),
            ),
        ]
    )
    threads = used.group_by("process", "pid", "tid", "thread").agg(
        (pl.col("cat") == "dequeue").any().alias("dequeue")
    )
    sort = {p: layout.sort_index(p) for p in threads["process"].unique().to_list() if p != "Python"}
    sort["Python"] = 0
    python_top = threads.filter((pl.col("process") == "Python") & ~pl.col("dequeue"))["tid"].max()
    named_threads = ("Python", "CANN", "Ascend Hardware", layout.comm_process)
    thread_sort = (
        pl.when((pl.col("process") == "Python") & pl.col("dequeue") & (python_top is not None))
        .then(pl.lit(python_top or 0) + 1)
        .when(pl.col("process").is_in(named_threads))
        .then(pl.col("tid"))
    )
    threads = threads.with_columns(
        pl.col("process")
        .replace_strict({p: layout.label(p) for p in sort}, default=None)
        .alias("process_label"),
        pl.col("process")
        .replace_strict(sort, default=None, return_dtype=I64)
        .alias("process_sort_index"),
        thread_sort.cast(I64).alias("thread_sort_index"),
    )
    schema = {n: _SLICE_SCHEMA.get(n, I64) for n, _ in body_columns("threads")}
    schema.update({"process_label": STR, "thread": STR, "process": STR})
    return _conform(threads, schema).sort(
        ["process_sort_index", "process", "thread_sort_index", "tid"], nulls_last=False
    )


# --------------------------------------------------------------------------- device tables


def _step_of(expr: str, db: _Db) -> str:
    if not db.has("STEP_TIME"):
        return "NULL"
    return f"(SELECT id FROM STEP_TIME s WHERE {expr} >= s.startNs AND {expr} <= s.endNs LIMIT 1)"


def _kernels(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "COMPUTE_TASK_INFO") or not db.has("TASK"):
        return None
    c = "COMPUTE_TASK_INFO"

    def text(column: str) -> str:
        return _s(db.col(c, column, "ci"))

    block = (
        db.col(c, "blockNum", "ci")
        if db.col(c, "blockNum") != "NULL"
        else db.col(c, "blockDim", "ci")
    )
    mix = (
        db.col(c, "mixBlockNum", "ci")
        if db.col(c, "mixBlockNum") != "NULL"
        else db.col(c, "mixBlockDim", "ci")
    )
    sql = f"""
        SELECT ci.globalTaskId AS global_task_id, {_step_of("t.startNs", db)} AS step,
               {db.col("TASK", "deviceId", "t")} AS device_id, {_id(db.col("TASK", "modelId", "t"))} AS model_id,
               t.taskId AS task_id, t.streamId AS stream_id, {text("name")} AS name, {text("opType")} AS type,
               {text("opState") if db.col(c, "opState") != "NULL" else "NULL"} AS op_state,
               {text("taskType")} AS accelerator_core, t.startNs AS start_ns, t.endNs - t.startNs AS dur_ns,
               {db.col(c, "waitNs", "ci")} AS wait_ns, {block} AS block_num, {mix} AS mix_block_num,
               {text("hf32Eligible") if db.col(c, "hf32Eligible") != "NULL" else "NULL"} AS hf32_eligible,
               {text("inputShapes")} AS input_shapes, {text("inputDataTypes")} AS input_data_types,
               {text("inputFormats")} AS input_formats, {text("outputShapes")} AS output_shapes,
               {text("outputDataTypes")} AS output_data_types, {text("outputFormats")} AS output_formats,
               {_id(db.col("TASK", "contextId", "t"))} AS context_id
        FROM COMPUTE_TASK_INFO ci JOIN TASK t ON t.globalTaskId = ci.globalTaskId
        ORDER BY t.startNs, t.streamId, t.taskId"""
    schema = {
        n: {"int32": pl.Int32(), "int64": I64, "double": F64}.get(str(t), STR)
        for n, t in body_columns("kernels")
    }
    frame = db.frame(sql, {"global_task_id": I64, **schema})
    frame = frame.with_columns(
        pl.col("input_shapes").str.strip_chars('"'), pl.col("output_shapes").str.strip_chars('"')
    )
    if db.has("TASK_PMU_INFO"):
        pmu = db.frame(
            f"SELECT globalTaskId AS global_task_id, {_s('name')} AS metric, value FROM TASK_PMU_INFO",
            {"global_task_id": I64, "metric": STR, "value": F64},
        ).with_columns(pl.col("metric").replace(_PMU_RENAMED))
        pmu = pmu.with_columns(
            pl.when(pl.col("metric").str.ends_with("_time"))
            .then(pl.col("metric") + "(us)")
            .otherwise(pl.col("metric"))
            .alias("metric")
        )
        extra = (
            pmu.group_by("global_task_id", maintain_order=True)
            .agg(
                pl.format('"{}": {}', pl.col("metric"), pl.col("value"))
                .str.join(", ")
                .alias("extra")
            )
            .with_columns(("{" + pl.col("extra") + "}").alias("extra"))
        )
        frame = frame.join(extra, on="global_task_id", how="left", maintain_order="left")
    return _conform(frame, schema)


def _memory_records(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    """memory_record.csv's rows: PTA/GE totals from MEMORY_RECORD, APP from NPU_MEM."""
    parts = []
    if db.has("MEMORY_RECORD"):
        t = "MEMORY_RECORD"
        parts.append(
            f"""SELECT {_s("component")} AS component, timestamp AS ts_ns,
                       totalAllocated / {_MB}.0 AS total_allocated_mb, totalReserved / {_MB}.0 AS total_reserved_mb,
                       totalActive / {_MB}.0 AS total_active_mb, {db.col(t, "streamPtr")} AS stream_ptr,
                       'NPU:' || {db.col(t, "deviceId")} AS device_type FROM MEMORY_RECORD"""
        )
    if db.has("NPU_MEM"):
        parts.append(
            f"""SELECT 'APP' AS component, timestampNs AS ts_ns, NULL AS total_allocated_mb,
                       (ddr + hbm) / {_MB}.0 AS total_reserved_mb, NULL AS total_active_mb, NULL AS stream_ptr,
                       'NPU:' || {db.col("NPU_MEM", "deviceId")} AS device_type
                FROM NPU_MEM WHERE {_s("type")} = 'app'"""
        )
    if not parts:
        _collected(db, result, "MEMORY_RECORD")
        return None
    schema = {
        "component": STR,
        "ts_ns": I64,
        "total_allocated_mb": F64,
        "total_reserved_mb": F64,
        "total_active_mb": F64,
        "stream_ptr": I64,
        "device_type": STR,
    }
    return db.frame(" UNION ALL ".join(parts) + " ORDER BY ts_ns", schema)


def _op_memory(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "OP_MEMORY"):
        return None
    t = "OP_MEMORY"

    def mb(column: str) -> str:
        return f"{db.col(t, column)} / {_MB}.0"

    sql = f"""SELECT {_s("name")} AS name, size / 1024.0 AS size_kb, allocationTime AS alloc_ns,
                     {db.col(t, "releaseTime")} AS release_ns, {db.col(t, "activeReleaseTime")} AS active_release_ns,
                     {db.col(t, "duration")} AS dur_ns, {db.col(t, "activeDuration")} AS active_dur_ns,
                     {mb("allocationTotalAllocated")} AS alloc_total_allocated_mb,
                     {mb("allocationTotalReserved")} AS alloc_total_reserved_mb,
                     {mb("allocationTotalActive")} AS alloc_total_active_mb,
                     {mb("releaseTotalAllocated")} AS release_total_allocated_mb,
                     {mb("releaseTotalReserved")} AS release_total_reserved_mb,
                     {mb("releaseTotalActive")} AS release_total_active_mb,
                     {db.col(t, "streamPtr")} AS stream_ptr, 'NPU:' || {db.col(t, "deviceId")} AS device_type
              FROM OP_MEMORY ORDER BY allocationTime"""
    schema = {
        n: {"int64": I64, "double": F64}.get(str(typ), STR) for n, typ in body_columns("op_memory")
    }
    return db.frame(sql, {k: v for k, v in schema.items() if k != "extra"})


def _module_memory(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame | None:
    if not _collected(db, result, "NPU_MODULE_MEM"):
        return None
    component = (
        _enum("ENUM_MODULE", "moduleId") if db.has("ENUM_MODULE") else "CAST(moduleId AS TEXT)"
    )
    device = db.col("NPU_MODULE_MEM", "deviceId")
    sql = f"""SELECT {device} AS device_id, {component} AS component, timestampNs AS ts_ns,
                     totalReserved / {_MB}.0 AS total_reserved_mb, 'NPU:' || {device} AS device
              FROM NPU_MODULE_MEM ORDER BY timestampNs, moduleId"""
    return db.frame(
        sql,
        {
            "device_id": pl.Int32(),
            "component": STR,
            "ts_ns": I64,
            "total_reserved_mb": F64,
            "device": STR,
        },
    )


def _api_stats(slices: pl.DataFrame) -> pl.DataFrame:
    """api_statistic.csv's figures, from the CANN API events (µs, population variance)."""
    cann = slices.filter(pl.col("process") == "CANN").with_columns(
        (pl.col("dur_ns") / 1000).alias("us")
    )
    return (
        cann.group_by("api_level", "api_name")
        .agg(
            pl.len().cast(I64).alias("count"),
            pl.col("us").sum().alias("total_us"),
            pl.col("us").mean().alias("avg_us"),
            pl.col("us").min().alias("min_us"),
            pl.col("us").max().alias("max_us"),
            pl.col("us").var(ddof=0).alias("variance"),
        )
        .rename({"api_level": "level"})
        .sort("total_us", "level", "api_name", descending=[True, False, False])
    )


def _op_stats(db: _Db, layout: _Layout, result: DbResult) -> pl.DataFrame:
    """op_statistic.csv's figures, from the compute tasks (µs; ratio of the total task time)."""
    kernels = _kernels(db, layout, DbResult())
    assert kernels is not None
    stats = (
        kernels.with_columns((pl.col("dur_ns") / 1000).alias("us"))
        .group_by(pl.col("type").alias("op_type"), pl.col("accelerator_core").alias("core_type"))
        .agg(
            pl.len().cast(I64).alias("count"),
            pl.col("us").sum().alias("total_us"),
            pl.col("us").min().alias("min_us"),
            pl.col("us").mean().alias("avg_us"),
            pl.col("us").max().alias("max_us"),
        )
    )
    return stats.with_columns(
        (pl.col("total_us") / pl.col("total_us").sum() * 100).alias("ratio_pct")
    ).sort("total_us", "op_type", descending=[True, False])


# --------------------------------------------------------------------------- analysis.db


def _analysis_tables(db: _Db, sink: TableSink, result: DbResult) -> None:
    if db.has("StepTraceTime"):
        result.rows["step_times"] = sink.arrow("step_times", _step_times(db).to_arrow())
    if db.has("CommAnalyzerTime"):
        result.rows["comm_ops"] = sink.arrow("comm_ops", _comm_ops(db).to_arrow())
    if db.has("CommAnalyzerMatrix"):
        result.rows["comm_links"] = sink.arrow("comm_links", _comm_links(db).to_arrow())


def _us(column: str) -> str:
    return f"CAST(round({column} * 1000) AS INTEGER)"


def _ms(column: str) -> str:
    return f"CAST(round({column} * 1000000) AS INTEGER)"


def _step_times(db: _Db) -> pl.DataFrame:
    t = "StepTraceTime"
    columns = {
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
    select = ", ".join(
        f"{_us(db.col(t, src)) if db.col(t, src) != 'NULL' else 'NULL'} AS {name}"
        for name, src in columns.items()
    )
    device = db.col(t, "deviceId")
    sql = f"SELECT {device} AS device_id, CAST(nullif(step, '') AS INTEGER) AS step, {select} FROM StepTraceTime"
    return db.frame(sql, {"device_id": pl.Int32(), "step": I64, **{n: I64 for n in columns}})


def _comm_ops(db: _Db) -> pl.DataFrame:
    t = "CommAnalyzerTime"
    sql = f"""SELECT step, type AS kind, hccl_op_name AS op_name, group_name AS "group",
                     {_us("start_timestamp")} AS start_ns, {_ms("elapse_time")} AS elapse_ns,
                     {_ms("transit_time")} AS transit_ns, {_ms("wait_time")} AS wait_ns,
                     {_ms("synchronization_time")} AS synchronization_ns, {_ms("idle_time")} AS idle_ns,
                     {db.col(t, "wait_time")} AS wait, {db.col(t, "synchronization_time")} AS sync,
                     {db.col(t, "transit_time")} AS transit
              FROM CommAnalyzerTime"""
    frame = db.frame(
        sql,
        {
            "step": STR,
            "kind": STR,
            "op_name": STR,
            "group": STR,
            "start_ns": I64,
            "elapse_ns": I64,
            "transit_ns": I64,
            "wait_ns": I64,
            "synchronization_ns": I64,
            "idle_ns": I64,
            "wait": F64,
            "sync": F64,
            "transit": F64,
        },
    )
    # msprof's ratios: wait / (wait + transit), synchronization / (synchronization + transit).
    frame = frame.with_columns(
        (pl.col("wait") / (pl.col("wait") + pl.col("transit")))
        .round(4)
        .fill_nan(0)
        .alias("wait_ratio"),
        (pl.col("sync") / (pl.col("sync") + pl.col("transit")))
        .round(4)
        .fill_nan(0)
        .alias("synchronization_ratio"),
    )
    bandwidth = _bandwidth(db)
    if bandwidth is not None:
        frame = frame.join(
            bandwidth, on=["step", "kind", "op_name", "group"], how="left", maintain_order="left"
        )
    return frame


def _bandwidth(db: _Db) -> pl.DataFrame | None:
    """communication.json's `Communication Bandwidth Info` per op, from CommAnalyzerBandwidth."""
    if not db.has("CommAnalyzerBandwidth"):
        return None
    rows = db.con.execute(
        """SELECT step, type, hccl_op_name, group_name, transport_type, transit_size, transit_time,
                  bandwidth, large_packet_ratio, package_size, count, total_duration
           FROM CommAnalyzerBandwidth"""
    ).fetchall()
    ops: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for step, kind, op, group, transport, size, time_ms, bw, large, package, count, total in rows:
        info = ops.setdefault((step, kind, op, group), {}).setdefault(
            transport,
            {
                "Transit Size(MB)": size,
                "Transit Time(ms)": time_ms,
                "Bandwidth(GB/s)": bw,
                "Large Packet Ratio": large,
                "Size Distribution": {},
            },
        )
        if count:
            info["Size Distribution"][
                repr(package) if isinstance(package, float) else str(package)
            ] = [count, total]
    keys = list(ops)
    return pl.DataFrame(
        {
            "step": [k[0] for k in keys],
            "kind": [k[1] for k in keys],
            "op_name": [k[2] for k in keys],
            "group": [k[3] for k in keys],
            "bandwidth": [json.dumps(ops[k], sort_keys=True) for k in keys],
        },
        schema={"step": STR, "kind": STR, "op_name": STR, "group": STR, "bandwidth": STR},
    )


def _comm_links(db: _Db) -> pl.DataFrame:
    t = "CommAnalyzerMatrix"
    sql = f"""SELECT step, type AS kind, hccl_op_name AS op_key, group_name AS "group",
                     CAST(src_rank AS INTEGER) AS src_rank, CAST(dst_rank AS INTEGER) AS dst_rank,
                     transport_type, transit_size AS transit_size_mb, {_ms("transit_time")} AS transit_ns,
                     bandwidth AS bandwidth_gbps, {db.col(t, "op_name")} AS op_name
              FROM CommAnalyzerMatrix"""
    return db.frame(
        sql,
        {
            "step": STR,
            "kind": STR,
            "op_key": STR,
            "group": STR,
            "src_rank": I64,
            "dst_rank": I64,
            "transport_type": STR,
            "transit_size_mb": F64,
            "transit_ns": I64,
            "bandwidth_gbps": F64,
            "op_name": STR,
        },
    )
