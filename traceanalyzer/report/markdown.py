"""``OUT/report.md``: the key numbers of a run, to paste into an issue or a PR comment.

Trace-derived text is made inert for Markdown renderers that allow inline HTML (GitHub, GitCode)
by :mod:`traceanalyzer.report.mdsafe`, and ``|`` is escaped inside tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceanalyzer.report import fmt
from traceanalyzer.report.inputs import ReportInputs
from traceanalyzer.report.mdsafe import md_inline, md_lines
from traceanalyzer.report.summary import run_summary

KEY_METRICS = 8  # metrics listed per finding; the HTML and findings.json have all of them


def md_text(value: Any) -> str:
    return md_inline(value or "")


def md_cell(value: Any) -> str:
    return md_text(value).replace("|", "\\|")


def md_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(inputs: ReportInputs, plot_files: Mapping[str, str] | None = None) -> str:
    """``plot_files`` maps a finding fingerprint to its PNG path relative to OUT."""
    plot_files = plot_files or {}
    doc = inputs.findings
    summary = run_summary(inputs)
    findings = doc.get("findings", [])
    lines = [f"# traceanalyzer: {md_text(inputs.title)}", ""]
    versions = "; ".join(
        f"{k.replace('_', ' ')} {', '.join(v)}" for k, v in summary.versions.items()
    )
    lines.append(
        f"{len(summary.ranks)} rank(s), {len(summary.sessions)} session(s)"
        + (f"; {md_text(versions)}" if versions else "")
        + f"; traceanalyzer {inputs.version}."
    )
    lines.append("")
    if inputs.bench:
        lines += ["## Serving benchmark", ""]
        lines += md_table(
            ["arm", "mean TTFT (ms)", "p99 TTFT (ms)", "mean TPOT (ms)", "p99 TPOT (ms)"],
            [
                [
                    r.arm,
                    *(
                        _ms(r.get(m, s))
                        for m, s in (
                            ("ttft", "mean"),
                            ("ttft", "p99"),
                            ("tpot", "mean"),
                            ("tpot", "p99"),
                        )
                    ),
                ]
                for r in inputs.bench
            ],
        )
        lines.append("")
    lines += ["## Findings", ""]
    if not findings:
        lines += ["No findings.", ""]
    else:
        lines += md_table(
            ["severity", "rule", "ranks", "what"],
            [[f["severity"], f["name"], f.get("ranks_label"), f.get("title")] for f in findings],
        )
        lines.append("")
    for f in findings:
        lines += _finding(f, plot_files.get(f.get("fingerprint", "")))
    skipped = [r for r in doc.get("rules", []) if r.get("status") == "not_evaluated"]
    if skipped:
        lines += ["## Not evaluated", ""]
        lines += [f"- **{md_text(r['name'])}**: {md_text(r.get('reason'))}" for r in skipped]
        lines.append("")
    errors = doc.get("errors") or []
    if errors:
        lines += ["## Rule errors", ""]
        lines += [
            f"- **{md_text(e.get('name') or e.get('rule'))}**: {md_text(e.get('error'))}"
            for e in errors
        ]
        lines.append("")
    if summary.skipped:
        lines += ["## Skipped or incomplete input", ""]
        lines += [f"- {md_text(s)}" for s in summary.skipped]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _finding(f: Mapping[str, Any], plot: str | None) -> list[str]:
    lines = [
        f"### [{f['severity']}] {md_text(f['name'])} on {md_text(f.get('ranks_label'))}",
        "",
        md_text(f.get("title")),
        "",
    ]
    metrics = list((f.get("metrics") or {}).items())[:KEY_METRICS]
    if metrics:
        lines += md_table(
            ["metric", "value"], [[fmt.label(k), fmt.metric(k, v)] for k, v in metrics]
        )
        lines.append("")
    if plot:
        lines += [f"![{md_text(f['name'])}]({plot})", ""]
    lines += ["<details><summary>Details</summary>", ""]
    lines += [line + "  " for line in md_lines(f.get("message"))]
    lines += ["", "</details>", "", f"**Fix:** {md_text(f.get('fix'))}", ""]
    lines.append(f"<sub>fingerprint `{f.get('fingerprint')}`</sub>")
    lines.append("")
    return lines
