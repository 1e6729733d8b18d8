"""Write every report of a run into OUT, each atomically (temporary file, then rename).

The reports are rendered from one :class:`~traceanalyzer.report.inputs.ReportData`, prepared
once (the findings' figures drawn in it). A report that fails to render must not cost the
others or the findings: each writer is isolated, and failures come back as ``errors`` for
``run`` to print.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from traceanalyzer.interrupts import contained
from traceanalyzer.report.annotations import build_annotations
from traceanalyzer.report.html_report import render_html
from traceanalyzer.report.inputs import ReportData, ReportInputs
from traceanalyzer.report.markdown import render_markdown
from traceanalyzer.report.overview_html import overview_figures
from traceanalyzer.report.plots import extension
from traceanalyzer.report.sarif import build_sarif
from traceanalyzer.store import write_atomic_bytes, write_atomic_text

if TYPE_CHECKING:
    from traceanalyzer.engine import Rule, RunResult

HTML = "report.html"
MARKDOWN = "report.md"
SARIF = "findings.sarif"
ANNOTATIONS = "annotations.json"
PLOTS_DIR = "plots"


@dataclass
class ReportFiles:
    """What :func:`write_reports` wrote, and what failed (name -> error text)."""

    written: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    unwritable: list[str] = field(default_factory=list)  # rendered, but the write failed
    seconds: float = 0.0

    @property
    def html(self) -> Path | None:
        return self.written.get(HTML)


def write_reports(
    out: str | os.PathLike[str],
    *,
    result: RunResult | None = None,
    rules: Iterable[Rule] | None = None,
    input_root: str | os.PathLike[str] | None = None,
    report: ReportData | None = None,
) -> ReportFiles:
    """Write report.html, report.md (+ plots/), findings.sarif and annotations.json into ``out``
    (from ``report``, else from OUT's findings, ingest summary and store)."""
    started = time.perf_counter()
    out = Path(out)
    files = ReportFiles()
    if report is None:
        inputs = ReportInputs.load(out, result=result, rules=rules, input_root=input_root)
        report = inputs.prepare()
    files.errors = dict(report.figure_errors)
    plots = dict(report.figures)
    plot_files: dict[str, str] = {}
    by_fp = {f["fingerprint"]: f for f in report.findings.get("findings", [])}
    for fp, data in plots.items():
        rel = f"{PLOTS_DIR}/{by_fp[fp]['name']}-{fp}.{extension(data)}"
        write_atomic_bytes(out / rel, data)
        plot_files[fp] = rel
    overview_files, overview_errors = overview_figures(report.overview)  # keyed by file name
    files.errors |= overview_errors
    for name, data in overview_files.items():
        write_atomic_bytes(out / PLOTS_DIR / name, data)
        plot_files[name] = f"{PLOTS_DIR}/{name}"
    plots |= overview_files

    def attempt(name: str, render) -> None:  # noqa: ANN001 - a zero-argument renderer
        try:
            write_atomic_text(out / name, render())
            files.written[name] = out / name
        except OSError as exc:  # the output's fault (disk full, permissions), not the report's
            files.errors[name] = f"cannot write {out / name}: {exc.strerror or exc}"
            files.unwritable.append(name)
        except BaseException as exc:  # e.g. a rule's failed marks: they cost their report only
            if not contained(exc):
                raise
            files.errors[name] = traceback.format_exc(limit=3).strip().splitlines()[-1]

    attempt(HTML, lambda: render_html(report, plots))
    attempt(MARKDOWN, lambda: render_markdown(report, plot_files))
    attempt(SARIF, lambda: json.dumps(build_sarif(report), indent=1) + "\n")
    attempt(ANNOTATIONS, lambda: json.dumps(build_annotations(report), indent=None) + "\n")
    if HTML in files.written and MARKDOWN in files.written:  # no report links an old figure now
        _prune_figures(out / PLOTS_DIR, keep=set(plot_files.values()))
    files.seconds = time.perf_counter() - started
    return files


# The names of the figures a run writes: a finding's (its rule's name, its fingerprint), the
# overview's. Only those are pruned: any other file in plots/ is not the run's to remove.
_FIGURE_NAME = re.compile(r"(?:.+-[0-9a-f]{16}\.(?:svg|png)|overview-[a-z]+\.svg)")


def _prune_figures(plots_dir: Path, keep: set[str]) -> None:
    """Remove the figures an earlier run left in ``plots/`` (a finding that no longer fires, a
    figure now drawn as SVG instead of PNG): the directory then holds what the reports show."""
    try:
        stale = [
            p
            for p in plots_dir.iterdir()
            if _FIGURE_NAME.fullmatch(p.name) and f"{PLOTS_DIR}/{p.name}" not in keep
        ]
    except OSError:  # no plots/ yet, or unreadable: nothing to prune
        return
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink()
