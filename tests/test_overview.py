"""The overview: where the time goes, on every run (breakdown, top-N tables, cluster, costs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from report_support import SAMPLES, run_sample

from traceanalyzer.compare.overview_diff import overview_deltas
from traceanalyzer.engine.findings import Cost, Finding, group_findings
from traceanalyzer.kit.testing import us
from traceanalyzer.kit.testing.store_builder import StoreBuilder
from traceanalyzer.overview import TopSizes, by_cost, finding_costs
from traceanalyzer.overview.breakdown import computing_ns
from traceanalyzer.overview.cluster import cluster_rows
from traceanalyzer.overview.compute import summarize_rank
from traceanalyzer.overview.model import overview_of, read_overview
from traceanalyzer.report.overview_text import cost_text, overview_markdown, overview_table
from traceanalyzer.step_components import BY_KEY, COMPONENT_NAMES
from traceanalyzer.store import Store

US = 1_000


def _steps(store: Store, rank: int = 0) -> pl.DataFrame:
    return summarize_rank(store, rank, TopSizes())["summary_steps"]


def _one(store: Store) -> dict:
    (row,) = _steps(store).to_dicts()
    assert sum(row[c] for c in COMPONENT_NAMES) == row["step_ns"]
    return row


# --------------------------------------------------------------------------------------------
# The breakdown on hand-built timelines: each component where it belongs, summing exactly
# --------------------------------------------------------------------------------------------


def _timeline() -> StoreBuilder:
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(2_000))
    b.step(0, "s0", 7, start_ns=0, dur_ns=us(1_000))
    return b


def test_each_class_lands_in_its_component() -> None:
    b = _timeline()
    b.task(
        0, "s0", "MatMul", stream=2, start_ns=us(100), dur_ns=us(200), task_type="AI_CORE"
    )  # 100-300
    b.hccl_task(
        0, "s0", "hcom_allReduce__1_0_1", stream=9, start_ns=us(250), dur_ns=us(150)
    )  # 250-400: 50 under compute
    b.task(
        0,
        "s0",
        "EVENT_WAIT",
        stream=3,
        start_ns=us(400),
        dur_ns=us(100),
        task_type="EVENT_WAIT_SQE",
    )  # 400-500
    b.task(
        0, "s0", "MEMCPY_ASYNC", stream=4, start_ns=us(500), dur_ns=us(50), task_type="PCIE_DMA_SQE"
    )  # 500-550
    b.task(
        0,
        "s0",
        "EVENT_WAIT",
        stream=3,
        start_ns=us(500),
        dur_ns=us(100),
        task_type="EVENT_WAIT_SQE",
    )  # under the copy
    row = _one(b.store())
    assert row["step"] == 7 and row["step_ns"] == 1_000 * US
    assert row["compute_ai_core_ns"] == 150 * US
    assert row["overlapped_ns"] == 50 * US
    assert row["comm_exposed_ns"] == 100 * US
    assert row["idle_stream_ns"] == 150 * US  # 400-500 and 550-600: waits, nothing else
    assert row["device_other_ns"] == 50 * US
    assert row["idle_other_ns"] == 500 * US
    assert (row["device_start_ns"], row["device_end_ns"]) == (100 * US, 400 * US)


def test_concurrent_accelerators_share_the_time() -> None:
    b = _timeline()
    b.task(0, "s0", "MatMul", stream=2, start_ns=0, dur_ns=us(100), task_type="AI_CORE")
    b.task(0, "s0", "Add", stream=3, start_ns=0, dur_ns=us(100), task_type="AI_VECTOR_CORE")
    b.task(0, "s0", "Cast", stream=4, start_ns=us(100), dur_ns=us(100), task_type="AI_CPU")
    b.task(0, "s0", "Fused", stream=5, start_ns=us(200), dur_ns=us(100), task_type="MIX_AIV")
    row = _one(b.store())
    assert row["compute_ai_core_ns"] == row["compute_ai_vector_ns"] == 50 * US
    assert row["compute_ai_cpu_ns"] == row["compute_mix_ns"] == 100 * US


def test_kernel_details_accelerator_wins_over_the_task_type() -> None:
    """Older traces call AI Vector kernels AI_CORE; kernel_details.csv says which they are."""
    b = _timeline()
    b.task(0, "s0", "Add", stream=2, start_ns=0, dur_ns=us(100), task_type="AI_CORE")
    b.rows["kernels"].append(
        {
            "rank": 0,
            "session": "s0",
            "stream_id": 2,
            "start_ns": 0,
            "accelerator_core": "AI_VECTOR_CORE",
        }
    )
    row = _one(b.store())
    assert row["compute_ai_vector_ns"] == 100 * US and row["compute_ai_core_ns"] == 0


@pytest.mark.parametrize(("launch_end_us", "host_bound"), [(250, True), (50, False)])
def test_a_gap_is_host_bound_when_the_launch_came_late(
    launch_end_us: float, host_bound: bool
) -> None:
    b = _timeline()
    b.api(0, "s0", "Node@launch", start_ns=0, dur_ns=us(10), connection_id=1)
    b.task(
        0,
        "s0",
        "MatMul",
        stream=2,
        start_ns=us(20),
        dur_ns=us(80),
        task_type="AI_CORE",
        connection_id=1,
    )  # ends at 100
    b.api(0, "s0", "Node@launch", start_ns=us(launch_end_us - 10), dur_ns=us(10), connection_id=2)
    b.task(
        0,
        "s0",
        "MatMul",
        stream=2,
        start_ns=us(300),
        dur_ns=us(100),
        task_type="AI_CORE",
        connection_id=2,
    )
    row = _one(b.store())
    assert row["idle_host_ns"] == (200 * US if host_bound else 0)


def test_without_markers_a_burst_of_device_work_is_the_window() -> None:
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(500))
    b.task(0, "s0", "MatMul", stream=2, start_ns=us(100), dur_ns=us(100), task_type="AI_CORE")
    row = _one(b.store())
    assert row["step_source"] == "device_activity" and row["step"] == 1
    assert row["step_ns"] == 100 * US and row["source"] == "events"
    assert row["phase"] == "unknown" and row["check_scope"] == "session"


def test_without_markers_or_compute_the_session_is_the_window() -> None:
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(500))
    b.task(0, "s0", "MEMCPY", stream=2, start_ns=us(100), dur_ns=us(100), task_type="MEMCPY")
    row = _one(b.store())
    assert row["step_source"] == "session" and row["step_ns"] == 500 * US
    assert row["device_other_ns"] == 100 * US


def test_a_profile_without_steps_is_checked_by_its_session_total() -> None:
    """The export's step breakdown of a profile without ProfilerStep has one row, Step empty:
    the iterations' breakdowns, and the time between them, sum to it."""
    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(2_000))
    for start in (100, 900):  # two bursts of 3 kernels: two iterations, and time around them
        for k in range(3):
            at = us(start + 60 * k)
            b.task(0, "s0", "MatMul", stream=2, start_ns=at, dur_ns=us(50), task_type="AI_CORE")
    b.step_time(0, "s0", None, computing_ns=us(300), free_ns=us(1_700))
    steps = _steps(b.store())
    assert steps.height == 2 and set(steps["check_scope"]) == {"session"}
    assert steps["check_deviation"].to_list() == [0.0, 0.0]


