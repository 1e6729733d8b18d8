"""report.html / report.md: one section and the right plot per finding, run summary, escaping."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_support import SICK, findings, run_sample

from traceanalyzer.engine.loader import load_rules
from traceanalyzer.kit.testing import us
from traceanalyzer.report import ReportInputs, fmt, write_reports

SVG = "{http://www.w3.org/2000/svg}"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):  # noqa: ANN001
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):  # noqa: ANN001
        self.text.append(data)


def data_groups(svg: ET.Element) -> list[ET.Element]:
    """Each axes' data of a chart (clipped to its box)."""
    return [g for g in svg.iter(f"{SVG}g") if g.get("class") == "data"]


def parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    return p


@pytest.mark.parametrize("sample", sorted(SICK))
def test_sick_sample_has_section_and_plot(sample: str) -> None:
    out = run_sample(sample)
    html = (out / "report.html").read_text("utf-8")
    doc = parse(html)
    fired = findings(out)
    assert [f["name"] for f in fired] == [SICK[sample]]
    for f in fired:
        section = [
            a for t, a in doc.tags if t == "section" and a.get("id") == f"f-{f['fingerprint']}"
        ]
        assert section, f"no section for {f['name']}"
    # the findings' figures are inline SVG charts, no image
    assert not [a for t, a in doc.tags if t == "img"]
    assert len([a for t, a in doc.tags if t == "svg" and a.get("class") == "chart"]) == len(fired)
    assert html.count('<figure class="ov-timeline"><svg ') == 1  # the overview's timeline, inline
    # self-contained: nothing is fetched from anywhere
    for tag, attrs in doc.tags:
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not re.match(r"^(https?:)?//", value), (tag, value)
    assert "<link" not in html
    # the markdown report and its plot files
    md = (out / "report.md").read_text("utf-8")
    assert SICK[sample] in md
    for f in fired:
        plot = out / "plots" / f"{f['name']}-{f['fingerprint']}.svg"
        assert ET.parse(plot).getroot().tag == f"{SVG}svg"
        assert f"plots/{plot.name}" in md


