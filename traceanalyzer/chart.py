"""A small SVG chart that reads like matplotlib's object-oriented Axes API, without matplotlib.

Rule figures are drawn on a :class:`Chart` (from :meth:`FigureContext.new
<traceanalyzer.engine.presentation.FigureContext.new>`): ``ax.plot``, ``ax.bar``,
``ax.set_xlabel``... record what to draw, and :meth:`Chart.to_svg` lays it out and writes the
SVG (inline in report.html, ``plots/*.svg`` on disk, ``_repr_svg_`` in a notebook). Importing
matplotlib and drawing with it cost most of a report; this costs a few milliseconds a figure.

Only the subset the built-in rules use is supported (:data:`SUPPORTED`); anything else raises
:class:`Unsupported`, which points at ``fig.matplotlib(...)`` for the full API. Geometry is in
SVG user units at 96 per inch; font sizes and line widths are in points, as in matplotlib. Text
width is estimated (0.6 em a character), which is enough to size the margins.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PX_PER_IN = 96
PT = PX_PER_IN / 72  # SVG units per typographic point
EM_PER_CHAR = 0.6  # estimated advance of one character, in em
# Line colours for ranks/series, in order; more ranks than colours repeat them.
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d")
# subplots_adjust's margins (fractions of the figure), each a minimum: the labels get room anyway
MARGIN_KEYS = ("left", "right", "top", "bottom", "wspace")
PAD = 8.0  # between the figure's edge and anything drawn
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif"
INK, MUTED, SPINE, GRID = "#111827", "#374151", "#6b7280", "#e5e7eb"
MAX_LABEL_CHARS = 48  # a tick or legend label longer than this is cut with an ellipsis
TICK_LEN, TICK_PAD = 3.5 * PT, 3.5 * PT
# anchors of matplotlib's viridis, interpolated linearly in between
VIRIDIS = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#b5de2b",
    "#fde725",
)
# what the chart draws; anything else raises Unsupported
SUPPORTED = {
    "Chart": ("subplots_adjust", "add_subplot", "colorbar", "to_svg"),
    "ChartAxes": (
        "plot",
        "step",
        "bar",
        "barh",
        "broken_barh",
        "fill_between",
        "vlines",
        "axvspan",
        "axhline",
        "text",
        "imshow",
        "twinx",
        "legend",
        "grid",
        "set_xlabel",
        "set_ylabel",
        "set_title",
        "set_xlim",
        "set_ylim",
        "set_xticks",
        "set_yticks",
        "set_xticklabels",
        "set_yticklabels",
        "transAxes",
        "transData",
    ),
}
_HINT = "for the full matplotlib API, draw with fig.matplotlib(...) instead of fig.new(...)"
# characters XML 1.0 forbids even escaped; a trace name may carry them
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_ALIASES = {
    "c": "color",
    "colors": "color",
    "facecolor": "color",
    "facecolors": "color",
    "fc": "color",
    "lw": "linewidth",
    "linewidths": "linewidth",
    "ls": "linestyle",
    "linestyles": "linestyle",
    "ms": "markersize",
    "ec": "edgecolor",
    "edgecolors": "edgecolor",
    "horizontalalignment": "ha",
    "verticalalignment": "va",
}
_LINE = {"color", "linewidth", "linestyle", "marker", "markersize", "label", "alpha", "zorder"}
_PATCH = {"color", "edgecolor", "label", "alpha", "zorder"}
_DASHES = {
    "-": None,
    "solid": None,
    "--": (3.7, 1.6),
    "dashed": (3.7, 1.6),
    ":": (1, 1.65),
    "dotted": (1, 1.65),
    "-.": (6.4, 1.6, 1, 1.6),
    "dashdot": (6.4, 1.6, 1, 1.6),
}
_MARKERS = {"o", ".", "s", "^", "D", "x", "+"}
_SHORT = {
    "b": "#1f77b4",
    "g": "#2ca02c",
    "r": "#d62728",
    "c": "#17becf",
    "m": "#9467bd",
    "y": "#bcbd22",
    "k": "#000000",
    "w": "#ffffff",
}
_LOCS = (
    "upper right",
    "upper left",
    "lower left",
    "lower right",
    "upper center",
    "lower center",
    "center left",
    "center right",
    "center",
    "right",
)


class Unsupported(TypeError, AttributeError):
    """A matplotlib feature the SVG chart does not have (use ``fig.matplotlib(...)``).

    An AttributeError for a missing method (so ``hasattr`` and ``getattr(..., default)`` work)
    and a TypeError for a keyword argument the chart does not take."""


def xml_text(value: Any) -> str:
    """Escaped for XML text and attributes, with the characters XML cannot hold dropped."""
    return html.escape(_NOT_XML.sub("", str(value)), quote=True)


def text_width(text: str, size_px: float) -> float:
    """Estimated width of one line of text (no font metrics: 0.6 em a character, 1 em a wide
    East Asian one)."""
    wide = sum(1 for ch in text if ch > "\u2e7f" and unicodedata.east_asian_width(ch) in "WF")
    return (len(text) + wide * (1 / EM_PER_CHAR - 1)) * size_px * EM_PER_CHAR


def shorten(text: Any, limit: int = MAX_LABEL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis."""
    text = str(text)
    return text if len(text) <= limit else text[: max(limit - 1, 1)] + "…"


def viridis(share: float) -> str:
    """The colour of ``share`` (0..1, clipped) on a viridis-like ramp."""
    share = min(max(share, 0.0), 1.0) if math.isfinite(share) else 0.0
    pos = share * (len(VIRIDIS) - 1)
    i = min(int(pos), len(VIRIDIS) - 2)
    a, b = (_rgb(VIRIDIS[k]) for k in (i, i + 1))
    return "#" + "".join(f"{round(x + (y - x) * (pos - i)):02x}" for x, y in zip(a, b, strict=True))


def nice_step(span: float, target: float) -> float:
    """The 1-2-2.5-5 x 10^k step that cuts ``span`` into about ``target`` intervals."""
    raw = span / max(target, 1.0)
    if not raw > 0 or not math.isfinite(raw):
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))


def tick_values(lo: float, hi: float, step: float) -> list[float]:
    """Multiples of ``step`` within [lo, hi]."""
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [k * step for k in range(first, last + 1)]


def tick_labels(ticks: Sequence[float], step: float) -> tuple[list[str], str]:
    """Compact labels for ``ticks`` spaced ``step`` apart, and the offset they are relative to
    ("" when none): 1.2k, 3M, 0.25, not 1200.0000001; an offset when the values are huge next
    to the step (int64 ns timestamps)."""
    if not ticks:
        return [], ""
    offset = 0.0
    peak = max(abs(t) for t in ticks)
    if peak / step >= 1e5:  # labels would be all alike: show them relative to a round offset
        magnitude = 10.0 ** math.ceil(math.log10(max(ticks[-1] - ticks[0], step)))
        offset = math.floor(ticks[0] / magnitude) * magnitude
        peak = max(abs(t - offset) for t in ticks)
    labels = [number(t - offset, step, peak) for t in ticks]
    if offset == 0:
        return labels, ""
    digits = max(0, math.floor(math.log10(abs(offset))) - round(math.log10(magnitude)))
    mantissa, exponent = f"{abs(offset):.{digits}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return labels, f"{'+' if offset > 0 else '−'}{mantissa}e{int(exponent)}"


