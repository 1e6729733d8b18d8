"""Which device tasks are kernels (compute), across export generations and levels.

Kernels carry a GE task type (`AI_CORE`, `MIX_AIV`, ... see ``vocabulary.AI_CORE_TASK_TYPES``).
An export without op info (Level0 of some generations) labels them with a runtime type or
`N/A`; there, every task that is no wait, copy, record or profiler marker is a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceanalyzer.vocabulary import (
    COPY_TASK_NAMES,
    COPY_TASK_TYPES,
    HARDWARE_PROCESS,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
)

# Runtime tasks that are no kernel: records, notifies, DMA and profiler markers.
NOT_KERNEL_PATTERN = r"RECORD|NOTIFY|Notify|SDMA|DMA|MEMCPY|PROFILING|PLACE_HOLDER|Write Value|WAIT"
KERNEL_COLUMNS = ("rank", "session", "name", "stream_id", "start_ns", "end_ns")


def kernel_tasks(
    slices: pl.LazyFrame,
    kernel_types: Sequence[str],
    *,
    not_kernel_pattern: str = NOT_KERNEL_PATTERN,
    ranks: Sequence[int] | None = None,
) -> pl.DataFrame:
    """Ascend Hardware kernels (``KERNEL_COLUMNS``): tasks of ``kernel_types``; in a session
    where no task has one of them, every task matching neither a wait, a copy nor
    ``not_kernel_pattern``."""
    frame = slices.filter(
        (pl.col("process") == HARDWARE_PROCESS) & (pl.col("end_ns") > pl.col("start_ns"))
    )
    if ranks is not None:
        frame = frame.filter(pl.col("rank").is_in(list(ranks)))
    tasks = frame.select(*KERNEL_COLUMNS, "task_type").collect()
    typed = pl.col("task_type").is_in(list(kernel_types))
    sessions = ["rank", "session"]
    if tasks.group_by(sessions).agg(typed.any().alias("_typed"))["_typed"].all():
        # every session has typed tasks: none is told by its name (the usual export)
        return tasks.filter(typed).select(KERNEL_COLUMNS).sort("start_ns")
    not_kernel = pl.any_horizontal(
        pl.col(c).is_in([*WAIT_TASK_TYPES, *WAIT_TASK_NAMES, *COPY_TASK_NAMES, *COPY_TASK_TYPES])
        | pl.col(c).str.contains(not_kernel_pattern)
        for c in ("name", "task_type")
    ).fill_null(False)
    untyped = ~typed.fill_null(False).any().over("rank", "session")
    return tasks.filter(typed | (untyped & ~not_kernel)).select(KERNEL_COLUMNS).sort("start_ns")
