"""The vocabulary of trace_view.json that its readers share: the result, the flattened args,
the sentinels, the process sort indexes and the cut of absurd names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

# Values msprof writes for "none" in id fields (uint32 and uint64 all-ones); they become null.
SENTINELS = (4294967295, 18446744073709551615)

# Args flattened into slices columns: (column, kind, keys in order of preference). A kind "id"
# is an integer whose "none" sentinel becomes null; "int" an integer; "text" the value as text.
# `args` keeps the event's whole object: removing these keys cost a fifth of the slices time,
# and the stream key that was written ("Stream Id" in G1, "Physic Stream Id" after) tells the
# generation.
ARG_COLUMNS = (
    ("stream_id", "id", ("Physic Stream Id", "Stream Id", "stream id")),
    ("task_type", "text", ("Task Type", "task type")),
    ("task_id", "id", ("Task Id", "task id")),
    ("model_id", "id", ("Model Id", "model id")),
    ("connection_id", "id", ("connection_id",)),
    ("api_level", "text", ("level",)),
    ("api_mode", "text", ("Mode",)),
    ("api_id", "text", ("id",)),
    ("memcpy_direction", "text", ("memcpy direction", "operation")),
    ("memcpy_size", "int", ("data size(Byte)", "size(B)")),
)
FLATTENED_KEYS = tuple(key for _, _, keys in ARG_COLUMNS for key in keys)

# msprof's process_sort_index per process name: G1-G3, and current msprof (which renumbered
# them). A device process's pid is ``(os_pid << 10) | (sort_index << 5) | device``; the Db
# reader numbers its processes so, and the synthetic exports write them so.
G2_SORT_INDEX = {
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
CURRENT_SORT_INDEX = {
    "CANN": 7,
    "Ascend Hardware": 14,
    "AI Core Freq": 15,
    "HCCL": 16,
    "Communication": 16,
    "NPU MEM": 17,
    # not seen in a current export yet: after NPU MEM, in the G2 order
    "HBM": 18,
    "LLC": 19,
    "Stars Soc Info": 20,
    "Acc PMU": 21,
    "QoS": 22,
    "Overlap Analysis": 31,
}


# Process and thread names (and process labels) longer than this are cut, with a note: a name is
# repeated in every row of its process when the tables are built, so a 10 MB name would
# multiply memory by the row count. The cut keeps a hash of the whole name, so two long names
# that share their start stay two processes.
MAX_NAME = 4096
CUT_KEEP = MAX_NAME - 11  # room for "…[" + 8 hex digits + "]"


def cut_end(digest: str) -> str:
    """What ends a name cut to :data:`CUT_KEEP` characters: the MD5 ``digest`` (hex) of the
    whole name, so two long names stay two."""
    return f"…[{digest[:8]}]"


def cut_name(name: str) -> str:
    if len(name) <= MAX_NAME:
        return name
    return name[:CUT_KEEP] + cut_end(hashlib.md5(name.encode("utf-8", "surrogatepass")).hexdigest())


def cut_names_note(count: int) -> str:
    return (
        f"{count} process/thread name(s) over {MAX_NAME:,} characters cut to that length "
        "(the cut ends with a hash of the whole name)"
    )


@dataclass
class TraceResult:
    rows: dict[str, int] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    processes: list[str] = field(default_factory=list)
    hw_stream_arg: str | None = None  # "Physic Stream Id" (G2+) or "Stream Id" (G1)
    warnings: list[str] = field(default_factory=list)
    # Why events were lost (truncated, empty, malformed), or None when every event was read.
    incomplete: str | None = None
    reader: str = "duckdb"  # or "native" (trace_native.py): which reader parsed the file