def number(value: float, step: float, peak: float) -> str:
    """``value`` printed to the precision of ``step``; from 100,000 in k, from a million in M,
    G, T (``peak`` is the largest value on the axis)."""
    scale, suffix = 1.0, ""
    for factor, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if peak >= (1e5 if factor == 1e3 else factor):  # 50000 stays 50000, 250000 is 250k
            scale, suffix = factor, unit
            break
    unit_step = step / scale
    if not unit_step >= 1e-5:
        return f"{value:.3g}"
    # the fewest decimals that print the step exactly: 0.25 needs two, 0.2 one, 5 none
    decimals = next(
        d for d in range(7) if d == 6 or abs(round(unit_step * 10**d) - unit_step * 10**d) < 1e-6
    )
    text = f"{value / scale:.{decimals}f}"
    if float(text) == 0:
        return text.lstrip("-")
    return text.replace("-", "−") + suffix  # a typographic minus, as matplotlib prints


@dataclass(frozen=True)
class Swatch:
    """A legend entry of a colour and a label (matplotlib's ``Patch(color=..., label=...)``)."""

    color: str
    label: str
    alpha: float = 1.0


# ---------------------------------------------------------------------------- drawing records


@dataclass
class _Style:
    color: str | None = None
    linewidth: float = 1.5
    linestyle: str = "-"
    marker: str | None = None
    markersize: float = 6.0
    label: str | None = None
    alpha: float = 1.0
    edgecolor: str | None = None
    zorder: float = 1.0

    def stroke(self, width: float | None = None) -> str:
        lw = (self.linewidth if width is None else width) * PT
        dash = _DASHES.get(self.linestyle or "-")
        parts = [f'stroke="{_color(self.color)}" stroke-width="{_f(lw)}" fill="none"']
        if dash:
            parts.append(f'stroke-dasharray="{" ".join(_f(d * lw) for d in dash)}"')
        if self.alpha < 1:
            parts.append(f'stroke-opacity="{_f(self.alpha)}"')
        return " ".join(parts)

    def fill(self, color: str | None = None) -> str:
        parts = [f'fill="{_color(color or self.color)}"']
        if self.alpha < 1:
            parts.append(f'fill-opacity="{_f(self.alpha)}"')
        if self.edgecolor:
            parts.append(f'stroke="{_color(self.edgecolor)}" stroke-width="{_f(0.6 * PT)}"')
        return " ".join(parts)


@dataclass
class _Artist:
    style: _Style
    kind: str  # "line", "patch" (legend handle), "text", "image"

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        """Data values along ``axis`` ("x"/"y") for autoscaling, and sticky edges (no margin)."""
        return [], []

    def points(self) -> Iterable[tuple[float, float]]:
        """Data points, for the legend's "best" corner."""
        return ()

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        raise NotImplementedError


@dataclass
class _Line(_Artist):
    x: list[float | None] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)
    where: str | None = None  # steps: "pre", "post", "mid"

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        return _finite(self.x if axis == "x" else self.y), []

    def points(self) -> Iterable[tuple[float, float]]:
        return _along(list(_pairs(self.x, self.y)))

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        out = []
        for run in _runs(self.x, self.y):
            pts = _steps(run, self.where) if self.where else run
            if len(pts) == 1 and not self.style.marker:  # a lone point stays visible
                x, y = pts[0]
                out.append(
                    f'<circle cx="{_f(sx(x))}" cy="{_f(sy(y))}" r="{_f(self.style.linewidth * PT)}" '
                    f"{self.style.fill()}/>"
                )
                continue
            if self.style.linestyle not in ("None", "none", "", " ") and len(pts) > 1:
                d = "M" + "L".join(f"{_f(sx(x))} {_f(sy(y))}" for x, y in pts)
                out.append(f'<path d="{d}" {self.style.stroke()} stroke-linejoin="round"/>')
            if self.style.marker:
                out.extend(_marker(self.style, sx(x), sy(y)) for x, y in run)
        return "".join(out)


@dataclass
class _Rects(_Artist):
    """Bars, broken bars and spans: (x0, x1, y0, y1) in data units, None for the axes' edge."""

    rects: list[tuple[float | None, float | None, float | None, float | None]] = field(
        default_factory=list
    )
    colors: list[str | None] = field(default_factory=list)
    sticky: dict[str, list[float]] = field(default_factory=dict)

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        i = 0 if axis == "x" else 2
        return _finite(v for r in self.rects for v in r[i : i + 2]), self.sticky.get(axis, [])

    def points(self) -> Iterable[tuple[float, float]]:
        for x0, x1, y0, y1 in self.rects:
            if x0 is not None and x1 is not None and y0 is not None and y1 is not None:
                yield from (
                    (x0 + (x1 - x0) * i / 2, y0 + (y1 - y0) * j / 2)
                    for i in range(3)
                    for j in range(3)
                )

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        boxes = []
        for (x0, x1, y0, y1), color in zip(self.rects, self.colors, strict=True):
            px0, px1 = sorted((sx.edge(x0, 0), sx.edge(x1, 1)))
            py0, py1 = sorted((sy.edge(y0, 0), sy.edge(y1, 1)))
            boxes.append((round(py0, 2), round(py1, 2), color or "", px0, max(px1, px0 + 0.3)))
        # thousands of tasks a pixel wide: touching boxes of one row and colour become one
        merged: list[list[Any]] = []
        for box in sorted(boxes):
            last = merged[-1] if merged else None
            if last and last[:3] == list(box[:3]) and box[3] <= last[4] + 0.5:
                last[4] = max(last[4], box[4])
            else:
                merged.append(list(box))
        return "".join(
            f'<rect x="{_f(x0)}" y="{_f(y0)}" width="{_f(x1 - x0)}" height="{_f(max(y1 - y0, 0.3))}" '
            f"{self.style.fill(color or None)}/>"
            for y0, y1, color, x0, x1 in merged
        )


@dataclass
class _Fill(_Artist):
    x: list[float | None] = field(default_factory=list)
    y1: list[float | None] = field(default_factory=list)
    y2: list[float | None] = field(default_factory=list)
    where: str | None = None

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        if axis == "x":
            xs = _finite(self.x)
            return xs, [min(xs), max(xs)] if xs else []
        return _finite(self.y1 + self.y2), _finite(self.y2)  # no margin below the baseline

    def points(self) -> Iterable[tuple[float, float]]:
        return _along(list(_pairs(self.x, self.y1)))

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        out = []
        for run in _runs(self.x, list(zip(self.y1, self.y2, strict=True)), pick=lambda ab: ab):
            top = [(x, ab[0]) for x, ab in run]
            bottom = [(x, ab[1]) for x, ab in run]
            if self.where:
                top, bottom = _steps(top, self.where), _steps(bottom, self.where)
            pts = top + bottom[::-1]
            d = "M" + "L".join(f"{_f(sx(x))} {_f(sy(y))}" for x, y in pts) + "Z"
            out.append(f'<path d="{d}" {self.style.fill()}/>')
        return "".join(out)


@dataclass
class _Segments(_Artist):
    """vlines: (x, y0, y1) each."""

    segments: list[tuple[float, float, float]] = field(default_factory=list)

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        if axis == "x":
            return [s[0] for s in self.segments], []
        return [v for s in self.segments for v in s[1:]], []

    def points(self) -> Iterable[tuple[float, float]]:
        return ((x, y0 + k * (y1 - y0) / 6) for x, y0, y1 in self.segments for k in range(7))

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        d = "".join(f"M{_f(sx(x))} {_f(sy(y0))}V{_f(sy(y1))}" for x, y0, y1 in self.segments)
        return f'<path d="{d}" {self.style.stroke()}/>' if d else ""


@dataclass
class _Rule(_Artist):
    """axhline: a horizontal line across the axes at y."""

    y: float = 0.0

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        return ([self.y], []) if axis == "y" else ([], [])

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        y = _f(sy(self.y))
        return f'<path d="M{_f(sx.p0)} {y}H{_f(sx.p1)}" {self.style.stroke()}/>'


