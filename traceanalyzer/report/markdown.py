"""``OUT/report.md``: the key numbers of a run, to paste into an issue or a PR comment.

Trace-derived text is made inert for Markdown renderers that allow inline HTML (GitHub, GitCode)
by :mod:`traceanalyzer.report.mdsafe`, and ``|`` is escaped inside tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceanalyzer.overview.model import FindingCost
from traceanalyzer.recipes.bench import COLUMNS as BENCH_COLUMNS
from traceanalyzer.report import fmt
from traceanalyzer.report.inputs import FindingView, ReportData
from traceanalyzer.report.mdsafe import md_inline, md_lines
from traceanalyzer.report.overview_text import cost_text, overview_markdown
from traceanalyzer.text import count

KEY_METRICS = 8  # metrics listed per finding; the HTML and findings.json have all of them


def md_text(value: Any) -> str:
    return md_inline(value or "")


def md_cell(value: Any) -> str:
    return md_inline(value or "", line_start=False).replace("|", "\\|")


def md_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(report: ReportData, plot_files: Mapping[str, str] | None = None) -> str:
    """``plot_files`` maps a finding fingerprint (or an overview figure's name) to its file's path
    relative to OUT."""
    from traceanalyzer.overview.document import by_cost

    plot_files = plot_files or {}
    doc = report.findings
    summary = report.summary
    costs = report.costs
    findings = by_cost(doc.get("findings", []), costs)
    lines = [f"# traceanalyzer: {md_text(report.title)}", ""]
    versions = "; ".join(
        f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in summary.versions.items()
    )
    lines.append(
        f"{count(len(summary.ranks), 'rank')}, {count(len(summary.sessions), 'session')}"
        + (f"; {md_text(versions)}" if versions else "")
        + f"; traceanalyzer {report.version}."
    )
    lines.append("")
    if report.bench:
        headers = ["arm", *(f"{name} (ms)" for name, _, _ in BENCH_COLUMNS)]
        rows = [[r.arm, *(_ms(r.get(m, s)) for _, m, s in BENCH_COLUMNS)] for r in report.bench]
        lines += ["## Serving benchmark", "", *md_table(headers, rows), ""]
    lines += overview_markdown(report.overview, md_table, plot_files)
    lines += ["## Findings", ""]
    if not findings:
        lines += ["No findings.", ""]
    else:
        lines += md_table(
            ["severity", "rule", "ranks", "cost", "what"],
            [
                [
                    f["severity"],
                    f["name"],
                    fmt.where(f),
                    cost_text(costs.get(f.get("fingerprint", ""))),
                    f.get("title"),
                ]
                for f in findings
            ],
        )
        lines.append("")
    for f in findings:
        plot = plot_files.get(f.get("fingerprint", ""))
        view = report.view(f)
        lines += _finding(f, plot, costs, view)
    for heading, listed in fmt.undecided(doc):
        lines += _bullets(heading, [_named(r["name"], r.get("reason")) for r in listed])
    errors = [
        _named(e.get("name") or e.get("rule"), e.get("error")) for e in doc.get("errors") or []
    ]
    lines += _bullets("Rule errors", errors)
    lines += _bullets("Skipped or incomplete input", [md_text(s) for s in summary.skipped])
    return "\n".join(lines).rstrip() + "\n"


def _bullets(heading: str, items: list[str]) -> list[str]:
    """A section of ``items`` (none without them)."""
    return [f"## {heading}", "", *(f"- {item}" for item in items), ""] if items else []


def _named(name: Any, text: Any) -> str:
    return f"**{md_text(name)}**: {md_text(text)}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _metric(key: str, value: Any, view: FindingView) -> str:
    """A metric in its unit; a point in time from its session's start, the trace clock after."""
    start, shown = view.session_starts.get(key), fmt.metric(value, view.units.get(key, ""))
    return shown if start is None else f"{fmt.since(value, start)} from session start ({shown})"


def _finding(
    f: Mapping[str, Any],
    plot: str | None,
    costs: Mapping[str, FindingCost],
    view: FindingView,
) -> list[str]:
    cost = cost_text(costs.get(f.get("fingerprint", "")))
    lines = [
        f"### [{f['severity']}] {md_text(f['name'])} on {md_text(fmt.where(f))}",
        "",
        md_text(f.get("title")) + (f" — {cost}" if cost else ""),
        "",
        *(f"> **Caveat:** {md_text(caveat)}" for caveat in f.get("caveats") or []),
    ]
    lines += [""] if f.get("caveats") else []
    metrics = list((f.get("metrics") or {}).items())[:KEY_METRICS]
    if metrics:
        lines += md_table(
            ["metric", "value"],
            [[fmt.label(k), _metric(k, v, view)] for k, v in metrics],
        )
        lines.append("")
    if plot:
        lines += [f"![{md_text(f['name'])}]({plot})", ""]
        lines += [f"*{md_text(view.caption)}*", ""] if view.caption else []
    lines += ["<details><summary>Details</summary>", ""]
    lines += [line + "  " for line in md_lines(f.get("message"))]
    lines += ["", "</details>", "", f"**Fix:** {md_text(f.get('fix'))}", ""]
    lines.append(f"<sub>fingerprint `{f.get('fingerprint')}`</sub>")
    lines.append("")
    return lines
