"""Flows and threads of a Db export, as trace_view.json pairs and names them."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceanalyzer.parse.db.database import I64, STR, Db, conform, schema_of
from traceanalyzer.parse.db.layout import Layout
from traceanalyzer.parse.db.slices import SYNC_TASK_TYPES

# --------------------------------------------------------------------------- flows

_ENDS = ("process", "thread", "pid", "tid")
# Device tasks trace_view.json draws no HostToDevice flow to, though their launch shares their
# connection id: the runtime's event and notify records and waits.
_UNDRAWN_LAUNCHES = [f"{task}_SQE" for task in SYNC_TASK_TYPES]


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


@dataclass(frozen=True)
class Links:
    """What the flows and the operators' device times both need: the slices' flow ends, the
    device tasks a host event can launch, and each Python event's connections with their flow
    categories."""

    ends: pl.DataFrame
    device: pl.DataFrame
    linked: pl.DataFrame
    cats: pl.DataFrame

    def launched(self) -> pl.DataFrame:
        """(api_row, the device task's ``*_dst`` columns and its ``dur_ns`` and ``task_type``)
        of every torch op → task pair that trace_view.json draws as an ``async_npu`` flow."""
        return self.linked.filter(pl.col("flow_cat") == "async_npu").join(
            self.device, left_on="link", right_on="connection_id", suffix="_dst"
        )


def link_table(
    layout: Layout, slices: pl.DataFrame, links: pl.DataFrame, cats: pl.DataFrame | None
) -> Links:
    """The slices' links (``links``: PYTORCH_API rowid → connection id; ``cats``:
    connectionCats, None when torch_npu did not write it)."""
    ends = slices.select(
        *_ENDS, "start_ns", "dur_ns", "task_type", "connection_id", "cat", "api_row", "api_level"
    )
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
    return Links(ends, device, linked.join(cats, on="link", maintain_order="left"), cats)


def flow_table(layout: Layout, links: Links) -> pl.DataFrame:
    """Flows as trace_view.json pairs them: host launch → device task (``HostToDevice``, id =
    connection id; ``async_npu``, id = the task's start ns), enqueue → dequeue
    (``async_task_queue``, id = correlation id) and forward → backward (``fwdbwd``)."""
    schema = schema_of("flows")
    ends, device, linked = links.ends, links.device, links.linked
    # A launch and its task share a connection id whether or not a torch op links them
    # (connectionCats lists only the torch links: an `aclrtMemcpyAsync` of the runtime's own
    # has its HostToDevice flow in trace_view.json, and none there). Event records and waits
    # have none (real G2 export).
    cann = ends.filter(pl.col("process") == "CANN")
    launched = device.filter(~pl.col("task_type").is_in(_UNDRAWN_LAUNCHES).fill_null(False))
    # A launch's flow id (a Node-level kernel launch, an HCCL op) carries a context in its
    # low 32 bits (4294967295, none, before the current generation, which writes 0); an
    # AscendCL call's (a memcpy, an event) is the connection id itself.
    context = 0 if layout.generation == "current" else 4294967295
    h2d_id = (
        pl.when(pl.col("api_level") != "acl")
        .then(pl.col("connection_id") * (1 << 32) + context)
        .otherwise(pl.col("connection_id"))
    )
    h2d = cann.join(launched, on="connection_id", suffix="_dst").with_columns(h2d_id.alias("h2d"))
    frames = [_pair(h2d, "HostToDevice", pl.format("HostToDevice{}", pl.col("h2d")), pl.col("h2d"))]
    to_npu = links.launched()
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
    flows = pl.concat([pl.DataFrame(schema=schema), *(conform(f, schema) for f in frames)])
    order = pl.coalesce("start_ns", "end_ns")
    return flows.sort(order, "end_ns", "cat", "flow_id", nulls_last=True, maintain_order=True)


def connection_id_table(db: Db) -> pl.DataFrame:
    """CONNECTION_IDS: the connection ids a PYTORCH_API row's connectionId stands for."""
    return db.scan("CONNECTION_IDS", link_id=("id", I64), link=("connectionId", I64))


def python_links(slices: pl.DataFrame, connection_ids: pl.DataFrame) -> pl.DataFrame:
    """(PYTORCH_API rowid, each connection id CONNECTION_IDS lists for its connectionId)."""
    apis = slices.select("api_row", "link_id").filter(pl.col("link_id").is_not_null())
    return apis.join(connection_ids, on="link_id", maintain_order="left").select("api_row", "link")


def connection_cats_table(db: Db) -> pl.DataFrame | None:
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


def thread_table(
    layout: Layout, slices: pl.DataFrame, counter_threads: pl.DataFrame
) -> pl.DataFrame:
    """Every (pid, tid) with events (``slices``: the slices' process, pid, tid, thread and cat,
    each row or only the distinct ones; ``counter_threads``: the counters' process, pid and
    tid), named and sorted as the Text export's M events name them."""
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
    return conform(threads, schema_of("threads")).sort(
        "process_sort_index", "process", "thread_sort_index", "tid", nulls_last=False
    )
