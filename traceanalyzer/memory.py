"""Device memory of a rank: the one derivation of the memory tables, for the overview and rules.

A profile with ``profile_memory=True`` records torch's caching allocator (component ``PTA``),
GE's (``GE``) and their sum (``PTA+GE``) after every allocation and free, and msprof samples
the process's whole device memory about every 20 ms (``APP``): the ``memory_records`` table
(memory_record.csv; Db MEMORY_RECORD and NPU_MEM's ``app`` rows). ``op_memory``
(operator_memory.csv, OP_MEMORY) has every tensor's allocation and release, ``module_memory``
(npu_module_mem.csv, NPU_MODULE_MEM) what each CANN module holds. This module is their only
reader (a stage: :data:`NAME`, :data:`INPUTS`, :func:`derive`); :func:`memory_of` gives a
store's, derived once per store and ranks.

What it derives, per rank (:class:`RankMemory`):

- ``levels``: per session and component, the peak allocated and reserved (the records' own
  values, exactly), when each was reached, and where it started and ended;
- ``outside``: at every APP sample, the process's memory outside torch's allocator (APP - PTA
  reserved: HCCL buffers, the runtime's workspaces, GE) and outside both allocators;
- ``steps``: per step window (the ``steps`` table's) and series, the baseline (the lowest
  value held during the window: what stays allocated from one iteration to the next) and the
  peak; for PTA, its reserved peak, the reserved memory not allocated at the step's allocated
  peak, and the segments the allocator took from (and gave back to) the driver in it;
- ``modules``: each CANN module's peak reserved memory, and what it held first and last;
- ``unfreed``: the allocations never released in the profile (operator_memory), largest first,
  or, without operator_memory, the rises of PTA's allocated memory that never came back;
- ``timeline``: each line (PTA allocated and reserved, GE allocated, APP) over time, its lowest
  and highest value in each of :data:`TIMELINE_SLOTS` equal slots of the rank's records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.derived.phases import STEADY_PHASES
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.engine.config import ConfigError, namespace_params
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.engine.rule import Rule
from traceanalyzer.intervals import asof_join, window_of
from traceanalyzer.store import Store

NAME = "memory"
INPUTS = ("memory_records", "op_memory", "module_memory", "steps")
NAMESPACE = "memory"  # run settings: `--set memory.capacity_gb=64`, `[memory]` in the config

PTA, GE, PTA_GE, APP = "PTA", "GE", "PTA+GE", "APP"
COMPONENTS = (PTA, GE, PTA_GE, APP)  # in the order the reports list them
# The series a step's baseline is taken of: what each allocator holds (allocated), and what
# the process holds outside both (APP - PTA reserved - GE reserved, named APP: it is the part
# of APP no allocator explains).
SERIES = (PTA, GE, APP)
TIMELINE_SLOTS = 400  # slots of a rank's memory timeline (the report's figure)
MB_BYTES = 1 << 20  # memory_record.csv's "MB" (the Db records bytes; the store keeps MB)
GB_MB = 1024.0

MEMORY_PARAMS: dict[str, Param] = {
    "capacity_gb": Param(
        0.0,
        "The device's memory in GB (2^30 bytes; Atlas A2 64, A3 64 per die). No export records "
        "it (NPU_INFO names the chip, not its memory): 0 leaves it unknown, and with it the "
        "headroom and the time to out-of-memory.",
    ),
}
NO_CAPACITY = (
    "the device's capacity is unknown (no export records it): set memory.capacity_gb "
    "(or the rule's capacity_gb)"
)
# what a profile without the allocators' records lacks, and how to collect it
MISSING, COLLECT_WITH = "memory_record", "profile_memory=True"


@dataclass(frozen=True)
class RankMemory:
    """What :func:`derive` derives of ranks' memory tables (see the module docstring)."""

    levels: pl.DataFrame
    outside: pl.DataFrame
    steps: pl.DataFrame
    modules: pl.DataFrame
    unfreed: pl.DataFrame
    timeline: pl.DataFrame


