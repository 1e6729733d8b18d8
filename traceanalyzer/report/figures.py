"""Key figures per rank, for before/after comparisons (``traceanalyzer diff``).

Each figure is one small query on the store, independent of whether a rule fired, so a diff can
say "capture time 2.5 ms -> 0.6 ms" even when the target run is clean. Name patterns are the
built-in rules' own default parameters (``rule_default``), so figures count what rules count:

- **capture time** (``capture_ns_mean``, ``captures``): aclgraph capture windows, i.e.
  ``aclmdlRICaptureBegin`` ... ``aclmdlRICaptureEnd`` CANN calls paired per host thread
  (outermost only), mean duration per window.
- **memcpy per capture** (``memcpy_per_capture``): synchronous host memcpy calls
  (``aclrtMemcpy``/``aclrtMemcpy2d``, runtime ``MemCopySync``/``rtMemcpy``) starting inside a
  capture window, averaged over windows, on the rule's CANN layer (``one_api_layer``: per rank,
  runtime calls when present (Level2), else AscendCL calls, never both).
- **transfer span time** (``transfer_ns_mean``, ``transfer_ns_total``, ``transfer_spans``): host
  spans named like a KV-store transfer (Mooncake ``batch_get_into_multi_buffers``...), outermost
  per rank session; for sessions without such a span whose ``profiler_metadata.json`` marks the
  window as a store transfer, the session window.
- **step time** (``step_ns_mean``, ``step_ns_median``, ``steps``): ``ProfilerStep#N`` host spans;
  without them, the ``Stage`` column of ``step_trace_time.csv``.

Missing data gives null, never zero: "no captures" is not "captures took 0 ms".
"""

from __future__ import annotations

import functools
from typing import Any

import polars as pl

from traceanalyzer.engine.primitives import (
    count_in_windows,
    one_api_layer,
    outermost,
    pair_windows,
)
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    NOT_HOST_PROCESSES,
    STORE_TRANSFER_WINDOW,
    WINDOW_KEY,
    session_metadata,
)

NOT_HOST = NOT_HOST_PROCESSES


@functools.cache  # loading the rule files once per process is enough
def rule_default(rule: str, param: str) -> Any:
    """A built-in rule's default parameter, so the figures count exactly what the rule counts."""
    from traceanalyzer.engine.loader import load_rules

    return load_rules(entry_points=False).rules.get(rule).params[param].default


FIGURES: dict[str, str] = {
    "captures": "aclgraph captures",
    "capture_ns_mean": "capture time (mean per capture)",
    "memcpy_per_capture": "host memcpy per capture (mean)",
    "transfer_spans": "transfer spans",
    "transfer_ns_mean": "transfer span time (mean)",
    "transfer_ns_total": "transfer span time (total)",
    "steps": "steps",
    "step_ns_mean": "step time (mean)",
    "step_ns_median": "step time (median)",
}
# A lower value is better for these (used to colour deltas); counts are neutral.
LOWER_IS_BETTER = {
    "capture_ns_mean",
    "memcpy_per_capture",
    "transfer_ns_mean",
    "transfer_ns_total",
    "step_ns_mean",
    "step_ns_median",
}
# Which figures speak for which rule, so a resolved/new finding carries the relevant deltas.
RULE_FIGURES: dict[str, tuple[str, ...]] = {
    "capture-memcpy-growth": ("memcpy_per_capture", "capture_ns_mean"),
    "store-transfer-stall": ("transfer_ns_mean", "transfer_ns_total"),
}


