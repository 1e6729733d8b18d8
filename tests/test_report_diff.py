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
    assert rank1["steps"] == 8 and rank1["captures"] is None  # absent, not zero
    marked = key_figures(run_sample("store_stall_session_marked")).row(0, named=True)
    assert marked["transfer_spans"] == 1  # the session window marked as a store transfer