class MemorySettingError(ConfigError):
    """A ``memory.NAME`` setting names no parameter or has a bad value."""


def memory_params(values: Mapping[str, Any] | None = None) -> Params:
    """The run's memory settings: defaults overlaid with ``values`` (``--set memory.X=...``,
    ``[memory]`` of the config file)."""
    return namespace_params(NAMESPACE, MEMORY_PARAMS, values, MemorySettingError)


def rule_overrides(rules: Iterable[Rule], values: Mapping[str, Any]) -> list[str]:
    """``RULE.NAME=VALUE`` for every rule that reads the setting ``NAME`` of :data:`MEMORY_PARAMS`
    (through the kit's ``device_memory``): what ``memory.NAME`` given for the run sets for
    each of them (``--set RULE.NAME`` after it still wins)."""
    return [
        f"{rule.name}.{name}={value}"
        for rule in rules
        for name, value in values.items()
        if rule.params.get(name) is MEMORY_PARAMS.get(name)
    ]


def capacity_mb(capacity_gb: float) -> float | None:
    """A ``capacity_gb`` setting in MB, None when unknown (0)."""
    return capacity_gb * GB_MB if capacity_gb > 0 else None


def memory_of(store: Store, ranks: Collection[int] | None = None) -> RankMemory:
    """The memory of ``ranks`` (every rank: None), derived once per store and ranks, and once
    per run for the rules and the overview (``Store.memo_for_run``)."""
    key = (NAME, None if ranks is None else tuple(sorted(ranks)))
    return store.memo_for_run(key, lambda: derive(store, ranks))


def _rank_filter(ranks: Collection[int] | None) -> pl.Expr:
    return pl.lit(True) if ranks is None else pl.col("rank").is_in(sorted(ranks))


def derive(store: Store, ranks: Collection[int] | None = None) -> RankMemory:
    """The stage's one derivation: :class:`RankMemory` from :data:`INPUTS`."""
    where = _rank_filter(ranks)
    records = (
        store.table("memory_records")
        .filter(where)
        .select(
            pl.col("rank").cast(pl.Int64),
            "session",
            "component",
            "ts_ns",
            pl.col("total_allocated_mb").alias("allocated_mb"),
            pl.col("total_reserved_mb").alias("reserved_mb"),
        )
        .collect()
    )
    records = _by_series(records)
    outside = _outside(records)
    series = _series(records, outside)
    windows = steps_of(store, ranks).select(
        pl.col("rank").cast(pl.Int64),
        "session",
        "step",
        "start_ns",
        "end_ns",
        "step_ns",
        "phase",
        "tokens",
        pl.col("phase").is_in(list(STEADY_PHASES)).alias("steady"),
    )
    return RankMemory(
        levels=_levels(records, outside),
        outside=outside,
        steps=_step_memory(series, windows),
        modules=_modules(store, where),
        unfreed=_unfreed(store, where, records),
        timeline=_timeline(records),
    )


def _by_series(records: pl.DataFrame) -> pl.DataFrame:
    """``records`` sorted by rank, session, component and time, ties in their order: each
    series sorted by time on its own (one sort by the text keys took five times as long)."""
    series = records.partition_by("rank", "session", "component", as_dict=True)
    if not series:
        return records
    order = sorted(series, key=lambda key: tuple((value is not None, value) for value in key))
    return pl.concat([series[key].sort("ts_ns", maintain_order=True) for key in order])


# --------------------------------------------------------------------------------------------
# Levels: peaks per component
# --------------------------------------------------------------------------------------------


