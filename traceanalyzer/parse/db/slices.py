"""The slices of a Db export: PYTORCH_API (Python), CANN_API (CANN), TASK (Ascend Hardware),
COMMUNICATION_OP and COMMUNICATION_TASK_INFO (HCCL / Communication), OVERLAP_ANALYSIS; named and
with the args keys of the Text export's events."""

from __future__ import annotations

import polars as pl

from traceanalyzer.parse.db.database import (
    CAT,
    I64,
    STR,
    Db,
    conform,
    json_args,
    no_sentinel,
    schema_of,
)
from traceanalyzer.parse.db.layout import Layout
from traceanalyzer.parse.db.operators import OperatorTexts, operator_texts
from traceanalyzer.parse.db.result import DbResult, collected
from traceanalyzer.parse.rows import stable_order
from traceanalyzer.vocabulary import CORE_TASK_TYPE

# CANN_API levels (ENUM_API_TYPE names) → the name prefix of the Text export's CANN events.
_LEVELS = ("model", "node", "runtime", "hccl", "communication")
_LAYER = {"acl": "AscendCL"} | {level: level.capitalize() for level in _LEVELS}
# PYTORCH_API types (ENUM_API_TYPE names) → chrome-trace category of the Text export.
_PYTORCH_CAT = {"op": "cpu_op", "trace": "python_function", "mstx": "mstx"}
# The runtime's event and notify records and waits (TASK.taskType), queued as `<type>_SQE`.
SYNC_TASK_TYPES = ("EVENT_RECORD", "EVENT_WAIT", "EVENT_RESET", "NOTIFY_RECORD", "NOTIFY_WAIT")
# TASK.taskType is the runtime's task type; the Text export's `Task Type` is the hardware
# queue's (SQE) type. Compute tasks take theirs from COMPUTE_TASK_INFO (AI_CORE, MIX_AIV, ...).
_SQE_TYPE = {
    "KERNEL_AICORE": "AI_CORE",
    "KERNEL_AIVEC": "AI_CORE",
    "KERNEL_MIX_AIC": "MIX_AIC",
    "KERNEL_MIX_AIV": "MIX_AIV",
    "MEMCPY_ASYNC": "PCIE_DMA_SQE",
    "PROFILING_ENABLE": "PLACE_HOLDER_SQE",
    "PROFILING_DISABLE": "PLACE_HOLDER_SQE",
    "STARS_COMMON": "DSA_SQE",
} | {task: f"{task}_SQE" for task in SYNC_TASK_TYPES}
# COMPUTE_TASK_INFO.taskType (the op's core) → `Task Type` of the Text export's device task.
_COMPUTE_SQE = CORE_TASK_TYPE
OVERLAP_THREADS = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
_ARGS_ROWS = 1 << 15  # Python slices whose args are built at once

# --------------------------------------------------------------------------- slices

# Slices keep the PYTORCH_API rowid and connectionId of their row (flows attach by them); the
# sink drops them. Their names are dictionary-encoded (Categorical): each held once, not once
# per row, and written to Parquet as the dictionary they are (as the Text reader writes them).
_SLICE_NAMES = ("ph", "process", "thread", "name", "cat")
# The Python slices keep their call chain and input dims ids too, for the operators' texts.
_SLICES = schema_of("slices", api_row=I64, link_id=I64, callchain=I64, dims_id=I64) | dict.fromkeys(
    _SLICE_NAMES, CAT
)


def all_slices(parts: list[pl.DataFrame | None]) -> pl.DataFrame:
    """Every slice, in reading order: the parts' chunks, not copied (sorted as they are written)."""
    frames = [pl.DataFrame(schema=_SLICES), *(p for p in parts if p is not None)]
    return pl.concat(frames, rechunk=False)


def slice_order(slices: pl.DataFrame) -> pl.Series:
    """The slices table's order, the Text derivation's: grouped by process (by its name), by
    time within it, parents (longer) before children."""
    return stable_order(
        slices,
        ["process", "start_ns", "dur_ns", "pid", "tid", "name"],
        [False, False, True, False, False, False],
    )


