"""``OUT/report.html``: the run summary, one section per finding with its plot, rule status."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from traceanalyzer.engine.findings import compress_ranks
from traceanalyzer.overview.model import FindingCost
from traceanalyzer.recipes.bench import COLUMNS as BENCH_COLUMNS
from traceanalyzer.report import fmt
from traceanalyzer.report.htmlkit import (
    bullets,
    chip,
    details,
    esc,
    inline,
    page,
    paragraphs,
    table,
)
from traceanalyzer.report.inputs import NO_VIEW, TRACE_FILE, FindingView, ReportData
from traceanalyzer.report.overview_html import overview_section
from traceanalyzer.report.overview_text import cost_text
from traceanalyzer.report.plots import embed
from traceanalyzer.report.summary import RunSummary

if TYPE_CHECKING:
    from traceanalyzer.recipes.bench import BenchResult

EVIDENCE_SHOWN = 50  # rows in the collapsible table; findings.json keeps them all


def finding_anchor(finding: Mapping[str, Any]) -> str:
    return f"f-{finding.get('fingerprint', '')}"


def render_html(
    report: ReportData, plots: Mapping[str, bytes] | None = None, *, now: datetime | None = None
) -> str:
    """The whole page. ``plots`` maps a finding fingerprint (or an overview figure's file name)
    to its figure file (SVG, inlined, or PNG)."""
    from traceanalyzer.overview.document import by_cost

    plots = plots or {}
    doc = report.findings
    summary = report.summary
    costs = report.costs
    findings = by_cost(doc.get("findings", []), costs)
    generated = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<header>",
        f"<h1>traceanalyzer report: {esc(report.title)}</h1>",
        f'<div class="sub">generated {esc(generated)} by traceanalyzer {esc(report.version)} '
        f'&middot; output <span class="mono">{esc(report.out)}</span></div>',
        "</header>",
        _cards(doc, summary),
        _bench(report.bench),
        overview_section(report.overview, plots),
        _overview(findings, costs),
    ]
    parts += [
        _finding_section(
            f,
            plots.get(f.get("fingerprint", "")),
            costs.get(f.get("fingerprint", "")),
            report.view(f),
        )
        for f in findings
    ]
    parts += [_rules_section(doc), _errors_section(doc), _run_section(summary), _footer()]
    return page(f"traceanalyzer: {report.title}", "".join(parts))


def _cards(doc: Mapping[str, Any], summary: RunSummary) -> str:
    counts = doc.get("summary", {}).get("by_severity", {})
    sev = " ".join(chip(f"{counts[s]} {s}", s) for s in fmt.SEVERITY_ORDER if counts.get(s))
    rules = doc.get("rules", [])
    evaluated = sum(r.get("status") in ("fired", "clean", "inconclusive") for r in rules)
    cards = [
        ("findings", str(len(doc.get("findings", []))), sev or chip("none", "clean")),
        ("ranks", str(len(summary.ranks)), esc(compress_ranks(summary.ranks))),
        ("sessions", str(len(summary.sessions)), ""),
        ("rules evaluated", f"{evaluated}/{len(rules)}", ""),
        (
            "formats",
            esc(", ".join(summary.versions.get("generation", [])) or "?"),
            esc(", ".join(summary.versions.get("profiler_level", []))),
        ),
    ]
    html_cards = "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{v}</div>'
        f'<div class="small muted">{extra}</div></div>'
        for k, v, extra in cards
    )
    return f'<section class="cards">{html_cards}</section>'


def _bench(bench: list[BenchResult]) -> str:
    if not bench:
        return ""

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f} ms"

    rows = [
        (
            r.arm,
            "-" if r.completed is None else r.completed,
            *(cell(r.get(m, s)) for _, m, s in BENCH_COLUMNS),
        )
        for r in bench
    ]
    headers = ("arm", "completed", *(name for name, _, _ in BENCH_COLUMNS))
    return (
        "<h2>Serving benchmark (vllm bench)</h2>"
        + table(headers, rows, numeric=(1, 2, 3, 4, 5))
        + '<p class="small muted">From <code>bench*.json</code> found next to the traces.</p>'
    )


def _overview(findings: list[Mapping[str, Any]], costs: Mapping[str, FindingCost]) -> str:
    if not findings:
        return "<h2>Findings</h2><p>No findings: every evaluated rule is silent.</p>"
    rows = [
        (
            chip(f["severity"], f["severity"]),
            f'<a href="#{esc(finding_anchor(f))}">{esc(f["name"])}</a>',
            esc(fmt.where(f)),
            esc(cost_text(costs.get(f.get("fingerprint", "")))),
            inline(f.get("title")),
        )
        for f in findings
    ]
    return "<h2>Findings</h2>" + table(
        ("severity", "rule", "ranks", "cost", "what"), rows, raw=(0, 1, 2, 3, 4)
    )


def _metrics(metrics: Mapping[str, Any], view: FindingView) -> str:
    """Metric cards, each in its unit; a point in time reads from its session's start, the
    trace clock on hover."""

    def value(k: str, v: Any) -> str:
        start = view.session_starts.get(k)
        shown = fmt.metric(v, view.units.get(k, ""))
        if start is None:
            return f'<div class="v">{esc(shown)}</div>'
        return (
            f'<div class="v" title="{esc(shown)} on the trace clock">'
            f"{esc(fmt.since(v, start))} <span class='small muted'>from session start</span></div>"
        )

    items = "".join(
        f'<div class="metric"><div class="k">{esc(fmt.label(k))}</div>{value(k, v)}</div>'
        for k, v in metrics.items()
    )
    return f'<div class="metrics">{items}</div>' if items else ""


def evidence_rows(finding: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    rows = []
    for e in (finding.get("evidence") or [])[:EVIDENCE_SHOWN]:
        start = e.get("start_ns")
        rows.append(
            (
                e.get("rank"),
                e.get("name"),
                "" if e.get("stream") is None else e["stream"],
                "" if start is None else fmt.trace_us(start),
                fmt.duration(e.get("dur_ns")) if e.get("dur_ns") is not None else "",
                e.get("detail") or "",
                e.get("session"),
            )
        )
    return rows


def _finding_section(
    f: Mapping[str, Any],
    plot: bytes | None,
    cost: FindingCost | None = None,
    view: FindingView = NO_VIEW,
) -> str:
    sev = f.get("severity", "info")
    parts = [
        f'<section class="finding {esc(sev)}" id="{esc(finding_anchor(f))}">',
        f"<h3>{inline(f.get('title'))}</h3>",
        '<div class="meta">',
        chip(sev, sev),
        chip(f"{f.get('rule')} {f.get('name')}"),
        f"<span>{esc(fmt.where(f))}</span>",
        chip(cost_text(cost)) if cost_text(cost) else "",
        f'<span class="mono small">fingerprint {esc(f.get("fingerprint"))}</span>',
        "</div>",
        *(
            f'<p class="caveat"><b>Caveat.</b> {inline(caveat)}</p>'
            for caveat in f.get("caveats") or []
        ),
        f'<div class="message">{paragraphs(f.get("message"))}</div>',
        _metrics(f.get("metrics") or {}, view),
    ]
    if plot:
        alt = f"plot for {f.get('name')}"
        parts.append(
            f"<figure>{embed(plot, alt)}<figcaption>{esc(view.caption)}</figcaption></figure>"
        )
    parts.append(f'<div class="fix"><b>Fix.</b> {inline(f.get("fix"))}</div>')
    evidence = f.get("evidence") or []
    if evidence:
        more = len(evidence) - EVIDENCE_SHOWN
        body = table(
            ("rank", "name", "stream", "start (µs, trace clock)", "duration", "detail", "session"),
            evidence_rows(f),
            numeric=(0, 2, 3, 4),
            names=(1,),
        )
        if more > 0:
            body += f'<p class="small muted">{more} more rows in findings.json.</p>'
        body += (
            '<p class="small muted">Start times are the trace\'s own clock: search them in '
            "Perfetto, or open the rank's timeline with the findings on it "
            "(<code>traceanalyzer annotate OUT</code>, for Text and Db sessions alike).</p>"
        )
        parts.append(details(f"Evidence ({len(evidence)} rows)", body))
    occurrences = f.get("occurrences") or []
    if len(occurrences) > 1:
        rows = [
            (
                ", ".join(map(str, o.get("ranks", []))),
                chip(o.get("severity"), o.get("severity", "plain")),
                inline(o.get("title")),
            )
            for o in occurrences
        ]
        per_rank = table(("ranks", "severity", "title"), rows, raw=(1, 2))
        parts.append(details(f"Per rank ({len(occurrences)})", per_rank))
    parts.append("</section>")
    return "".join(parts)


def _rules_section(doc: Mapping[str, Any]) -> str:
    rules = doc.get("rules", [])
    if not rules:
        return ""
    rows = []
    for r in rules:
        status = r.get("status", "")
        why = r.get("reason") or ""
        notes = r.get("notes") or []
        note_html = ""
        if notes:
            note_html = details(
                f"{len(notes)} note(s)", bullets(inline(n.get("text")) for n in notes)
            )
        rows.append(
            (
                esc(r.get("rule")),
                esc(r.get("name")),
                chip(status.replace("_", " "), status),
                str(r.get("findings", 0)),
                inline(why) + note_html,
            )
        )
    lead = "".join(
        f"<p><b>{heading}:</b></p>"
        + bullets(f"<b>{esc(r.get('name'))}</b>: {inline(r.get('reason'))}" for r in listed)
        for heading, listed in fmt.undecided(doc)
    )
    headers = ("id", "rule", "status", "findings", "why / notes")
    return "<h2>Rules</h2>" + lead + table(headers, rows, numeric=(3,), raw=(0, 1, 2, 3, 4))


def _errors_section(doc: Mapping[str, Any]) -> str:
    errors = doc.get("errors") or []
    if not errors:
        return ""
    items = "".join(
        details(
            f"{e.get('name') or e.get('rule')}: {e.get('error')}",
            f"<pre>{esc(e.get('traceback'))}</pre>",
        )
        for e in errors
    )
    return f"<h2>Rule errors</h2><p>These rules failed; the others ran.</p>{items}"


def _versions(s: Mapping[str, Any]) -> str:
    said = [
        f"{k} {s[c]}"
        for k, c in (("torch_npu", "torch_npu_version"), ("CANN", "cann_version"))
        if s.get(c)
    ]
    return ", ".join(said) or "not recorded"


def _span(s: Mapping[str, Any]) -> str:
    return (
        fmt.duration(s["end_ns"] - s["start_ns"]) if s.get("start_ns") and s.get("end_ns") else ""
    )


# the run table's columns: the header, and a session's cell (RunSummary.sessions)
RUN_COLUMNS: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("rank", lambda s: s.get("rank")),
    ("session", lambda s: s.get("session")),
    ("ingest", lambda s: s.get("status", "")),
    ("format", lambda s: s.get("generation") or "?"),
    ("level", lambda s: s.get("profiler_level") or "?"),
    ("versions", _versions),
    ("span", _span),
    ("missing files", lambda s: ", ".join(s.get("missing_files") or [])),
    ("incomplete files (data lost)", lambda s: ", ".join(s.get("incomplete_files") or [])),
)


def _run_section(summary: RunSummary) -> str:
    rows = [[cell(s) for _, cell in RUN_COLUMNS] for s in summary.sessions]
    body = "<h2>Run</h2>" + table([h for h, _ in RUN_COLUMNS], rows, numeric=(0, 6))
    versions = "; ".join(
        f"{k.replace('_', ' ')}: {', '.join(v)}" for k, v in summary.versions.items()
    )
    if versions:
        body += f'<p class="small muted">{esc(versions)}</p>'
    skipped = summary.skipped
    if skipped:
        body += "<p><b>Skipped or incomplete:</b></p>" + bullets(map(esc, skipped))
    else:
        body += '<p class="small muted">Nothing was skipped: every session and file was read.</p>'
    return body


def _footer() -> str:
    files = ("findings.json", "findings.sarif", "annotations.json", "report.md", "ingest.json")
    links = " &middot; ".join(f'<a href="{esc(name)}">{esc(name)}</a>' for name in files)
    return (
        f"<footer>Files in this output: {links}.<br>"
        "<code>traceanalyzer annotate OUT</code> (or <code>run --annotate</code>) writes each "
        f"rank session's timeline with the findings on their own tracks, "
        f"<code>annotated/rank=R/&lt;session&gt;/{TRACE_FILE.name}</code>, for Text and Db "
        "sessions alike: open it in Perfetto or MindStudio Insight.</footer>"
    )
