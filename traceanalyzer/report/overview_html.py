"""The overview in report.html: where the time goes, before the findings.

Reads findings.json's ``summary.overview`` (``docs/overview.md``); the figures (the heat map
from :mod:`~traceanalyzer.report.overview_plots`, the timeline strip from
:mod:`~traceanalyzer.report.overview_timeline`) are drawn once by :func:`overview_figures`, and
the Markdown report links the same files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from traceanalyzer.chart import PALETTE
from traceanalyzer.overview.model import STEP, Means, Overview
from traceanalyzer.report import overview_text as text
from traceanalyzer.report.htmlkit import bullets, details, esc, table
from traceanalyzer.report.overview_memory import memory_figures, memory_html
from traceanalyzer.report.overview_plots import COLORS, PHASE_COLORS, heatmap_figure
from traceanalyzer.report.plots import svg_file
from traceanalyzer.text import count, sentence

BREAKDOWN_SVG, TIMELINE_SVG = "overview-breakdown.svg", "overview-timeline.svg"
RANKS_SHOWN = 8  # the per-rank table opens folded beyond this (the heat map shows them all)


def overview_figures(overview: Overview | None) -> tuple[dict[str, bytes], dict[str, str]]:
    """The overview's figure files by name (the heat map's SVG, the timeline's SVG), and what
    failed to draw (a figure is a nicety; the tables stand)."""
    if overview is None or not overview.usable:
        return {}, {}
    files: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    for what, draw in (
        (f"plot {BREAKDOWN_SVG}", lambda: {BREAKDOWN_SVG: _heatmap_svg(overview)}),
        (f"plot {TIMELINE_SVG}", lambda: {TIMELINE_SVG: _timeline_svg(overview)}),
        ("plot memory timeline", lambda: memory_figures(overview)),
    ):
        try:
            files |= {name: data for name, data in draw().items() if data is not None}
        except Exception as exc:
            errors[what] = f"{type(exc).__name__}: {exc}"
    return files, errors


def _heatmap_svg(overview: Overview) -> bytes | None:
    fig = heatmap_figure(overview)
    return None if fig is None else svg_file(fig.to_svg())


def _timeline_svg(overview: Overview) -> bytes | None:
    from traceanalyzer.report.overview_timeline import timeline_svg

    svg = timeline_svg(overview)
    return None if svg is None else svg_file(svg)


def overview_section(overview: Overview | None, figures: Mapping[str, bytes]) -> str:
    """``figures``: :func:`overview_figures`' files by name (absent ones are not shown)."""
    if overview is None:
        return ""
    head = '<h2 id="overview">Where the time goes</h2>'
    if not overview.usable:
        why = overview.error and f"The overview failed: {overview.error}"
        return head + f"<p>{esc(why or 'No step or window to break down.')}</p>"
    mean = overview.mean or {}
    lead = (
        (f'<p class="headline"><b>{esc(overview.headline)}</b></p>' if overview.headline else "")
        + f"<p>Mean step <b>{esc(text.fmt.duration(mean.get(STEP)))}</b> over "
        f"{count(overview.steps, 'step')} of {count(len(overview.ranks), 'rank')}. "
        f'<span class="small muted">{esc(text.source_line(overview))}.</span></p>'
    )
    warning = text.check_warning(overview)
    if warning:
        lead = f'<p class="warning"><b>Unreliable overview:</b> {esc(warning)}</p>' + lead
    parts = [head, '<section class="overview">', lead]
    caption = (
        "<figcaption>Each rank's mean step split into compute (by accelerator), "
        "communication, copies and idle time.</figcaption>"
    )
    if BREAKDOWN_SVG in figures:  # the heat map, past 8 ranks, inline
        parts.append(f"<figure>{figures[BREAKDOWN_SVG].decode('utf-8')}{caption}</figure>")
    else:
        parts.append(f'<figure class="ov-bars">{stacked_bars(overview)}{caption}</figure>')
    parts.append(
        table(["component", "per step", "share"], text.component_rows(overview), numeric=(1, 2))
    )
    if TIMELINE_SVG in figures:  # inline: crisp, and each task says what it is on hover
        rank = overview.representative.rank if overview.representative else None
        parts.append(
            f'<figure class="ov-timeline">{figures[TIMELINE_SVG].decode("utf-8")}'
            f"<figcaption>Rank {esc(rank)}, the step whose time is the median of "
            "all steps: device streams, tasks coloured as in the breakdown.</figcaption></figure>"
        )
    headers = text.compact_headers()
    ranks = table(
        headers, text.compact_rows(overview), numeric=tuple(range(1, 10)), names=_names(headers)
    )
    many = len(overview.ranks) > RANKS_SHOWN
    parts.append(details(f"Per rank ({len(overview.ranks)})", ranks, open_=not many))
    parts += [
        f'<p class="small muted">{esc(sentence(note))}</p>'
        for note in text.unmeasured_notes(overview)
    ]
    parts.append(_phases(overview))
    parts.append(_collectives(overview))
    parts.append(_cluster(overview))
    for index, (title, (headers, rows)) in enumerate(text.top_rows(overview).items()):
        if rows:
            numeric = tuple(i for i, h in enumerate(headers) if h not in text.TEXT_COLUMNS)
            body = table(headers, rows, numeric=numeric, names=_names(headers))
            parts.append(details(f"{title} ({len(rows)})", body, open_=index == 0))
    parts.append(memory_html(overview, figures))
    parts.append("</section>")
    return "".join(parts)


