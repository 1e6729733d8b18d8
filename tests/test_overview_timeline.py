"""The overview's timeline strip: hand-built SVG, well-formed, escaped, and bounded in size."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from traceanalyzer.json_shape import to_json
from traceanalyzer.kit import Store, StoreBuilder, us
from traceanalyzer.overview.model import read_overview
from traceanalyzer.overview.timeline import MAX_RECTS, step_timeline
from traceanalyzer.report.overview_timeline import CLASS_COLORS
from traceanalyzer.report.overview_timeline import timeline_svg as draw

SVG = "{http://www.w3.org/2000/svg}"
NASTY = "Mat<Mul> & \"quoted\" 'op'\x01"
STEP = {"rank": 0, "session": "s0", "step": 7, "start_ns": 0, "end_ns": 1_000_000_000}


def timeline_svg(overview: dict, store: Store) -> str | None:
    """The strip as a run draws it: the overview computes the rectangles, the report draws."""
    rep = overview["representative"]
    timeline = rep and {**rep, "timeline": to_json(step_timeline(store, rep))}
    return draw(read_overview({"representative": timeline}))


def test_names_are_escaped_and_each_task_says_what_it_is() -> None:
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(2_000_000))
    b.step(0, "s0", 7, start_ns=0, dur_ns=us(1_000_000))
    b.task(0, "s0", NASTY, stream=2, start_ns=us(100_000), dur_ns=us(200_000), task_type="AI_CORE")
    b.hccl_task(
        0, "s0", "hcom_allReduce__1_0_1", stream=9, start_ns=us(250_000), dur_ns=us(150_000)
    )
    svg = timeline_svg({"representative": STEP}, b.store())
    assert svg is not None
    root = ET.fromstring(svg)  # well-formed XML, as written to plots/overview-timeline.svg
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert labels[0] == "rank 0, step 7: device streams (colours as in the breakdown)"
    assert (
        "communication" in labels and "stream 2" in labels and "ms from the step's start" in labels
    )
    tips = {r.get("fill"): r.find(f"{SVG}title").text for r in root.iter(f"{SVG}rect")}
    assert tips[CLASS_COLORS["ai_core"]] == "Mat<Mul> & \"quoted\" 'op' (ai_core, 200 ms)"
    assert "hcom_allReduce__1_0_1 (comm" in tips[CLASS_COLORS["comm"]]


def test_many_tiny_tasks_merge_into_a_bounded_svg() -> None:
    """A busy step (here 40,000 one-µs kernels on 2 streams) stays a small file."""
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(2_000_000))
    b.step(0, "s0", 7, start_ns=0, dur_ns=us(1_000_000))
    for i in range(20_000):
        for stream in (2, 3):
            b.task(
                0,
                "s0",
                f"op{i}",
                stream=stream,
                start_ns=us(i * 50 + stream),
                dur_ns=us(1),
                task_type="AI_CORE",
            )
    b.task(0, "s0", "Long<&>", stream=4, start_ns=0, dur_ns=us(900_000), task_type="AI_VECTOR_CORE")
    svg = timeline_svg({"representative": STEP}, b.store())
    assert svg is not None and len(svg) < 1_000_000
    rects = list(ET.fromstring(svg).iter(f"{SVG}rect"))
    assert 2 <= len(rects) <= MAX_RECTS
    tips = [r.find(f"{SVG}title").text for r in rects]
    assert "Long<&> (ai_vector, 900 ms)" in tips
    assert any(t.startswith("20000 ai_core tasks") for t in tips)  # one dense run per stream


def test_no_representative_step_draws_nothing() -> None:
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(2_000))
    assert timeline_svg({"representative": None}, b.store()) is None


def test_tasks_that_start_together_keep_one_order() -> None:
    """A collective and its first copy start together: the same store always gives the same
    rectangles in the same order (findings.json is compared across runs and executors)."""
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(2_000_000))
    b.step(0, "s0", 7, start_ns=0, dur_ns=us(1_000_000))
    for k in range(8):  # several ties, so that an arbitrary order shows
        start = us(100_000 * (k + 1))
        b.hccl_task(0, "s0", f"hcom_allReduce__{k}", stream=9, start_ns=start, dur_ns=us(50_000))
        b.hccl_task(0, "s0", f"Memcpy{k}", stream=9, start_ns=start, dur_ns=us(2_000))
    store = b.store()
    timelines = [step_timeline(store, STEP) for _ in range(20)]
    orders = {tuple((r.start_ns, r.end_ns, r.name) for r in t.rects) for t in timelines if t}
    assert len(orders) == 1
    (order,) = orders
    assert list(order) == sorted(order)  # by start, then end: the copy before its collective