@dataclass
class _Text(_Artist):
    x: float = 0.0
    y: float = 0.0
    text: str = ""
    size: float = 10.0
    ha: str = "left"
    va: str = "baseline"
    in_axes: bool = False  # x, y are axes fractions (transform=ax.transAxes)
    rotation: float = 0.0

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        x = sx.fraction(self.x) if self.in_axes else sx(self.x)
        y = sy.fraction(self.y) if self.in_axes else sy(self.y)
        size, color, opacity = self.size * PT, self.style.color or INK, self.style.alpha
        return _label(x, y, self.text, size, self.ha, self.va, color, self.rotation, opacity)


@dataclass
class Image(_Artist):
    """What ``imshow`` draws and returns (for ``colorbar``): a matrix of values as cells, row 0
    at the top."""

    rows: list[list[float]] = field(default_factory=list)
    vmin: float = 0.0
    vmax: float = 1.0

    def extent(self, axis: str) -> tuple[list[float], list[float]]:
        n = len(self.rows[0]) if axis == "x" and self.rows else len(self.rows)
        return [-0.5, n - 0.5], [-0.5, n - 0.5]

    def color(self, value: float) -> str:
        span = self.vmax - self.vmin
        return viridis((value - self.vmin) / span if span else 0.0)

    def draw(self, sx: _Scale, sy: _Scale) -> str:
        out = []
        for i, row in enumerate(self.rows):
            py0, py1 = sorted((sy(i - 0.5), sy(i + 0.5)))
            for j, value in enumerate(row):
                px0, px1 = sorted((sx(j - 0.5), sx(j + 0.5)))
                fill = self.color(value) if _num(value) is not None else "#ffffff"
                out.append(
                    f'<rect x="{_f(px0)}" y="{_f(py0)}" width="{_f(px1 - px0 + 0.2)}" '
                    f'height="{_f(py1 - py0 + 0.2)}" fill="{fill}"/>'  # +0.2: no hairline seams
                )
        return "".join(out)


# ---------------------------------------------------------------------------- axes and chart


class _Coords:
    """``ax.transAxes`` / ``ax.transData``: which coordinates ``ax.text`` is given in."""

    def __init__(self, axes: bool) -> None:
        self.axes = axes


class _Scale:
    """Data -> SVG units along one axis: ``start`` maps to ``p0``, ``end`` to ``p1``."""

    def __init__(self, start: float, end: float, p0: float, p1: float) -> None:
        self.start, self.end, self.p0, self.p1 = start, end, p0, p1

    def __call__(self, value: float) -> float:
        return self.p0 + (value - self.start) / (self.end - self.start) * (self.p1 - self.p0)

    def fraction(self, share: float) -> float:
        return self.p0 + share * (self.p1 - self.p0)

    def edge(self, value: float | None, side: int) -> float:
        """``value``, or the axes' near (0) / far (1) edge when None (a span across)."""
        return self.fraction(side) if value is None else self(value)


@dataclass
class _Axis:
    """One axis's settings; a twin shares its x axis with its parent."""

    name: str  # "x" or "y"
    owners: list[ChartAxes] = field(default_factory=list)
    lim: tuple[float | None, float | None] = (None, None)
    categories: dict[str, int] = field(default_factory=dict)
    ticks: list[float] | None = None
    ticklabels: list[str] | None = None
    label: str = ""
    label_size: float = 9.0
    tick_size: float = 8.0
    rotation: float = 0.0
    ha: str | None = None
    grid: bool = False
    grid_color: str = GRID
    grid_width: float = 0.6
    inverted: bool = False  # default direction when no limits are set (imshow: row 0 on top)
    max_chars: int = MAX_LABEL_CHARS  # tick labels are cut to this (the chart sets it)

    def positions(self, values: Iterable[Any]) -> list[float | None]:
        """Numbers as they are; strings become categories 0, 1, 2... in first-seen order."""
        out: list[float | None] = []
        for v in values:
            if isinstance(v, str):
                out.append(float(self.categories.setdefault(v, len(self.categories))))
            else:
                out.append(_num(v))
        return out

    def limits(self) -> tuple[float, float]:
        """(start, end): start at the bottom/left; reversed when inverted."""
        values, sticky = [], []
        for ax in self.owners:
            for artist in ax._artists:
                v, s = artist.extent(self.name)
                values += v
                sticky += s
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        span = hi - lo
        if span == 0:
            delta = abs(lo) * 0.05 or 0.5
            lo, hi = lo - delta, hi + delta
        else:
            pad_lo, pad_hi = lo - 0.05 * span, hi + 0.05 * span
            lo = max((s for s in sticky if pad_lo < s <= lo), default=pad_lo)
            hi = min((s for s in sticky if hi <= s < pad_hi), default=pad_hi)
        start, end = self.lim
        if start is not None and end is not None:
            return (start, end) if start != end else (start - 0.5, end + 0.5)
        if self.inverted:
            lo, hi = hi, lo
        start = lo if start is None else start
        end = hi if end is None else end
        if start == end:
            end = start + 1.0
        return start, end

    def tick_marks(self, length: float) -> tuple[list[float], list[str], str]:
        """Tick positions, their labels and the offset text, for an axis ``length`` units long."""
        start, end = self.limits()
        lo, hi = min(start, end), max(start, end)
        size = self.tick_size * PT
        if self.ticks is not None:
            ticks = [t for t in self.ticks if lo - 1e-9 <= t <= hi + 1e-9]
            labels = self._fixed_labels(ticks, self.ticks)
            return ticks, labels, ""
        if self.categories:
            names = {i: name for name, i in self.categories.items()}
            spacing = size * 1.4 if self.name == "y" or self.rotation else 0
            if not spacing:
                spacing = (
                    max(text_width(shorten(n, self.max_chars), size) for n in names.values()) + size
                )
            every = max(1, math.ceil(nice_step(len(names), length / spacing)))
            ticks = [float(i) for i in sorted(names) if lo <= i <= hi and i % every == 0]
            return ticks, self._fixed_labels(ticks, None, names), ""
        spacing = size * 2.2 if self.name == "y" else size * 6  # about matplotlib's density
        target = max(length / spacing, 1.5)
        for _ in range(6):  # widen the step until the labels do not touch
            step = nice_step(hi - lo, target)
            ticks = tick_values(lo, hi, step)
            labels, offset = tick_labels(ticks, step)
            if self.name == "y" or self.rotation or len(ticks) < 2:
                break
            widest = max(text_width(label, size) for label in labels)
            if widest + size <= length * step / (hi - lo):
                break
            target *= 0.7
        if self.ticklabels is not None:
            labels = self._fixed_labels(ticks, ticks)
        return ticks, labels, offset

    def widest(self, labels: Iterable[str]) -> float:
        """The width of the widest of the tick ``labels``, as cut."""
        size = self.tick_size * PT
        return max((text_width(shorten(t, self.max_chars), size) for t in labels), default=0)

    def depth(self, labels: Sequence[str]) -> float:
        """How far the x tick ``labels`` reach below their top, rotated."""
        rot = math.radians(self.rotation)
        size = self.tick_size * PT
        return self.widest(labels) * math.sin(rot) + size * math.cos(rot) if labels else 0

    def _fixed_labels(
        self, ticks: list[float], given: list[float] | None, names: Mapping[int, str] | None = None
    ) -> list[str]:
        if self.ticklabels is not None and given is not None:
            index = {t: i for i, t in enumerate(given)}
            return [
                self.ticklabels[index[t]] if index[t] < len(self.ticklabels) else "" for t in ticks
            ]
        if names is not None:
            return [names[int(t)] for t in ticks]
        step = min((b - a for a, b in zip(ticks, ticks[1:], strict=False)), default=1.0) or 1.0
        return tick_labels(ticks, step)[0]


