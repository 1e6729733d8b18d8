"""Device memory: the memory stage, the overview's memory section in every report, and the
memory rules end to end on the synthetic memory scenarios (Text and Db) and the real exports."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from report_support import assert_typed_round_trip

from traceanalyzer.kit import StoreBuilder, us
from traceanalyzer.memory import memory_of
from traceanalyzer.synth import generate

MB = 1 << 20


def _run(src: Path, out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """``traceanalyzer run`` (not quiet: the terminal's overview too); findings.json and the
    terminal's output."""
    from traceanalyzer.cli import main

    result = CliRunner().invoke(main, ["run", str(src), "--out", str(out), "-j", "1", *extra])
    assert result.exit_code in (0, 1, 3), result.output
    return json.loads((out / "findings.json").read_text("utf-8")), result.output


def _memory(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["summary"]["overview"]["memory"]


def _components(doc: dict[str, Any], rank: int) -> dict[str, Any]:
    (row,) = [r for r in _memory(doc)["ranks"] if r["rank"] == rank]
    return row["components"]


# --------------------------------------------------------------------------------------------
# The real exports: the memory section's peaks are memory_record's own, Text and Db alike
# --------------------------------------------------------------------------------------------


def _csv_peaks(path: Path) -> dict[str, dict[str, float]]:
    """Per component, the highest Total Allocated(MB) and Total Reserved(MB) of the CSV."""
    peaks: dict[str, dict[str, float]] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            mine = peaks.setdefault(row["Component"], {})
            for key, column in (
                ("allocated", "Total Allocated(MB)"),
                ("reserved", "Total Reserved(MB)"),
            ):
                if row[column].strip():
                    mine[key] = max(mine.get(key, float("-inf")), float(row[column]))
    return peaks


def _db_peaks(path: Path) -> dict[str, dict[str, float]]:
    """The same from ascend_pytorch_profiler_N.db: MEMORY_RECORD's bytes, NPU_MEM's app rows."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        rows = con.execute(
            "SELECT s.value, max(totalAllocated), max(totalReserved) FROM MEMORY_RECORD m "
            "JOIN STRING_IDS s ON s.id = m.component GROUP BY s.value"
        ).fetchall()
        (app,) = con.execute(
            "SELECT max(ddr + hbm) FROM NPU_MEM WHERE type = (SELECT id FROM STRING_IDS "
            "WHERE value = 'app')"
        ).fetchone()
    finally:
        con.close()
    peaks = {c: {"allocated": a / MB, "reserved": r / MB} for c, a, r in rows}
    return peaks | {"APP": {"reserved": app / MB}}


@pytest.fixture(scope="module")
def real_runs(
    real_g2: Path, real_g2_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, Path, dict[str, Any], str]]:
    out = tmp_path_factory.mktemp("memory-real")
    runs = {}
    for name, src in (("text", real_g2), ("db", real_g2_db)):
        doc, terminal = _run(src, out / name)
        runs[name] = (src, out / name, doc, terminal)
    return runs


@pytest.mark.parametrize("export", ["text", "db"])
def test_real_peaks_are_memory_records_own(real_runs, export: str) -> None:
    """Every component's peak allocated and reserved, per rank, is exactly the highest value
    memory_record.csv (the Db's MEMORY_RECORD and NPU_MEM) records."""
    src, _, doc, _ = real_runs[export]
    for rank in (0, 1):
        output = src / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        expected = (
            _csv_peaks(output / "memory_record.csv")
            if export == "text"
            else _db_peaks(output / f"ascend_pytorch_profiler_{rank}.db")
        )
        got = _components(doc, rank)
        assert sorted(got) == sorted(expected) == ["APP", "GE", "PTA", "PTA+GE"]
        for component, peaks in expected.items():
            for what, value in peaks.items():
                assert got[component][f"peak_{what}_mb"] == value, (rank, component, what)
        assert got["APP"]["peak_allocated_mb"] is None  # the process's memory: reserved only


def test_real_outside_torch_is_app_less_pta_reserved(real_runs) -> None:
    """APP - PTA: at APP's peak sample, the process's memory less what torch's allocator
    reserved then (the last PTA record before it), from the CSV itself."""
    src, _, doc, _ = real_runs["text"]
    path = src / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv"
    with path.open(encoding="utf-8", newline="") as f:
        rows = [(r["Component"], float(r["Timestamp(us)"]), r) for r in csv.DictReader(f)]
    app = [(ts, float(r["Total Reserved(MB)"])) for c, ts, r in rows if c == "APP"]
    peak_ts, peak = max(app, key=lambda a: (a[1], -a[0]))
    held = [
        (ts, float(r["Total Reserved(MB)"])) for c, ts, r in rows if c == "PTA" and ts <= peak_ts
    ]
    expected = peak - max(held)[1]
    (rank0,) = [r for r in _memory(doc)["ranks"] if r["rank"] == 0]
    assert rank0["outside_torch_mb"] == pytest.approx(expected)
    modules = {m["module"] for m in rank0["outside_modules"]}
    assert {"HCCL", "RUNTIME"} <= modules and "APP" not in modules  # npu_module_mem's APP is torch


@pytest.mark.parametrize("export", ["text", "db"])
def test_real_memory_section_in_every_report(real_runs, export: str) -> None:
    _, out, doc, terminal = real_runs[export]
    assert "device memory (peak per rank" in terminal and "1.16 GB" in terminal
    assert "capacity unknown" in terminal
    markdown = (out / "report.md").read_text("utf-8")
    assert "### Device memory" in markdown and "plots/memory-timeline-rank0.svg" in markdown
    html = (out / "report.html").read_text("utf-8")
    assert "Device memory" in html and "seconds from the first record" in html  # inline SVG
    assert (out / "plots" / "memory-timeline-rank1.svg").is_file()
    # one steady step: the rules could not judge a trend, and say so
    statuses = {r["name"]: r["status"] for r in doc["rules"]}
    assert statuses["memory-growth"] == statuses["memory-fragmentation"] == "inconclusive"


# --------------------------------------------------------------------------------------------
# The synthetic memory scenarios, end to end
# --------------------------------------------------------------------------------------------

SCENARIOS = {
    "leak": ("memory-leak", {}),
    "app": ("memory-app-leak", {}),
    "plateau": ("memory-plateau", {"plateau_iterations": 20}),
    "sawtooth": ("memory-sawtooth", {}),
    "fragmentation": ("memory-fragmented", {}),
}


@pytest.fixture(scope="module")
def scenario_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    root = tmp_path_factory.mktemp("memory-scenarios")
    runs = {}
    for name, (scenario, knobs) in SCENARIOS.items():
        generate(scenario, root / name / "in", iterations=32, **knobs)
        runs[name] = (root / name / "in", _run(root / name / "in", root / name / "out")[0])
    return runs


def _fired(doc: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["name"] == rule]


def _leak_truth(src: Path, op: str) -> float:
    """Bytes per second the generator leaked: the op's allocations never freed, over the time
    from the first to the last (operator_memory.csv, not our derivation)."""
    (path,) = src.glob("*/ASCEND_PROFILER_OUTPUT/operator_memory.csv")
    with path.open(encoding="utf-8", newline="") as f:
        leaked = [
            r for r in csv.DictReader(f) if r["Name"] == op and not r["Release Time(us)"].strip()
        ]
    times = [float(r["Allocation Time(us)"]) for r in leaked]
    size = sum(float(r["Size(KB)"]) * 1024 for r in leaked[1:])  # the intervals between them
    return size / ((max(times) - min(times)) / 1e6)


def test_a_leak_in_torch_is_named_with_its_rate(scenario_runs) -> None:
    src, doc = scenario_runs["leak"]
    (finding,) = _fired(doc, "memory-growth")
    m = finding["metrics"]
    assert m["component"] == "PTA"
    assert m["bytes_per_iteration"] == pytest.approx(4 * MB, rel=0.2)
    assert m["rate_bytes_per_s"] == pytest.approx(_leak_truth(src, "aten::empty_strided"), rel=0.2)
    assert m["time_to_oom_s"] is None  # no capacity: unknown, and said why
    assert "capacity is unknown" in finding["message"]
    assert any("aten::empty_strided x32" in never for never in m["never_freed"])
    assert not _fired(doc, "memory-fragmentation")


def test_growth_outside_torch_is_told_from_torchs(scenario_runs) -> None:
    _, doc = scenario_runs["app"]
    (finding,) = _fired(doc, "memory-growth")
    assert finding["metrics"]["component"] == "APP"
    assert finding["metrics"]["bytes_per_iteration"] == pytest.approx(4 * MB, rel=0.2)
    assert "HCCL 404 MB ->" in finding["message"] and not finding["metrics"]["never_freed"]


@pytest.mark.parametrize("decoy", ["plateau", "sawtooth"])
def test_growth_that_stops_or_returns_is_silent(scenario_runs, decoy: str) -> None:
    _, doc = scenario_runs[decoy]
    assert not [f for f in doc["findings"] if f["name"].startswith("memory-")]
    statuses = {r["name"]: r["status"] for r in doc["rules"]}
    assert statuses["memory-growth"] == "clean"


def test_fragmentation_is_named(scenario_runs) -> None:
    _, doc = scenario_runs["fragmentation"]
    (finding,) = _fired(doc, "memory-fragmentation")
    assert finding["metrics"]["gap_mb"] == pytest.approx(8192, rel=0.01)
    assert "expandable_segments:True" in finding["fix"] and "alloc-churn" in finding["fix"]
    assert not _fired(doc, "memory-growth")


def test_scenario_peaks_and_phases(scenario_runs) -> None:
    """The overview's peaks are the generated memory_record.csv's; the peaks per phase scale
    with the batch: a prefill of 2048 tokens allocates 512 MB of activations, a decode 4 MB."""
    src, doc = scenario_runs["leak"]
    (path,) = src.glob("*/ASCEND_PROFILER_OUTPUT/memory_record.csv")
    got = _components(doc, 0)
    for component, peaks in _csv_peaks(path).items():
        for what, value in peaks.items():
            assert got[component][f"peak_{what}_mb"] == value
    (rank,) = _memory(doc)["ranks"]
    phases = {p["phase"]: p for p in rank["phases"]}
    assert phases["prefill"]["activation_mb"] == pytest.approx(512, rel=0.05)
    assert phases["decode"]["activation_mb"] < 16
    assert rank["static"][0]["name"] == "aten::zeros" and rank["static"][0]["size_mb"] == 6144
    assert_typed_round_trip(doc["summary"]["overview"])  # the memory section is typed


def test_the_db_export_gives_the_same_verdicts(tmp_path: Path) -> None:
    generate("memory-leak", tmp_path / "in", iterations=16, export="db")
    doc, _ = _run(tmp_path / "in", tmp_path / "out")
    (finding,) = _fired(doc, "memory-growth")
    assert finding["metrics"]["component"] == "PTA"
    assert finding["metrics"]["bytes_per_iteration"] == pytest.approx(4 * MB, rel=0.2)


def test_the_capacity_setting_gives_headroom_and_time_to_oom(tmp_path: Path) -> None:
    generate("memory-leak", tmp_path / "in", iterations=16)
    doc, terminal = _run(tmp_path / "in", tmp_path / "out", "--set", "memory.capacity_gb=20")
    (rank,) = _memory(doc)["ranks"]
    assert rank["headroom_mb"] == pytest.approx(20 * 1024 - rank["in_use_mb"])
    (finding,) = _fired(doc, "memory-growth")
    assert finding["metrics"]["time_to_oom_s"] > 0 and finding["severity"] == "error"
    assert "capacity unknown" not in terminal
    from traceanalyzer.cli import main

    bad = CliRunner().invoke(main, ["run", str(tmp_path / "in"), "--out", str(tmp_path / "o2"),
                                    "--set", "memory.capacty_gb=20"])  # fmt: skip
    assert bad.exit_code == 2 and "did you mean 'capacity_gb'" in bad.output


def test_the_config_files_memory_table_sets_the_capacity(tmp_path: Path) -> None:
    generate("memory", tmp_path / "in", iterations=8)
    config = tmp_path / "traceanalyzer.toml"
    config.write_text("[memory]\ncapacity_gb = 32\n", encoding="utf-8")
    doc, _ = _run(tmp_path / "in", tmp_path / "out", "--config", str(config))
    assert _memory(doc)["capacity_mb"] == 32 * 1024
    params = {r["name"]: r["params"] for r in doc["rules"]}
    assert (
        params["memory-growth"]["capacity_gb"]
        == params["memory-fragmentation"]["capacity_gb"]
        == 32
    )


def test_a_profile_without_memory_says_how_to_collect_it(tmp_path: Path) -> None:
    generate("inference-baseline", tmp_path / "in", steps=2, layers=1)
    doc, terminal = _run(tmp_path / "in", tmp_path / "out")
    assert "device memory" not in terminal  # nothing to say in the terminal
    reasons = {r["name"]: r["reason"] for r in doc["rules"]}
    expected = "missing memory_record (collect with profile_memory=True)"
    assert expected in reasons["memory-growth"] and expected in reasons["memory-fragmentation"]
    markdown = (tmp_path / "out" / "report.md").read_text("utf-8")
    assert "Not collected: no memory_record (collect with profile_memory=True)." in markdown


def test_a_run_derives_each_ranks_memory_once(tmp_path: Path, monkeypatch) -> None:
    """The memory rules and the overview read one derivation per rank (they derived it three
    times: once per memory rule, side by side, and again for the overview's summary)."""
    from traceanalyzer import memory
    from traceanalyzer.store import RankStore, run_memo

    derived: list[tuple[int, ...] | None] = []
    derive = memory.derive

    def counted(store, ranks=None):
        derived.append(None if ranks is None else tuple(sorted(ranks)))
        return derive(store, ranks)

    monkeypatch.setattr(memory, "derive", counted)
    generate("memory-fragmented", tmp_path / "in", ranks=2, iterations=8)
    doc, _ = _run(tmp_path / "in", tmp_path / "out")
    assert _memory(doc)["ranks"] and sorted(derived) == [(0,), (1,)]
    # outside a run, each snapshot derives its own; inside, the run's snapshots share it
    derived.clear()
    for _ in range(2):
        memory_of(RankStore(tmp_path / "out", [0]), [0])
    with run_memo(tmp_path / "out"):
        for _ in range(2):
            memory_of(RankStore(tmp_path / "out", [0]), [0])
    assert derived == [(0,), (0,), (0,)]


# --------------------------------------------------------------------------------------------
# The stage on hand-built records
# --------------------------------------------------------------------------------------------


def test_a_steps_baseline_includes_the_value_held_when_it_opened() -> None:
    """Step 2 has no record of its own after its start: its baseline and peak are the value
    held from step 1's last record."""
    b = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(300))
    for number in (1, 2, 3):
        b.step(0, "s", number, start_ns=us(100 * (number - 1)), dur_ns=us(90))
    for ts, allocated in ((10, 100.0), (50, 300.0), (80, 150.0), (220, 160.0)):
        b.memory(0, "s", "PTA", ts_ns=us(ts), allocated_mb=allocated, reserved_mb=400.0)
    steps = memory_of(b.store()).steps.filter(pl.col("series") == "PTA").sort("step")
    assert steps["baseline_mb"].to_list() == [100.0, 150.0, 150.0]
    assert steps["peak_mb"].to_list() == [300.0, 150.0, 160.0]


def test_without_operator_memory_the_rises_that_stay_are_the_static_allocations() -> None:
    b = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(100))
    for ts, allocated in ((1, 100.0), (2, 6244.0), (3, 6500.0), (4, 6244.0), (5, 6252.0)):
        b.memory(0, "s", "PTA", ts_ns=us(ts), allocated_mb=allocated, reserved_mb=7000.0)
    unfreed = memory_of(b.store()).unfreed
    assert unfreed.select("name", "size_mb", "source").rows() == [
        ("6144.0 MB held", 6144.0, "memory_record"),
        ("8.0 MB held", 8.0, "memory_record"),
    ]


def test_app_alone_is_all_outside_torch() -> None:
    """A session torch recorded nothing of (APP samples only): its growth is the process's,
    outside torch, and memory-growth judges it."""
    b = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(12 * 20_000))
    for number in range(1, 13):
        b.step(0, "s", number, start_ns=us((number - 1) * 20_000), dur_ns=us(19_900))
        b.memory(
            0, "s", "APP", ts_ns=us((number - 1) * 20_000 + 100), reserved_mb=2_000.0 + 8 * number
        )
    memory = memory_of(b.store())
    assert memory.outside["outside_mb"].to_list()[:2] == [2_008.0, 2_016.0]
    from traceanalyzer.engine import evaluate

    (finding,) = [f for f in evaluate(b.store()).findings if f.name == "memory-growth"]
    assert finding.metrics["component"] == "APP"


def test_a_long_profiles_timeline_keeps_600_runs_at_most() -> None:
    """4,000 windows alternating decode and idle are drawn at the phase strip's resolution."""
    from traceanalyzer.overview.memory import _lanes
    from traceanalyzer.overview.phases import TIMELINE_RUNS

    n = 4_000
    steps = pl.DataFrame(
        {
            "rank": [0] * n,
            "session": ["s"] * n,
            "start_ns": [i * 1_000 for i in range(n)],
            "end_ns": [(i + 1) * 1_000 for i in range(n)],
            "phase": ["decode" if i % 2 else "idle" for i in range(n)],
        }
    )
    timeline = pl.DataFrame({"line": ["APP"], "ts_ns": [0], "min_mb": [1.0], "max_mb": [2.0]})
    lane = _lanes(0, timeline, steps)
    assert 0 < len(lane.runs) <= TIMELINE_RUNS
    assert lane.runs[-1].end_ns == n * 1_000
