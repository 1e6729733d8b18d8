"""The device tasks the stages after the steps read, and the expert-parallel (EP) exchange ops
among them.

The steps' task reads them once from the slices the steps read (``derive.STEP_SLICES``): the
``exchanges``, ``moe_layers`` and ``collectives`` stages read the EP exchange ops at the default
patterns, ``kernel_layers`` and ``collectives`` the communication ops. A rule whose patterns
differ finds its own (``analyses.moe``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceanalyzer.derived.derive import STEP_SLICES
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.patterns import any_of
from traceanalyzer.stages import Read
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import DEVICE_PROCESSES

EXCHANGE_PARAMS = {
    "mc2_ops": Param(
        r"MoeDistribute(?:Dispatch|Combine)",
        "Regex on device task names of the MC2 exchange (dispatch/combine kernels).",
    ),
    "alltoall_ops": Param(
        r"(?i)^hcom_all_?to_?all", "Regex on collective names of the all-to-all exchange."
    ),
    "allgather_ops": Param(
        r"(?i)^hcom_(?:all_?gather|reduce_?scatter)",
        "Regex on collective names of the all-gather exchange (all-gather there, "
        "reduce-scatter back).",
    ),
}
DEFAULTS = Params({name: param.default for name, param in EXCHANGE_PARAMS.items()})
# the device tasks' columns read here: the exchanges', the compute kernels' and the experts'
DEVICE_COLUMNS = (
    "rank", "session", "process", "thread", "name", "task_type", "stream_id", "start_ns", "end_ns",
)  # fmt: skip


def device_slices(slices: pl.LazyFrame) -> pl.DataFrame:
    """The device tasks (device and communication processes, ``end_ns > start_ns``) of
    ``slices``, in their order, with :data:`DEVICE_COLUMNS`: what the exchanges, the compute
    kernels and the expert kernels are read from."""
    return (
        slices.filter(
            pl.col("process").is_in(DEVICE_PROCESSES) & (pl.col("end_ns") > pl.col("start_ns"))
        )
        .select(DEVICE_COLUMNS)
        .collect()
    )


def _path_of(p: Any) -> pl.Expr:
    name = pl.col("name")
    return (
        pl.when(name.str.contains(p.mc2_ops))
        .then(pl.lit("mc2"))
        .when(name.str.contains(p.alltoall_ops))
        .then(pl.lit("alltoall"))
        .when(name.str.contains(p.allgather_ops))
        .then(pl.lit("allgather"))
    )


def exchange_ops_in(device: pl.DataFrame, p: Any) -> pl.DataFrame:
    """EP exchange ops of ``device`` (:func:`device_slices`): rank, session, name, process,
    thread, start_ns, end_ns, path (MC2 kernels on a compute stream, HCCL ops on their group
    row)."""
    return (
        device.lazy()
        # the few exchange ops first, then their path
        .filter(pl.col("name").str.contains(any_of((p.mc2_ops, p.alltoall_ops, p.allgather_ops))))
        .with_columns(_path_of(p).alias("path"))
        .filter(pl.col("path").is_not_null())
        .select("rank", "session", "name", "process", "thread", "start_ns", "end_ns", "path")
        .unique(["rank", "session", "name", "start_ns"])  # a trace with repeated events
        .collect()
        .sort("rank", "session", "start_ns")
    )


def _device_tasks(
    store: Store, ranks: list[int], params: None, step_slices: pl.LazyFrame
) -> pl.DataFrame:
    return device_slices(step_slices)


def _exchange_ops(
    store: Store, ranks: list[int], params: None, device_tasks: pl.DataFrame
) -> pl.DataFrame:
    return exchange_ops_in(device_tasks, DEFAULTS)


DEVICE_TASKS = Read("device_tasks", _device_tasks, (STEP_SLICES,))
EXCHANGE_OPS = Read("exchange_ops", _exchange_ops, (DEVICE_TASKS,))
