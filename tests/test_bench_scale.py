"""benchmarks/bench_scale.py --small: many small ranks, their fixed cost and the store's size.

The benchmark's own figures are not checked (this machine is shared): only that a tiny case
runs end to end, through the CLI as the benchmark runs it, and publishes every figure."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

from traceanalyzer.discover import discover

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    inputs = importlib.import_module("bench_inputs")
    monkeypatch.setattr(inputs, "CACHE", tmp_path / "cache")
    return importlib.import_module("bench_scale")


def test_a_small_collection_and_its_subset_are_distinct_ranks(bench: ModuleType) -> None:
    inputs = importlib.import_module("bench_inputs")
    root = inputs.build_small_collection(4)
    assert sorted(s.rank for s in discover(root).sessions) == [0, 1, 2, 3]
    assert inputs.build_small_collection(4) == root  # cached
    part = inputs.build_small_collection(2, of=4)
    assert sorted(s.rank for s in discover(part).sessions) == [0, 1]
    for rank in part.iterdir():  # the same files, hard-linked
        trace = Path("ASCEND_PROFILER_OUTPUT") / "trace_view.json"
        assert (rank / trace).stat().st_ino == (root / rank.name / trace).stat().st_ino


def test_tree_size_counts_files_dirs_and_a_hard_link_once(
    bench: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "t" / "d").mkdir(parents=True)
    (tmp_path / "t" / "d" / "a").write_bytes(b"x" * 5000)
    (tmp_path / "t" / "b").hardlink_to(tmp_path / "t" / "d" / "a")
    size = bench.tree_size(tmp_path / "t")
    assert (size["files"], size["dirs"], size["apparent_bytes"]) == (2, 2, 5000)
    blocks = sum(p.stat().st_blocks * 512 for p in (tmp_path / "t", tmp_path / "t" / "d"))
    assert size["on_disk_bytes"] == blocks + (tmp_path / "t" / "b").stat().st_blocks * 512
    assert size["dirs_on_disk_bytes"] == blocks


def test_small_ranks_publish_the_floor_ratio_fixed_cost_and_store_size(
    bench: ModuleType, tmp_path: Path
) -> None:
    out = tmp_path / "small.json"
    argv = ["--small", "8", "--jobs", "2", "--work", str(tmp_path / "work"), "--json", str(out)]
    bench.main(argv + ["--clean"])
    figures = json.loads(out.read_text())
    assert (figures["ranks"], figures["quarter_ranks"]) == (8, 2)
    assert figures["floor"]["traces"] == 8 and figures["floor"]["seconds"] > 0
    assert {"traces_s", "csvs_s", "side_jsons_s"} <= set(figures["floor"])
    floor = figures["floor"]
    assert figures["input"]["files"] == floor["traces"] + floor["csvs"] + floor["side_jsons"]
    for run in ("cold", "warm", "quarter_cold"):
        assert figures[run]["exit_code"] in (0, 1) and figures[run]["executor"], run
        assert set(figures[run]["stages"]) == {"steps", "rules", "overview"}, run
    assert figures["cold"]["statuses"] == {"ingested": 8}
    assert figures["warm"]["statuses"] == {"cached": 8}
    assert figures["store"]["all"]["files"] > figures["store"]["tables"]["files"] > 0
    derived = figures["derived"]
    for key in (
        "cold_x_floor",
        "warm_x_floor",
        "per_rank_s",
        "intercept_s",
        "store_x_input_on_disk",
        "store_x_input_apparent",
        "store_files",
        "store_dirs",
        "store_files_per_rank",
        "store_dirs_per_rank",
        "store_dirs_share_on_disk",
    ):
        assert isinstance(derived[key], int | float), key
    stages = {"steps", "rules", "overview", "ingest_and_rest", "ingest_tasks"}
    assert set(derived["stage_s_per_rank"]) == set(derived["stage_slope_s_per_rank"]) == stages
    assert set(figures["goals"]) == {"cold <= 5x floor", "store on disk <= 1.5x input"}
    assert not (tmp_path / "work" / "out-small-n").exists()  # --clean


def test_small_needs_two_ranks(bench: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--small", "1", "--work", str(tmp_path)])
