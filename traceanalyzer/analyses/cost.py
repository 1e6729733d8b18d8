"""The analysed window of each rank: the time a finding's cost is a share of (``Cost.share``).

It is the rank's steps (the steps table's windows, the idle time between two iterations
included: what the overview's breakdown covers) where the rank has them, else its sessions from
first to last event. One definition, so every rule's cost share is the share the overview and
the reports give it.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.derived.tables import steps_of
from traceanalyzer.engine.findings import Cost, bounded_share
from traceanalyzer.engine.rule import RuleContext

WINDOW_SCHEMA = {"rank": pl.Int32, "session": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}


def analysed_windows(ctx: RuleContext) -> pl.DataFrame:
    """The windows of every rank in scope: its steps, else its sessions (rank, session, bounds)."""
    return ctx.shared(_analysed_windows)


def _analysed_windows(ctx: RuleContext) -> pl.DataFrame:
    steps = (
        steps_of(ctx.store, ctx.ranks)
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .select("rank", "session", "start_ns", "end_ns")
        .cast(WINDOW_SCHEMA)  # type: ignore[arg-type]
    )
    with_steps = steps["rank"].unique().to_list()
    sessions = (
        ctx.sessions()
        .filter((pl.col("end_ns") > pl.col("start_ns")) & ~pl.col("rank").is_in(with_steps))
        .select("rank", "session", "start_ns", "end_ns")
        .cast(WINDOW_SCHEMA)  # type: ignore[arg-type]
    )
    return pl.concat([steps, sessions]).sort("rank", "start_ns")


def analysed_window_ns(ctx: RuleContext) -> dict[int, int]:
    """Per rank: total step time, else total session time (ns); ranks without either are absent."""
    totals = (
        analysed_windows(ctx)
        .group_by("rank")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("window_ns"))
    )
    return {int(r): int(w) for r, w in totals.iter_rows()}


def window_share(cost_ns: float | None, window_ns: int | None) -> float | None:
    """``cost_ns`` as a share of the window (within [0, 1]), or None when either is unknown
    or the window is empty."""
    if cost_ns is None or not window_ns or window_ns <= 0:
        return None
    return bounded_share(cost_ns / window_ns)


def cost_over(ns: float | None, window_ns: int | None) -> Cost:
    """A finding's cost: ``ns`` lost from a window of ``window_ns`` (the rank's analysed
    window, :func:`analysed_window_ns`), with its share of it (None when either is unknown)."""
    return Cost(ns, window_share(ns, window_ns))
