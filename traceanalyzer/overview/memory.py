"""The overview's device memory: where it goes, per rank, and how it scales with the batch.

Per rank in the workers, :func:`memory_tables` writes the ``summary_memory*`` tables from the
memory stage (:mod:`traceanalyzer.memory`, the one reader of the memory tables); in the driver
:func:`memory_section` builds findings.json's ``summary.overview.memory`` from them
(``docs/overview.md``), with the device's capacity when the run was told it
(``memory.capacity_gb``: no export records it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.derived.phases import IDLE_PHASE
from traceanalyzer.memory import (
    APP,
    COLLECT_WITH,
    GE,
    MISSING,
    NO_CAPACITY,
    PTA,
    PTA_GE,
    capacity_mb,
    memory_of,
)
from traceanalyzer.overview.model import (
    Memory,
    MemoryLane,
    MemoryPhase,
    MemoryPoint,
    MemoryRank,
    OutsideModule,
    Peaks,
    TokenBucket,
    Unfreed,
)
from traceanalyzer.overview.phases import lane_runs, phase_order
from traceanalyzer.stats import theil_sen_slope
from traceanalyzer.store import Store

TABLES = (
    "summary_memory",
    "summary_memory_steps",
    "summary_memory_timeline",
    "summary_memory_static",
)
STATIC_SHOWN = 5  # the largest allocations never freed, per session and per rank
TIMELINE_RANKS = 4  # ranks drawn (those that hold the most)
MIN_TOKEN_COUNTS = 3  # distinct batch sizes a slope per 1k tokens needs
NOT_COLLECTED = f"no {MISSING} (collect with {COLLECT_WITH})"


def memory_tables(store: Store, rank: int) -> dict[str, pl.DataFrame]:
    """The rank's ``summary_memory*`` tables, keyed by session (no rows without memory records)."""
    memory = memory_of(store, [rank])
    modules = memory.modules.drop("rank").with_columns(pl.lit("npu_module_mem").alias("source"))
    levels = memory.levels.drop("rank").with_columns(pl.lit("memory_record").alias("source"))
    return {
        "summary_memory": pl.concat([levels, modules], how="diagonal_relaxed"),
        "summary_memory_steps": memory.steps.drop("rank", "step_ns", "steady"),
        "summary_memory_timeline": memory.timeline.drop("rank"),
        "summary_memory_static": _static(memory.unfreed),
    }


def _static(unfreed: pl.DataFrame) -> pl.DataFrame:
    """Per session, the allocations never freed grouped by what allocated them (a leak's
    thousand small ones are one row), the most memory first, :data:`STATIC_SHOWN` of them."""
    return (
        unfreed.group_by("session", "name", "source")
        .agg(
            pl.len().alias("count"),
            pl.col("size_mb").sum(),
            pl.col("size_mb").max().alias("largest_mb"),
            pl.col("alloc_ns").min(),
        )
        .sort("session", "size_mb", "alloc_ns", descending=[False, True, False])
        .group_by("session", maintain_order=True)
        .head(STATIC_SHOWN)
    )


def memory_section(store: Store, capacity_gb: float = 0.0) -> Memory:
    """``summary.overview.memory``: per rank the peaks per component (exactly as recorded),
    what lies outside torch, the capacity and headroom, the largest allocations never freed and
    the peaks per phase and batch size; the timeline of the ranks that hold the most."""
    capacity = capacity_mb(capacity_gb)
    levels = store.table("summary_memory").collect()
    # npu_module_mem.csv comes at every profiler level; without the allocators' records there
    # is no peak, no split and no timeline to show
    if levels.filter(pl.col("source") == "memory_record").is_empty():
        return Memory(
            ranks=[], reason=NOT_COLLECTED, capacity_mb=capacity, capacity_reason=None, timeline=[]
        )
    steps = store.table("summary_memory_steps").collect()
    static = store.table("summary_memory_static").collect()
    ranks = [
        _rank(int(rank), part, steps.filter(pl.col("rank") == rank),  # type: ignore[arg-type]
              static.filter(pl.col("rank") == rank), capacity)
        for (rank,), part in levels.sort("rank").group_by("rank", maintain_order=True)
    ]  # fmt: skip
    drawn = sorted(
        sorted(ranks, key=lambda r: -(r.in_use_mb or 0.0))[:TIMELINE_RANKS], key=lambda r: r.rank
    )
    timeline = store.table("summary_memory_timeline").collect()
    return Memory(
        ranks=ranks,
        reason=None,
        capacity_mb=capacity,
        capacity_reason=None if capacity is not None else NO_CAPACITY,
        timeline=[_lanes(r.rank, timeline.filter(pl.col("rank") == r.rank), steps) for r in drawn],
    )


def _peaks(rows: pl.DataFrame) -> Peaks:
    """A component's peaks over the rank's sessions (the session that reached each)."""
    out: dict[str, Any] = {"reserved_at_peak_allocated_mb": None}
    for what in ("allocated", "reserved"):
        known = rows.filter(pl.col(f"peak_{what}_mb").is_not_null())
        if known.is_empty():
            out |= {f"peak_{what}_mb": None, f"peak_{what}_ns": None}
            continue
        top = known.sort(f"peak_{what}_mb", descending=True).row(0, named=True)
        out |= {
            f"peak_{what}_mb": top[f"peak_{what}_mb"],
            f"peak_{what}_ns": top[f"peak_{what}_ns"],
        }
        if what == "allocated":
            out["reserved_at_peak_allocated_mb"] = top["reserved_at_peak_allocated_mb"]
    return Peaks(samples=int(rows["samples"].sum()), **out)


