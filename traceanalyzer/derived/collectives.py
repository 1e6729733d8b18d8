"""The ``collectives`` derived table: every collective of a rank, its time split into what it
waited for, what it moved and where nothing ran.

A collective op (``hcom_allReduce__586_0_1`` on the HCCL / Communication process, or an MC2
exchange kernel, ``MoeDistributeDispatch*`` / ``Combine*``) starts on each rank when the rank
launches it and ends on all of them together, once the last one has arrived and the data has
moved. Inside it, the communication planes run the protocol: each waits for its peer's notify
(``Notify_Wait``), then copies or reduces (``Memcpy``, ``Reduce_Inline``, RDMA), signalling as
it goes (``Notify_Record``). So an op's time (``elapse``) is, on each rank:

- ``arrival_ns``: the waits before its first transfer, on any plane: waiting for the last rank
  to arrive (the rank that arrives last waits least);
- ``transfer_ns``: the transfers (overlaps once): the data moving at the link's speed;
- ``other_ns``: the rest of the protocol (the waits and signals after the first transfer);
- ``idle_ns``: time inside the op in which no task of it ran.

They sum to the op's time. Where the trace has no plane task of an op, communication.json's
figures are used (Synchronization Time, Transit Time, Wait Time, Idle Time); an MC2 kernel has
no tasks to split (its time is its elapse; the peers' comparison splits it,
:mod:`traceanalyzer.analyses.cross_rank`). ``export_idle_ns`` is communication.json's own
``Idle Time``, which counts every plane but the one it reads as idle: ``waited_for`` names the
peer rank (the plane task's ``dst rank``) of the op's longest wait, which is often what that
idle time is (a wait for a rank outside the profile, on another plane).

A stage derived in the steps' task from the device tasks read there once for it and the stages
beside it (``derived.device``; no scan but one of the longest waits' args).
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceanalyzer.derived.device import DEVICE_TASKS, EXCHANGE_OPS
from traceanalyzer.derived.stage import TABLE as STEPS
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.intervals import asof_join, union_intervals, window_of
from traceanalyzer.stages import Stage, declare, rows_of
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    COMMUNICATION_PROCESSES,
    HARDWARE_PROCESS,
    NOTIFY_WAIT_NAMES,
)

TABLE = "collectives"
# the communication process's rows that are collective ops (the plane tasks carry a task type)
OP_PATTERN = r"^hcom_"
# `hcom_allReduce__586_0_1` -> `allReduce`; an MC2 kernel -> `MoeDistributeDispatch`
KIND = r"^hcom_([A-Za-z]+)|(MoeDistribute(?:Dispatch|Combine))"
MC2_PATTERN = r"MoeDistribute(?:Dispatch|Combine)"
MC2_GROUP = "MC2"
# a plane task that signals its peer: neither a wait nor a transfer
SIGNAL_NAMES = ("Notify_Record", "Notify Record", "Write Value", "NOTIFY_RECORD")
# without plane tasks, the device's own twins of them on the op's stream
HARDWARE_TRANSFERS = ("SDMA", "RDMA", "RDMA_SEND", "RDMASend", "Memcpy", "Reduce_Inline")
# the longest wait of an op is looked up (its peer) from this long
WAITED_FOR_MIN_NS = 50_000
DST_RANK = r'"dst rank"\s*:\s*"?(-?\d+)'
SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "step": pl.Int64, "phase": pl.String,
    "group": pl.String, "name": pl.String, "kind": pl.String, "start_ns": pl.Int64,
    "end_ns": pl.Int64, "arrival_ns": pl.Int64, "transfer_ns": pl.Int64, "other_ns": pl.Int64,
    "idle_ns": pl.Int64, "export_idle_ns": pl.Int64, "waited_for": pl.Int64,
    "source": pl.String,
}  # fmt: skip
SPLIT = ("arrival_ns", "transfer_ns", "other_ns", "idle_ns")
_KEYS = ["_op"]  # an op of the ranks derived together: its row in their ops


def _clip(frame: pl.DataFrame, lo: str, hi: str) -> pl.DataFrame:
    return frame.with_columns(
        pl.max_horizontal("start_ns", lo).alias("start_ns"),
        pl.min_horizontal("end_ns", hi).alias("end_ns"),
    )


def _covered(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """Per op (``_op``), the length of the union of ``frame``'s intervals, as ``name``."""
    merged = union_intervals(frame.select(*_KEYS, "start_ns", "end_ns"), by=_KEYS)
    return merged.group_by(_KEYS).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias(name))


