"""findings.json's overview as typed values (traceanalyzer.overview.model): the model describes
every field a run writes, reads an older document's missing sections as empty ones, and a
damaged one's fields too, naming each (an OUT someone sent is data)."""

from __future__ import annotations

import copy
import json

import pytest
from report_support import assert_typed_round_trip, run_sample

from traceanalyzer.engine.findings import Cost, Finding
from traceanalyzer.overview import finding_costs
from traceanalyzer.overview.model import overview_problems, read_overview
from traceanalyzer.report.overview_html import overview_section
from traceanalyzer.report.overview_text import overview_markdown, overview_table


def _overview(sample: str) -> dict:
    return json.loads((run_sample(sample) / "findings.json").read_text())["summary"]["overview"]


def _markdown(overview: dict) -> str:
    return "\n".join(overview_markdown(read_overview(overview), lambda h, r: [str(h)], {}))


@pytest.mark.parametrize(
    "sample", ["store_stall_2rank_rank1_sick", "inference_baseline_g3_level0", "straggler_2rank"]
)
def test_the_model_describes_every_field_a_run_writes(sample: str) -> None:
    assert_typed_round_trip(_overview(sample))


def test_an_older_document_reads_with_empty_sections() -> None:
    """A findings.json written before the phases, the memory, the collectives, the costs and
    the windows: the reports show what it has, and a finding's cost is of the steps' time."""
    old = copy.deepcopy(_overview("store_stall_2rank_rank1_sick"))
    for section in ("phases", "memory", "collectives", "costs", "representative", "unmeasured"):
        del old[section]
    for rank in old["ranks"]:
        del rank["window_ns"], rank["phase_ns"]
    assert overview_problems(old) == []
    overview = read_overview(old)
    assert overview.memory is None and overview.collectives is None
    assert overview.phases.rows == [] and overview.costs == {}
    assert "where the time goes" in overview_table(overview)
    assert "## Where the time goes" in _markdown(old)
    assert "Where the time goes" in overview_section(overview, {})
    rank = overview.ranks[0]
    finding = Finding("TA000", "n", "info", [rank.rank], [], "t", "m", "", cost=Cost(1_000))
    cost = finding_costs([finding], overview)[finding.fingerprint]
    assert cost.cost_share == pytest.approx(1_000 / rank.total_ns)


def test_a_damaged_field_reads_as_empty_and_is_named() -> None:
    damaged = copy.deepcopy(_overview("store_stall_2rank_rank1_sick"))
    damaged["ranks"][0]["steps"] = "many"
    damaged["phases"]["rows"] = "x"
    damaged["representative"]["timeline"]["rects"][0] = [1, 2]
    damaged["collectives"]["critical_path"] = 5
    damaged["mean"]["step_ns"] = True
    assert overview_problems(damaged) == [
        "summary.overview.mean.step_ns: expected a number, got a boolean",
        "summary.overview.ranks[0].steps: expected an integer, got a string",
        "summary.overview.representative.timeline.rects[0]: expected a list of 7 items, got a list",
        "summary.overview.phases.rows: expected a list, got a string",
        "summary.overview.collectives.critical_path: expected an object, got a number",
    ]
    overview = read_overview(damaged)  # never raises: what does not fit is empty
    assert overview.ranks[0].steps == 0 and overview.phases.rows == []
    assert overview.mean is not None and "step_ns" not in overview.mean
    rects = damaged["representative"]["timeline"]["rects"]
    assert overview.representative and overview.representative.timeline
    assert len(overview.representative.timeline.rects) == len(rects) - 1  # the damaged one out
    assert "where the time goes" in overview_table(overview)
    assert "## Where the time goes" in _markdown(damaged)


def test_a_document_that_is_no_overview_reads_as_an_empty_one() -> None:
    for value in ("x", 5, [], None):
        overview = read_overview(value)
        assert not overview.usable and overview.ranks == []
    assert overview_problems([]) == ["summary.overview: expected an object, got a list"]
    failed = read_overview({"schema_version": 1, "error": "ValueError: boom"})
    assert failed.error == "ValueError: boom" and not failed.usable
    assert overview_table(failed) == "overview failed: ValueError: boom"