def stacked_bars(
    overview: Overview,
    bars: list[tuple[str, Means]] | None = None,
    *,
    full_width: bool = False,
    row_class: str = "ov-row",
) -> str:
    """One bar per rank (or per ``bars``: label and mean components), as long as its mean step
    (``full_width``: each as wide as the track, its parts shares), split into its components
    (HTML: instant, crisp, and each part says its time on hover), with the legend under it."""
    if bars is None:
        bars = [(f"rank {r.rank}", r.mean) for r in overview.ranks]
    components = [c for c in overview.components if any(m.get(c.key) for _, m in bars)]
    longest = max((m.get(STEP) or 0.0 for _, m in bars), default=0.0) or 1.0
    rows = []
    for label, m in bars:
        step = m.get(STEP) or 0.0
        parts = "".join(
            f'<span style="width:{100 * m.get(c.key, 0.0) / step:.3f}%;'
            f'background:{COLORS[c.key]}" title="{esc(c.label)}: '
            f'{esc(text.fmt.duration(m.get(c.key)))} ({esc(text.share(m.get(c.key, 0.0), step))})">'
            "</span>"
            for c in components
            if step and m.get(c.key)
        )
        width = 100.0 if full_width else 100 * step / longest
        rows.append(
            f'<div class="{row_class}"><span class="ov-rank">{esc(label)}</span>'
            f'<span class="ov-track"><span class="ov-bar" style="width:{width:.3f}%">'
            f'{parts}</span></span><span class="ov-step">{esc(text.fmt.duration(step))}</span></div>'
        )
    legend = "".join(
        f'<span><i style="background:{COLORS[c.key]}"></i>{esc(c.label)}</span>' for c in components
    )
    return "".join(rows) + f'<div class="ov-legend">{legend}</div>'


def _phases(overview: Overview) -> str:
    """The phase table and strip: each kind of iteration on its own, and when each ran."""
    note = text.phase_note(overview)
    muted = f'<p class="small muted">{esc(note)}.</p>' if note else ""
    ep = _phase_lists(overview)
    if not text.phases_known(overview):
        return muted + ep
    headers = text.phase_headers()
    body = table(headers, text.phase_rows(overview), numeric=tuple(range(1, len(headers))))
    caption = (
        "<figcaption>The phases over time, per rank (from its first step; idle: no iteration "
        "ran). Hover a block for its time.</figcaption>"
    )
    strip = f'<figure class="ov-bars">{phase_strip(overview)}{caption}</figure>'
    rows = [(r.phase, r.mean) for r in overview.phases.rows]
    bars = (
        f'<figure class="ov-bars">{stacked_bars(overview, rows, full_width=True, row_class="ov-row ov-phase")}'
        "<figcaption>Each phase's mean iteration split into its components (every bar the "
        "whole iteration: shares; its time on the right).</figcaption></figure>"
    )
    return details("By phase", bars + body + ep + muted + strip, open_=True)


def _phase_lists(overview: Overview) -> str:
    return "".join(
        f'<p class="small">{sentence(title, ":")}</p>' + bullets(map(esc, lines), "small")
        for title, lines in text.phase_sections(overview)
    )