def test_without_device_tasks_step_trace_time_is_the_source() -> None:
    b = _timeline()
    b.step_time(0, "s0", 7, computing_ns=us(300), free_ns=us(600), communication_ns=us(100))
    row = _one(b.store())
    assert row["source"] == "step_trace_time"
    assert row["compute_other_ns"] == 300 * US and row["comm_exposed_ns"] == 100 * US
    assert row["idle_other_ns"] == 600 * US


def test_kernel_details_name_the_top_kernels_of_a_session_without_its_trace() -> None:
    """A session whose trace_view.json was lost (or unreadable) has no device tasks: the
    compute kernels kernel_details.csv lists name its top kernels, the rest (HCCL) do not."""
    row = {"rank": 0, "session": "s0", "type": "MatMulV3"}
    kernels = [
        {
            **row,
            "name": "MatMul_1",
            "accelerator_core": "AI_CORE",
            "start_ns": us(t),
            "dur_ns": us(90),
        }
        for t in (100, 300)
    ]
    kernels.append(
        {**row, "name": "hcom_allReduce_", "accelerator_core": "HCCL", "start_ns": us(500),
         "dur_ns": us(400)}
    )  # fmt: skip
    store = Store.from_frames(
        {
            "sessions": [{"rank": 0, "session": "s0", "start_ns": 0, "end_ns": us(1_000)}],
            "kernels": kernels,
        }
    )
    tops = summarize_rank(store, 0, TopSizes())["summary_kernels"]
    whole = tops.filter(pl.col("phase") == "all")
    assert whole["name"].to_list() == ["MatMul_1"]
    assert whole.row(0, named=True)["total_ns"] == us(180)


