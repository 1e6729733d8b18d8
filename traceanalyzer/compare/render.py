"""Render a :class:`~traceanalyzer.compare.diff.DiffResult` for the terminal and as diff.html."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from traceanalyzer.compare.diff import Delta, DiffResult, FindingChange
from traceanalyzer.compare.explain_render import (
    explain_html,
    explain_markdown,
    explain_text,
    settings_html,
    settings_markdown,
    settings_text,
    waterfalls,
)
from traceanalyzer.compare.overview_diff import overview_diff_html, overview_diff_text
from traceanalyzer.compare.phase_diff import phase_diff_html, phase_diff_text
from traceanalyzer.report import fmt
from traceanalyzer.report.htmlkit import change_cell, chip, esc, inline, page, table
from traceanalyzer.report.markdown import md_table, md_text

STATUS_KIND = {"new": "error", "resolved": "clean", "changed": "warning", "unchanged": "plain"}


def _sides(d: Delta) -> tuple[str, str]:
    """Both sides in the unit the rule declared."""
    return fmt.metric(d.base, d.unit), fmt.metric(d.target, d.unit)


def delta_text(d: Delta) -> str:
    """``2.52 s -> 25.7 ms (-99.0%)``: both sides in the unit the rule declared."""
    out = " -> ".join(_sides(d))
    if d.rel is not None:
        out += f" ({fmt.change(d.rel)})"
    return out


def _counts(diff: DiffResult) -> str:
    return ", ".join(f"{n} {status}" for status, n in diff.counts.items())


def render_diff_text(diff: DiffResult) -> str:
    lines = [f"base:   {diff.base}", f"target: {diff.target}"]
    lines.append(f"findings: {_counts(diff)}")
    lines += [f"note: {note}" for note in diff.rank_notes]
    for c in diff.changes:
        side = c.current
        ranks = ", ".join(map(str, side.get("ranks") or []))
        lines.append(f"  {c.status:<9} {c.name:<24} rank {ranks:<8} {side.get('title', '')}")
        for d in c.metrics:
            lines.append(f"            {fmt.label(d.key)}: {delta_text(d)}")
        for d in c.figures:
            if d.base or d.target:  # 0 or nothing on both sides: no row
                lines.append(f"            {d.label}: {delta_text(d)}  [{d.scope}]")
    lines += overview_diff_text(diff.overview)
    lines += phase_diff_text(diff.phases)
    lines += explain_text(diff.phases)
    lines += settings_text(diff.settings_changed)
    moved = [d for d in diff.figures if d.change]
    if moved:
        lines.append("key figures that moved (per rank):")
        for d in moved:
            lines.append(f"  rank {d.ranks[0]:<4} {d.label:<32} {delta_text(d)}")
    return "\n".join(lines)


def _change_section(c: FindingChange) -> str:
    side = c.current
    sev = side.get("severity", "info")
    parts = [
        f'<section class="finding {esc(sev)}">',
        f"<h3>{inline(side.get('title'))}</h3>",
        '<div class="meta">',
        chip(c.status, STATUS_KIND[c.status]),
        chip(sev, sev),
        chip(f"{c.rule} {c.name}"),
        f"<span>{esc(side.get('ranks_label'))}</span>",
        f'<span class="mono small">fingerprint {esc(c.fingerprint)}</span>',
        "</div>",
    ]
    if (
        c.status == "changed"
        and c.base
        and c.target
        and c.base.get("title") != c.target.get("title")
    ):
        parts.append(f'<p class="small muted">before: {inline(c.base.get("title"))}</p>')
    shown = [(fmt.label(d.key), d, "finding metric") for d in c.metrics]
    shown += [(d.label, d, d.scope) for d in c.figures if d.base or d.target]
    rows = [(label, *_sides(d), change_cell(d.rel, d.better), scope) for label, d, scope in shown]
    if rows:
        parts.append(
            table(
                ("figure", "base", "target", "change", "scope"), rows, numeric=(1, 2, 3), raw=(3,)
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _link(from_dir: Path, to: Path) -> str:
    try:
        return Path(os.path.relpath(to, from_dir)).as_posix()
    except ValueError:
        return to.resolve().as_uri()


def render_diff_html(
    diff: DiffResult,
    out_dir: Path,
    *,
    now: datetime | None = None,
    svgs: Mapping[str, str] | None = None,
) -> str:
    """diff.html; ``svgs``: each phase's waterfall (:func:`waterfalls`, drawn here when None)."""
    generated = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    counts = " ".join(chip(f"{n} {s}", STATUS_KIND[s]) for s, n in diff.counts.items())
    links = []
    for label, side in (("base", diff.base), ("target", diff.target)):
        report = side / "report.html"
        target = f'<a href="{esc(_link(out_dir, report))}">report</a>' if report.is_file() else ""
        links.append(f'<tr><th>{label}</th><td class="mono">{esc(side)}</td><td>{target}</td></tr>')
    parts = [
        "<header><h1>traceanalyzer diff</h1>",
        f'<div class="sub">generated {esc(generated)}</div></header>',
        f'<div class="tablewrap"><table>{"".join(links)}</table></div>',
        f"<p>{counts}</p>",
        *(f'<p class="note">{esc(note)}</p>' for note in diff.rank_notes),
        overview_diff_html(diff.overview),
        phase_diff_html(diff.phases),
        explain_html(diff.phases, waterfalls(diff.phases) if svgs is None else svgs),
        settings_html(diff.settings_changed),
        "<h2>Findings</h2>",
    ]
    if not diff.changes:
        parts.append("<p>No findings in either run.</p>")
    parts += [_change_section(c) for c in diff.changes]
    parts.append("<h2>Key figures per rank</h2>")
    rows = [(d.ranks[0], d.label, *_sides(d), change_cell(d.rel, d.better)) for d in diff.figures]
    if rows:
        parts.append(
            table(
                ("rank", "figure", "base", "target", "change"), rows, numeric=(0, 2, 3, 4), raw=(4,)
            )
        )
        parts.append(
            '<p class="small muted">Each rule defines its key figures (see its documentation: '
            "<code>traceanalyzer rules explain RULE</code>); they are computed with the "
            "parameters each run used.</p>"
        )
    else:
        parts.append("<p>No key figure could be computed on either side.</p>")
    return page("traceanalyzer diff", "".join(parts))