def _rank(
    rank: int,
    levels: pl.DataFrame,
    steps: pl.DataFrame,
    static: pl.DataFrame,
    capacity: float | None,
) -> MemoryRank:
    records = levels.filter(pl.col("source") == "memory_record")
    components = {
        str(c): _peaks(rows) for (c,), rows in records.group_by("component", maintain_order=True)
    }
    # the process's memory at its peak: APP's samples, else what the allocators reserved
    in_use = next(
        (
            components[c].peak_reserved_mb
            for c in (APP, PTA_GE, PTA)
            if c in components and components[c].peak_reserved_mb is not None
        ),
        None,
    )
    outside = records.filter(pl.col("component") == APP)["outside_torch_mb"].drop_nulls()
    modules = (
        levels.filter((pl.col("source") == "npu_module_mem") & (pl.col("component") != APP))
        .group_by("component")
        .agg(pl.col("peak_reserved_mb").max())
        .sort("peak_reserved_mb", "component", descending=[True, False])
    )
    unfreed = static.sort("size_mb", descending=True).head(STATIC_SHOWN)
    return MemoryRank(
        rank=rank,
        sessions=records["session"].n_unique(),
        components={c: components[c] for c in _ordered(components)},
        # the process's memory outside torch's allocator at APP's peak (GE included)
        outside_torch_mb=float(outside.max()) if outside.len() else None,  # type: ignore[arg-type]
        outside_modules=[
            OutsideModule(module=m, peak_reserved_mb=mb) for m, mb in modules.iter_rows()
        ],
        in_use_mb=in_use,
        capacity_mb=capacity,
        headroom_mb=capacity - in_use if capacity is not None and in_use is not None else None,
        static=[
            Unfreed(**r)
            for r in unfreed.select(
                "name", "count", "size_mb", "largest_mb", "alloc_ns", "source"
            ).to_dicts()
        ],
        phases=_phases(steps.filter(pl.col("series") == PTA)),
    )


def _ordered(components: Mapping[str, Any]) -> list[str]:
    order = {c: i for i, c in enumerate((PTA, GE, PTA_GE, APP))}
    return sorted(components, key=lambda c: (order.get(c, len(order)), c))


def _bucket(tokens: int) -> int:
    """The power of two at or above ``tokens``: batch sizes grouped as ``<= 256``."""
    return 1 << max(int(tokens) - 1, 0).bit_length()


def _phases(steps: pl.DataFrame) -> list[MemoryPhase]:
    """Per phase (in the reports' order, idle gaps left out): the steps, the highest allocated
    peak and the typical one, the activations (peak - baseline: what the batch allocates and
    frees), their growth per 1k new tokens, and the peaks per batch size."""
    steps = steps.filter(
        pl.col("phase").is_not_null() & (pl.col("phase") != IDLE_PHASE)
    ).with_columns((pl.col("peak_mb") - pl.col("baseline_mb")).alias("activation_mb"))
    out = []
    for (phase,), part in sorted(steps.group_by("phase"), key=lambda kv: phase_order(kv[0][0])):
        sized = part.filter(pl.col("tokens").is_not_null() & (pl.col("tokens") > 0))
        slope = None
        if sized["tokens"].n_unique() >= MIN_TOKEN_COUNTS:
            tokens = sized["tokens"].to_numpy().astype(float)
            slope = theil_sen_slope(sized["activation_mb"].to_numpy(), tokens) * 1000
        buckets = (
            sized.with_columns(
                pl.col("tokens").map_elements(_bucket, return_dtype=pl.Int64).alias("up_to")
            )
            .group_by("up_to")
            .agg(
                pl.len().alias("steps"),
                pl.col("peak_mb").max(),
                pl.col("activation_mb").median(),
            )
            .sort("up_to")
        )
        out.append(
            MemoryPhase(
                phase=str(phase),
                steps=part.height,
                peak_mb=float(part["peak_mb"].max()),  # type: ignore[arg-type]
                p50_peak_mb=float(np.median(part["peak_mb"].to_numpy())),
                activation_mb=float(np.median(part["activation_mb"].to_numpy())),
                mb_per_1k_tokens=slope,
                by_tokens=[TokenBucket(**b) for b in buckets.to_dicts()],
            )
        )
    return out


def _lanes(rank: int, timeline: pl.DataFrame, steps: pl.DataFrame) -> MemoryLane:
    """One rank's figure: each line's [t, min, max] in ns from the rank's first record, and
    its windows as [start, end, phase] on the same clock (neighbours of one phase merged; past
    :data:`~traceanalyzer.overview.phases.TIMELINE_RUNS` runs, as many slots of the phase that
    holds most of each)."""
    origin = int(timeline["ts_ns"].min()) if timeline.height else 0  # type: ignore[arg-type]
    lines = {
        str(line): [
            MemoryPoint(int(t) - origin, lo, hi)
            for t, lo, hi in part.select("ts_ns", "min_mb", "max_mb").iter_rows()
        ]
        for (line,), part in timeline.sort("ts_ns").group_by("line", maintain_order=True)
    }
    windows = (
        steps.filter(pl.col("rank") == rank)
        .unique(["session", "start_ns"], keep="first")
        .sort("start_ns")
    )
    runs, _ = lane_runs(windows, origin, apart=False)  # as the phase strip draws them
    return MemoryLane(rank=rank, lines=lines, runs=runs)