def with_names(frame: pl.DataFrame, layout: Layout, process: str, thread: pl.Expr) -> pl.DataFrame:
    """The slices of one process, named, without the reader's working columns."""
    named = frame.with_columns(
        pl.lit("X").alias("ph"),
        pl.lit(process).alias("process"),
        pl.lit(layout.pid(process), dtype=I64).alias("pid"),
        thread.alias("thread"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
    )
    return conform(named, _SLICES)


def python_slices(
    db: Db, layout: Layout, result: DbResult
) -> tuple[pl.DataFrame | None, OperatorTexts | None]:
    """PYTORCH_API's slices, and the texts of the torch ops' operator_details rows."""
    if not collected(db, result, "PYTORCH_API"):
        return None, None
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
    stacks = _call_stacks(db)
    frame = frame.join(_correlations(db), on="link_id", how="left", maintain_order="left")
    frame = frame.with_columns(
        db.text(pl.col("name_id")).alias("name"),
        db.enum("ENUM_API_TYPE", pl.col("kind_id")).alias("kind"),
        (pl.col("global_tid") & 0xFFFFFFFF).alias("tid"),
    )
    op_args = json_args(
        ("Sequence number", pl.col("seq").fill_null(-1), False),
        ("Fwd thread id", pl.col("fwd").fill_null(0), False),
        ("Input Dims", db.quoted(pl.col("dims_id")), None),
        ("Input type", db.quoted(pl.col("types_id")), None),
    )  # and their `Call stack`, added as they are written (with_call_stacks)
    queue_args = json_args(("correlation_id", pl.col("correlation"), False))
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
    # block of rows at a time: the JSON fragments of all rows at once would take twice the
    # memory of the result. Only the ops keep their call chain (their stacks' key).
    thread = pl.format("Thread {}", pl.col("tid"))
    no_chain = pl.lit(None, dtype=I64).alias("callchain")
    blocks = []
    for block in frame.iter_slices(_ARGS_ROWS):
        ops = block.filter(is_op).with_columns(op_args.alias("args"))
        queues = block.filter(is_queue).with_columns(queue_args.alias("args"), no_chain)
        rest = block.filter(~is_op & ~is_queue).with_columns(
            pl.lit(None, dtype=STR).alias("args"), no_chain
        )
        named = [with_names(part, layout, "Python", thread) for part in (ops, queues, rest)]
        blocks.append(pl.concat(named).sort("api_row"))
    python = pl.concat([pl.DataFrame(schema=_SLICES), *blocks], rechunk=False)
    return python, operator_texts(db, stacks, python)


def with_call_stacks(part: pl.DataFrame, stacks: pl.DataFrame) -> pl.DataFrame:
    """``part`` (rows of the slices) with each torch op's `Call stack` (``stacks``: callchain →
    its JSON string literal) added to its args, as trace_view.json's last key. The slices
    hold the ops' args without it: the stacks are most of the args' text (35 of the 63 MB on
    the benchmark's Db twin) and are held once, for the operators too, not once more in the
    args of all the slices until they are written."""
    part = part.join(stacks, on="callchain", how="left", maintain_order="left")
    pair = pl.lit('"Call stack": ') + pl.col("stack")
    spliced = (
        pl.when(pl.col("args").is_null())
        .then(pl.lit("{") + pair + pl.lit("}"))
        .otherwise(pl.col("args").str.head(-1) + pl.lit(", ") + pair + pl.lit("}"))
    )
    args = pl.when(pl.col("stack").is_not_null()).then(spliced).otherwise(pl.col("args"))
    return part.with_columns(args.alias("args")).drop("stack")


def _call_stacks(db: Db) -> pl.DataFrame:
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


def _correlations(db: Db) -> pl.DataFrame:
    """CONNECTION_IDS id → the first connection id it lists (an enqueue's correlation id)."""
    links = db.scan("CONNECTION_IDS", link_id=("id", I64), correlation=("connectionId", I64))
    return links.unique("link_id", keep="first", maintain_order=True)


def _shapes_swapped(db: Db) -> bool:
    """torch_npu 2.1-2.5 write the type list into inputShapes and the dims into inputDtypes; a
    shape never holds a letter, so one that does tells the columns are swapped."""
    if not (
        db.has_column("PYTORCH_API", "inputShapes")
        and db.has_column("PYTORCH_API", "inputDtypes")
        and db.has_column("STRING_IDS", "value")
    ):
        return False
    return bool(
        db.value(
            "SELECT EXISTS (SELECT 1 FROM STRING_IDS WHERE value GLOB '*[A-Za-z]*' AND id IN "
            "(SELECT inputShapes FROM PYTORCH_API WHERE inputShapes IS NOT NULL LIMIT 1000))"
        )
    )


def cann_slices(db: Db, layout: Layout, result: DbResult) -> pl.DataFrame | None:
    if not collected(db, result, "CANN_API"):
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
        json_args(
            ("Thread Id", pl.col("tid"), False),
            ("level", pl.col("api_level"), True),
            ("id", api_id, True),
            ("connection_id", pl.col("connection_id"), False),
        ).alias("args"),
    )
    return with_names(frame, layout, "CANN", pl.format("Thread {}", pl.col("tid")))