def render_diff_markdown(diff: DiffResult, plot_files: Mapping[str, str]) -> str:
    """diff.md: what changed, to paste into an issue; ``plot_files``: phase -> its waterfall's
    path from diff.md."""
    lines = [
        "# traceanalyzer diff",
        "",
        "- " + md_text(f"base: `{diff.base}`"),
        "- " + md_text(f"target: `{diff.target}`"),
        f"- findings: {_counts(diff)}",
        *(f"- note: {md_text(note)}" for note in diff.rank_notes),
        "",
    ]
    if diff.changes:
        rows = [
            [c.status, c.name, ", ".join(map(str, c.current.get("ranks") or [])),
             c.current.get("title", "")]
            for c in diff.changes
        ]  # fmt: skip
        lines += ["## Findings", "", *md_table(["status", "rule", "ranks", "title"], rows), ""]
    if diff.phases.rows:
        rows = [
            [r.phase, f"{r.base.steps} -> {r.target.steps}",
             f"{fmt.duration(r.base.p50_ns)} -> {fmt.duration(r.target.p50_ns)}",
             f"{fmt.duration(r.base.mean_ns)} -> {fmt.duration(r.target.mean_ns)}", r.verdict]
            for r in diff.phases.rows
        ]  # fmt: skip
        headers = ["phase", "iterations", "median", "mean", "verdict"]
        lines += ["## By phase", "", *md_table(headers, rows), ""]
        summary = diff.phases.summary()
        lines += [md_text(summary), ""] if summary else []
    lines += explain_markdown(diff.phases, plot_files)
    lines += settings_markdown(diff.settings_changed)
    return "\n".join(lines)