def _levels(records: pl.DataFrame, outside: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, session, component): samples, the peaks (the records' own values) and when
    they were first reached, the reserved memory at the allocated peak, the first and last
    values; for APP, the memory outside torch (APP - PTA reserved) at its peak."""
    by = ["rank", "session", "component"]
    peaks = records.group_by(by, maintain_order=True).agg(
        pl.len().alias("samples"),
        pl.col("ts_ns").min().alias("first_ns"),
        pl.col("ts_ns").max().alias("last_ns"),
        pl.col("allocated_mb").max().alias("peak_allocated_mb"),
        pl.col("ts_ns").filter(pl.col("allocated_mb") == pl.col("allocated_mb").max()).min()
        .alias("peak_allocated_ns"),
        pl.col("reserved_mb").filter(pl.col("allocated_mb") == pl.col("allocated_mb").max())
        .first().alias("reserved_at_peak_allocated_mb"),
        pl.col("reserved_mb").max().alias("peak_reserved_mb"),
        pl.col("ts_ns").filter(pl.col("reserved_mb") == pl.col("reserved_mb").max()).min()
        .alias("peak_reserved_ns"),
        pl.col("allocated_mb").first().alias("first_allocated_mb"),
        pl.col("allocated_mb").last().alias("last_allocated_mb"),
        pl.col("reserved_mb").first().alias("first_reserved_mb"),
        pl.col("reserved_mb").last().alias("last_reserved_mb"),
    )  # fmt: skip
    at_peak = (
        outside.sort("app_mb", "ts_ns", descending=[True, False])
        .group_by("rank", "session", maintain_order=True)
        .first()
        .select("rank", "session", pl.lit(APP).alias("component"), "outside_torch_mb")
    )
    return peaks.join(at_peak, on=by, how="left").sort(
        "rank", "session", pl.col("component").replace_strict(_ORDER, default=len(_ORDER))
    )


_ORDER = {c: i for i, c in enumerate(COMPONENTS)}


# --------------------------------------------------------------------------------------------
# Outside torch: APP against the allocators
# --------------------------------------------------------------------------------------------


def _held(samples: pl.DataFrame, at: pl.DataFrame, value: str, name: str) -> pl.DataFrame:
    """``at`` (rank, session, ts_ns) with ``samples``' ``value`` held at each time (the last
    sample at or before it; null before the first) as ``name``."""
    right = samples.select("rank", "session", "ts_ns", pl.col(value).alias(name)).sort("ts_ns")
    return (
        at.with_row_index("_row")
        .sort("ts_ns")
        .pipe(asof_join, right, "ts_ns", "ts_ns", ["rank", "session"])
        .sort("_row")
        .drop("_row")
    )


def _outside(records: pl.DataFrame) -> pl.DataFrame:
    """At every APP sample: the process's memory (``app_mb``), PTA's and GE's reserved memory
    held then, what lies outside torch (``outside_torch_mb``: APP - PTA reserved, GE included)
    and outside both allocators (``outside_mb``). A sample before the first PTA record has no
    split (null); in a session torch recorded nothing of, all of APP is outside it."""
    app = records.filter(pl.col("component") == APP).select(
        "rank", "session", "ts_ns", pl.col("reserved_mb").alias("app_mb")
    )
    pta = records.filter(pl.col("component") == PTA)
    ge = records.filter(pl.col("component") == GE)
    held = _held(ge, _held(pta, app, "reserved_mb", "pta_reserved_mb"), "reserved_mb", "ge_mb")
    untracked = ~pl.col("session").is_in(pta["session"].unique().implode())
    held = held.with_columns(
        pl.when(untracked).then(0.0).otherwise(pl.col("pta_reserved_mb")).alias("pta_reserved_mb")
    )
    return held.with_columns(
        (pl.col("app_mb") - pl.col("pta_reserved_mb")).alias("outside_torch_mb"),
        (pl.col("app_mb") - pl.col("pta_reserved_mb") - pl.col("ge_mb").fill_null(0.0)).alias(
            "outside_mb"
        ),
    )


def _series(records: pl.DataFrame, outside: pl.DataFrame) -> pl.DataFrame:
    """The values a step's baseline is taken of (rank, session, series, ts_ns, value_mb):
    PTA's and GE's allocated memory, and the process's memory outside both (APP); PTA's rows
    with its reserved memory and how much it moved (``_delta``: the allocator went to the
    driver)."""
    allocators = records.filter(pl.col("component").is_in([PTA, GE])).select(
        "rank", "session", pl.col("component").alias("series"), "ts_ns",
        pl.col("allocated_mb").alias("value_mb"),
        pl.when(pl.col("component") == PTA).then(pl.col("reserved_mb")).alias("reserved_mb"),
        pl.when(pl.col("component") == PTA)
        .then(pl.col("reserved_mb").diff().over("rank", "session", "component"))
        .alias("_delta"),
    )  # fmt: skip
    rest = outside.filter(pl.col("outside_mb").is_not_null()).select(
        "rank", "session", pl.lit(APP).alias("series"), "ts_ns",
        pl.col("outside_mb").alias("value_mb"),
    )  # fmt: skip
    return pl.concat([allocators, rest], how="diagonal").drop_nulls("value_mb")


# --------------------------------------------------------------------------------------------
# Per step window
# --------------------------------------------------------------------------------------------

STEP_KEYS = ("rank", "session", "step", "start_ns", "end_ns", "step_ns", "phase", "tokens")


def _step_memory(series: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per window and series: the value held when it opened and every value inside it, as the
    window's ``baseline_mb`` (lowest) and ``peak_mb`` (highest); for PTA, ``reserved_peak_mb``,
    ``gap_at_peak_mb`` (reserved - allocated at the allocated peak), ``segment_allocs`` and
    ``segment_frees`` (the records whose reserved memory rose, fell: the allocator went to the
    driver)."""
    schema = {
        **{k: windows.schema[k] for k in STEP_KEYS},
        "steady": pl.Boolean, "series": pl.String, "baseline_mb": pl.Float64,
        "peak_mb": pl.Float64, "reserved_peak_mb": pl.Float64, "gap_at_peak_mb": pl.Float64,
        "segment_allocs": pl.UInt32, "segment_frees": pl.UInt32,
    }  # fmt: skip
    if series.is_empty() or windows.is_empty():
        return pl.DataFrame(schema=schema)
    windows = windows.sort("rank", "session", "start_ns").with_row_index("_w")
    inside = window_of(series, windows, at="ts_ns", by=("rank", "session"), keep=["_w"]).drop_nulls(
        "_w"
    )
    # the value each series held when the window opened
    opened = (
        windows.select("rank", "session", "_w", pl.col("start_ns").alias("ts_ns"))
        .join(series.select("series").unique(), how="cross")
        .sort("ts_ns")
        .pipe(
            asof_join,
            series.drop("_delta").sort("ts_ns"),
            "ts_ns",
            "ts_ns",
            ["rank", "session", "series"],
        )
        .drop_nulls("value_mb")
        .with_columns(pl.lit(None, pl.Float64).alias("_delta"))
    )
    held = pl.concat([opened.select(inside.columns), inside], how="vertical_relaxed")
    agg = held.group_by("_w", "series").agg(
        pl.col("value_mb").min().alias("baseline_mb"),
        pl.col("value_mb").max().alias("peak_mb"),
        pl.col("reserved_mb").max().alias("reserved_peak_mb"),
        (pl.col("reserved_mb") - pl.col("value_mb")).sort_by("value_mb").last()
        .alias("gap_at_peak_mb"),
        (pl.col("_delta") > 0).sum().alias("segment_allocs"),
        (pl.col("_delta") < 0).sum().alias("segment_frees"),
    )  # fmt: skip
    return (
        windows.join(agg, on="_w")
        .select(*STEP_KEYS, "steady", *list(schema)[len(STEP_KEYS) + 1 :])
        .cast(schema)
        .sort("rank", "session", "start_ns", "series")
    )


