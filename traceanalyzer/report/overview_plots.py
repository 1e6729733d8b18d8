"""The overview's colours, and its one chart: the breakdown per rank as a heat map past 8 ranks
(report.html draws the stacked bars of fewer ranks in HTML, and the timeline strip is SVG:
:mod:`traceanalyzer.report.overview_timeline`). Both are SVG: no run imports matplotlib.
"""

from __future__ import annotations

from traceanalyzer.chart import Chart
from traceanalyzer.overview.model import Overview
from traceanalyzer.step_components import COMPONENTS

HEATMAP_ABOVE = 8  # ranks: more than this and bars are unreadable, the heat map reads at a glance
# one colour per component, in bar order: compute blues/greens, communication purples, idle greys
COLORS: dict[str, str] = {c.key: c.colour for c in COMPONENTS}


# one colour per phase (traceanalyzer.derived.phases.PHASES): the work warm, the rest muted
PHASE_COLORS: dict[str, str] = {
    "prefill": "#1d4ed8",
    "decode": "#0d9488",
    "mixed": "#7c3aed",
    "spec_decode": "#db2777",
    "dummy": "#f59e0b",
    "warmup": "#a16207",
    "idle": "#e5e7eb",
    "unknown": "#9ca3af",
}


def heatmap_figure(overview: Overview) -> Chart | None:
    """Past 8 ranks (bars would be unreadable): ranks x components, coloured by share of the
    step. Up to 8, report.html draws the stacked bars itself, in HTML."""
    ranks, components = overview.ranks, overview.components
    if len(ranks) <= HEATMAP_ABOVE or not components:
        return None
    shares = [[r.mean.get(c.key, 0.0) / (r.step_ns or 1.0) for c in components] for r in ranks]
    chart = Chart(9.5, 1.6 + min(len(ranks), 64) * 0.09)  # the rotated labels under the cells
    (ax,) = chart.axes
    cells = ax.imshow(shares, vmin=0, vmax=1)
    ax.set_xticks(range(len(components)), [c.label for c in components], rotation=30)
    step = max(1, len(ranks) // 32)
    ax.set_yticks(range(0, len(ranks), step), [str(r.rank) for r in ranks[::step]], fontsize=6)
    ax.set_ylabel("rank")
    chart.colorbar(cells, label="share of the step")
    return chart