def phase_strip(overview: Overview) -> str:
    """One track per rank, its runs of one phase placed on a time axis common to the ranks."""
    lanes = overview.phases.timeline
    longest = max((lane.span_ns for lane in lanes), default=0) or 1
    rows, seen = [], []
    for lane in lanes:
        blocks = []
        for start, end, phase in lane.runs:
            seen += [phase] if phase not in seen else []
            blocks.append(
                f'<span style="left:{100 * start / longest:.3f}%;'
                f"width:{max(100 * (end - start) / longest, 0.05):.3f}%;"
                f'background:{PHASE_COLORS.get(phase, "#9ca3af")}" '
                f'title="{esc(phase)}: {esc(text.fmt.duration(end - start))} at '
                f'+{esc(text.fmt.duration(start))}"></span>'
            )
        rows.append(
            f'<div class="ov-row ov-lane"><span class="ov-rank">rank {esc(lane.rank)}</span>'
            f'<span class="ov-track ov-strip">{"".join(blocks)}</span>'
            f'<span class="ov-step">{esc(text.fmt.duration(lane.span_ns))}</span></div>'
        )
    legend = "".join(
        f'<span><i style="background:{PHASE_COLORS.get(p, "#9ca3af")}"></i>{esc(p)}</span>'
        for p in seen
    )
    return "".join(rows) + f'<div class="ov-legend">{legend}</div>'


def _collectives(overview: Overview) -> str:
    """Where the collectives' time goes, and the strip of each iteration's root rank."""
    lines = text.collective_lines(overview)
    if not lines:
        return ""
    body = bullets(map(esc, lines), "small") + root_strip(overview)
    ranks = text.collective_rank_rows(overview)
    if ranks:
        body += table(text.COLLECTIVE_HEADERS, ranks, numeric=(1, 2, 3, 4, 5))
    return details("Collectives and the critical path", body, open_=True)


def _root_colour(rank: int | None) -> str:
    return "#e5e7eb" if rank is None else PALETTE[rank % len(PALETTE)]


def root_strip(overview: Overview) -> str:
    """Per root rank, the share of the iterations the others waited on it last (a bar), and
    the iterations in time order coloured by their root (grey: balanced)."""
    path = overview.collectives.critical_path if overview.collectives else None
    if path is None or not path.roots:
        return ""
    rows = []
    for r in path.roots:
        outside = " (not in the profile)" if r.outside else ""
        rows.append(
            f'<div class="ov-row"><span class="ov-rank">rank {esc(r.rank)}</span>'
            f'<span class="ov-track"><span class="ov-bar" style="width:{100 * r.share:.3f}%;'
            f'background:{_root_colour(r.rank)}" title="rank {esc(r.rank)}{outside}: root '
            f"of {esc(r.iterations)} iterations, {esc(text.fmt.duration(r.wait_ns))} "
            f'waited"></span></span><span class="ov-step">{esc(text.fmt.percent(r.share))}'
            "</span></div>"
        )
    sequence = path.sequence
    width = 100 / max(len(sequence), 1)
    blocks = "".join(
        f'<span style="left:{i * width:.3f}%;width:{width:.3f}%;background:{_root_colour(root)}" '
        f'title="iteration {i + 1}: {"balanced" if root is None else f"waited on rank {root}"}">'
        "</span>"
        for i, root in enumerate(sequence)
    )
    rows.append(
        '<div class="ov-row ov-lane"><span class="ov-rank">iterations</span>'
        f'<span class="ov-track ov-strip">{blocks}</span><span class="ov-step"></span></div>'
    )
    caption = (
        "<figcaption>The rank each iteration waited on last (its root): the share of the "
        "iterations per rank, then the iterations in time order (grey: balanced).</figcaption>"
    )
    return f'<figure class="ov-bars">{"".join(rows)}{caption}</figure>'


def _cluster(overview: Overview) -> str:
    rows = text.cluster_rows(overview)
    if len(rows) <= 1:
        return ""
    outliers = [r for r in overview.cluster if r.outlier]
    body = table(
        text.CLUSTER_HEADERS, rows, numeric=(1, 2, 3, 4, 5, 7), names=_names(text.CLUSTER_HEADERS)
    )
    # mark outlier rows for the eye; the table text also says "(outlier)"
    for row in rows:
        if row[0].endswith("(outlier)"):
            cell = f"<tr><td>{esc(row[0])}</td>"
            body = body.replace(cell, f'<tr class="outlier"><td>{esc(row[0])}</td>')
    note = (
        f"{count(len(outliers), 'outlier rank')}: robust z-score of the step time above 3.5 and 10% "
        "above the median (the rules' outlier statistics), shown whether or not a rule fired."
        if outliers
        else "No outlier rank (robust z-score of the step time above 3.5: none is 10% above "
        "the median)."
    )
    return details(
        f"Cluster ({len(rows)} ranks)", body + f'<p class="small muted">{esc(note)}</p>', open_=True
    )


def _names(headers: Sequence[str]) -> tuple[int, ...]:
    """The columns of ``headers`` that hold kernels' and APIs' names (shortened in the middle)."""
    return tuple(i for i, h in enumerate(headers) if h in text.NAME_COLUMNS)
