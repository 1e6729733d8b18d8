"""The overview's colours, and its one matplotlib figure: the breakdown per rank as a heat map
past 8 ranks (report.html draws the stacked bars of fewer ranks in HTML, and the timeline strip
is SVG: :mod:`traceanalyzer.report.overview_timeline`).

matplotlib is imported only when the heat map is drawn (the Agg canvas, no pyplot: nothing
global is switched, so notebooks keep their inline backend).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
HEATMAP_ABOVE = 8  # ranks: more than this and bars are unreadable, the heat map reads at a glance
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
