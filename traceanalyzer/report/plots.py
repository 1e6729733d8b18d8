"""Each finding's figure, drawn by its own rule (``Rule.figure``; :meth:`ReportInputs.figure
<traceanalyzer.report.inputs.ReportInputs.figure>`), as the bytes of a file.

A rule draws an SVG :class:`~traceanalyzer.chart.Chart` (``fig.new``): no matplotlib is
imported, report.html inlines the SVG and report.md links ``plots/<name>-<fp>.svg``. A rule
that needs the whole of matplotlib draws a ``Figure`` (``fig.matplotlib``), which becomes a PNG
through the Agg canvas (never ``pyplot``: no global backend is switched, so a notebook keeps its
inline plotting, and nothing needs a display).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from traceanalyzer.chart import Chart
from traceanalyzer.printable import printable
from traceanalyzer.report.htmlkit import img_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def render(fig: Chart | Figure) -> bytes:
    """The figure as a file: SVG (UTF-8) for a chart, PNG for a matplotlib figure."""
    return svg_file(fig.to_svg()) if isinstance(fig, Chart) else render_png(fig)


def svg_file(svg: str) -> bytes:
    """An SVG as its file's bytes, without the control characters of the names in its text
    (they come from the input; :func:`~traceanalyzer.printable.printable`)."""
    return printable(svg, lines=True).encode("utf-8")


def extension(data: bytes) -> str:
    """The file extension of :func:`render`'s bytes: ``png`` or ``svg``."""
    return "png" if data.startswith(PNG_MAGIC) else "svg"


def render_png(fig: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def embed(data: bytes, alt: str) -> str:
    """The figure in HTML: an SVG inline (crisp, scales with the page), a PNG as an image."""
    return img_png(data, alt) if extension(data) == "png" else data.decode("utf-8")