@dataclass
class _Legend:
    entries: list[tuple[str, _Style, str]]  # label, style, kind
    loc: str = "best"
    anchor: tuple[float, float] | None = None  # axes fraction of the ``loc`` corner
    size: float = 8.0
    frame: bool = True
    title: str = ""

    def box(self) -> tuple[float, float]:
        size = self.size * PT
        width = max([text_width(shorten(t, 40), size) for t, _, _ in self.entries] or [0])
        width = max(width + 2.6 * size, text_width(self.title, size))
        rows = len(self.entries) + (1 if self.title else 0)
        return width + size, rows * size * 1.35 + size * 0.7


class ChartAxes:
    """One plotting area; the methods are matplotlib's, with their usual keyword arguments."""

    def __init__(
        self, chart: Chart, x: _Axis | None = None, twin_of: ChartAxes | None = None
    ) -> None:
        self._chart = chart
        self._artists: list[_Artist] = []
        self._x = x or _Axis("x")
        self._y = _Axis("y")
        self._x.owners.append(self)
        self._y.owners.append(self)
        self._twin_of = twin_of
        self._twins: list[ChartAxes] = []
        self._title: tuple[str, float, str] | None = None
        self._legend: _Legend | None = None
        self._colorbar: tuple[Image, str] | None = None
        self._cycle = 0

    transAxes = property(lambda self: _Coords(axes=True))  # noqa: N815 - matplotlib's name
    transData = property(lambda self: _Coords(axes=False))  # noqa: N815 - matplotlib's name

    def __getattr__(self, name: str) -> Any:
        raise _unsupported("ChartAxes", name)

    # -- drawing
    def plot(self, *args: Any, **kwargs: Any) -> None:
        """``plot(y)`` or ``plot(x, y)``; NaN, None and inf break the line."""
        if len(args) == 1:
            y = list(args[0])
            args = (range(len(y)), y)
        if len(args) != 2 or any(isinstance(a, str) for a in args):
            raise Unsupported(f"ChartAxes.plot takes (y) or (x, y), no format string; {_HINT}")
        self._line("plot", args[0], args[1], None, kwargs)

    def step(self, x: Any, y: Any, *, where: str = "pre", **kwargs: Any) -> None:
        if where not in ("pre", "post", "mid"):
            raise ValueError("step: where must be 'pre', 'post' or 'mid'")
        self._line("step", x, y, where, kwargs)

    def bar(self, x: Any, height: Any, width: float = 0.8, **kwargs: Any) -> None:
        """Vertical bars from 0; ``x`` strings are categories (ticks labelled with them)."""
        style, fills = self._patch_style("bar", kwargs)
        xs = self._x.positions(_seq(x))
        rects = [
            (c - width / 2, c + width / 2, 0.0, h) if c is not None and h is not None else None
            for c, h in zip(xs, (_num(h) for h in _seq(height, len(xs))), strict=False)
        ]
        self._rects(style, rects, fills, {"y": [0.0]})

    def barh(self, y: Any, width: Any, height: float = 0.8, **kwargs: Any) -> None:
        """Horizontal bars from 0; ``y`` strings are categories, the first at the bottom."""
        style, fills = self._patch_style("barh", kwargs)
        ys = self._y.positions(_seq(y))
        rects = [
            (0.0, w, c - height / 2, c + height / 2) if c is not None and w is not None else None
            for c, w in zip(ys, (_num(w) for w in _seq(width, len(ys))), strict=False)
        ]
        self._rects(style, rects, fills, {"x": [0.0]})

    def broken_barh(self, xranges: Any, yrange: tuple[float, float], **kwargs: Any) -> None:
        """Bars (x, width) of ``xranges``, all from ``yrange`` = (ymin, height)."""
        style, fills = self._patch_style("broken_barh", kwargs)
        y0, h = float(yrange[0]), float(yrange[1])
        rects = []
        for x, w in ((_num(x), _num(w)) for x, w in xranges):
            rects.append(None if x is None or w is None else (x, x + w, y0, y0 + h))
        self._rects(style, rects, fills, {})

    def axvspan(self, xmin: float, xmax: float, **kwargs: Any) -> None:
        """A band across the whole height between ``xmin`` and ``xmax``."""
        style, fills = self._patch_style("axvspan", kwargs)
        lo, hi = _num(xmin), _num(xmax)
        self._rects(style, [None if lo is None or hi is None else (lo, hi, None, None)], fills, {})

    def fill_between(
        self, x: Any, y1: Any, y2: Any = 0, *, step: str | None = None, **kwargs: Any
    ) -> None:
        style, _ = self._patch_style("fill_between", kwargs)
        xs = self._x.positions(_seq(x))
        top = [_num(v) for v in _seq(y1, len(xs))]
        bottom = [_num(v) for v in _seq(y2, len(xs))]
        self._add(_Fill(style, "patch", xs, top, bottom, step))

    def vlines(self, x: Any, ymin: Any, ymax: Any, **kwargs: Any) -> None:
        style = self._style("vlines", kwargs, _LINE - {"marker", "markersize"}, linewidth=1.0)
        xs = self._x.positions(_seq(x))
        rows = zip(xs, _seq(ymin, len(xs)), _seq(ymax, len(xs)), strict=True)
        segments = [(a, _num(b), _num(c)) for a, b, c in rows]
        finite = [(a, b, c) for a, b, c in segments if None not in (a, b, c)]
        self._add(_Segments(style, "line", finite))  # type: ignore[arg-type]

    def axhline(self, y: float = 0.0, **kwargs: Any) -> None:
        """A horizontal line across the axes (none at a NaN, None or inf ``y``)."""
        style = self._style("axhline", kwargs, _LINE - {"marker", "markersize"})
        if _num(y) is not None:
            self._add(_Rule(style, "line", float(y)))

    def text(self, x: float, y: float, s: Any, **kwargs: Any) -> None:
        allowed = {"fontsize", "color", "ha", "va", "transform", "rotation", "alpha", "zorder"}
        opts = _options("text", kwargs, allowed)
        if _num(x) is None or _num(y) is None:
            return  # nowhere to put it
        coords = opts.get("transform")
        style = _Style(
            color=opts.get("color"), alpha=opts.get("alpha", 1.0), zorder=opts.get("zorder", 3)
        )
        in_axes = isinstance(coords, _Coords) and coords.axes
        size, rotation = float(opts.get("fontsize", 10)), float(opts.get("rotation", 0))
        ha, va = opts.get("ha", "left"), opts.get("va", "baseline")
        self._add(_Text(style, "text", float(x), float(y), str(s), size, ha, va, in_axes, rotation))

    def imshow(self, data: Any, **kwargs: Any) -> Image:
        """A matrix as cells (row 0 on top), coloured on a viridis-like ramp."""
        opts = _options("imshow", kwargs, {"cmap", "vmin", "vmax", "aspect", "interpolation"})
        if opts.get("cmap", "viridis") != "viridis" or opts.get("aspect", "auto") != "auto":
            raise Unsupported(f"ChartAxes.imshow draws cmap='viridis', aspect='auto' only; {_HINT}")
        rows = [[_num(v) for v in row] for row in data]
        values = _finite(v for row in rows for v in row)
        vmin = opts.get("vmin", min(values, default=0.0))
        vmax = opts.get("vmax", max(values, default=1.0))
        image = Image(_Style(zorder=0), "image", rows, vmin, vmax)  # type: ignore[arg-type]
        self._y.inverted = True
        self._add(image)
        return image

    def twinx(self) -> ChartAxes:
        """An axes on the same box and x axis, its y axis on the right."""
        twin = ChartAxes(self._chart, x=self._x, twin_of=self)
        self._twins.append(twin)
        return twin

    def legend(self, handles: Sequence[Swatch] | None = None, **kwargs: Any) -> None:
        allowed = {"loc", "bbox_to_anchor", "fontsize", "frameon", "title"}
        opts = _options("legend", kwargs, allowed)
        if handles is not None:
            if not all(isinstance(h, Swatch) for h in handles):
                raise Unsupported(f"legend handles must be chart.Swatch(color, label); {_HINT}")
            entries = [(h.label, _Style(color=h.color, alpha=h.alpha), "patch") for h in handles]
        else:
            entries = [
                (a.style.label, a.style, a.kind)
                for a in self._artists
                if a.style.label and not a.style.label.startswith("_")
            ]
        loc = opts.get("loc", "best")
        if loc != "best" and loc not in _LOCS:
            raise ValueError(f"legend loc {loc!r}: one of 'best', {', '.join(map(repr, _LOCS))}")
        anchor = opts.get("bbox_to_anchor")
        self._legend = _Legend(
            entries,  # type: ignore[arg-type]
            loc,
            None if anchor is None else (float(anchor[0]), float(anchor[1])),
            float(opts.get("fontsize", 8)),
            bool(opts.get("frameon", True)),
            str(opts.get("title") or ""),
        )

    # -- decoration
    def set_xlabel(self, label: Any, **kwargs: Any) -> None:
        opts = _options("set_xlabel", kwargs, {"fontsize"})
        self._x.label, self._x.label_size = str(label), opts.get("fontsize", self._x.label_size)

    def set_ylabel(self, label: Any, **kwargs: Any) -> None:
        opts = _options("set_ylabel", kwargs, {"fontsize"})
        self._y.label, self._y.label_size = str(label), opts.get("fontsize", self._y.label_size)

    def set_title(self, label: Any, **kwargs: Any) -> None:
        opts = _options("set_title", kwargs, {"fontsize", "loc"})
        self._title = (str(label), float(opts.get("fontsize", 10)), opts.get("loc", "center"))

    def set_xlim(self, left: Any = None, right: float | None = None) -> None:
        """Either side None keeps it autoscaled; ``left > right`` reverses the axis."""
        self._x.lim = _lim(self._x.lim, left, right)

    def set_ylim(self, bottom: Any = None, top: float | None = None) -> None:
        """Either side None keeps it autoscaled; ``bottom > top`` puts the first rows on top."""
        self._y.lim = _lim(self._y.lim, bottom, top)

    def set_xticks(
        self, ticks: Iterable[float], labels: Iterable[Any] | None = None, **kwargs: Any
    ) -> None:
        _set_ticks(self._x, ticks, labels, _options("set_xticks", kwargs, _TICK_TEXT))

    def set_yticks(
        self, ticks: Iterable[float], labels: Iterable[Any] | None = None, **kwargs: Any
    ) -> None:
        _set_ticks(self._y, ticks, labels, _options("set_yticks", kwargs, _TICK_TEXT))

    def set_xticklabels(self, labels: Iterable[Any], **kwargs: Any) -> None:
        _set_ticks(self._x, None, labels, _options("set_xticklabels", kwargs, _TICK_TEXT))

    def set_yticklabels(self, labels: Iterable[Any], **kwargs: Any) -> None:
        _set_ticks(self._y, None, labels, _options("set_yticklabels", kwargs, _TICK_TEXT))

    def grid(self, visible: bool | None = True, axis: str = "both", **kwargs: Any) -> None:
        opts = _options("grid", kwargs, {"color", "linewidth"})
        for a in (self._x, self._y) if axis == "both" else (self._x if axis == "x" else self._y,):
            a.grid = True if visible is None else bool(visible)
            a.grid_color = opts.get("color", a.grid_color)
            a.grid_width = float(opts.get("linewidth", a.grid_width))

    # -- internals
    def _add(self, artist: _Artist) -> None:
        self._artists.append(artist)

    def _next_color(self) -> str:
        self._cycle += 1
        return PALETTE[(self._cycle - 1) % len(PALETTE)]

    def _style(
        self, method: str, kwargs: dict[str, Any], allowed: set[str], **defaults: Any
    ) -> _Style:
        style = _Style(**{"zorder": 2.0, **defaults, **_options(method, kwargs, allowed)})
        style.color = style.color if style.color is not None else self._next_color()
        return style

    def _line(self, method: str, x: Any, y: Any, where: str | None, kwargs: dict[str, Any]) -> None:
        style = self._style(method, kwargs, _LINE)
        if style.marker in ("", "None", "none"):
            style.marker = None
        if style.marker is not None and style.marker not in _MARKERS:
            raise Unsupported(
                f"marker {style.marker!r}: the chart draws {sorted(_MARKERS)}; {_HINT}"
            )
        xs = self._x.positions(_seq(x))
        ys = self._y.positions(_seq(y, len(xs)))
        if len(xs) != len(ys):
            raise ValueError(f"{method}: x and y differ in length ({len(xs)} and {len(ys)})")
        self._add(_Line(style, "line", xs, ys, where))

    def _patch_style(self, method: str, kwargs: dict[str, Any]) -> tuple[_Style, list[Any] | None]:
        """The style, and the per-item colours when ``color`` is a list."""
        given = [kwargs.pop(k) for k in ("color", "facecolor", "facecolors") if k in kwargs]
        color = given[0] if given else None
        style = self._style(method, kwargs, _PATCH, zorder=1.0)
        if isinstance(color, list | tuple) and not _is_rgb(color):
            return style, list(color)
        if color is not None:
            style.color = color
        return style, None

    def _rects(
        self,
        style: _Style,
        rects: list[Any],
        fills: list[Any] | None,
        sticky: dict[str, list[float]],
    ) -> None:
        """Add the rectangles that have finite corners (None: a NaN or None in the data), each
        with its colour when ``fills`` lists one per rectangle (repeated when shorter)."""
        keep = [(r, fills[i % len(fills)] if fills else None) for i, r in enumerate(rects)]
        keep = [(r, c) for r, c in keep if r is not None]
        self._add(_Rects(style, "patch", [r for r, _ in keep], [c for _, c in keep], sticky))

    def _decor(self, width: float, height: float) -> dict[str, float]:
        """Space needed outside a ``width`` x ``height`` box by its ticks, labels, title, outside
        legend and colour scale: left, right, top, bottom."""
        need = {"left": PAD, "right": PAD, "top": PAD, "bottom": PAD}
        for ax in (self, *self._twins):
            _, labels, _ = ax._y.tick_marks(height)
            widest = ax._y.widest(labels)
            extra = ax._y.label_size * PT * 1.3 + 4 if ax._y.label else 0
            side = "left" if ax is self else "right"
            need[side] = max(need[side], TICK_LEN + TICK_PAD + widest + extra + 4)
        size = self._x.tick_size * PT
        _, labels, offset = self._x.tick_marks(width)
        widest = self._x.widest(labels)
        need["bottom"] = TICK_LEN + TICK_PAD + self._x.depth(labels) + PAD
        if self._x.label:
            need["bottom"] += self._x.label_size * PT * 1.3 + 2
        if offset:
            need["bottom"] += size * 1.2
        if not self._x.rotation:  # the last tick label is centred on the axis end
            need["right"] = max(need["right"], widest / 2 + PAD)
        if self._title:
            need["top"] = self._title[1] * PT * 1.2 + 6 * PT + PAD
        for ax in (self, *self._twins):
            legend = ax._legend
            if legend and legend.anchor and legend.anchor[0] >= 1 and legend.entries:
                need["right"] = max(need["right"], legend.box()[0] + 8)
        if self._colorbar:
            image, label = self._colorbar
            labels = tick_labels(*_ticks_of(image.vmin, image.vmax))[0]
            widest = max((text_width(t, size) for t in labels), default=0)
            need["right"] = max(need["right"], 30 + widest + (size * 1.6 if label else 0))
        return need

    def _render(self, box: tuple[float, float, float, float], clip: str) -> list[str]:
        x0, y0, x1, y1 = box
        sx = _Scale(*self._x.limits(), x0, x1)
        sy = _Scale(*self._y.limits(), y1, y0)
        xt, xl, xoff = self._x.tick_marks(x1 - x0)
        yt, yl, yoff = self._y.tick_marks(y1 - y0)
        out: list[str] = []
        if self._x.grid and self._twin_of is None:  # a twin shares its parent's x axis
            out += [_grid_line(self._x, sx(t), y0, sx(t), y1) for t in xt]
        if self._y.grid:
            out += [_grid_line(self._y, x0, sy(t), x1, sy(t)) for t in yt]
        artists = sorted(self._artists, key=lambda a: a.style.zorder)
        body = "".join(a.draw(sx, sy) for a in artists if a.kind != "text")
        if body:
            out.append(f'<g class="data" clip-path="url(#{clip})">{body}</g>')
        right = self._twin_of is not None
        spine_x, ha = (x1, "left") if right else (x0, "right")
        out.append(_spine(f"M{_f(spine_x)} {_f(y0)}V{_f(y1)}"))
        out += _y_ticks(self._y, sy, yt, yl, spine_x, right, (x0, y0, x1, y1))
        if yoff:
            out.append(_label(spine_x, y0 - 4, yoff, self._y.tick_size * PT, ha, "bottom", MUTED))
        if not right:
            out.append(_spine(f"M{_f(x0)} {_f(y1)}H{_f(x1)}"))
            out += _x_ticks(self._x, sx, xt, xl, xoff, (x0, y0, x1, y1))
            if self._title:
                out.append(_title(self._title, x0, x1, y0, self._chart.width))
        out += [a.draw(sx, sy) for a in artists if a.kind == "text"]
        if self._legend and self._legend.entries:
            out.append(_legend(self._legend, (x0, y0, x1, y1), self._points(sx, sy)))
        if self._colorbar:
            out += _colorbar(*self._colorbar, x1, y0, y1, self._x.tick_size)
        return out

    def _points(self, sx: _Scale, sy: _Scale) -> list[tuple[float, float]]:
        pts = []
        for ax in (self, *self._twins):
            ysc = sy if ax is self else _Scale(*ax._y.limits(), sy.p0, sy.p1)
            pts += [(sx(x), ysc(y)) for a in ax._artists for x, y in a.points()]
        return pts


