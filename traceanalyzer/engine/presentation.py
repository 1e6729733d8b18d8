"""What a rule shows besides its findings: a figure, key figures per rank, timeline marks.

A rule registers them on itself, next to its detection function (see
:meth:`~traceanalyzer.engine.rule.Rule.figure`, ``.key_figures`` and ``.marks``); the report
layers (``report.html``, ``diff``, ``annotations.json``) only ever call the rule object, so an
external rule is presented exactly like a built-in one.

- **figure**: ``fn(FigureContext) -> Chart | Figure | None``, drawn for each finding of the
  rule: an SVG :class:`~traceanalyzer.chart.Chart` from :meth:`FigureContext.new`, or a
  matplotlib ``Figure`` from :meth:`FigureContext.matplotlib` (imported there, only then).
- **key figures**: ``fn(RuleContext) -> polars.DataFrame`` with one row per rank (column
  ``rank`` plus one column per declared :class:`KeyFigure`, null where the data is absent;
  or those rows as a list of dicts; the rule core casts, sorts and fills them in),
  computed with the run's effective parameters on every rank shard, whether or not the rule
  fired (not where it is not evaluated); ``diff`` compares them between runs.
- **marks**: ``fn(finding) -> Iterable[Mark]``, slices for the Perfetto overlay; without it,
  every evidence row with a start time is one mark (:func:`evidence_marks`).
- **units**: the units of its findings' metrics (``@rule(units={"wait_ns": NS})``,
  :mod:`traceanalyzer.engine.units`), which say how the reports and ``diff`` print them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from traceanalyzer.chart import GRID, Chart, ChartAxes
from traceanalyzer.engine.findings import COST_UNITS
from traceanalyzer.engine.params import Params

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from traceanalyzer.store import Store

Better = Literal["lower", "higher"]
# matplotlib figures (FigureContext.matplotlib): resolution and fixed margins
DPI = 110
_MARGINS = {"left": 0.07, "right": 0.98, "top": 0.9, "bottom": 0.16, "wspace": 0.22}


@dataclass(frozen=True)
class KeyFigure:
    """A number per rank that says how a run did, for before/after comparisons (``diff``).

    ``name`` is the column the key-figures function returns; ``label`` is what people read
    ("capture time (mean per capture)"); ``better`` colours a change as an improvement or a
    regression (None: neutral, e.g. a count); ``unit`` (:mod:`~traceanalyzer.engine.units`:
    ``NS``, ``RATIO``, ``COUNT``, or one printed after the number, ``MHz``) says how to print it.
    """

    name: str
    label: str
    better: Better | None = None
    unit: str = ""

    def __post_init__(self) -> None:
        if self.name == "rank" or not self.name.isidentifier():
            raise ValueError(f"key figure name {self.name!r} must be an identifier, not 'rank'")
        if self.better not in (None, "lower", "higher"):
            raise ValueError(f"key figure {self.name}: better must be 'lower', 'higher' or None")


@dataclass(frozen=True)
class Mark:
    """One slice on the timeline overlay (``annotations.json``), on the trace's own clock.

    ``track`` None puts it on the finding's own track; another name gives it a track of its own
    under the finding. ``category`` is the Chrome-trace ``cat`` (filterable in Perfetto).
    ``flows_out`` / ``flows_in``: ids of arrows that leave / reach this mark (an arrow is drawn
    where both its ends are in the same trace: a chain of waits from one rank to another).
    """

    rank: int
    session: str
    name: str
    start_ns: int
    dur_ns: int | None
    track: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    category: str = "evidence"
    flows_out: tuple[str, ...] = ()
    flows_in: tuple[str, ...] = ()


@dataclass
class FigureContext:
    """What a figure function receives.

    ``finding`` is the grouped finding as in findings.json (``ranks``, ``series``,
    ``occurrences``, ``metrics``, ``evidence``, and ``params``: the parameters it ran with);
    ``params`` the same parameters as :class:`~traceanalyzer.engine.params.Params`; ``store`` the
    run's store (read-only; None when the report has no store).
    """

    finding: Mapping[str, Any]
    params: Params
    store: Store | None = None

    def new(
        self,
        width_in: float,
        height_in: float,
        cols: int = 1,
        margins: Mapping[str, float] | None = None,
    ) -> tuple[Chart, list[ChartAxes]]:
        """An SVG chart with ``cols`` axes side by side, in the reports' style (light grid).

        The axes take the subset of matplotlib's Axes API the built-in rules use
        (:mod:`traceanalyzer.chart`); :meth:`matplotlib` gives the whole of it.
        The margins fit the labels; ``margins`` (``subplots_adjust`` fractions) only widen them.
        """
        chart = Chart(width_in, height_in, cols, margins)
        for ax in chart.axes:
            ax.grid(True)  # the chart's grid is light by default
        return chart, chart.axes

    def matplotlib(
        self,
        width_in: float,
        height_in: float,
        cols: int = 1,
        margins: Mapping[str, float] | None = None,
    ) -> tuple[Figure, list[Axes]]:
        """A matplotlib figure in the reports' style, for figures the chart cannot draw.

        It costs the import of matplotlib (about half a second) and becomes a PNG in the
        reports. Object-oriented matplotlib (no ``pyplot``): no global backend is switched, so
        a notebook keeps its inline plotting, and nothing needs a display.
        """
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width_in, height_in), dpi=DPI)
        # fixed margins, not layout="constrained": the layout solver alone costs ~0.4 s a figure
        fig.subplots_adjust(**{**_MARGINS, **(margins or {})})
        axes = fig.subplots(1, cols, squeeze=False)[0].tolist()
        for ax in axes:
            ax.spines[["top", "right"]].set_visible(False)
            ax.grid(True, color=GRID, linewidth=0.6)
            ax.set_axisbelow(True)
            ax.tick_params(labelsize=8)
        return fig, axes

    def series_by_rank(self) -> list[tuple[list[int], dict[str, list[Any]]]]:
        """(ranks, series) of every occurrence; the finding's own series when they have none."""
        return series_by_rank(self.finding)


