"""PNG per finding: each finding's figure is drawn by its own rule (``Rule.figure``).

A rule draws with the object-oriented matplotlib API (``Figure`` + Agg canvas, see
:meth:`~traceanalyzer.engine.presentation.FigureContext.new`), never ``pyplot``: no global
backend is switched, so a notebook keeps its inline plotting, and nothing needs a display.
matplotlib is imported only when a figure is actually drawn.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from traceanalyzer.report.inputs import ReportInputs

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure_for(finding: dict[str, Any], inputs: ReportInputs) -> Figure | None:
    """The finding's figure, or None when its rule draws none or the data is missing."""
    return inputs.figure(finding)


def render_png(fig: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()
