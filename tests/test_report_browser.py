"""report.html in a real headless browser: finding sections present and every figure shown.

The report's inline script sets ``<body data-images-loaded="N">`` once all N images have
``naturalWidth > 0`` (``"error"`` otherwise); ``--dump-dom`` serialises the DOM after scripts ran.
Skipped where chromium is absent (``.ci/run`` installs it: ``apt-get install -y chromium``). Wide
tables are measured at 1280 and 1920 px: they fit their box (a long name wraps in its cell), or
scroll inside it; the page never scrolls sideways.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from report_support import SICK, findings, run_sample

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")


def browse(html: Path, tmp_path: Path, *extra: str) -> str:
    args = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", *extra,
        html.resolve().as_uri(),
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("sample", sorted(SICK))
def test_sections_and_images_render(sample: str, tmp_path: Path) -> None:
    out = run_sample(sample)
    dom = browse(out / "report.html", tmp_path, "--dump-dom")
    fired = findings(out)
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert (out / "report.html").read_text("utf-8").count("<img ") == 0  # figures are inline SVG
    assert 'data-images-loaded="0"' in body, body
    assert len(re.findall(r'<svg [^>]*class="chart"', dom)) == len(fired)
    for f in fired:
        assert f'id="f-{f["fingerprint"]}"' in dom
    assert dom.count('<section class="finding') == len(fired)


def test_screenshot(tmp_path: Path) -> None:
    out = run_sample("store_stall_2rank_rank1_sick")
    shot = tmp_path / "report.png"
    browse(out / "report.html", tmp_path, f"--screenshot={shot}", "--window-size=1280,1800")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_script_in_trace_name_stays_text(tmp_path: Path) -> None:
    """A `<script>` in trace data reaches the browser as text: no element, no execution."""
    from traceanalyzer.report import ReportInputs
    from traceanalyzer.report.html_report import render_html

    out = run_sample("store_stall_2rank_rank1_sick")
    inputs = ReportInputs.load(out)
    payload = "<script>document.body.setAttribute('data-pwned','1')</script>"
    inputs.findings["findings"][0]["evidence"][0]["name"] = payload
    inputs.findings["findings"][0]["title"] = f"stall in {payload}"
    page = tmp_path / "report.html"
    page.write_text(render_html(inputs.prepare()))
    dom = browse(page, tmp_path, "--dump-dom")
    assert "data-pwned" not in re.search(r"<body[^>]*>", dom).group(0)
    assert dom.count("<script>") == 1  # the report's own image check only
    assert "&lt;script&gt;document.body" in dom


def test_overview_renders_without_findings(tmp_path: Path) -> None:
    """A healthy run opens on where the time goes: its stacked bar, tables and timeline strip."""
    out = run_sample("inference_baseline")
    assert not findings(out)
    dom = browse(out / "report.html", tmp_path, "--dump-dom")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-images-loaded="0"' in body, body  # no image: the timeline strip is inline SVG
    assert dom.index('id="overview"') < dom.index("<h2>Findings</h2>")
    section = dom.split('<section class="overview">', 1)[1].split("</section>", 1)[0]
    assert "compute: AI Core" in section and "idle: waiting on the host" in section
    assert section.count("<img ") == 0 and section.count('class="ov-row"') == 1
    strip = section.split('<figure class="ov-timeline">', 1)[1].split("</figure>", 1)[0]
    assert strip.startswith("<svg ") and strip.count("<rect ") >= 1
    assert "<title>" in strip and "ms from the step's start" in strip


# Opens every <details>, then writes into <body data-overflow> how far each table box's content
# and the page reach past their width, in px: a table that does not fit its box scrolls inside
# it, and the page itself never scrolls sideways.
MEASURE_SCRIPT = """<script>
window.addEventListener('load',function(){
[].forEach.call(document.querySelectorAll('details'),function(d){d.open=true;});
var boxes=[].map.call(document.querySelectorAll('.tablewrap'),function(w){
return {head:w.querySelector('th')?w.querySelector('th').textContent:'',
past:w.scrollWidth-w.clientWidth,clips:getComputedStyle(w).overflowX};});
document.body.setAttribute('data-overflow',JSON.stringify({boxes:boxes,
page:document.documentElement.scrollWidth-window.innerWidth}));});
</script>"""
# a real kernel name from a G2 export, twice over: a name longer than any column
LONG_KERNEL = (
    "aclnnMaxPool2dWithMaskBackward_MaxPoolGradWithArgmaxV1AiCore_MaxPoolGradWithArgmaxV1" * 2
)


@pytest.mark.parametrize("width", [1280, 1920])
@pytest.mark.parametrize("sample", ["store_stall_2rank_rank1_sick", "capture_growth_level2"])
def test_wide_tables_fit_or_scroll_inside_their_box(
    sample: str, width: int, tmp_path: Path
) -> None:
    import html
    import json

    out = run_sample(sample)
    page = (out / "report.html").read_text("utf-8")
    overview = json.loads((out / "findings.json").read_text("utf-8"))["summary"]["overview"]
    top = html.escape(overview["top_kernels"][0]["name"])
    assert page.count(top) >= 2  # the top kernels table and the per rank rows
    measured = tmp_path / "report.html"
    measured.write_text(
        page.replace(top, LONG_KERNEL).replace("</body>", MEASURE_SCRIPT + "</body>")
    )
    dom = browse(measured, tmp_path, "--dump-dom", f"--window-size={width},1000")
    found = re.search(r'data-overflow="([^"]*)"', dom)
    assert found, re.search(r"<body[^>]*>", dom).group(0)
    doc = json.loads(html.unescape(found.group(1)))
    assert doc["page"] <= 0, doc  # the page never scrolls sideways
    assert doc["boxes"] and all(box["clips"] == "auto" for box in doc["boxes"])
    # every table fits its box: the long name wraps inside its cell
    assert [box for box in doc["boxes"] if box["past"] > 0] == [], doc
