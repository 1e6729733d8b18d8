"""One matplotlib figure per finding, drawn from the finding's own series and the store.

Figures are built with the object-oriented API (``Figure`` + Agg canvas), never ``pyplot``: no
global backend is switched, so importing this in a notebook leaves inline plotting alone, and
nothing needs a display. Each plotter returns a ``Figure`` (notebooks show it) and
:func:`render_png` turns it into PNG bytes for the HTML (data URI) and ``OUT/plots/``.

Plotters are registered by rule *name*; a rule without a plotter simply has no image.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from traceanalyzer.report.inputs import ReportInputs
from traceanalyzer.vocabulary import DEVICE_PROCESSES

DPI = 110
MAX_RANK_LINES = 12  # more lines than this is unreadable; the rest are drawn thin and grey
MAX_STREAM_ROWS = 24
COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"]
WAIT_COLORS = {"NOTIFY_WAIT": "#dc2626", "EVENT_WAIT": "#f97316"}
# TA002's defaults; the parameters the rule actually ran with (findings.json) take precedence.
DEFAULT_WAIT_TYPES = ("EVENT_WAIT_SQE", "NOTIFY_WAIT_SQE")
DEFAULT_WAIT_NAMES = ("EVENT_WAIT", "NOTIFY_WAIT", "Notify Wait", "Notify_Wait")
COPY_NAMES, COPY_TYPES = ("MEMCPY_ASYNC",), ("PCIE_DMA_SQE", "SDMA_SQE")  # the transfer's own work
PAD = 0.06  # share of the span shown before and after it

Plotter = Callable[[dict[str, Any], ReportInputs], Figure | None]
PLOTTERS: dict[str, Plotter] = {}


def plotter(rule_name: str) -> Callable[[Plotter], Plotter]:
    """Register the figure of a rule (by name, e.g. ``capture-memcpy-growth``)."""

    def register(fn: Plotter) -> Plotter:
        PLOTTERS[rule_name] = fn
        return fn

    return register


def figure_for(finding: dict[str, Any], inputs: ReportInputs) -> Figure | None:
    """The finding's figure, or None when its rule has no plotter or the data is missing."""
    fn = PLOTTERS.get(finding.get("name", ""))
    return fn(finding, inputs) if fn else None