# --------------------------------------------------------------------------------------------
# Modules and what was never freed
# --------------------------------------------------------------------------------------------


def _modules(store: Store, where: pl.Expr) -> pl.DataFrame:
    """Per (rank, session, module): the module's peak, first and last reserved MB
    (npu_module_mem.csv), the modules that held any."""
    return (
        store.table("module_memory")
        .filter(where)
        .sort("ts_ns")
        .group_by(pl.col("rank").cast(pl.Int64), "session", "component")
        .agg(
            pl.col("total_reserved_mb").max().alias("peak_reserved_mb"),
            pl.col("total_reserved_mb").first().alias("first_reserved_mb"),
            pl.col("total_reserved_mb").last().alias("last_reserved_mb"),
        )
        .filter(pl.col("peak_reserved_mb") > 0)
        .collect()
        .sort("rank", "session", "peak_reserved_mb", descending=[False, False, True])
    )


def _unfreed(store: Store, where: pl.Expr, records: pl.DataFrame) -> pl.DataFrame:
    """The allocations never released in the profile, largest first: rank, session, name,
    size_mb, alloc_ns, source (``operator_memory``; for a session without it, ``memory_record``:
    each rise of PTA's allocated memory that it never fell back below, named by its size)."""
    ops = (
        store.table("op_memory")
        .filter(where & pl.col("release_ns").is_null())
        .select(
            pl.col("rank").cast(pl.Int64),
            "session",
            "name",
            (pl.col("size_kb") / 1024).alias("size_mb"),
            "alloc_ns",
            pl.lit("operator_memory").alias("source"),
        )
        .collect()
    )
    with_ops = store.table("op_memory").filter(where).select("session").unique().collect()
    pta = records.filter(
        (pl.col("component") == PTA) & ~pl.col("session").is_in(with_ops["session"].implode())
    )
    rises = (
        pta.with_columns(
            (pl.col("allocated_mb") - pl.col("allocated_mb").shift(1).over("rank", "session"))
            .alias("size_mb"),
            # the lowest it held from this record on: a rise it never fell back below stayed
            pl.col("allocated_mb").reverse().cum_min().reverse().over("rank", "session")
            .alias("_floor"),
            pl.col("allocated_mb").shift(1).over("rank", "session").alias("_before"),
        )
        .filter((pl.col("size_mb") > 0) & (pl.col("_floor") >= pl.col("_before") + pl.col("size_mb")))
        .select(
            "rank", "session", pl.format("{} MB held", pl.col("size_mb").round(1)).alias("name"),
            "size_mb", pl.col("ts_ns").alias("alloc_ns"), pl.lit("memory_record").alias("source"),
        )
    )  # fmt: skip
    return pl.concat([ops, rises]).sort(
        "rank", "session", "size_mb", "alloc_ns", descending=[False, False, True, False]
    )


