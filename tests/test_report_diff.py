"""traceanalyzer diff: new / resolved / changed findings with deltas, key figures, --fail-on-new."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from report_support import SAMPLES, findings, run_sample

from traceanalyzer.cli import main
from traceanalyzer.compare.diff import diff_outputs
from traceanalyzer.overview.model import Overview, read_overview


def key_figures(out: Path) -> pl.DataFrame:
    """The run's key figures (findings.json) as one row per rank, one column per figure."""
    doc = json.loads((out / "findings.json").read_text())
    rows: dict[int, dict] = {}
    for entry in doc["key_figures"]:
        for v in entry["values"]:
            rows.setdefault(v["rank"], {"rank": v["rank"]})[entry["figure"]] = v["value"]
    return pl.DataFrame(list(rows.values()))


def test_stall_vs_healthy_reports_resolved_with_transfer_delta(tmp_path: Path) -> None:
    base, target = run_sample("store_stall_2rank_rank1_sick"), run_sample("store_healthy")
    res = CliRunner().invoke(main, ["diff", str(base), str(target), "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert "resolved  store-transfer-stall" in res.output
    assert "transfer span time (mean): 2.52 s -> 25.7 ms (-99.0%)" in res.output
    doc = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert doc["summary"] == {"new": 0, "resolved": 1, "changed": 0, "unchanged": 0}
    (change,) = doc["findings"]
    assert change["status"] == "resolved" and change["name"] == "store-transfer-stall"
    delta = {d["key"]: d for d in change["figure_deltas"]}["transfer_ns_mean"]
    assert delta["base"] > 2.5e9 and delta["target"] < 3e7 and delta["rel"] < -0.98
    html = (tmp_path / "d" / "diff.html").read_text()
    assert "resolved" in html and "-99.0%" in html


def test_fail_on_new(tmp_path: Path) -> None:
    healthy, sick = run_sample("store_healthy"), run_sample("store_stall_2rank_rank1_sick")
    res = CliRunner().invoke(
        main, ["diff", str(healthy), str(sick), "--out", str(tmp_path), "--fail-on-new"]
    )
    assert res.exit_code == 1, res.output
    assert "new       store-transfer-stall" in res.output
    res = CliRunner().invoke(
        main, ["diff", str(sick), str(healthy), "--out", str(tmp_path), "--fail-on-new"]
    )
    assert res.exit_code == 0
    res = CliRunner().invoke(
        main,
        ["diff", str(sick), str(sick), "--out", str(tmp_path), "--fail-on-new", "--format", "json"],
    )
    assert res.exit_code == 0
    assert json.loads(res.output)["summary"]["unchanged"] == 1


def test_changed_finding_lists_metric_deltas(tmp_path: Path) -> None:
    """The same finding (same fingerprint) with other numbers is `changed`, with deltas."""
    base = run_sample("capture_growth_2rank")
    target = tmp_path / "target"
    import shutil

    shutil.copytree(base, target)
    doc = json.loads((target / "findings.json").read_text())
    doc["findings"][0]["metrics"]["slope_per_capture"] = 4.0
    (target / "findings.json").write_text(json.dumps(doc))
    diff = diff_outputs(base, target)
    (change,) = diff.changes
    assert change.status == "changed"
    (delta,) = change.metrics
    assert (delta.key, delta.base, delta.target, delta.rel) == ("slope_per_capture", 2.0, 4.0, 1.0)


def test_diff_of_input_dirs_analyses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # default output dirs land under ./traceanalyzer-out
    res = CliRunner().invoke(
        main,
        ["diff", str(SAMPLES / "store_stall_session_marked"), str(SAMPLES / "store_healthy"), "-q"],
    )
    assert res.exit_code == 0, res.output
    assert "1 resolved" in res.output
    assert (tmp_path / "traceanalyzer-out" / "store_healthy" / "report.html").is_file()
    assert list((tmp_path / "traceanalyzer-out").glob("diff-*/diff.html"))


def test_key_figures_agree_with_the_rule_series() -> None:
    """The rule's key figures count exactly what its detection counts."""
    for sample in ("capture_growth_2rank", "capture_growth_level2"):
        out = run_sample(sample)
        figures = key_figures(out)
        for occ in findings(out)[0]["occurrences"]:
            (rank,) = occ["ranks"]
            row = figures.filter(pl.col("rank") == rank).row(0, named=True)
            series = occ["series"]
            assert row["captures"] == len(series["memcpy_calls"])
            assert row["memcpy_per_capture"] == pytest.approx(
                sum(series["memcpy_calls"]) / row["captures"]
            )
            assert row["capture_ns_mean"] == pytest.approx(
                sum(series["capture_ns"]) / row["captures"]
            )


def test_key_figures_transfer_and_steps() -> None:
    figures = key_figures(run_sample("store_stall_2rank_rank1_sick"))
    rank1 = figures.filter(pl.col("rank") == 1).row(0, named=True)
    assert rank1["transfer_spans"] == 2 and rank1["transfer_ns_mean"] > 2.5e9
    assert (
        rank1["steps"] == 7 and rank1["captures"] is None
    )  # absent, not zero  # 8 steps, ProfilerStep#1 warm-up
    marked = key_figures(run_sample("store_stall_session_marked")).row(0, named=True)
    assert marked["transfer_spans"] == 1  # the session window marked as a store transfer


def test_an_output_without_key_figures_gets_them_from_the_rules(tmp_path: Path) -> None:
    """findings.json written before rules had key figures: the loaded rules compute them from
    the store, with the parameters that run recorded."""
    import shutil

    from traceanalyzer.engine.loader import load_rules

    base = tmp_path / "base"
    shutil.copytree(run_sample("store_stall_2rank_rank1_sick"), base)
    doc = json.loads((base / "findings.json").read_text())
    del doc["key_figures"]
    (base / "findings.json").write_text(json.dumps(doc))
    target = run_sample("store_healthy")
    assert not diff_outputs(base, target).changes[0].figures[0].base  # nothing to compare
    (change,) = diff_outputs(base, target, load_rules().rules).changes
    delta = {d.key: d for d in change.figures}["transfer_ns_mean"]
    assert delta.base > 2.5e9 and delta.target < 3e7 and delta.better is True


def test_a_rank_in_one_run_only_is_noted(tmp_path: Path) -> None:
    from traceanalyzer.compare.diff import DiffResult
    from traceanalyzer.compare.render import render_diff_html, render_diff_text

    diff = DiffResult(tmp_path / "a", tmp_path / "b", [], [], [0, 1, 2, 3], [0, 1, 4])
    assert diff.rank_notes == [
        "ranks 2, 3 only in base (absent from target): its findings there are resolved by "
        "absence, not by a change",
        "rank 4 only in target (absent from base): its findings there are new by absence, not "
        "by a change",
    ]
    assert diff.to_dict()["notes"] == diff.rank_notes
    text = render_diff_text(diff)
    assert f"note: {diff.rank_notes[0]}" in text and f"note: {diff.rank_notes[1]}" in text
    assert "ranks 2, 3 only in base" in render_diff_html(diff, tmp_path)
    assert DiffResult(tmp_path, tmp_path, [], [], [0, 1], [0, 1]).rank_notes == []


def test_a_rise_of_twice_or_more_is_a_factor() -> None:
    """3.4 µs -> 66.3 µs is 19.5x, not "+1850.0%"; smaller changes stay percentages."""
    from traceanalyzer.compare.diff import Delta
    from traceanalyzer.compare.render import delta_text
    from traceanalyzer.report import fmt

    assert fmt.change(66.3 / 3.4 - 1) == "19.5x"
    assert fmt.change(-0.984) == "-98.4%" and fmt.change(0.5) == "+50.0%" and fmt.change(None) == ""
    assert delta_text(Delta("x", 3.4, 66.3)) == "3.4 -> 66.3 (19.5x)"


def _figures(values: dict[int, float | None]):
    from traceanalyzer.compare.diff import Figure, KeyFigures

    figure = Figure("store-transfer-stall", "spans", "transfer spans", "lower", "count")
    return figure, KeyFigures([figure], {(figure.rule, figure.key): values})


def test_a_rank_profiled_in_both_runs_is_never_said_not_profiled() -> None:
    """The target profiled rank 1 but the rule was not evaluated there: no figure, n/a; not
    "rank 1 not profiled there" with the mean of other ranks in its place."""
    from traceanalyzer.compare.diff import KeyFigures, figure_deltas_for

    _figure, base = _figures({0: 1.0, 1: 2.0})
    (delta,) = figure_deltas_for(
        "store-transfer-stall", [1], base, KeyFigures(), profiled=([0, 1], [0, 1])
    )
    assert (delta.base, delta.target, delta.scope) == (2.0, None, "rank 1")
    _figure, target = _figures({0: 3.0})
    (delta,) = figure_deltas_for("store-transfer-stall", [1], base, target, profiled=([0, 1], [0]))
    assert delta.target == 3.0 and "rank 1 not profiled there" in delta.scope  # it was not


def test_no_key_figure_row_of_nothing_on_both_sides() -> None:
    from traceanalyzer.compare.diff import _per_rank

    _figure, base = _figures({0: 0.0, 1: 2.0, 2: None})
    _figure, target = _figures({0: 0.0, 1: 0.0, 2: 0.0})
    assert [d.ranks for d in _per_rank(base, target)] == [[1]]


def test_unrelated_workloads_are_said_to_be(tmp_path: Path) -> None:
    from traceanalyzer.compare.diff import workload_note

    def doc(shares: dict[str, float]) -> Overview:
        kernels = [{"name": k, "share": v} for k, v in shares.items()]
        return read_overview({"top_kernels": kernels})

    related = doc({"MatMul": 0.6, "Add": 0.4}), doc({"MatMul": 0.5, "Mul": 0.5})
    assert workload_note(*related) is None
    note = workload_note(doc({"MatMul": 0.1, "Add": 0.9}), doc({"MatMul": 0.05, "Gmm": 0.95}))
    assert note and note.startswith("the two runs have 5% of their compute in common")
    # two samples of one generator are one workload; no note
    same = diff_outputs(run_sample("store_stall_2rank_rank1_sick"), run_sample("store_healthy"))
    assert same.workload_note is None


def test_a_findings_json_from_before_typed_costs_still_diffs(tmp_path: Path) -> None:
    """An older findings.json (the cost only as metrics, where its rule put them: first, say)
    loads, and a changed cost is a metric delta in its unit."""
    import shutil

    base = run_sample("store_stall_2rank_rank1_sick")
    older = tmp_path / "older"
    shutil.copytree(base, older)
    doc = json.loads((older / "findings.json").read_text())
    for finding in doc["findings"]:
        for holder in (finding, *finding["occurrences"]):
            metrics = holder["metrics"]
            cost = {k: metrics.pop(k) for k in ("cost_ns", "cost_share")}
            holder["metrics"] = {**cost, "cost_ns": cost["cost_ns"] * 2, **metrics}
    (older / "findings.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["diff", str(older), str(base), "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert "changed   store-transfer-stall" in res.output
    assert "cost: 10 s -> 5 s (-50.0%)" in res.output


def test_metric_deltas_take_their_rules_units() -> None:
    """A time on the trace's clock (declared so) always differs and is left out; a figure with
    "start" in its name is still compared; each delta is printed in its declared unit."""
    from traceanalyzer.compare.diff import metric_deltas
    from traceanalyzer.compare.render import delta_text
    from traceanalyzer.engine.presentation import Presentation
    from traceanalyzer.engine.units import NS, TRACE_NS

    shown = Presentation(units={"worst_at": TRACE_NS, "wait": NS})
    base = {"metrics": {"worst_at": 1, "wait": 2e6, "baseline_start_mb": 10}}
    target = {"metrics": {"worst_at": 2, "wait": 1e6, "baseline_start_mb": 20}}
    deltas = metric_deltas(base, target, shown)
    assert [(d.key, d.unit) for d in deltas] == [("wait", NS), ("baseline_start_mb", "")]
    assert [delta_text(d) for d in deltas] == ["2 ms -> 1 ms (-50.0%)", "10 -> 20 (2.0x)"]