def test_reports_written_again_leave_no_stale_figure(tmp_path: Path) -> None:
    """plots/ holds what the reports show: a figure of an earlier run (a finding that no longer
    fires, a PNG now drawn as SVG) is removed; anything that is not a figure is left alone."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(run_sample("capture_growth_2rank"), out)
    plots = out / "plots"
    current = sorted(p.name for p in plots.iterdir())
    (plots / "capture-memcpy-growth-0123456789abcdef.png").write_bytes(b"\x89PNG old")
    (plots / "gone-rule-fedcba9876543210.svg").write_text("<svg/>")
    (plots / "notes.txt").write_text("mine")
    files = write_reports(out)
    assert not files.errors, files.errors
    assert sorted(p.name for p in plots.iterdir()) == sorted([*current, "notes.txt"])


def test_plot_matches_rule() -> None:
    drawn = {r.name for r in load_rules().rules if r.presentation.figure is not None}
    assert {"capture-memcpy-growth", "store-transfer-stall"} <= drawn
    out = run_sample("capture_growth_2rank")
    (f,) = findings(out)
    # one line per rank, drawn from every rank's own series (kept in occurrences)
    assert sorted(o["ranks"][0] for o in f["occurrences"] if o.get("series")) == [0, 1]
    svg = ET.fromstring(ReportInputs.load(out).figure(f).to_svg())
    left, right = data_groups(svg)
    for axes in (left, right):
        lines = [p for p in axes.iter(f"{SVG}path") if p.get("stroke-linejoin") == "round"]
        assert len(lines) == 2  # one per rank
    markers = [c for c in left.iter(f"{SVG}circle") if c.get("fill") == "#2563eb"]
    assert len(markers) == len(f["occurrences"][0]["series"]["memcpy_calls"])


def test_stall_gantt_highlights_waits_per_stream() -> None:
    out = run_sample("store_stall_2rank_rank1_sick")
    (f,) = findings(out)
    svg = ET.fromstring(ReportInputs.load(out).figure(f).to_svg())
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.get("text-anchor") == "end"]
    assert labels[0].startswith("host: batch_get_into_multi_buffers")
    for stream in (39, 40, 43, 46):
        assert f"stream {stream}  ◀ stalls" in labels
    (data,) = data_groups(svg)
    colors = {r.get("fill") for r in data.iter(f"{SVG}rect")}
    assert len(colors) >= 4  # the span's shade, the span, NOTIFY_WAIT, EVENT_WAIT (other tasks)


def test_run_summary_and_not_evaluated_rules() -> None:
    out = run_sample("inference_baseline_g3_level0")
    html = (out / "report.html").read_text("utf-8")
    assert "No findings" in html
    assert "Not evaluated" in html and "collect with profiler_level=Level1 or Level2" in html
    assert "missing ranks" not in html  # a healthy one-rank sample misses nothing
    assert "Level0" in html and "g3" in html
    assert "api_statistic.csv" in html  # missing files listed


def test_reports_are_rewritten_without_errors() -> None:
    """Reports can be written again over a finished run (their speed is a benchmark's matter,
    not a timed test's: benchmarks/bench_scale.py)."""
    out = run_sample("store_stall_2rank_rank1_sick")
    write_reports(out)
    files = write_reports(out)
    assert not files.errors


SCRIPT = '<script>alert("pwned")</script>'


def test_trace_strings_are_escaped(tmp_path: Path) -> None:
    """An op name from user code containing <script> is shown as text everywhere."""
    from traceanalyzer.engine import Evidence, RuleContext, evaluate, rule
    from traceanalyzer.engine.registry import RuleSet
    from traceanalyzer.kit.testing.rank_builder import RankBuilder, build_store
    from traceanalyzer.store import Store

    b = RankBuilder(rank=0)
    b.span(f"my_op{SCRIPT}", start_ns=us(100), dur_ns=us(50))
    out = build_store(tmp_path, b)

    @rule(
        id="TX901",
        name="echo-op",
        severity="warning",
        summary="Echoes user op names.",
        fix="Rename `op` & retry.",
    )
    def echo(ctx: RuleContext):  # noqa: ANN202
        """
        ## What it detects
        x
        ## Why it matters
        x
        ## How to fix
        x
        ## Example
        x
        ## References
        x
        """
        import polars as pl

        rows = ctx.table("slices").filter(pl.col("name").str.contains("<script>")).collect()
        for row in rows.iter_rows(named=True):
            yield ctx.finding(
                rank=row["rank"],
                title=f"op `{row['name']}` is odd",
                message=f"Op {row['name']} on {row['thread']}",
                location={"name": row["name"]},
                evidence=[
                    Evidence(
                        rank=row["rank"],
                        session=row["session"],
                        name=row["name"],
                        start_ns=row["start_ns"],
                        dur_ns=row["dur_ns"],
                    )
                ],  # fmt: skip
                metrics={"name_metric": row["name"]},
            )

    result = evaluate(Store.open(out), rules=RuleSet([echo]), config_path=False)
    assert len(result.findings) == 1
    from traceanalyzer.engine import write_findings_json

    write_findings_json(result, out)
    files = write_reports(out, result=result, rules=[echo])
    assert not files.errors
    html = (out / "report.html").read_text("utf-8")
    assert SCRIPT not in html
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in html
    doc = parse(html)
    assert sum(t == "script" for t, _ in doc.tags) == 1  # only the report's own image check
    assert any(SCRIPT in text for text in doc.text)  # ...and the name reads as text
    md = (out / "report.md").read_text("utf-8")
    # a backslash escape, no entities: renderers show it as text
    assert not re.search(r"(?<!\\)<script>", md) and "\\<script>" in md


def test_report_md_is_clean_markdown() -> None:
    """No HTML entities, no "(s)" plurals; numbers read as written."""
    md = (run_sample("capture_growth_2rank") / "report.md").read_text("utf-8")
    assert not re.search(r"&(gt|lt|amp|quot);", md)
    assert "(s)" not in md
    assert "2 ranks, 2 sessions" in md and "Rank 0 (1 session)" in md
    assert "CANN >= 9.1.0" in md and "p<1e-16" in md


def test_metric_times_read_from_the_session_start() -> None:
    out = run_sample("store_stall_2rank_rank1_sick")
    (f,) = findings(out)
    start = f["metrics"]["worst_span_start_ns"]
    session_start = json_sessions_start(out, rank=1)
    relative = fmt.since(start, session_start)
    html = (out / "report.html").read_text("utf-8")
    absolute = f"{fmt.trace_us(start)} µs"
    assert f'title="{absolute} on the trace clock">{relative} ' in html
    md = (out / "report.md").read_text("utf-8")
    assert f"| worst span start | {relative} from session start ({absolute}) |" in md


def test_finding_counts_agree_between_summary_and_rules_table() -> None:
    out = run_sample("capture_growth_2rank")  # one finding grouped over two ranks
    doc = json.loads((out / "findings.json").read_text("utf-8"))
    per_rule = {r["name"]: r["findings"] for r in doc["rules"]}
    assert per_rule["capture-memcpy-growth"] == 1 == doc["summary"]["findings"]
    assert sum(per_rule.values()) == len(doc["findings"])


def json_sessions_start(out: Path, rank: int) -> int:
    from traceanalyzer.store import Store

    frame = Store.open(out).sessions()
    (start,) = frame.filter(frame["rank"] == rank)["start_ns"].to_list()
    return start