# --------------------------------------------------------------------------------------------
# Synthetic scenarios and the real export
# --------------------------------------------------------------------------------------------

SAMPLE_DIRS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def sample_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Store]:
    from traceanalyzer.ingest import ingest

    stores = {}
    for name in SAMPLE_DIRS:
        out = tmp_path_factory.mktemp(name)
        ingest(SAMPLES / name, out, jobs=1)
        stores[name] = Store.open(out)
    return stores


@pytest.mark.parametrize("sample", SAMPLE_DIRS)
def test_components_sum_to_the_step_on_every_sample(
    sample: str, sample_stores: dict[str, Store]
) -> None:
    store = sample_stores[sample]
    for rank in store.table("sessions").select("rank").collect()["rank"].unique():
        steps = _steps(store, rank)
        assert steps.height and (steps["step_ns"] > 0).all()
        total = steps.select(pl.sum_horizontal(*COMPONENT_NAMES)).to_series()
        assert ((total - steps["step_ns"]).abs() <= 0.01 * steps["step_ns"]).all()
        assert (steps.select(pl.min_horizontal(*COMPONENT_NAMES)).to_series() >= -1).all()
        # the generator's overlap analysis, like torch_npu's, never counts an instant twice
        assert not steps.filter(pl.col("check_deviation") > 0.02).height, steps


def test_real_export_agrees_with_step_trace_time(real_g2_store: Path) -> None:
    """Computing, Communication(Not Overlapped), Overlapped, Stage and Preparing within 2% of
    the step, on both ranks of the real G2 export."""
    store = Store.open(real_g2_store)
    for rank in (0, 1):
        (row,) = _steps(store, rank).with_columns(computing_ns().alias("computing")).to_dicts()
        (csv,) = store.table("step_times").filter(pl.col("rank") == rank).collect().to_dicts()
        stage = csv["stage_ns"]
        assert row["source"] == "events" and row["check_deviation"] < 0.02
        pairs = [
            (row["computing"], csv["computing_ns"]),
            (row["comm_exposed_ns"], csv["communication_not_overlapped_ns"]),
            (row["overlapped_ns"], csv["overlapped_ns"]),
            (row["device_end_ns"] - row["device_start_ns"], stage),
            (row["device_start_ns"] - row["start_ns"], csv["preparing_ns"]),
        ]
        for ours, theirs in pairs:
            assert abs(ours - theirs) <= 0.02 * stage, (rank, ours, theirs)
        # Free is the idle inside Stage: our idle and copies less what lies outside Stage
        outside = row["step_ns"] - stage
        free = sum(row[c] for c in COMPONENT_NAMES if c.startswith(("idle", "device_other")))
        assert abs(free - outside - csv["free_ns"]) <= 0.02 * stage


@pytest.mark.parametrize("export", ["real_g2_store", "real_g2_db_store"])
def test_host_bound_idle_is_one_figure(export: str, request: pytest.FixtureRequest) -> None:
    """host-launch-bound's host-bound idle (its key figure, the worst compute stream) and its
    idle after syncs are the overview's idle host and idle sync, on the real Text and Db
    exports: one derivation (on main they were 30.3 ms vs 20.2 ms on the Db export)."""
    from traceanalyzer.engine import evaluate
    from traceanalyzer.engine.loader import load_rules
    from traceanalyzer.engine.registry import RuleSet

    store = Store.open(request.getfixturevalue(export))
    rule = next(r for r in load_rules(entry_points=False).rules if r.name == "host-launch-bound")
    (status,) = evaluate(store, rules=RuleSet([rule]), config_path=False).rules
    figures = {r["rank"]: r["host_bound_idle_ns"] for r in status.key_figure_rows}
    after_sync = " ".join(n.text for n in status.notes)
    for rank in (0, 1):
        steps = _steps(store, rank)
        idle_host, idle_sync = steps["idle_host_ns"].sum(), steps["idle_sync_ns"].sum()
        assert idle_host > 0 and figures[rank] == pytest.approx(idle_host, rel=0.005)
        assert f"{idle_sync / 1e6:.3g} ms more followed host synchronisations" in after_sync


