"""``OUT/findings.sarif``: SARIF 2.1.0 so CI systems and code-scanning UIs can list findings.

- ``tool.driver.rules`` documents every rule that ran (summary, docstring as help markdown,
  default level from its severity).
- Each finding is one result; its locations are the ``trace_view.json`` of every affected rank
  session, relative to ``%SRCROOT%`` (the input root, given as an absolute ``file://`` URI in
  ``originalUriBaseIds``) so the log stays valid when the folder moves.
- ``partialFingerprints`` carries the finding fingerprint: the same problem keeps its identity
  across runs, which is what code-scanning UIs use to track alerts.
- Rules not evaluated and rule errors are ``toolExecutionNotifications``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from traceanalyzer.report import fmt
from traceanalyzer.report.inputs import TRACE_FILE, ReportData
from traceanalyzer.report.mdsafe import md_inline, md_lines

if TYPE_CHECKING:
    from traceanalyzer.engine import Rule

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
FINGERPRINT_KEY = "traceanalyzer/v1"
ROOT_ID = "%SRCROOT%"
MAX_LOCATIONS = 20  # per result; all ranks are still listed in properties


def _first_section(doc: str) -> str:
    """The text of the docstring's first ``##`` section (What it detects)."""
    body: list[str] = []
    for line in doc.splitlines():
        if line.startswith("## "):
            if body:
                break
            continue
        body.append(line)
    return " ".join(x.strip() for x in body if x.strip())


def _descriptor(rule_id: str, status: dict[str, Any], doc: Rule | None) -> dict[str, Any]:
    severity = (doc.severity if doc else None) or status.get("severity") or "warning"
    name = (doc.name if doc else None) or status.get("name") or rule_id
    out: dict[str, Any] = {
        "id": rule_id,
        "name": name,
        "shortDescription": {"text": (doc.summary if doc else "") or name},
        "defaultConfiguration": {"level": LEVELS.get(severity, "warning")},
        "properties": {"tags": ["performance", "ascend", "torch_npu"]},
    }
    if doc and doc.doc:
        out["fullDescription"] = {"text": _first_section(doc.doc) or doc.summary}
        help_md = f"**{doc.summary}**\n\n{doc.doc.strip()}"
        if doc.fix:
            help_md += f"\n\n**Fix:** {doc.fix}"
        out["help"] = {"text": doc.doc.strip(), "markdown": help_md}
    return out


def _location(trace: Path | None, root: Path | None, rank: int, session: str) -> dict[str, Any]:
    if trace is None:
        artifact: dict[str, Any] = {"uri": quote(f"{session}/{TRACE_FILE.as_posix()}")}
    elif root is not None:
        try:
            rel = Path(os.path.relpath(trace, root)).as_posix()
            artifact = {"uri": quote(rel), "uriBaseId": ROOT_ID}  # a URI: percent-encoded
        except ValueError:
            artifact = {"uri": trace.resolve().as_uri()}
    else:
        artifact = {"uri": trace.resolve().as_uri()}
    return {
        "physicalLocation": {"artifactLocation": artifact},
        "logicalLocations": [
            {
                "name": f"rank {rank}",
                "fullyQualifiedName": f"rank{rank}/{session}",
                "kind": "module",
            }
        ],
        "message": {"text": f"rank {rank}, session {session}"},
    }


def _markdown(message: str, finding: dict[str, Any]) -> str:
    """The result's markdown: trace names in it are made inert (no HTML, links or images)."""
    body = "  \n".join(md_lines(finding.get("message")))
    return f"**{md_inline(message)}**\n\n{body}\n\n**Fix:** {md_inline(finding.get('fix'))}"


def _rank_sessions(report: ReportData, finding: dict[str, Any]) -> list[tuple[int, str]]:
    """(rank, session) pairs the finding concerns, from evidence then the session list."""
    sessions = set(finding.get("sessions") or [])
    ranks = set(finding.get("ranks") or [])
    pairs = {(int(r), s) for (r, s) in report.trace_files if r in ranks and s in sessions}
    pairs |= {(int(e["rank"]), e["session"]) for e in finding.get("evidence") or []}
    return sorted(pairs)


def build_sarif(report: ReportData) -> dict[str, Any]:
    """The SARIF log as a dict (``json.dumps`` it)."""
    doc = report.findings
    root = report.input_root
    statuses = {r["rule"]: r for r in doc.get("rules", [])}
    # the rules that ran, then any other rule a finding names
    rule_ids = list(dict.fromkeys([*statuses, *(f["rule"] for f in doc.get("findings", []))]))
    index = {rid: i for i, rid in enumerate(rule_ids)}
    descriptors = [
        _descriptor(rid, statuses.get(rid, {}), report.rules.get(rid)) for rid in rule_ids
    ]

    results = []
    for f in doc.get("findings", []):
        pairs = _rank_sessions(report, f)
        message = f"{f.get('name')} on {f.get('ranks_label')}: {f.get('title')}"
        results.append(
            {
                "ruleId": f["rule"],
                "ruleIndex": index[f["rule"]],
                "level": LEVELS.get(f.get("severity"), "warning"),
                "message": {"text": message, "markdown": _markdown(message, f)},
                "locations": [
                    _location(report.trace_files.get((r, s)), root, r, s)
                    for r, s in pairs[:MAX_LOCATIONS]
                ],
                "partialFingerprints": {FINGERPRINT_KEY: f["fingerprint"]},
                "properties": {
                    "ranks": f.get("ranks"),
                    "totalRanks": f.get("total_ranks"),
                    "phases": f.get("phases") or [],
                    "metrics": f.get("metrics"),
                    "location": f.get("location"),
                },
            }
        )

    notifications = []
    for status in doc.get("rules", []):
        if status.get("status") in fmt.UNDECIDED:
            verdict = fmt.UNDECIDED[status["status"]].lower()
            notifications.append(
                {
                    "level": "note",
                    "message": {"text": f"{status.get('name')} {verdict}: {status.get('reason')}"},
                    "associatedRule": {"id": status["rule"], "index": index[status["rule"]]},
                }
            )
    for error in doc.get("errors") or []:
        note: dict[str, Any] = {
            "level": "error",
            "message": {
                "text": f"{error.get('name') or error.get('rule')} failed: {error.get('error')}"
            },
        }
        if error.get("rule") in index:
            note["associatedRule"] = {"id": error["rule"], "index": index[error["rule"]]}
        notifications.append(note)

    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "traceanalyzer",
                "version": report.version,
                "semanticVersion": report.version,
                "rules": descriptors,
            }
        },
        "invocations": [
            {
                "executionSuccessful": not doc.get("errors"),
                "toolExecutionNotifications": notifications,
            }
        ],
        "results": results,
    }
    if root is not None:
        run["originalUriBaseIds"] = {ROOT_ID: {"uri": root.resolve().as_uri() + "/"}}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}