class Chart:
    """A figure of one row of :class:`ChartAxes`, serialised as SVG by :meth:`to_svg`.

    ``width_in`` x ``height_in`` inches (96 SVG units each, ``width="100%"`` so it scales).
    The margins fit the tick labels, axis labels, titles, an outside legend and a colour scale
    (their widths estimated); ``margins`` (``subplots_adjust``'s fractions of the figure: left,
    right, top, bottom, wspace) only ever widen them.
    """

    def __init__(
        self,
        width_in: float,
        height_in: float,
        cols: int = 1,
        margins: Mapping[str, float] | None = None,
    ) -> None:
        self.width, self.height = width_in * PX_PER_IN, height_in * PX_PER_IN
        self._margins: dict[str, float] = {}
        self.subplots_adjust(**(margins or {}))
        self._axes: list[ChartAxes] = [ChartAxes(self) for _ in range(cols)]

    def __getattr__(self, name: str) -> Any:
        raise _unsupported("Chart", name)

    @property
    def axes(self) -> list[ChartAxes]:
        """The axes, left to right (twins after them), as matplotlib's ``Figure.axes``."""
        return [a for ax in self._axes for a in (ax, *ax._twins)]

    def subplots_adjust(self, **margins: float) -> None:
        unknown = sorted(set(margins) - set(MARGIN_KEYS))
        if unknown:
            supported = ", ".join(MARGIN_KEYS)
            raise Unsupported(
                f"subplots_adjust takes {supported}, not {', '.join(unknown)}; {_HINT}"
            )
        self._margins.update({k: float(v) for k, v in margins.items() if v is not None})

    def add_subplot(self, nrows: int = 1, ncols: int = 1, index: int = 1) -> ChartAxes:
        """The ``index``-th (from 1) axes of one row of ``ncols``; a chart has one row only."""
        if nrows != 1 or not 1 <= index <= ncols:
            raise Unsupported(
                f"a chart has one row of axes (add_subplot(1, ncols, index)); {_HINT}"
            )
        while len(self._axes) < ncols:
            self._axes.append(ChartAxes(self))
        return self._axes[index - 1]

    def colorbar(self, mappable: Image, ax: ChartAxes | None = None, label: str = "") -> None:
        """A colour scale to the right of ``ax`` (the first axes by default) for an imshow."""
        if not isinstance(mappable, Image):
            raise Unsupported(f"colorbar takes what ChartAxes.imshow returned; {_HINT}")
        (ax or self._axes[0])._colorbar = (mappable, str(label))

    def to_svg(self) -> str:
        """The chart as a standalone ``<svg>`` element (also valid inline in HTML)."""
        boxes = self._layout()
        parts: list[str] = []
        clips: list[str] = []
        for i, (ax, box) in enumerate(zip(self._axes, boxes, strict=True)):
            for j, a in enumerate((ax, *ax._twins)):
                clip = f"\x00id-clip-{i}-{j}"
                clips.append(
                    f'<clipPath id="{clip}"><rect x="{_f(box[0])}" y="{_f(box[1])}" '
                    f'width="{_f(box[2] - box[0])}" height="{_f(box[3] - box[1])}"/></clipPath>'
                )
                parts += a._render(box, clip)
        body = f"<defs>{''.join(clips)}</defs>{''.join(parts)}"
        # ids unique on a page of many inline charts, and stable for equal charts
        # NUL never comes from a text (xml_text drops it), so the placeholder is unambiguous
        body = body.replace("\x00id", "c" + hashlib.sha1(body.encode()).hexdigest()[:10])
        w, h = _f(self.width), _f(self.height)
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {w} {h}" '
            f'width="100%" style="max-width:{w}px" font-family="{FONT}" font-size="11" '
            f'xml:space="preserve" role="img" aria-label="{xml_text(self._aria())}">'
            f'<rect width="{w}" height="{h}" fill="#ffffff"/>{body}</svg>'
        )

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def _aria(self) -> str:
        titles = [ax._title[0] for ax in self._axes if ax._title]
        labels = [f"{ax._y.label} by {ax._x.label}" for ax in self._axes if ax._y.label]
        return "; ".join(titles or labels) or "chart"

    def _layout(self) -> list[tuple[float, float, float, float]]:
        """The boxes of the axes, left to right, in SVG units (x0, y0, x1, y1)."""
        m = self._margins
        cols = len(self._axes)
        if not cols:  # Chart(..., cols=0) and no add_subplot: an empty figure
            return []
        # a first guess of the boxes: the ticks, hence the labels' room, depend on their size
        guess = ((self.width - 120 * cols) / cols, self.height - 70)
        for ax in self.axes:  # category names take at most a third of the width
            room = self.width / 3 / cols / (ax._y.tick_size * PT * EM_PER_CHAR)
            ax._y.max_chars = int(min(max(room, 8), MAX_LABEL_CHARS))
        needs = [ax._decor(*guess) for ax in self._axes]
        left = max(m.get("left", 0) * self.width, needs[0]["left"])
        right = self.width - max((1 - m.get("right", 1)) * self.width, needs[-1]["right"])
        top = max((1 - m.get("top", 1)) * self.height, max(n["top"] for n in needs))
        bottom = self.height - max(
            m.get("bottom", 0) * self.height, max(n["bottom"] for n in needs)
        )
        width, gaps = (right - left) / cols, [0.0] * cols
        for _ in range(2):  # the gaps depend on the width and the width on the gaps
            gaps = [
                max(m.get("wspace", 0) * width, needs[i]["right"] + needs[i + 1]["left"] + PAD)
                for i in range(cols - 1)
            ] + [0.0]
            width = max((right - left - sum(gaps)) / cols, 10.0)
        boxes, x = [], left
        for gap in gaps:
            boxes.append((x, top, x + width, max(bottom, top + 10)))
            x += width + gap
        return boxes


