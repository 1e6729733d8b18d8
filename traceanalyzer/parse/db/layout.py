"""The session as the Text export of it would number it: generation, pids, process labels."""

from __future__ import annotations

from dataclasses import dataclass

from traceanalyzer import json_shape
from traceanalyzer.parse.db.database import Db, DbUnreadable
from traceanalyzer.parse.db.result import DbResult
from traceanalyzer.parse.trace_shared import CURRENT_SORT_INDEX, G2_SORT_INDEX

# META_DATA SCHEMA_VERSION majors this reader knows (1.x: torch_npu 2.1 .. 2.8).
KNOWN_SCHEMA_MAJORS = (1,)
# Without these the file is not a torch_npu profiler database, whatever its name.
_REQUIRED_TABLES = ("STRING_IDS",)
_EVENT_TABLES = ("PYTORCH_API", "CANN_API", "TASK")

# META_DATA values that are JSON in every export: one that does not decode is said
_JSON_KEYS = ("ENV_VARIABLES", "parallel_group_info")
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
    return db.value("SELECT CAST(value AS TEXT) FROM META_DATA WHERE name = 'SCHEMA_VERSION'")


def check_schema(db: Db, version: str | None) -> None:
    # a required table that is there but not read (a view) still says what the file is
    missing = [t for t in _REQUIRED_TABLES if not db.has(t) and not db.refused(t)]
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
            os_pid = db.value(f"SELECT CAST({column} AS INTEGER) >> {shift} FROM {table} LIMIT 1")
    device = None
    for table in ("TASK", "RANK_DEVICE_MAP"):
        if device is None and db.has_column(table, "deviceId"):
            device = db.value(f"SELECT CAST(deviceId AS INTEGER) FROM {table} LIMIT 1")
    comm = "Communication" if generation in ("g3", "current") else "HCCL"
    # msprof's pids hold the device in 5 bits and the process id above them
    return Layout(_within(os_pid, 1 << 31), _within(device, 1 << 5), generation, comm)


def _within(value: object, limit: int) -> int:
    """``value`` when it is an integer in [0, limit), else 0 (a damaged id)."""
    return value if isinstance(value, int) and 0 <= value < limit else 0


def session_facts(db: Db, result: DbResult) -> None:
    """The host and the session's own records (META_DATA, SESSION_TIME_INFO, NPU_INFO); the
    rank is discovery's (RANK_DEVICE_MAP when nothing else tells it). A value that does not
    decode costs that value, with a warning."""
    if db.has_column("HOST_INFO", "hostName"):
        result.hostname = db.value("SELECT CAST(hostName AS TEXT) FROM HOST_INFO LIMIT 1")
    if db.has_column("META_DATA", "name") and db.has_column("META_DATA", "value"):
        meta = "SELECT CAST(name AS TEXT), CAST(value AS TEXT) FROM META_DATA"
        decoded: dict[str, object] = {}
        for name, value in db.rows(meta):
            if name is None or name.startswith("SCHEMA_VERSION"):
                continue
            result.metadata[name] = value
            if value is None:
                continue
            try:
                decoded[name] = json_shape.loads(value)
            except json_shape.InputFileError as exc:
                if name in _JSON_KEYS or "nested" in str(exc):
                    result.warnings.append(f"{db.path.name}: META_DATA {name}: {exc}; ignored")
                continue  # a plain text value: the metadata keeps it as it is
            if name == "ENV_VARIABLES":
                result.metadata[name] = decoded[name]
        # torch_npu keeps each profiler_metadata.json key here, its value as JSON: conformed
        # as discovery conforms that file's
        kept, dropped = json_shape.conform(decoded, json_shape.PROFILER_METADATA)
        result.profiler_metadata = kept
        result.warnings += [f"{db.path.name}: META_DATA {d}; ignored" for d in dropped]
    if db.has("SESSION_TIME_INFO"):
        row = db.first_row("SESSION_TIME_INFO")
        result.metadata |= {f"SESSION_TIME_INFO.{n}": v for n, v in row.items()}
    if db.has_column("NPU_INFO", "name"):
        result.metadata["NPU_INFO"] = db.value("SELECT CAST(name AS TEXT) FROM NPU_INFO LIMIT 1")