def task_slices(db: Db, layout: Layout, result: DbResult) -> pl.DataFrame | None:
    if not collected(db, result, "TASK"):
        return None
    runtime_type = db.text(pl.col("runtime_type_id"))
    compute_type = pl.lit(None, dtype=STR)
    if "compute_type_id" in db.tasks.columns:
        # Level0 records no op info: the core is `N/A`, and the runtime's type tells the queue.
        compute_type = db.text(pl.col("compute_type_id")).replace("N/A", None)
    sqe = (
        pl.when(compute_type.is_not_null())
        .then(compute_type.replace(_COMPUTE_SQE))
        .when(
            pl.col("global_task_id").is_in(db.mix_subtask_ids.implode())
            & ~runtime_type.is_in(["KERNEL_MIX_AIC", "MIX_AIC"])
        )
        .then(pl.lit("MIX_AIV"))  # a subtask of a parent, its core unrecorded (Level0)
        .otherwise(runtime_type.replace(_SQE_TYPE))
    )
    name = runtime_type
    if "name_id" in db.tasks.columns:
        name = pl.coalesce(db.text(pl.col("name_id")), runtime_type)
    steps = db.tasks.filter(~pl.col("global_task_id").is_in(db.envelope_task_ids.implode()))
    frame = steps.with_columns(
        name.alias("name"),
        sqe.alias("task_type"),
        pl.col("stream_id").alias("tid"),
        no_sentinel(pl.col("raw_model_id")).alias("model_id"),
        no_sentinel(pl.col("raw_connection_id")).alias("connection_id"),
    ).with_columns(
        json_args(
            ("Model Id", pl.col("raw_model_id"), False),
            ("Task Type", pl.col("task_type"), True),
            ("Physic Stream Id", pl.col("stream_id"), False),
            ("Task Id", pl.col("task_id"), False),
            ("Subtask Id", pl.col("context_id"), False),
            ("connection_id", pl.col("raw_connection_id"), False),
        ).alias("args")
    )
    return with_names(frame, layout, "Ascend Hardware", pl.format("Stream {}", pl.col("tid")))


def comm_op_slices(db: Db, layout: Layout) -> pl.DataFrame | None:
    if not db.has("COMMUNICATION_OP"):
        return None
    frame = db.comm_ops
    frame = frame.join(db.comm_groups, on="group_id", how="left", maintain_order="left")
    frame = frame.with_columns(
        db.text(pl.col("name_id")).alias("name"),
        pl.col("group_tid").alias("tid"),
        no_sentinel(pl.col("raw_connection_id")).alias("connection_id"),
        json_args(
            ("connection_id", pl.col("raw_connection_id"), False),
            ("data_type", db.enum("ENUM_HCCL_DATA_TYPE", pl.col("data_type_id")), True),
            ("alg_type", db.text(pl.col("alg_type_id")), True),
            ("count", pl.col("count"), False),
        ).alias("args"),
    )
    thread = pl.format("Group {} Communication", pl.col("group_index"))
    return with_names(frame, layout, layout.comm_process, thread)


def plane_slices(db: Db, layout: Layout) -> pl.DataFrame | None:
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
        no_sentinel(pl.col("raw_model_id")).alias("model_id"),
    ).with_columns(
        pl.col("name").alias("task_type"),
        json_args(
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
    return with_names(frame, layout, layout.comm_process, pl.format("Plane {}", pl.col("plane")))


def overlap_slices(db: Db, layout: Layout, result: DbResult) -> pl.DataFrame | None:
    if not collected(db, result, "OVERLAP_ANALYSIS"):
        return None
    frame = db.scan(
        "OVERLAP_ANALYSIS", start_ns=("startNs", I64), end_ns=("endNs", I64), tid=("type", I64)
    )
    names = pl.col("tid").replace_strict(
        dict(enumerate(OVERLAP_THREADS)), default=None, return_dtype=STR
    )
    frame = frame.with_columns(names.alias("name"))
    return with_names(frame, layout, "Overlap Analysis", pl.col("name"))