# ---------------------------------------------------------------------------- SVG pieces

_TICK_TEXT = {"fontsize", "rotation", "ha"}


def _set_ticks(
    axis: _Axis, ticks: Iterable[float] | None, labels: Iterable[Any] | None, opts: dict[str, Any]
) -> None:
    if ticks is not None:
        axis.ticks = [float(t) for t in ticks]
    if labels is not None:
        axis.ticklabels = [str(v) for v in labels]
    axis.tick_size = float(opts.get("fontsize", axis.tick_size))
    axis.rotation = float(opts.get("rotation", axis.rotation))
    axis.ha = opts.get("ha", axis.ha)


def _x_ticks(
    axis: _Axis,
    sx: _Scale,
    ticks: list[float],
    labels: list[str],
    offset: str,
    box: tuple[float, float, float, float],
) -> list[str]:
    x0, _, x1, y1 = box
    size = axis.tick_size * PT
    out = []
    base = y1 + TICK_LEN + TICK_PAD
    ha = axis.ha or ("right" if axis.rotation else "center")
    for t, label in zip(ticks, labels, strict=True):
        x = sx(t)
        out.append(_spine(f"M{_f(x)} {_f(y1)}v{_f(TICK_LEN)}"))
        out.append(
            _label(x, base, label, size, ha, "top", MUTED, axis.rotation, limit=axis.max_chars)
        )
    below = base + axis.depth(labels)
    if offset:
        out.append(_label(x1, below + 2, offset, size, "right", "top", MUTED))
        below += size * 1.2
    if axis.label:
        out.append(
            _label((x0 + x1) / 2, below + 4, axis.label, axis.label_size * PT, "center", "top", INK)
        )
    return out