def test_a_run_derives_the_host_bound_gaps_once(real_g2_store: Path, monkeypatch) -> None:
    """In a run, host-launch-bound at its defaults and the overview's breakdown read one
    derivation of the gaps (each derived them: ~80 ms of CPU on the realistic rank); a rule set
    otherwise derives its own, and the overview's stays at the defaults."""
    from traceanalyzer import host_gaps
    from traceanalyzer.engine.loader import load_rules
    from traceanalyzer.engine.runner import evaluate_rule
    from traceanalyzer.store import RankStore, run_memo

    derived = []  # each derivation classifies the gaps once
    classify = host_gaps.classify_gaps
    monkeypatch.setattr(
        host_gaps, "classify_gaps", lambda *a, **k: derived.append(1) or classify(*a, **k)
    )
    rule = next(r for r in load_rules(entry_points=False).rules if r.name == "host-launch-bound")
    idle = {}
    for params in ({}, {"min_gap_us": 3.0}):
        with run_memo(real_g2_store):
            outcome = evaluate_rule(rule, RankStore(real_g2_store, [0]), params, frozenset({0}))
            assert outcome.status == "evaluated", outcome.error
            steps = _steps(RankStore(real_g2_store, [0]))
            idle[len(params)] = steps["idle_host_ns"].sum(), steps["idle_sync_ns"].sum()
    assert len(derived) == 3  # once at the defaults, twice with the rule's own setting
    assert idle[0] == idle[1]


# --------------------------------------------------------------------------------------------
# Cluster view and costs
# --------------------------------------------------------------------------------------------


def _cluster_input(step_ms: list[float]) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows = []
    for rank, ms in enumerate(step_ms):
        row = dict.fromkeys(COMPONENT_NAMES, 0) | {"rank": rank, "step_ns": int(ms * 1e6)}
        row["compute_ai_core_ns"] = int(ms * 1e6)
        rows.append(row)
    kernels = pl.DataFrame({"rank": [0], "name": ["MatMul"], "total_ns": [5]})
    return pl.DataFrame(rows), kernels


def test_the_slow_rank_is_the_outlier() -> None:
    rows = cluster_rows(*_cluster_input([10, 10.1, 9.9, 10, 10.2, 14]))
    assert rows.filter(pl.col("outlier"))["rank"].to_list() == [5]
    assert rows.filter(pl.col("rank") == 0)["top_kernel"].item() == "MatMul"


def test_two_ranks_have_no_outlier_statistics() -> None:
    rows = cluster_rows(*_cluster_input([10, 30]))
    assert rows["step_z"].is_null().all() and not rows["outlier"].any()


def test_headline_names_the_largest_parts() -> None:
    from traceanalyzer.overview.document import headline

    mean = {"step_ns": 100.0, "comm_exposed_ns": 64.0, "idle_host_ns": 17.0, "compute_mix_ns": 9.0}
    assert headline(mean) == (
        "Most of the step is exposed communication (64%), then the device waiting on the host "
        "(17%)."
    )
    assert headline({"step_ns": 10.0, "compute_ai_core_ns": 4.0, "overlapped_ns": 0.2}) == (
        "The largest part of the step is compute (42%)."
    )


def _costed(name: str, ranks: list[int], cost: Cost | None) -> Finding:
    """A finding of ``ranks`` stating ``cost`` (None: its rule states none)."""
    return Finding(
        rule="TA999", name=name, severity="warning", ranks=ranks, sessions=[], title=name,
        message="m", fix="f", location={"name": name}, cost=cost,
    )  # fmt: skip


