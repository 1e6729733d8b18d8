"""The session as the Text export of it would number it: generation, pids, process labels."""

from __future__ import annotations

import json
from dataclasses import dataclass

from traceanalyzer.parse.db.database import Db, DbUnreadable
from traceanalyzer.parse.db.result import DbResult
from traceanalyzer.parse.trace_shared import CURRENT_SORT_INDEX, G2_SORT_INDEX

# META_DATA SCHEMA_VERSION majors this reader knows (1.x: torch_npu 2.1 .. 2.8).
KNOWN_SCHEMA_MAJORS = (1,)
# Without these the file is not a torch_npu profiler database, whatever its name.
_REQUIRED_TABLES = ("STRING_IDS",)
_EVENT_TABLES = ("PYTORCH_API", "CANN_API", "TASK")

_CURRENT_HOST_DEVICE = 31  # current msprof writes the host layers' pids with device bits 31


@dataclass
class Layout:
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


def schema_version(db: Db) -> str | None:
    if not (db.has_column("META_DATA", "name") and db.has_column("META_DATA", "value")):
        return None
    return db.value("SELECT value FROM META_DATA WHERE name = 'SCHEMA_VERSION'")


def check_schema(db: Db, version: str | None) -> None:
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


def generation_of(db: Db) -> str:
    """Name the generation from the schema: `communication` level and `blockNum` came later."""
    if db.has_column("COMPUTE_TASK_INFO", "blockNum"):
        return "current"
    levels = set()
    if db.has_column("ENUM_API_TYPE", "name"):
        levels = {r[0] for r in db.rows("SELECT CAST(name AS TEXT) FROM ENUM_API_TYPE")}
    return "g3" if "communication" in levels else "g2"


def layout_of(db: Db, generation: str) -> Layout:
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
    return Layout(int(os_pid or 0), int(device or 0), generation, comm)


def session_facts(db: Db, result: DbResult) -> None:
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