def _y_ticks(
    axis: _Axis,
    sy: _Scale,
    ticks: list[float],
    labels: list[str],
    spine: float,
    right: bool,
    box: tuple[float, float, float, float],
) -> list[str]:
    size = axis.tick_size * PT
    sign, ha = (1, "left") if right else (-1, "right")
    edge = spine + sign * (TICK_LEN + TICK_PAD)  # where the tick labels start
    out = []
    for t, label in zip(ticks, labels, strict=True):
        y = sy(t)
        out.append(_spine(f"M{_f(spine)} {_f(y)}h{_f(sign * TICK_LEN)}"))
        out.append(_label(edge, y, label, size, ha, "center", MUTED, limit=axis.max_chars))
    if axis.label:
        widest = axis.widest(labels)
        x = spine + sign * (TICK_LEN + TICK_PAD + widest + 4 + axis.label_size * PT * 0.5)
        y = (box[1] + box[3]) / 2
        out.append(
            _label(x, y, axis.label, axis.label_size * PT, "center", "center", INK, rotation=90)
        )
    return out


def _spine(d: str) -> str:
    """A spine or tick mark along the path ``d``."""
    return f'<path d="{d}" stroke="{SPINE}" stroke-width="{_f(0.8 * PT)}"/>'


def _grid_line(axis: _Axis, x0: float, y0: float, x1: float, y1: float) -> str:
    return (
        f'<path d="M{_f(x0)} {_f(y0)}L{_f(x1)} {_f(y1)}" stroke="{_color(axis.grid_color)}" '
        f'stroke-width="{_f(axis.grid_width * PT)}"/>'
    )


def _title(title: tuple[str, float, str], x0: float, x1: float, y0: float, width: float) -> str:
    """The title over the box; a long one may overhang it, up to the figure's edges."""
    text, size, loc = title
    size_px = size * PT
    x = {"left": x0, "right": x1}.get(loc, (x0 + x1) / 2)
    room = {"left": width - PAD - x0, "right": x1 - PAD}.get(loc, 2 * min(x - PAD, width - PAD - x))
    fits = max(int(room / (size_px * EM_PER_CHAR)), 4)
    ha = {"left": "left", "right": "right"}.get(loc, "center")
    return _label(x, y0 - 6 * PT, text, size_px, ha, "bottom", INK, limit=fits)


def _label(
    x: float,
    y: float,
    text: str,
    size: float,
    ha: str,
    va: str,
    color: str = INK,
    rotation: float = 0.0,
    opacity: float = 1.0,
    limit: int = MAX_LABEL_CHARS,
) -> str:
    """A text at (x, y) aligned like matplotlib's ha/va; long lines are cut, the whole text
    in a hover title; several lines are stacked."""
    lines = str(text).split("\n")
    cut = [shorten(line, limit) for line in lines]
    anchor = {"left": "start", "right": "end"}.get(ha, "middle")
    height = size * 1.2 * len(lines)
    top = {"top": 0.0, "center": -height / 2, "bottom": -height, "baseline": -height + size * 0.4}
    first = top.get(va, 0.0) + size * 0.8  # baseline of the first line (ascent ~0.8 em)
    attrs = f'font-size="{_f(size)}" fill="{_color(color)}" text-anchor="{anchor}"'
    if opacity < 1:
        attrs += f' fill-opacity="{_f(opacity)}"'
    if rotation:
        attrs += f' transform="rotate({_f(-rotation)} {_f(x)} {_f(y)})"'
    hover = f"<title>{xml_text(text)}</title>" if cut != lines else ""
    if len(lines) == 1:
        return f'<text x="{_f(x)}" y="{_f(y + first)}" {attrs}>{hover}{xml_text(cut[0])}</text>'
    spans = "".join(
        f'<tspan x="{_f(x)}" y="{_f(y + first + i * size * 1.2)}">{xml_text(line)}</tspan>'
        for i, line in enumerate(cut)
    )
    return f"<text {attrs}>{hover}{spans}</text>"


def _legend(
    legend: _Legend, box: tuple[float, float, float, float], points: list[tuple[float, float]]
) -> str:
    x0, y0, x1, y1 = box
    width, height = legend.box()
    pad = 6.0

    def corner(loc: str) -> tuple[float, float]:
        """Top-left of the legend placed at ``loc`` (inside the box, or at the anchor)."""
        fx = 0.0 if "left" in loc else 1.0 if "right" in loc else 0.5
        fy = 0.0 if "upper" in loc else 1.0 if "lower" in loc else 0.5
        if legend.anchor is not None:  # the ``loc`` corner of the legend sits on the anchor
            ax_, ay = x0 + legend.anchor[0] * (x1 - x0), y1 - legend.anchor[1] * (y1 - y0)
            return ax_ - fx * width, ay - fy * height
        return (
            x0 + pad + fx * (x1 - x0 - 2 * pad - width),
            y0 + pad + fy * (y1 - y0 - 2 * pad - height),
        )

    def covered(loc: str) -> int:
        lx, ly = corner(loc)
        return sum(lx <= px <= lx + width and ly <= py <= ly + height for px, py in points)

    loc = legend.loc
    if loc == "best":
        loc = min(_LOCS[:6], key=covered) if legend.anchor is None else "upper right"
    lx, ly = corner(loc)
    size = legend.size * PT
    out = []
    if legend.frame:
        out.append(
            f'<rect x="{_f(lx)}" y="{_f(ly)}" width="{_f(width)}" height="{_f(height)}" rx="3" '
            f'fill="#ffffff" fill-opacity="0.85" stroke="#d1d5db" stroke-width="{_f(0.6 * PT)}"/>'
        )
    y = ly + size * 0.35
    if legend.title:
        out.append(_label(lx + size / 2, y, legend.title, size, "left", "top", INK))
        y += size * 1.35
    for label, style, kind in legend.entries:
        mid = y + size * 0.6
        hx = lx + size / 2
        if kind == "patch":
            out.append(
                f'<rect x="{_f(hx)}" y="{_f(mid - size * 0.4)}" width="{_f(size * 1.6)}" '
                f'height="{_f(size * 0.8)}" {style.fill()}/>'
            )
        else:
            out.append(f'<path d="M{_f(hx)} {_f(mid)}h{_f(size * 1.6)}" {style.stroke()}/>')
            if style.marker:
                out.append(_marker(style, hx + size * 0.8, mid))
        out.append(_label(hx + size * 2.1, mid, shorten(label, 40), size, "left", "center", INK))
        y += size * 1.35
    return '<g class="legend">' + "".join(out) + "</g>"


