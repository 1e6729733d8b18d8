"""benchmarks/bench_overhead.py's figures and page, from given runs (nothing is timed here)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_overhead")


def _runs(bench: ModuleType, base: list[float], ours: list[float], floor: list[float]) -> dict:
    def runs(seconds: list[float]) -> list[dict]:
        return [
            {"seconds": s, "cpu_seconds": s * 1.5, "peak_rss_mb": 100.0, "load": 3.0}
            for s in seconds
        ]

    return {bench.BASE: runs(base), bench.OURS: runs(ours), bench.FLOOR_OUTSIDE: runs(floor)}


def test_the_cost_is_judged_on_each_run_against_its_rounds_floor(bench: ModuleType) -> None:
    """A busy round slows every case of it: the ratios to that round's floor cancel it, where
    the medians of the seconds alone would not."""
    figures = bench.figures(_runs(bench, [2.0, 4.0, 2.0], [2.1, 4.2, 2.1], [1.0, 2.0, 1.0]))
    for metric in bench.METRICS:
        m = figures["metrics"][metric]
        assert m["to_floor"] == {bench.BASE: 2.0, bench.OURS: pytest.approx(2.1)}
        assert m["cost"] == pytest.approx(0.05)
        assert m["pairwise"]["median"] == pytest.approx(1.05)
    assert figures["metrics"]["cpu_seconds"]["cases"][bench.OURS]["median"] == pytest.approx(3.15)


def test_the_page_says_the_verdict_on_the_realistic_rank_and_the_load(bench: ModuleType) -> None:
    machine = {"cores": 2, "cpu": "cpu", "memory_gb": 24.0, "os": "Linux", "python": "3.11"}
    meta = {
        "label": "a change", "machine": machine, "ours_commit": "abc", "base_commit": "def",
        "rounds": 3, "ranks": "realistic: 259 MB", "command": "python benchmarks/x.py",
    }  # fmt: skip
    slow = bench.figures(_runs(bench, [2.0, 2.0, 2.0], [2.4, 2.4, 2.4], [1.0, 1.0, 1.0]))
    failed = {"failed": {bench.OURS: "exit 2: error"}}
    page = bench.render(
        [{"meta": meta, "results": {bench.REALISTIC: slow, "serving": failed}}], "Title", "Notes."
    )
    assert (
        "wall: ours/floor 2.40x against base/floor 2.00x, **+20.0%** (goal <= +5%: missed)" in page
    )
    assert (
        "| realistic | ours | 2.40 (2.40-2.40) | 2.40x | 3.60 (3.60-3.60) | 2.40x | 100 |" in page
    )
    assert "| serving | failed:" in page
    assert "Load average before the runs: 3.0 to 3.0 (median 3.0) on 2 cores." in page
    assert page.rstrip().endswith("Notes.")