def test_costs_are_the_rules_stated_costs() -> None:
    """A finding costs what its rule states (summed over its occurrences); a rule that states
    none (growth, not lost time) has no cost and sorts last, and so does one whose cost it
    could not tell on its rank (both None): n/a, never 0."""
    overview = {"ranks": [{"rank": 0, "total_ns": 1_000}, {"rank": 1, "total_ns": 1_000}]}
    (grouped,) = group_findings([_costed("y", [1], Cost(500))])
    findings = [
        _costed("x", [0], Cost(100, 0.1)),
        grouped,
        _costed("z", [0], None),
        _costed("u", [1], Cost(None, None)),
    ]
    a, b, c, u = (f.fingerprint for f in findings)
    costs = finding_costs(findings, read_overview(overview))
    assert costs[a].cost_share == pytest.approx(0.1)
    assert costs[b].cost_share == pytest.approx(0.5)
    assert c not in costs and u not in costs
    written = [f.to_dict() for f in findings]
    assert [f["fingerprint"] for f in by_cost(written, costs)] == [b, a, c, u]
    assert cost_text(costs.get(u)) == ""  # no "costs 0 µs"
    # findings.json writes the cost where its readers find it: as metrics, after the rule's
    assert written[0]["metrics"] == {"cost_ns": 100, "cost_share": 0.1}
    assert written[1]["occurrences"][0]["metrics"] == {"cost_ns": 500, "cost_share": None}
    assert written[2]["metrics"] == {}
    assert written[3]["metrics"] == {"cost_ns": None, "cost_share": None}


# --------------------------------------------------------------------------------------------
# Through `run`: store tables, findings.json, reports, terminal, cache, diff
# --------------------------------------------------------------------------------------------


