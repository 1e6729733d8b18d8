"""The overview's figures: the breakdown per rank as a heat map past 8 ranks (report.html draws
the stacked bars of fewer ranks in HTML), and a timeline strip of one representative step.

matplotlib is imported inside each function, only when a figure is drawn (the Agg canvas, no
pyplot: nothing global is switched, so notebooks keep their inline backend).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from traceanalyzer.store import Store

DPI = 110
HEATMAP_ABOVE = 8  # ranks: more than this and bars are unreadable, the heat map reads at a glance
MAX_STREAMS = 16
# one colour per component, in bar order: compute blues/greens, communication purples, idle greys
COLORS: dict[str, str] = {
    "compute_ai_core_ns": "#1d4ed8",
    "compute_ai_vector_ns": "#0891b2",
    "compute_mix_ns": "#0d9488",
    "compute_ai_cpu_ns": "#65a30d",
    "compute_other_ns": "#93c5fd",
    "overlapped_ns": "#a78bfa",
    "comm_exposed_ns": "#7c3aed",
    "device_other_ns": "#f59e0b",
    "idle_host_ns": "#dc2626",
    "idle_stream_ns": "#f97316",
    "idle_other_ns": "#d1d5db",
}
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


def _figure(width: float, height: float) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    return fig, fig.add_subplot(1, 1, 1)


def heatmap_figure(overview: Mapping[str, Any]) -> Figure | None:
    """Past 8 ranks (bars would be unreadable): ranks x components, coloured by share of the
    step. Up to 8, report.html draws the stacked bars itself, in HTML."""
    import numpy as np

    ranks = overview.get("ranks") or []
    components = overview.get("components") or []
    if len(ranks) <= HEATMAP_ABOVE or not components:
        return None
    shares = np.array(
        [[r.get(c["key"], 0.0) / (r.get("step_ns") or 1.0) for c in components] for r in ranks]
    )
    height = 2.6 + min(len(ranks), 64) * 0.09
    # 1.6 in above the cells for the rotated component labels, whatever the rank count
    fig, ax = _figure(9.5, height)
    fig.subplots_adjust(left=0.08, right=0.86, top=1 - 1.6 / height, bottom=0.2 / height)
    image = ax.imshow(
        shares, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest"
    )
    ax.set_xticks(range(len(components)))
    ax.set_xticklabels([c["label"] for c in components], rotation=30, ha="left", fontsize=7)
    ax.xaxis.tick_top()
    step = max(1, len(ranks) // 32)
    ax.set_yticks(range(0, len(ranks), step))
    ax.set_yticklabels([str(ranks[i]["rank"]) for i in range(0, len(ranks), step)], fontsize=6)
    ax.set_ylabel("rank")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="share of the step")
    return fig


def timeline_figure(overview: Mapping[str, Any], store: Store) -> Figure | None:
    """The device streams during the representative step, tasks coloured by component."""
    from traceanalyzer.overview.compute import device_tasks

    rep = overview.get("representative")
    if not rep:
        return None
    start, end = int(rep["start_ns"]), int(rep["end_ns"])
    window = (
        (pl.col("session") == rep["session"])
        & (pl.col("start_ns") < end)
        & (pl.col("end_ns") > start)
    )
    tasks = device_tasks(store, [int(rep["rank"])], where=window)
    if tasks.is_empty():
        return None
    tasks = tasks.with_columns(
        pl.when(pl.col("cls") == "comm")
        .then(pl.lit("communication"))
        .otherwise(pl.format("stream {}", pl.col("stream_id")))
        .alias("row")
    )
    busiest = (tasks.group_by("row").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True))[
        "row"
    ].to_list()[:MAX_STREAMS]
    rows = sorted(busiest, key=lambda r: (r != "communication", len(r), r))
    fig, ax = _figure(9.5, 1.0 + 0.28 * len(rows))
    fig.subplots_adjust(left=0.14, right=0.98, top=0.85, bottom=0.25)
    for y, row in enumerate(rows):
        part = tasks.filter(pl.col("row") == row)
        for cls, group in part.group_by("cls"):
            spans = [
                ((s - start) / 1e6, (e - s) / 1e6)
                for s, e in group.select(
                    pl.col("start_ns").clip(start, end), pl.col("end_ns").clip(start, end)
                ).iter_rows()
            ]
            ax.broken_barh(spans, (y - 0.4, 0.8), color=CLASS_COLORS.get(str(cls[0]), "#9ca3af"))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, (end - start) / 1e6)
    ax.set_xlabel("ms from the step's start")
    step = "the whole window" if rep.get("step") is None else f"step {rep['step']}"
    ax.set_title(
        f"rank {rep['rank']}, {step}: device streams (colours as in the breakdown)",
        fontsize=9,
        loc="left",
    )
    ax.tick_params(axis="x", labelsize=7)
    return fig