def _hccl_ops(device: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The collective ops of ``device`` (the steps' device tasks) and the tasks that run them:
    the plane tasks, else (a rank whose export has none) the device's wait and transfer tasks."""
    comm = device.filter(pl.col("process").is_in(COMMUNICATION_PROCESSES))
    ops = comm.filter(pl.col("task_type").is_null() & pl.col("name").str.contains(OP_PATTERN))
    planes = comm.filter(pl.col("task_type").is_not_null())
    with_planes = planes["rank"].unique().implode()
    hardware = device.filter(
        (pl.col("process") == HARDWARE_PROCESS)
        & ~pl.col("rank").is_in(with_planes)
        & pl.col("rank").is_in(ops["rank"].unique().implode())
        & (
            pl.col("name").is_in([*NOTIFY_WAIT_NAMES, *HARDWARE_TRANSFERS, *SIGNAL_NAMES])
            | pl.col("task_type").is_in([*NOTIFY_WAIT_NAMES, *HARDWARE_TRANSFERS])
        )
    )
    tasks = pl.concat([planes, hardware])
    ops = ops.select(
        "rank", "session", pl.col("thread").fill_null("").alias("group"), "name", "start_ns",
        "end_ns",
    ).unique(["rank", "session", "name", "start_ns"], maintain_order=True)  # fmt: skip
    return ops, tasks


def _split(ops: pl.DataFrame, tasks: pl.DataFrame) -> pl.DataFrame:
    """``ops`` (with ``_op``) with the split of each op that has tasks: ``arrival_ns``,
    ``transfer_ns``, ``other_ns``, ``idle_ns``, and its longest arrival wait (``_wait_*``)."""
    windows = ops.select(
        "rank", "session", "_op", pl.col("start_ns").alias("_os"), pl.col("end_ns").alias("_oe")
    ).sort("_os")
    placed = (
        tasks.select("rank", "session", "thread", "name", "task_type", "start_ns", "end_ns")
        .sort("start_ns")
        .pipe(asof_join, windows, "start_ns", "_os", ["rank", "session"])
        .filter(pl.col("_op").is_not_null() & (pl.col("start_ns") < pl.col("_oe")))
        .pipe(_clip, "_os", "_oe")
    )  # fmt: skip
    wait = pl.col("name").is_in(NOTIFY_WAIT_NAMES) | pl.col("task_type").is_in(NOTIFY_WAIT_NAMES)
    signal = pl.col("name").is_in(SIGNAL_NAMES) | pl.col("task_type").is_in(SIGNAL_NAMES)
    placed = placed.with_columns(
        pl.when(wait).then(pl.lit("wait")).when(signal).then(pl.lit("signal"))
        .otherwise(pl.lit("transfer")).alias("_kind")
    )  # fmt: skip
    transfers = placed.filter(pl.col("_kind") == "transfer")
    # each plane waits for its peer, then moves data: its waits before its first transfer
    plane = [*_KEYS, "thread"]
    first = transfers.group_by(plane).agg(pl.col("start_ns").min().alias("_first"))
    early = (
        placed.filter(pl.col("_kind") == "wait")
        .join(first, on=plane, how="left")
        .with_columns(pl.col("_first").fill_null(pl.col("_oe")))
        .pipe(_clip, "_os", "_first")
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
    longest = (
        early.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("_wait_ns"))
        .sort("_wait_ns", "start_ns", descending=[True, False])
        .group_by(_KEYS, maintain_order=True)
        .first()
        .select(
            *_KEYS,
            pl.col("thread").alias("_wait_thread"),
            pl.col("start_ns").alias("_wait_start"),
            "_wait_ns",
        )
    )
    # a transfer on one plane while another still waits counts as a transfer: the parts are
    # disjoint (transfer, then arrival, then the rest), and sum to the op
    interval = [*_KEYS, "start_ns", "end_ns"]
    moving_or_waiting = pl.concat([transfers.select(interval), early.select(interval)])
    parts = [
        _covered(placed, "_busy"),
        _covered(transfers, "transfer_ns"),
        _covered(moving_or_waiting, "_early"),
        longest,
    ]
    out = ops
    for part in parts:
        out = out.join(part, on=_KEYS, how="left")
    elapse = pl.col("end_ns") - pl.col("start_ns")
    traced = pl.col("_op").is_in(placed["_op"].unique().implode())
    return out.with_columns(
        pl.when(traced).then(pl.col(c).fill_null(0)).alias(c)
        for c in ("transfer_ns", "_early", "_busy")
    ).with_columns(
        (pl.col("_early") - pl.col("transfer_ns")).alias("arrival_ns"),
        (pl.col("_busy") - pl.col("_early")).alias("other_ns"),
        (elapse - pl.col("_busy")).clip(0).alias("idle_ns"),
        pl.when(traced).then(pl.lit("tasks")).alias("source"),
    )


def _from_communication(comm_ops: pl.DataFrame) -> pl.DataFrame:
    """communication.json's ops (rank, session, name, start_ns, end_ns, the split, group)."""
    sync = pl.coalesce("synchronization_ns", "wait_ns")
    return comm_ops.filter(pl.col("kind") == "collective").select(
        "rank",
        "session",
        pl.col("group").fill_null(""),
        pl.col("op_name").alias("name"),
        "start_ns",
        (pl.col("start_ns") + pl.col("elapse_ns")).alias("end_ns"),
        sync.alias("arrival_ns"),
        pl.col("transit_ns").alias("transfer_ns"),
        (pl.col("wait_ns") - sync).clip(0).alias("other_ns"),
        (pl.col("elapse_ns") - pl.col("transit_ns") - pl.col("wait_ns")).clip(0).alias("idle_ns"),
        pl.col("idle_ns").alias("export_idle_ns"),
    )


def _waited_for(store: Store, ranks: list[int], ops: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with ``waited_for``: the peer rank of each op's longest arrival wait on a plane,
    read from its args (only for waits of at least :data:`WAITED_FOR_MIN_NS`)."""
    wanted = ops.filter(pl.col("_wait_ns") >= WAITED_FOR_MIN_NS)
    if wanted.is_empty() or wanted["_wait_thread"].is_null().all():
        return ops.with_columns(pl.lit(None, pl.Int64).alias("waited_for"))
    peers = (
        store.scan("slices")
        .filter(
            pl.col("rank").is_in(ranks)
            & pl.col("process").is_in(COMMUNICATION_PROCESSES)
            & pl.col("start_ns").is_in(wanted["_wait_start"].unique().implode())
        )
        .select(
            "rank",
            "session",
            pl.col("thread").alias("_wait_thread"),
            pl.col("start_ns").alias("_wait_start"),
            pl.col("args")
            .str.extract(DST_RANK, 1)
            .cast(pl.Int64, strict=False)
            .alias("waited_for"),
        )
        .collect()
        .drop_nulls("waited_for")
        .unique(["rank", "session", "_wait_thread", "_wait_start"])
    )
    keys = ["rank", "session", "_wait_thread", "_wait_start"]
    return ops.join(peers.cast({"rank": ops.schema["rank"]}), on=keys, how="left")


def derive_collectives(
    store: Store,
    ranks: list[int],
    params: None,
    *,
    device_tasks: pl.DataFrame,
    exchange_ops: pl.DataFrame,
    steps: pl.DataFrame,
) -> pl.DataFrame:
    """The ``collectives`` rows (:data:`SCHEMA`) of ``ranks``, from their device tasks
    (:func:`~traceanalyzer.derived.device.device_slices`), EP exchange ops (their MC2 exchange
    kernels) and steps."""
    mc2 = exchange_ops.filter(pl.col("path") == "mc2")
    present = sorted(set(device_tasks["rank"].unique()) | set(mc2["rank"].unique()))
    if not present:  # no device task: nothing to split
        return pl.DataFrame(schema=SCHEMA)
    ops, tasks = _hccl_ops(device_tasks)
    ops = ops.with_row_index("_op")
    split = _split(ops, tasks)
    split = _waited_for(store, present, split)
    comm = _from_communication(
        store.scan("comm_ops").filter(pl.col("rank").is_in(present)).collect()
    ).cast({"rank": ops.schema["rank"]})
    keys = ["rank", "session", "name"]
    traced = ops.join(split.select("_op", *SPLIT, "source", "waited_for"), on="_op", how="left")
    # communication.json says what the trace's tasks do not (Level0: no plane task), and its
    # own Idle Time beside the trace's split
    traced = traced.join(
        comm.select(*keys, *(pl.col(c).alias(f"_c_{c}") for c in (*SPLIT, "export_idle_ns"))),
        on=keys,
        how="left",
    )
    no_tasks = pl.col("source").is_null() & pl.col("_c_arrival_ns").is_not_null()
    traced = traced.with_columns(
        *(pl.when(no_tasks).then(pl.col(f"_c_{c}")).otherwise(pl.col(c)).alias(c) for c in SPLIT),
        pl.when(no_tasks).then(pl.lit("communication.json")).otherwise(pl.col("source"))
        .fill_null("op").alias("source"),
        pl.col("_c_export_idle_ns").alias("export_idle_ns"),
    )  # fmt: skip
    only_json = comm.join(ops.select(keys), on=keys, how="anti").with_columns(
        pl.lit("communication.json").alias("source")
    )
    kernels = mc2.select(
        "rank", "session", pl.lit(MC2_GROUP).alias("group"), "name", "start_ns", "end_ns",
        pl.lit("kernel").alias("source"),
    )  # fmt: skip
    rows = pl.concat([traced, only_json, kernels], how="diagonal_relaxed").with_columns(
        pl.coalesce(pl.col("name").str.extract(KIND, 1), pl.col("name").str.extract(KIND, 2))
        .fill_null(pl.col("name"))
        .alias("kind")
    )
    windows = steps.filter(pl.col("step").is_not_null())
    placed = window_of(
        rows.sort("rank", "session", "start_ns"),
        windows.cast({"rank": rows.schema["rank"]}),
        keep=["step", "phase"],
    )
    return placed.select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]


def collectives_of(store: Store, ranks: Collection[int] | None = None) -> pl.DataFrame:
    """The collectives of ``ranks`` (every rank: None): the store's ``collectives`` table,
    derived here for a rank it was not derived for (a fixture's store, or one written before
    the table existed), once per store."""
    return store.derived(TABLE, ranks).collect()


COLLECTIVES = declare(
    Stage(
        name=TABLE,
        tables=(TABLE,),
        derive=derive_collectives,
        inputs=("slices", "comm_ops", STEPS),
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the steps' task's
        reads=(DEVICE_TASKS, EXCHANGE_OPS, rows_of(STEPS)),
        order=("rank", "session", "start_ns"),
    )
)