def test_run_writes_the_overview_everywhere(tmp_path: Path) -> None:
    from traceanalyzer.cli import main

    out = tmp_path / "out"
    sample = SAMPLES / "inference_baseline_current_level2"
    args = ["run", str(sample), "--out", str(out), "-j", "1", "--top-kernels", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "where the time goes" in result.output and "top kernel" in result.output
    store = Store.open(out)
    kernels = store.table("summary_kernels").collect()
    per_table = kernels.group_by("rank", "session", "phase").len()["len"]
    assert kernels.height and per_table.max() <= 2
    for table in ("summary_steps", "summary_host_apis", "summary_collectives", "summary_ranks"):
        assert store.table(table).collect().height, table
    assert set(store.table("summary_ranks").collect()["session"]) == {"all"}
    overview = json.loads((out / "findings.json").read_text())["summary"]["overview"]
    assert overview["schema_version"] == 1 and len(overview["ranks"]) == 2
    assert [c["key"] for c in overview["components"]] == list(COMPONENT_NAMES)
    source = dict(overview["source"])
    assert source.pop("component") in {"Computing", "Communication(Not Overlapped)", "Overlapped"}
    assert source.pop("worst_rank") in {0, 1}
    assert source == {
        "breakdown": ["events"],
        "reference": "step_trace_time.csv",
        "checked_steps": 4,
        "differing_steps": 0,
        "differing_ranks": [],
        "max_deviation": pytest.approx(0, abs=0.01),
        "tolerance": 0.02,
        "agrees": True,
    }
    assert "step_trace_time.csv" not in result.output  # said only when it disagrees
    assert len(overview["top_kernels"]) == 2 and overview["top_collectives"][0]["wait_ns"]
    md = (out / "report.md").read_text()
    assert md.index("## Where the time goes") < md.index("## Findings")
    assert (
        "plots/overview-timeline.svg" in md and (out / "plots" / "overview-timeline.svg").is_file()
    )
    html = (out / "report.html").read_text()
    assert html.index('id="overview"') < html.index("<h2>Findings</h2>")
    assert html.count('class="ov-row"') == 2  # a stacked bar per rank
    # a warm re-run recomputes nothing; other top sizes, or other steps, recompute it
    from traceanalyzer.derived.stage import STEPS
    from traceanalyzer.executor import LocalExecutor
    from traceanalyzer.overview.stage import SUMMARY
    from traceanalyzer.stages import run_stages

    def computed(sizes: TopSizes) -> list[int]:
        return run_stages(out, LocalExecutor(), [SUMMARY], {"summary": sizes}).computed["summary"]

    assert computed(TopSizes(kernels=2)) == []
    assert computed(TopSizes(kernels=3)) == [0, 1]
    assert computed(TopSizes(kernels=3)) == []
    run_stages(out, LocalExecutor(), [STEPS], {"steps": {"warmup_steps": 2}})
    assert computed(TopSizes(kernels=3)) == [0, 1]


def test_json_format_has_the_summary_section(tmp_path: Path) -> None:
    from traceanalyzer.cli import main

    out = tmp_path / "out"
    args = ["run", str(SAMPLES / "inference_baseline"), "--out", str(out), "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    overview = json.loads(result.output)["summary"]["overview"]
    assert overview["mean"]["step_ns"] > 0 and overview["representative"]["rank"] == 0


def test_findings_state_their_cost_and_sort_by_it() -> None:
    out = run_sample("store_stall_2rank_rank1_sick")
    doc = json.loads((out / "findings.json").read_text())
    (finding,) = doc["findings"]
    cost = doc["summary"]["overview"]["costs"][finding["fingerprint"]]
    assert cost["cost_share"] > 0.9
    md = (out / "report.md").read_text()
    assert "step time)" in md.split("## Findings", 1)[1]


def test_diff_compares_the_breakdowns(tmp_path: Path) -> None:
    from traceanalyzer.cli import main

    sick, healthy = run_sample("store_stall_2rank_rank1_sick"), run_sample("store_healthy")
    result = CliRunner().invoke(main, ["diff", str(sick), str(healthy), "--out", str(tmp_path)])
    assert "where the time goes (mean per step, base -> target):" in result.output
    doc = json.loads((tmp_path / "diff.json").read_text())
    step = doc["overview"][0]
    assert step["key"] == "step_ns" and step["target"] < step["base"] and step["rel"] < -0.5
    assert "Where the time goes" in (tmp_path / "diff.html").read_text()


def test_heat_map_beyond_eight_ranks_bars_below() -> None:
    from traceanalyzer.report.overview_html import stacked_bars
    from traceanalyzer.report.overview_plots import heatmap_figure

    ranks = [{"rank": r, "step_ns": 10.0, "idle_other_ns": 10.0} for r in range(12)]
    overview = {"ranks": ranks, "components": [{"key": k, "label": k} for k in COMPONENT_NAMES]}
    fig = heatmap_figure(read_overview(overview))
    assert fig is not None
    svg = ET.fromstring(fig.to_svg())
    cells = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") == "#440154"]
    assert len(cells) == 12 * (len(COMPONENT_NAMES) - 1)  # every share 0 but idle_other's
    few = read_overview({**overview, "ranks": ranks[:3]})
    assert heatmap_figure(few) is None
    bars = stacked_bars(few)
    assert bars.count('class="ov-row"') == 3 and 'title="idle_other_ns: ' in bars


def test_matplotlib_is_imported_only_to_draw() -> None:
    code = (
        "import sys, traceanalyzer.overview, traceanalyzer.report.overview_html, "
        "traceanalyzer.report.overview_text, traceanalyzer.report.overview_plots; "
        "assert 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_breakdown_the_export_contradicts_is_said_loudly(tmp_path: Path) -> None:
    """The self-check is a warning in the terminal, the report and findings.json, naming the
    component that differs; a finding's cost share on those ranks carries the caveat."""
    from traceanalyzer.cli import main

    sample = tmp_path / "in"
    shutil.copytree(SAMPLES / "inference_baseline", sample)
    for csv in sample.glob("*/ASCEND_PROFILER_OUTPUT/step_trace_time.csv"):
        lines = csv.read_text().splitlines()
        rows = [line.split(",") for line in lines[1:]]
        for row in rows:
            row[1] = f"{float(row[1]) * 3:.3f}"  # Computing tripled: events cannot agree
        csv.write_text("\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(sample), "--out", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "warning: the breakdown contradicts step_trace_time.csv on 4 of 4 steps" in result.output
    assert "Computing differs by" in result.output
    source = json.loads((out / "findings.json").read_text())["summary"]["overview"]["source"]
    assert source["agrees"] is False and source["component"] == "Computing"
    assert source["differing_ranks"] == [0]
    assert "Unreliable overview" in (out / "report.html").read_text()
    assert "**Warning:** the breakdown contradicts" in (out / "report.md").read_text()


def test_cost_shares_on_a_contradicted_breakdown_carry_the_caveat() -> None:
    overview = {
        "ranks": [{"rank": 0, "total_ns": 1_000}, {"rank": 1, "total_ns": 1_000}],
        "source": {"differing_ranks": [1]},
    }
    a, b = _costed("a", [0], Cost(100)), _costed("b", [1], Cost(100))
    costs = finding_costs([a, b], read_overview(overview))
    assert "unreliable" not in cost_text(costs[a.fingerprint])
    assert costs[b.fingerprint].unreliable_ranks == [1]
    assert "unreliable" in cost_text(costs[b.fingerprint])


COST_PHRASE = re.compile(
    r"^costs (?:"
    r"\S+ \S+ \((?P<share>\d+(?:\.\d)?% of (?:rank \d+'s|the \d+ ranks') step time)"
    r"(?:, \d+(?:\.\d)?% of (?:its|their) [a-z_/]+ time)?\)"
    r"|\d+(?:\.\d)?% of (?:rank \d+'s|the \d+ ranks') step time"
    r"|\S+ \S+ on (?:rank \d+|the \d+ ranks)"
    r")(?:; unreliable: .*)?$"
)


@pytest.mark.parametrize("sample", ["store_stall_2rank_rank1_sick", "straggler_2rank"])
def test_every_finding_states_its_cost_one_way(sample: str, tmp_path: Path) -> None:
    """The time, over which ranks, and the share of which time: one phrasing for every rule."""
    from traceanalyzer.cli import main
    from traceanalyzer.report.overview_text import cost_text

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(SAMPLES / sample), "--out", str(out), "-j", "1"])
    assert result.exit_code in (0, 1), result.output
    doc = json.loads((out / "findings.json").read_text())
    costs = read_overview(doc["summary"]["overview"]).costs
    assert doc["findings"] and costs
    for finding in doc["findings"]:
        text = cost_text(costs.get(finding["fingerprint"]))
        assert not text or COST_PHRASE.match(text), (finding["name"], text)
        if text:
            assert f"[{text}]" in result.output  # the terminal line says the same


def test_the_terminal_shows_the_outliers_and_the_slowest_of_many_ranks() -> None:
    from traceanalyzer.report.overview_text import TERMINAL_RANKS, overview_table, terminal_ranks

    ranks = [{"rank": r, "steps": 4, "step_ns": 1000.0 + r} for r in range(TERMINAL_RANKS + 4)]
    overview = {"ranks": ranks, "cluster": [{"rank": 0, "outlier": True}]}
    shown = terminal_ranks(read_overview(overview))
    assert shown is not None and len(shown) == TERMINAL_RANKS
    assert 0 in shown and max(r["rank"] for r in ranks) in shown and 1 not in shown
    assert terminal_ranks(read_overview({"ranks": ranks[:TERMINAL_RANKS]})) is None
    table = overview_table(read_overview({**overview, "mean": {"step_ns": 1.0}}))
    assert "... and 4 more ranks" in table


def test_a_level0_trace_says_what_it_could_not_measure() -> None:
    """A Level0 Text export records no CANN layer: its launches are known (HostToDevice flows)
    but no synchronisation is, so idle sync is "n/a" with the reason and where its time went,
    not a measured 0, as sync-in-step says "not evaluated"; and its kernel_details.csv writes
    N/A for the Accelerator Core, so AI Vector compute is not told from AI Core either. A
    Level1 sample measures both."""

    def run(name: str) -> dict:
        return json.loads((run_sample(name) / "findings.json").read_text())

    level0 = run("inference_baseline_g3_level0")
    overview = level0["summary"]["overview"]
    keys = ["compute_ai_vector_ns", "idle_sync_ns"]
    said = {k: f"{BY_KEY[k].unmeasured.why} (collect with profiler_level=Level1)" for k in keys}
    assert overview["unmeasured"] == {k: {"ranks": [0], "reason": said[k]} for k in keys}
    assert overview["ranks"][0]["unmeasured"] == keys
    assert all(r["unmeasured"] == keys for r in overview["phases"]["rows"])
    table = overview_table(read_overview(overview))
    header, row = (line.split() for line in table.splitlines()[2:4])
    assert row[header.index("sync") - 1] == "n/a"  # the header's "idle sync" is two words
    assert row[header.index("compute")] != "n/a"  # the AI Core part of it is measured
    why = said["idle_sync_ns"]
    assert f"idle sync not measured on rank 0: {why}" in table
    assert "compute: AI Vector not measured on rank 0: " in table
    md_table = lambda h, rows: [str(h), *map(str, rows)]  # noqa: E731
    md = "\n".join(overview_markdown(read_overview(overview), md_table, {}))
    assert "'idle: after a host synchronisation', 'n/a', 'n/a'" in md
    assert "'compute: AI Vector', 'n/a', 'n/a'" in md
    assert f"- Idle sync not measured on rank 0: {why}." in md
    sync_rule = next(r for r in level0["rules"] if r["name"] == "sync-in-step")
    assert sync_rule["status"] == "not_evaluated"

    level1 = run("inference_baseline")
    overview1 = level1["summary"]["overview"]
    assert overview1["unmeasured"] == {} and overview1["ranks"][0]["unmeasured"] == []
    assert "not measured" not in overview_table(read_overview(overview1))
    # diff: a zero nobody measured is no base to compare with
    deltas = overview_deltas(overview_of(level0), overview_of(level1))
    sync = next(d for d in deltas if d.key == "idle_sync_ns")
    assert sync.base is None and sync.target is not None and sync.change is None


def test_p50_is_the_median_not_the_upper_middle() -> None:
    """Steps of 16.4, 16.6, 27.9 and 27.9 ms: the p50 is 22.25 ms (was 27.9, the upper one)."""
    from traceanalyzer.overview.phases import phases_section

    b = StoreBuilder().session(0, "s0", start_ns=0, end_ns=us(200_000))
    t = 0
    for n, ms in enumerate((5.0, 16.4, 16.6, 27.9, 27.9), 1):  # the first step is warm-up
        b.step(0, "s0", n, start_ns=t, dur_ns=us(int(ms * 1000)))
        b.task(
            0, "s0", "MatMul", stream=2, start_ns=t + us(10), dur_ns=us(100), task_type="AI_CORE"
        )
        t += us(int(ms * 1000)) + us(1000)
    store = b.store()
    summary = summarize_rank(store, 0, TopSizes())
    windows, kernels, apis = (
        summary[t].with_columns(rank=pl.lit(0, pl.Int32))
        for t in ("summary_steps", "summary_kernels", "summary_host_apis")
    )
    (row,) = [r for r in phases_section(windows, kernels, apis).rows if r.phase != "warmup"]
    assert row.steps == 4 and row.p50_ns == pytest.approx(22.25e6)


def test_a_serving_headline_leads_with_its_phases() -> None:
    """12 ms prefills and 0.4 ms decodes: the headline gives each phase its own parts and
    median, not one mean over both; a profile of one phase keeps the whole step's headline."""
    from traceanalyzer.overview.headline import phase_headline

    def row(phase: str, steps: int, step_ms: float, compute: float, sync: float) -> dict:
        mean = {"step_ns": step_ms * 1e6, "compute_mix_ns": compute * step_ms * 1e6,
                "idle_sync_ns": sync * step_ms * 1e6}  # fmt: skip
        total = int(steps * step_ms * 1e6)
        return {"phase": phase, "steps": steps, "total_ns": total, "p50_ns": step_ms * 1e6,
                "mean": mean}  # fmt: skip

    rows = read_overview({"phases": {"rows": [
        row("prefill", 1, 12.0, 0.98, 0.0), row("decode", 18, 0.419, 0.29, 0.66),
        row("idle", 3, 1.0, 0.0, 0.0),
    ]}}).phases.rows  # fmt: skip
    assert phase_headline(rows) == (  # by their share of the time
        "Per phase: prefill (1 iteration, p50 12 ms): compute 98%; decode (18, p50 419 µs): "
        "the device drained by host synchronisations 66%, then compute 29%."
    )
    assert phase_headline(rows[1:]) is None