def render_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _figure(
    width: float, height: float, cols: int = 1, margins: dict[str, float] | None = None
) -> tuple[Figure, list[Any]]:
    # fixed margins, not layout="constrained": the layout solver alone costs ~0.4 s per figure
    fig = Figure(figsize=(width, height), dpi=DPI)
    fig.subplots_adjust(
        **{
            "left": 0.07,
            "right": 0.98,
            "top": 0.9,
            "bottom": 0.16,
            "wspace": 0.22,
            **(margins or {}),
        }
    )
    axes = fig.subplots(1, cols, squeeze=False)[0].tolist()
    for ax in axes:
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(True, color="#e5e7eb", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(labelsize=8)
    return fig, axes


# --------------------------------------------------------------------------------------------
# capture-memcpy-growth: memcpy calls and capture time against capture index, per rank
# --------------------------------------------------------------------------------------------


def rank_series(finding: dict[str, Any]) -> list[tuple[list[int], dict[str, list[Any]]]]:
    """(ranks, series) per occurrence; the finding's own series when occurrences lack them."""
    out = [
        (list(o.get("ranks") or []), o["series"])
        for o in finding.get("occurrences") or []
        if o.get("series")
    ]
    return out or [(list(finding.get("ranks") or []), finding.get("series") or {})]


@plotter("capture-memcpy-growth")
def capture_growth_figure(finding: dict[str, Any], inputs: ReportInputs) -> Figure | None:
    series = [(ranks, s) for ranks, s in rank_series(finding) if s.get("memcpy_calls")]
    if not series:
        return None
    fig, (left, right) = _figure(9.0, 3.1, cols=2)
    per_session = finding.get("location", {}).get("source") == "api_stats"
    has_time = False
    for i, (ranks, s) in enumerate(series):
        label = "rank " + ", ".join(map(str, ranks))
        bold = i < MAX_RANK_LINES
        style = {
            "color": COLORS[i % len(COLORS)] if bold else "#9ca3af",
            "linewidth": 1.6 if bold else 0.6,
            "marker": "o" if bold else None,
            "markersize": 3,
            "label": label if bold else None,
        }
        x = s.get("capture_index") or list(range(len(s["memcpy_calls"])))
        left.plot(x, s["memcpy_calls"], **style)
        times = s.get("capture_ns") or []
        points = [(xi, t / 1e6) for xi, t in zip(x, times, strict=False) if t is not None]
        if points:
            has_time = True
            right.plot([p[0] for p in points], [p[1] for p in points], **style)
    unit = "session" if per_session else "capture"
    left.set_title(f"host memcpy calls per {unit}", fontsize=10)
    left.set_xlabel(f"{unit} index (time order)", fontsize=9)
    left.set_ylabel("calls", fontsize=9)
    left.set_ylim(bottom=0)
    right.set_title("capture duration", fontsize=10)
    right.set_xlabel("capture index (time order)", fontsize=9)
    right.set_ylabel("ms", fontsize=9)
    if has_time:
        right.set_ylim(bottom=0)
    else:
        right.text(0.5, 0.5, "no per-capture times\n(api_statistic.csv only)", ha="center",
                   va="center", transform=right.transAxes, color="#6b7280", fontsize=9)  # fmt: skip
    if len(series) > 1:
        left.legend(fontsize=8, frameon=False)
    return fig


# --------------------------------------------------------------------------------------------
# store-transfer-stall: a stream Gantt of the worst transfer span, waits highlighted
# --------------------------------------------------------------------------------------------


def worst_span(finding: dict[str, Any]) -> dict[str, Any] | None:
    """rank, session, start_ns, dur_ns, name of the worst stalled span (evidence row 0)."""
    metrics = finding.get("metrics") or {}
    start = metrics.get("worst_span_start_ns")
    spans = [e for e in finding.get("evidence") or [] if e.get("stream") is None]
    for e in spans:
        if start is None or e.get("start_ns") == start:
            return e
    return spans[0] if spans else None


def span_tasks(inputs: ReportInputs, span: dict[str, Any], pad: float = PAD) -> pl.DataFrame:
    # the padding shows what happens right before and after the span
    """Device tasks of the span's rank session overlapping the span window (padded)."""
    if inputs.store is None:
        return pl.DataFrame()
    start, dur = int(span["start_ns"]), int(span["dur_ns"] or 0)
    lo, hi = start - int(dur * pad), start + dur + int(dur * pad)
    return (
        inputs.store.table("slices")
        .filter(
            (pl.col("rank") == span["rank"])
            & (pl.col("session") == span["session"])
            & pl.col("process").is_in(DEVICE_PROCESSES)
            & pl.col("stream_id").is_not_null()
            & (pl.col("start_ns") < hi)
            & (pl.col("end_ns") > lo)
        )
        .select("process", "stream_id", "name", "task_type", "start_ns", "end_ns")
        .collect()
    )


def _kind(name: str | None, task_type: str | None, waits: tuple, wait_types: tuple) -> str:
    if (task_type in wait_types) or (name in waits):
        text = f"{name or ''} {task_type or ''}".lower()
        return "NOTIFY_WAIT" if "notify" in text else "EVENT_WAIT"
    return "task"


@plotter("store-transfer-stall")
def transfer_stall_figure(finding: dict[str, Any], inputs: ReportInputs) -> Figure | None:
    span = worst_span(finding)
    if span is None or span.get("start_ns") is None:
        return None
    tasks = span_tasks(inputs, span)
    params = inputs.rule_params(finding.get("rule", ""))
    waits = tuple(params.get("wait_names") or DEFAULT_WAIT_NAMES)
    wait_types = tuple(params.get("wait_task_types") or DEFAULT_WAIT_TYPES)
    stalling = set((finding.get("series") or {}).get("stream") or [])
    start, dur = int(span["start_ns"]), int(span["dur_ns"] or 1)
    lo, hi = start - int(dur * PAD), start + dur + int(dur * PAD)
    scale = 1e6 if dur < 5e9 else 1e9  # ms for short spans, s for long ones
    unit = "ms" if scale == 1e6 else "s"

    def rel(ns: int) -> float:
        return (ns - start) / scale

    rows: dict[tuple[str, int], list[tuple[str, float, float]]] = {}
    copying: set[tuple[str, int]] = set()
    for process, stream, name, task_type, s, e in tasks.iter_rows():
        kind = _kind(name, task_type, waits, wait_types)
        s, e = max(s, lo), min(e, hi)  # a wait of the previous span must not stretch the axis
        rows.setdefault((process, int(stream)), []).append((kind, rel(s), (e - s) / scale))
        if name in COPY_NAMES or task_type in COPY_TYPES:
            copying.add((process, int(stream)))
    # stalling streams first, then the others by id; cap the row count
    keys = sorted(rows, key=lambda k: (k[1] not in stalling, k[1], k[0]))[:MAX_STREAM_ROWS]
    height = 1.2 + 0.32 * (len(keys) + 1)
    fig_h = min(height, 9.0)
    fig, (ax,) = _figure(
        9.0,
        fig_h,
        margins={"left": 0.26, "right": 0.8, "top": 1 - 0.35 / fig_h, "bottom": 0.5 / fig_h},
    )
    ax.grid(axis="y", visible=False)
    labels = [f"host: {span.get('name') or 'transfer'}"]
    ax.broken_barh([(0, dur / scale)], (-0.35, 0.7), facecolors="#1d4ed8")
    for y, key in enumerate(keys, start=1):
        process, stream = key
        prefix = "" if process == "Ascend Hardware" else f"{process} "
        mark = "  ◀ stalls" if stream in stalling else "  (copies)" if key in copying else ""
        labels.append(f"{prefix}stream {stream}{mark}")
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for kind, x, w in rows[key]:
            by_kind.setdefault(kind, []).append((x, max(w, dur / scale / 800)))
        for kind, bars in by_kind.items():
            color = WAIT_COLORS.get(kind, "#94a3b8")
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=color)
    ax.axvspan(0, dur / scale, color="#fde68a", alpha=0.35, zorder=0)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.4, -0.6)
    ax.set_xlim(rel(lo), rel(hi))
    ax.set_xlabel(f"{unit} from span start (rank {span['rank']})", fontsize=9)
    ax.set_title(f"worst transfer span: {span.get('name')} ({dur / 1e6:,.1f} ms)", fontsize=10)
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color="#1d4ed8", label="transfer span (host)"),
            Patch(color=WAIT_COLORS["NOTIFY_WAIT"], label="NOTIFY_WAIT"),
            Patch(color=WAIT_COLORS["EVENT_WAIT"], label="EVENT_WAIT"),
            Patch(color="#94a3b8", label="other task"),
        ],
        fontsize=7,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    if len(rows) > len(keys):
        ax.text(1.0, 1.02, f"{len(rows) - len(keys)} more streams not shown", ha="right",
                transform=ax.transAxes, fontsize=7, color="#6b7280")  # fmt: skip
    return fig
