"""The overview's timeline strip: the device streams of one representative step, as inline SVG.

Built by hand (no matplotlib: a run without findings must not pay for importing it) from
``summary.overview.representative.timeline`` (:mod:`traceanalyzer.overview.timeline`: the
rows and the merged rectangles); each rectangle carries a ``<title>`` (name, class, duration)
for hover.
"""

from __future__ import annotations

from traceanalyzer.chart import nice_step, tick_labels, tick_values, xml_text
from traceanalyzer.overview.model import Overview, Rect
from traceanalyzer.overview.timeline import STRIP_PX
from traceanalyzer.report import fmt
from traceanalyzer.step_components import COMPONENTS

OTHER_COLOR = "#9ca3af"
# task classes of the timeline (traceanalyzer.overview.breakdown) -> the component's colour
CLASS_COLORS: dict[str, str] = {c.task_class: c.colour for c in COMPONENTS if c.task_class}
# geometry, in SVG user units (pixels at 100%)
LEFT, RIGHT, TOP, ROW, BAR, AXIS = 110, 12, 26, 20, 14, 38
PLOT = STRIP_PX  # the width the overview merged the rectangles for
WIDTH = LEFT + PLOT + RIGHT


def timeline_svg(overview: Overview) -> str | None:
    """The strip as a standalone ``<svg>`` element (also valid inline in HTML), or None when the
    overview has no representative step or the step has no device task."""
    rep = overview.representative
    timeline = rep.timeline if rep else None
    if rep is None or timeline is None or not timeline.rects:
        return None
    rows, span = timeline.rows, int(timeline.span_ns)
    height = TOP + ROW * len(rows) + AXIS
    step = "the whole window" if rep.step is None else f"step {rep.step}"
    title = f"rank {rep.rank}, {step}: device streams (colours as in the breakdown)"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} '
        f'{height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11" '
        f'role="img" aria-label="{xml_text(title)}">',
        f'<text x="{LEFT}" y="15" font-size="12">{xml_text(title)}</text>',
    ]
    for i, row in enumerate(rows):
        y = TOP + ROW * i
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + ROW / 2 + 4:.0f}" text-anchor="end">{xml_text(row)}</text>'
        )
    scale = PLOT / span
    for r in timeline.rects:
        x = LEFT + r.start_ns * scale
        w = max((r.end_ns - r.start_ns) * scale, 0.5)  # a lone short task stays visible
        y = TOP + ROW * r.row + (ROW - BAR) / 2
        parts.append(
            f'<rect x="{x:.2f}" y="{y:.0f}" width="{w:.2f}" height="{BAR}" '
            f'fill="{CLASS_COLORS.get(r.cls, OTHER_COLOR)}"><title>{xml_text(_tip(r))}</title></rect>'
        )
    parts += _axis(span, TOP + ROW * len(rows))
    parts.append("</svg>")
    return "".join(parts)


def _tip(rect: Rect) -> str:
    if rect.tasks == 1:
        return f"{rect.name} ({rect.cls}, {fmt.duration(rect.busy_ns)})"
    span = fmt.duration(rect.end_ns - rect.start_ns)
    return (
        f"{rect.tasks} {rect.cls} tasks, {fmt.duration(rect.busy_ns)} busy in {span}; "
        f"longest: {rect.name}"
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
