"""The device streams of the overview's representative step, ready to draw.

The step whose time is the median of all steps (``summary.overview.representative``) gets its
device tasks, one row per stream (communication as one), merged into rectangles: tasks of one
row and class that would be narrower than a pixel of the strip join their neighbours, and the
merge coarsens until at most :data:`MAX_RECTS` remain, so a 200 MB rank still gives a small
figure. The reports draw it (``report/overview_timeline.py``) from ``representative.timeline``
alone: no renderer opens the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from traceanalyzer.overview.compute import device_tasks
from traceanalyzer.overview.model import Rect, StepTimeline
from traceanalyzer.store import Store

MAX_STREAMS = 16  # rows: the busiest streams (communication counts as one)
MAX_RECTS = 3000
STRIP_PX = 838  # the strip's drawn width: a rectangle narrower than its pixel merges


def step_timeline(store: Store, rep: Mapping[str, Any] | None) -> StepTimeline | None:
    """``rows`` (labels, top to bottom), ``span_ns`` and ``rects`` (:class:`Rect`: times from
    the step's start, ``row`` an index into ``rows``), or None when there is no representative
    step or it has no device task."""
    if not rep or rep.get("start_ns") is None or rep.get("end_ns") is None:
        return None
    start, end = int(rep["start_ns"]), int(rep["end_ns"])
    if end <= start:
        return None
    tasks = _step_tasks(store, rep, start, end)
    if tasks.is_empty():
        return None
    rows = _rows(tasks)
    rects = merge_rects(tasks.filter(pl.col("row").is_in(rows)), (end - start) / STRIP_PX)
    index = {row: i for i, row in enumerate(rows)}
    return StepTimeline(
        rows=rows,
        span_ns=end - start,
        rects=[
            Rect(index[row], cls, first - start, last - start, tasks, busy, name)
            for row, cls, first, last, tasks, busy, name in rects.select(Rect._fields).iter_rows()
        ],
    )


def _step_tasks(store: Store, rep: Mapping[str, Any], start: int, end: int) -> pl.DataFrame:
    """The rank's device tasks overlapping the step, clipped to it, each with its row."""
    window = (
        (pl.col("session") == rep["session"])
        & (pl.col("start_ns") < end)
        & (pl.col("end_ns") > start)
    )
    tasks = device_tasks(store, [int(rep["rank"])], where=window)
    return tasks.select(
        pl.when(pl.col("cls") == "comm")
        .then(pl.lit("communication"))
        .otherwise(pl.format("stream {}", pl.col("stream_id")))
        .alias("row"),
        pl.col("cls").cast(pl.String),
        pl.col("name").cast(pl.String).fill_null(""),
        pl.col("start_ns").clip(start, end),
        pl.col("end_ns").clip(start, end),
    )


def _rows(tasks: pl.DataFrame) -> list[str]:
    """The busiest rows, communication first, then streams by id."""
    busy = tasks.group_by("row").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("busy"))
    busiest = busy.sort("busy", "row", descending=[True, False])["row"].to_list()[:MAX_STREAMS]
    return sorted(busiest, key=lambda r: (r != "communication", len(r), r))


def merge_rects(tasks: pl.DataFrame, ns_per_px: float, limit: int = MAX_RECTS) -> pl.DataFrame:
    """Rectangles to draw: row, cls, start_ns, end_ns, tasks, busy_ns, name (the longest task's).

    Within a row and class, a task joins the previous rectangle when the gap between them is
    under the resolution and either of the two is narrower than it; the resolution doubles
    until at most ``limit`` rectangles remain (at worst one per row and class)."""
    # name last: tasks alike in all else still come in one order (the rectangle's name is the
    # first longest one)
    tasks = tasks.sort("row", "cls", "start_ns", "end_ns", "name")
    resolution = max(ns_per_px, 1.0)
    while True:
        rects = _merge(tasks, resolution)
        if rects.height <= limit:
            return rects
        resolution *= 2


def _merge(tasks: pl.DataFrame, resolution: float) -> pl.DataFrame:
    key = ["row", "cls"]
    width = pl.col("end_ns") - pl.col("start_ns")
    narrow = width < resolution
    gap = pl.col("start_ns") - pl.col("end_ns").cum_max().shift(1).over(key)
    joins = (gap < resolution) & (narrow | narrow.shift(1).over(key))
    return (
        tasks.with_columns(width.alias("dur"), (~joins.fill_null(False)).cum_sum().alias("group"))
        .group_by("group")
        .agg(
            pl.col("row").first(),
            pl.col("cls").first(),
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.len().alias("tasks"),
            pl.col("dur").sum().alias("busy_ns"),
            # equal durations: the first name in order wins, never whichever the sort left first
            pl.col("name").sort_by("dur", descending=True, maintain_order=True).first(),
        )
        # group_by returns groups in any order, and rectangles of one row and class may start
        # together (a collective and its first copy): the groups' numbers are the tasks' sorted
        # order, so the same store always gives the same findings.json
        .sort("group")
        .drop("group")
    )