def series_by_rank(finding: Mapping[str, Any]) -> list[tuple[list[int], dict[str, list[Any]]]]:
    """(ranks, series) per occurrence of a grouped finding, so a plot can draw every rank."""
    out = [
        (list(o.get("ranks") or []), o["series"])
        for o in finding.get("occurrences") or []
        if o.get("series")
    ]
    return out or [(list(finding.get("ranks") or []), dict(finding.get("series") or {}))]


def evidence_marks(finding: Mapping[str, Any]) -> Iterator[Mark]:
    """The default marks: one per evidence row that has a start time."""
    for e in finding.get("evidence") or []:
        if e.get("start_ns") is None:
            continue
        name = e.get("name") or "evidence"
        if e.get("stream") is not None:
            name = f"stream {e['stream']}: {name}"
        yield Mark(
            rank=int(e["rank"]),
            session=str(e.get("session") or ""),
            name=name,
            start_ns=int(e["start_ns"]),
            dur_ns=e.get("dur_ns"),
            args={"stream": e.get("stream"), "detail": e.get("detail")},
        )


FigureFn = Callable[[FigureContext], "Chart | Figure | None"]
# fn(RuleContext) -> one row per rank (the rule core calls it: Rule.key_figure_frame)
KeyFiguresFn = Callable[..., "pl.DataFrame | list[dict[str, Any]]"]
MarksFn = Callable[[Mapping[str, Any]], Iterable[Mark]]


@dataclass
class Presentation:
    """The presentation a rule registered (all optional)."""

    figure: FigureFn | None = None
    caption: str = ""
    key_figures: tuple[KeyFigure, ...] = ()
    compute_key_figures: KeyFiguresFn | None = None
    marks: MarksFn | None = None
    units: Mapping[str, str] = field(default_factory=dict)  # its findings' metric -> its unit

    def unit(self, metric: str) -> str:
        """The unit of one of its findings' metrics: a cost's, else the one the rule declared;
        "" (a plain number) when it declared none."""
        return COST_UNITS.get(metric) or self.units.get(metric, "")

    def marks_for(self, finding: Mapping[str, Any]) -> list[Mark]:
        return list((self.marks or evidence_marks)(finding))


def key_figure_document(
    rule_id: str, rule_name: str, figures: Iterable[KeyFigure], rows: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The ``key_figures`` entries of findings.json for one rule: one per declared figure, with
    its value on every rank (null where the data is absent)."""
    rows = list(rows)
    return [
        {
            "rule": rule_id,
            "name": rule_name,
            "figure": k.name,
            "label": k.label,
            "better": k.better,
            "unit": k.unit,
            "values": [{"rank": int(r["rank"]), "value": _finite(r.get(k.name))} for r in rows],
        }
        for k in figures
    ]


def _finite(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None
