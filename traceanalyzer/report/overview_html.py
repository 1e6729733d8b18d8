"""The overview in report.html: where the time goes, before the findings.

Reads findings.json's ``summary.overview`` (``docs/overview.md``); the figures come from
:mod:`traceanalyzer.report.overview_plots` and are drawn once by :func:`overview_images` (the
Markdown report links the same PNGs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from traceanalyzer.report import overview_text as text
from traceanalyzer.report.htmlkit import details, esc, img_png, table
from traceanalyzer.report.overview_plots import COLORS

if TYPE_CHECKING:
    from traceanalyzer.report.inputs import ReportInputs

BREAKDOWN_PNG, TIMELINE_PNG = "overview-breakdown.png", "overview-timeline.png"
RANKS_SHOWN = 8  # the per-rank table opens folded beyond this (the heat map shows them all)


def overview_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """findings.json's summary.overview, or None (an older run, or the overview was off)."""
    return (doc.get("summary") or {}).get("overview")


def overview_costs(doc: Mapping[str, Any]) -> dict[str, Any]:
    return (overview_of(doc) or {}).get("costs") or {}


def overview_images(inputs: ReportInputs) -> tuple[dict[str, bytes], dict[str, str]]:
    """PNG by file name, and what failed to draw (a figure is a nicety; the tables stand)."""
    from traceanalyzer.report.overview_plots import heatmap_figure, timeline_figure
    from traceanalyzer.report.plots import render_png

    overview = overview_of(inputs.findings)
    if not text.usable(overview):
        return {}, {}
    assert overview is not None
    pngs: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    drawers = {
        BREAKDOWN_PNG: lambda: heatmap_figure(overview),
        TIMELINE_PNG: lambda: timeline_figure(overview, inputs.store) if inputs.store else None,
    }
    for name, draw in drawers.items():
        try:
            fig = draw()
            if fig is not None:
                pngs[name] = render_png(fig)
        except Exception as exc:
            errors[f"plot {name}"] = f"{type(exc).__name__}: {exc}"
    return pngs, errors


def overview_section(doc: Mapping[str, Any], pngs: Mapping[str, bytes]) -> str:
    overview = overview_of(doc)
    if not overview:
        return ""
    head = '<h2 id="overview">Where the time goes</h2>'
    if not text.usable(overview):
        why = overview.get("error") and f"The overview failed: {overview['error']}"
        return head + f"<p>{esc(why or 'No step or window to break down.')}</p>"
    mean = overview.get("mean") or {}
    lead = (
        (
            f'<p class="headline"><b>{esc(overview["headline"])}</b></p>'
            if overview.get("headline")
            else ""
        )
        + f"<p>Mean step <b>{esc(text.fmt.duration(mean.get('step_ns')))}</b> over "
        f"{overview['steps']} step(s) of {len(overview['ranks'])} rank(s). "
        f'<span class="small muted">{esc(text.source_line(overview))}.</span></p>'
    )
    parts = [head, '<section class="overview">', lead]
    caption = (
        "<figcaption>Each rank's mean step split into compute (by accelerator), "
        "communication, copies and idle time.</figcaption>"
    )
    if BREAKDOWN_PNG in pngs:  # the heat map, past 8 ranks
        parts.append(
            f"<figure>{img_png(pngs[BREAKDOWN_PNG], 'time breakdown per rank')}{caption}</figure>"
        )
    else:
        parts.append(f'<figure class="ov-bars">{stacked_bars(overview)}{caption}</figure>')
    parts.append(
        table(["component", "per step", "share"], text.component_rows(overview), numeric=(1, 2))
    )
    if TIMELINE_PNG in pngs:
        rep = overview.get("representative") or {}
        parts.append(
            f"<figure>{img_png(pngs[TIMELINE_PNG], 'timeline of a representative step')}"
            f"<figcaption>Rank {esc(rep.get('rank'))}, the step whose time is the median of "
            "all steps: device streams, tasks coloured as in the breakdown.</figcaption></figure>"
        )
    ranks = table(text.compact_headers(), text.compact_rows(overview), numeric=tuple(range(1, 10)))
    many = len(overview["ranks"]) > RANKS_SHOWN
    parts.append(details(f"Per rank ({len(overview['ranks'])})", ranks, open_=not many))
    parts.append(_cluster(overview))
    for index, (title, (headers, rows)) in enumerate(text.top_rows(overview).items()):
        if rows:
            numeric = tuple(i for i, h in enumerate(headers) if h not in text.TEXT_COLUMNS)
            body = table(headers, rows, numeric=numeric)
            parts.append(details(f"{title} ({len(rows)})", body, open_=index == 0))
    parts.append("</section>")
    return "".join(parts)


def stacked_bars(overview: Mapping[str, Any]) -> str:
    """One bar per rank, as long as its mean step, split into its components (HTML: instant,
    crisp, and each part says its time on hover), with the legend under it."""
    ranks = overview.get("ranks") or []
    components = [
        c for c in overview.get("components") or [] if any(r.get(c["key"]) for r in ranks)
    ]
    longest = max((r.get("step_ns") or 0.0 for r in ranks), default=0.0) or 1.0
    rows = []
    for r in ranks:
        step = r.get("step_ns") or 0.0
        parts = "".join(
            f'<span style="width:{100 * r.get(c["key"], 0.0) / step:.3f}%;'
            f'background:{COLORS[c["key"]]}" title="{esc(c["label"])}: '
            f'{esc(text.fmt.duration(r.get(c["key"])))} ({esc(text.share(r.get(c["key"], 0.0), step))})">'
            "</span>"
            for c in components
            if step and r.get(c["key"])
        )
        rows.append(
            f'<div class="ov-row"><span class="ov-rank">rank {esc(r["rank"])}</span>'
            f'<span class="ov-track"><span class="ov-bar" style="width:{100 * step / longest:.3f}%">'
            f'{parts}</span></span><span class="ov-step">{esc(text.fmt.duration(step))}</span></div>'
        )
    legend = "".join(
        f'<span><i style="background:{COLORS[c["key"]]}"></i>{esc(c["label"])}</span>'
        for c in components
    )
    return "".join(rows) + f'<div class="ov-legend">{legend}</div>'


def _cluster(overview: Mapping[str, Any]) -> str:
    rows = text.cluster_rows(overview)
    if len(rows) <= 1:
        return ""
    outliers = [r for r in overview.get("cluster") or [] if r.get("outlier")]
    body = table(text.CLUSTER_HEADERS, rows, numeric=(1, 2, 3, 4, 5, 7))
    # mark outlier rows for the eye; the table text also says "(outlier)"
    for row in rows:
        if row[0].endswith("(outlier)"):
            cell = f"<tr><td>{esc(row[0])}</td>"
            body = body.replace(cell, f'<tr class="outlier"><td>{esc(row[0])}</td>')
    note = (
        f"{len(outliers)} outlier rank(s): robust z-score of the step time above 3.5 and 10% "
        "above the median (the rules' outlier statistics), shown whether or not a rule fired."
        if outliers
        else "No outlier rank (robust z-score of the step time, as the rules compute it)."
    )
    return details(
        f"Cluster ({len(rows)} ranks)", body + f'<p class="small muted">{esc(note)}</p>', open_=True
    )