def capture_figures(store: Store) -> pl.DataFrame:
    """rank, captures, capture_ns_mean, memcpy_per_capture."""
    cann = store.table("slices").filter(pl.col("process") == "CANN")
    api = pl.col("api_name")
    is_begin = api.str.contains(rule_default("capture-memcpy-growth", "capture_begin"))
    is_end = api.str.contains(rule_default("capture-memcpy-growth", "capture_end"))
    windows = pair_windows(cann.filter(is_begin | is_end), is_begin=is_begin, is_end=is_end).select(
        "rank", "session", "start_ns", "end_ns", "dur_ns"
    )
    schema = {"rank": pl.Int32, "captures": pl.UInt32, "capture_ns_mean": pl.Float64,
              "memcpy_per_capture": pl.Float64}  # fmt: skip
    if windows.is_empty():
        return pl.DataFrame(schema=schema)
    windows = outermost(windows).with_row_index("window_id")
    memcpy = one_api_layer(
        cann.filter(api.str.contains(rule_default("capture-memcpy-growth", "memcpy_pattern"))),
        rule_default("capture-memcpy-growth", "layer"),
    ).select("rank", "session", "start_ns", "end_ns")
    counted = count_in_windows(windows, memcpy, window_id="window_id", name="memcpy")
    return (
        counted.group_by("rank")
        .agg(
            pl.len().alias("captures"),
            pl.col("dur_ns").mean().alias("capture_ns_mean"),
            pl.col("memcpy").mean().cast(pl.Float64).alias("memcpy_per_capture"),
        )
        .cast(schema)
    )


def transfer_figures(store: Store) -> pl.DataFrame:
    """rank, transfer_spans, transfer_ns_mean, transfer_ns_total."""
    transfer_pattern = rule_default("store-transfer-stall", "span_pattern")
    spans = (
        store.table("slices")
        .filter(~pl.col("process").is_in(NOT_HOST) & pl.col("name").str.contains(transfer_pattern))
        .select("rank", "session", "start_ns", "end_ns")
        .collect()
    )
    spans = outermost(spans)
    with_spans = set(spans.select("rank", "session").iter_rows())
    marked = [
        {
            "rank": r["rank"],
            "session": r["session"],
            "start_ns": r["start_ns"],
            "end_ns": r["end_ns"],
        }
        for r in store.sessions().iter_rows(named=True)
        if (r["rank"], r["session"]) not in with_spans
        and r["start_ns"] is not None
        and r["end_ns"] is not None
        and session_metadata(r.get("metadata")).get(WINDOW_KEY) == STORE_TRANSFER_WINDOW
    ]
    if marked:
        spans = pl.concat([spans, pl.DataFrame(marked, schema=spans.schema)])
    return (
        spans.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
        .group_by("rank")
        .agg(
            pl.len().alias("transfer_spans"),
            pl.col("dur_ns").mean().alias("transfer_ns_mean"),
            pl.col("dur_ns").sum().cast(pl.Float64).alias("transfer_ns_total"),
        )
        .cast({"rank": pl.Int32, "transfer_spans": pl.UInt32})
    )


def step_figures(store: Store) -> pl.DataFrame:
    """rank, steps, step_ns_mean, step_ns_median."""
    steps = (
        store.table("slices")
        .filter(
            ~pl.col("process").is_in(NOT_HOST) & pl.col("name").str.starts_with("ProfilerStep#")
        )
        .select("rank", pl.col("dur_ns"))
        .collect()
    )
    fallback = (
        store.table("step_times")
        .filter(~pl.col("rank").is_in(steps["rank"].unique().to_list()))
        .select("rank", pl.col("stage_ns").alias("dur_ns"))
        .drop_nulls()
        .collect()
    )
    return (
        pl.concat([steps, fallback])
        .group_by("rank")
        .agg(
            pl.len().alias("steps"),
            pl.col("dur_ns").mean().alias("step_ns_mean"),
            pl.col("dur_ns").median().alias("step_ns_median"),
        )
        .cast({"rank": pl.Int32, "steps": pl.UInt32})
    )


def key_figures(store: Store) -> pl.DataFrame:
    """One row per rank with every figure in :data:`FIGURES` (null when the data is absent)."""
    ranks = store.table("sessions").select(pl.col("rank").unique()).collect()
    out = ranks.cast({"rank": pl.Int32})
    for part in (capture_figures(store), transfer_figures(store), step_figures(store)):
        out = out.join(part, on="rank", how="left")
    return out.select("rank", *FIGURES).sort("rank")
