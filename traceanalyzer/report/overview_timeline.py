"""The overview's timeline strip: the device streams of one representative step, as inline SVG.

Built by hand (no matplotlib: a run without findings must not pay for importing it). Each task
rectangle carries a ``<title>`` (name, class, duration) for hover. Tasks of one row and class
that would be narrower than a pixel merge with their neighbours, and the merge coarsens until
at most :data:`MAX_RECTS` rectangles remain, so a 200 MB rank still gives a small file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.chart import nice_step, tick_labels, tick_values, xml_text
from traceanalyzer.report import fmt
from traceanalyzer.report.overview_plots import COLORS

if TYPE_CHECKING:
    from traceanalyzer.store import Store

MAX_STREAMS = 16  # rows: the busiest streams (communication counts as one)
MAX_RECTS = 3000
OTHER_COLOR = "#9ca3af"
# task classes of the timeline (traceanalyzer.overview.breakdown) -> the component's colour
CLASS_COLORS: dict[str, str] = {
    "ai_core": COLORS["compute_ai_core_ns"],
    "ai_vector": COLORS["compute_ai_vector_ns"],
    "mix": COLORS["compute_mix_ns"],
    "ai_cpu": COLORS["compute_ai_cpu_ns"],
    "compute_other": COLORS["compute_other_ns"],
    "comm": COLORS["comm_exposed_ns"],
    "device_other": COLORS["device_other_ns"],
    "wait": COLORS["idle_stream_ns"],
}
# geometry, in SVG user units (pixels at 100%)
WIDTH, LEFT, RIGHT, TOP, ROW, BAR, AXIS = 960, 110, 12, 26, 20, 14, 38
PLOT = WIDTH - LEFT - RIGHT


def timeline_svg(overview: Mapping[str, Any], store: Store) -> str | None:
    """The strip as a standalone ``<svg>`` element (also valid inline in HTML), or None when the
    overview has no representative step or the step has no device task."""
    rep = overview.get("representative")
    if not rep:
        return None
    start, end = int(rep["start_ns"]), int(rep["end_ns"])
    tasks = _step_tasks(store, rep, start, end)
    if tasks.is_empty() or end <= start:
        return None
    rows = _rows(tasks)
    rects = merge_rects(tasks.filter(pl.col("row").is_in(rows)), (end - start) / PLOT)
    height = TOP + ROW * len(rows) + AXIS
    step = "the whole window" if rep.get("step") is None else f"step {rep['step']}"
    title = f"rank {rep['rank']}, {step}: device streams (colours as in the breakdown)"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} '
        f'{height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11" '
        f'role="img" aria-label="{xml_text(title)}">',
        f'<text x="{LEFT}" y="15" font-size="12">{xml_text(title)}</text>',
    ]
    index = {row: i for i, row in enumerate(rows)}
    for i, row in enumerate(rows):
        y = TOP + ROW * i
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + ROW / 2 + 4:.0f}" text-anchor="end">{xml_text(row)}</text>'
        )
    scale = PLOT / (end - start)
    for r in rects.iter_rows(named=True):
        x = LEFT + (r["start_ns"] - start) * scale
        w = max((r["end_ns"] - r["start_ns"]) * scale, 0.5)  # a lone short task stays visible
        y = TOP + ROW * index[r["row"]] + (ROW - BAR) / 2
        parts.append(
            f'<rect x="{x:.2f}" y="{y:.0f}" width="{w:.2f}" height="{BAR}" '
            f'fill="{CLASS_COLORS.get(r["cls"], OTHER_COLOR)}"><title>{xml_text(_tip(r))}</title></rect>'
        )
    parts += _axis(end - start, TOP + ROW * len(rows))
    parts.append("</svg>")
    return "".join(parts)


def _step_tasks(store: Store, rep: Mapping[str, Any], start: int, end: int) -> pl.DataFrame:
    """The rank's device tasks overlapping the step, clipped to it, each with its row."""
    from traceanalyzer.overview.compute import device_tasks

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
    tasks = tasks.sort("row", "cls", "start_ns", "end_ns")
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
            pl.col("name").sort_by("dur", descending=True).first(),
        )
        .drop("group")
        .sort("row", "cls", "start_ns")
    )


def _tip(rect: Mapping[str, Any]) -> str:
    if rect["tasks"] == 1:
        return f"{rect['name']} ({rect['cls']}, {fmt.duration(rect['busy_ns'])})"
    span = fmt.duration(rect["end_ns"] - rect["start_ns"])
    return (
        f"{rect['tasks']} {rect['cls']} tasks, {fmt.duration(rect['busy_ns'])} busy in {span}; "
        f"longest: {rect['name']}"
    )


def _axis(span_ns: int, y: int) -> list[str]:
    """The x axis under the rows: ms from the step's start, a tick every 1/2/5 x 10^k ms."""
    span_ms = span_ns / 1e6
    step = nice_step(span_ms, 6)
    ticks = tick_values(0.0, span_ms, step)
    parts = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT}" y2="{y}" stroke="#6b7280"/>']
    for tick, label in zip(ticks, tick_labels(ticks, step)[0], strict=True):
        x = LEFT + PLOT * tick / span_ms
        parts.append(
            f'<line x1="{x:.2f}" y1="{y}" x2="{x:.2f}" y2="{y + 4}" stroke="#6b7280"/>'
            f'<text x="{x:.2f}" y="{y + 15}" text-anchor="middle">{label}</text>'
        )
    parts.append(
        f'<text x="{LEFT + PLOT / 2}" y="{y + 31}" text-anchor="middle" fill="#4b5563">'
        "ms from the step's start</text>"
    )
    return parts