def _timeline(records: pl.DataFrame) -> pl.DataFrame:
    """rank, session, line, ts_ns (slot start), min_mb, max_mb: every line's values in
    :data:`TIMELINE_SLOTS` equal slots of the rank's recorded time (a slot without a record
    has no row: the value held on)."""
    lines = pl.concat(
        [
            records.filter(pl.col("component") == component).select(
                "rank", "session", pl.lit(line).alias("line"), "ts_ns",
                pl.col(value).alias("value_mb"),
            )
            for line, component, value in (
                ("PTA allocated", PTA, "allocated_mb"),
                ("PTA reserved", PTA, "reserved_mb"),
                ("GE allocated", GE, "allocated_mb"),
                ("APP", APP, "reserved_mb"),
            )
        ]
    ).drop_nulls("value_mb")  # fmt: skip
    first = pl.col("ts_ns").min().over("rank")
    width = ((pl.col("ts_ns").max().over("rank") - first) // TIMELINE_SLOTS + 1).alias("_w")
    return (
        lines.with_columns(first.alias("_t0"), width)
        .with_columns(
            (
                pl.col("_t0") + (pl.col("ts_ns") - pl.col("_t0")) // pl.col("_w") * pl.col("_w")
            ).alias("slot")
        )
        .group_by("rank", "session", "line", "slot")
        .agg(pl.col("value_mb").min().alias("min_mb"), pl.col("value_mb").max().alias("max_mb"))
        .rename({"slot": "ts_ns"})
        .sort("rank", "session", "line", "ts_ns")
    )


def steady_steps(memory: RankMemory, series: str) -> pl.DataFrame:
    """The steady windows' rows of ``series`` (not warm-up, dummy or idle), in time order."""
    return memory.steps.filter(pl.col("steady") & (pl.col("series") == series)).sort(
        "rank", "session", "start_ns"
    )