def _colorbar(
    image: Image, label: str, x1: float, y0: float, y1: float, tick_size: float
) -> list[str]:
    """A vertical colour scale right of the axes, with ticks and the label."""
    bx, bw = x1 + 12, 12.0
    stops = "".join(
        f'<stop offset="{_f(i / (len(VIRIDIS) - 1))}" stop-color="{c}"/>'
        for i, c in enumerate(VIRIDIS)
    )
    grad = "\x00id-ramp"
    out = [
        f'<defs><linearGradient id="{grad}" x1="0" y1="1" x2="0" y2="0">{stops}</linearGradient></defs>',
        f'<rect x="{_f(bx)}" y="{_f(y0)}" width="{_f(bw)}" height="{_f(y1 - y0)}" fill="url(#{grad})"/>',
    ]
    scale = _Scale(image.vmin, image.vmax if image.vmax != image.vmin else image.vmin + 1, y1, y0)
    ticks, step = _ticks_of(image.vmin, image.vmax)
    size = tick_size * PT
    labels = tick_labels(ticks, step)[0]
    for t, text in zip(ticks, labels, strict=True):
        y = scale(t)
        out.append(f'<path d="M{_f(bx + bw)} {_f(y)}h{_f(TICK_LEN)}" stroke="{SPINE}"/>')
        out.append(_label(bx + bw + TICK_LEN + 2, y, text, size, "left", "center", MUTED))
    if label:
        widest = max((text_width(t, size) for t in labels), default=0)
        x = bx + bw + TICK_LEN + widest + 4 + size
        out.append(_label(x, (y0 + y1) / 2, label, size, "center", "center", INK, rotation=90))
    return out


def _ticks_of(lo: float, hi: float) -> tuple[list[float], float]:
    step = nice_step(hi - lo, 5) if hi > lo else 1.0
    return tick_values(lo, hi, step), step


def _marker(style: _Style, x: float, y: float) -> str:
    r = style.markersize * PT / 2
    fill = style.fill()
    m = style.marker
    if m in ("o", "."):
        return f'<circle cx="{_f(x)}" cy="{_f(y)}" r="{_f(r if m == "o" else r / 2)}" {fill}/>'
    if m == "s":
        return f'<rect x="{_f(x - r)}" y="{_f(y - r)}" width="{_f(2 * r)}" height="{_f(2 * r)}" {fill}/>'
    if m in ("^", "D"):
        pts = ((0, -r), (r, r), (-r, r)) if m == "^" else ((0, -r), (r, 0), (0, r), (-r, 0))
        return f'<path d="M{"L".join(f"{_f(x + a)} {_f(y + b)}" for a, b in pts)}Z" {fill}/>'
    cross = f"M{_f(x - r)} {_f(y - r)}L{_f(x + r)} {_f(y + r)}M{_f(x - r)} {_f(y + r)}L{_f(x + r)} {_f(y - r)}"
    if m == "+":
        cross = f"M{_f(x - r)} {_f(y)}H{_f(x + r)}M{_f(x)} {_f(y - r)}V{_f(y + r)}"
    return f'<path d="{cross}" {style.stroke(1.0)}/>'


# ---------------------------------------------------------------------------- values


def _unsupported(owner: str, name: str) -> AttributeError:
    if name.startswith("_"):  # copy, pickle and IPython probe for these: a plain "no"
        return AttributeError(name)
    return Unsupported(
        f"{owner}.{name} is not supported by the SVG chart (it supports "
        f"{', '.join(SUPPORTED[owner])}); {_HINT}"
    )


def _options(method: str, kwargs: Mapping[str, Any], allowed: set[str]) -> dict[str, Any]:
    """``kwargs`` with matplotlib's aliases resolved (lw -> linewidth...), checked."""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        name = _ALIASES.get(key, key)
        if name not in allowed:
            raise Unsupported(
                f"ChartAxes.{method}() does not take {key}= (it takes "
                f"{', '.join(sorted(allowed))}); {_HINT}"
            )
        out[name] = value
    if "zorder" in out:
        out["zorder"] = float(out["zorder"])
    return out


def _lim(
    current: tuple[float | None, float | None], a: Any, b: Any
) -> tuple[float | None, float | None]:
    """New limits from ``set_xlim(a, b)`` or ``set_xlim((a, b))``; None or NaN keeps a side."""
    if isinstance(a, tuple | list):
        a, b = a
    a, b = _num(a), _num(b)
    return (current[0] if a is None else a, current[1] if b is None else b)


def _num(value: Any) -> float | None:
    """A finite float, or None (None, NaN, inf, not a number)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _seq(values: Any, length: int | None = None) -> list[Any]:
    """A list of ``values``; a scalar repeated ``length`` times."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        return [values] * (length if length is not None else 1)
    return list(values)


def _finite(values: Iterable[Any]) -> list[float]:
    return [v for v in (_num(x) for x in values) if v is not None]


def _along(points: list[tuple[float, float]], limit: int = 400) -> list[tuple[float, float]]:
    """``points`` and, when there are few, points in between (a straight line covers them)."""
    if len(points) > limit:
        return points
    out = points[:1]
    for (xa, ya), (xb, yb) in zip(points, points[1:], strict=False):
        out += [(xa + (xb - xa) * k / 8, ya + (yb - ya) * k / 8) for k in range(1, 9)]
    return out


def _pairs(xs: Sequence[Any], ys: Sequence[Any]) -> Iterable[tuple[float, float]]:
    for x, y in zip(xs, ys, strict=False):
        if _num(x) is not None and _num(y) is not None:
            yield x, y


def _runs(xs: Sequence[Any], ys: Sequence[Any], pick: Any = None) -> list[list[Any]]:
    """Runs of consecutive points whose x and y are finite (a gap where one is not)."""
    runs: list[list[Any]] = [[]]
    for x, y in zip(xs, ys, strict=False):
        values = pick(y) if pick else (y,)
        if _num(x) is None or any(_num(v) is None for v in values):
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((x, y))
    return [r for r in runs if r]


def _steps(pts: list[tuple[float, float]], where: str) -> list[tuple[float, float]]:
    """The corners of a staircase through ``pts``, held after (post), before (pre) or around
    (mid) each point."""
    out = pts[:1]
    for (xa, ya), (xb, yb) in zip(pts, pts[1:], strict=False):
        if where == "post":
            out += [(xb, ya), (xb, yb)]
        elif where == "pre":
            out += [(xa, yb), (xb, yb)]
        else:
            xm = (xa + xb) / 2
            out += [(xm, ya), (xm, yb), (xb, yb)]
    return out


def _rgb(color: str) -> tuple[int, int, int]:
    h = color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _is_rgb(value: Any) -> bool:
    return len(value) in (3, 4) and all(isinstance(v, float) for v in value)


def _color(color: Any) -> str:
    """An SVG colour from a matplotlib one: '#hex', a CSS name, 'C0'..'C9', 'r', (r, g, b)."""
    if color is None:
        return PALETTE[0]
    if isinstance(color, tuple | list) and _is_rgb(color):
        return "#" + "".join(f"{round(min(max(c, 0.0), 1.0) * 255):02x}" for c in color[:3])
    text = str(color)
    if re.fullmatch(r"C\d", text):
        return PALETTE[int(text[1]) % len(PALETTE)]
    return xml_text(_SHORT.get(text, text))


def _f(value: float) -> str:
    """A coordinate, short: 12.5, not 12.500000001."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
