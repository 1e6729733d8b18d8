"""benchmarks/bench_compare.py's page, from given figures (nothing is timed here)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_compare")


def _meta(bench: ModuleType, preliminary: bool) -> dict:
    machine = {
        "cores": 2,
        "cpu": "cpu",
        "memory_gb": 24.0,
        "os": "Linux",
        "python": "3.11",
        "load_average": (3.0, 2.0, 1.0),
    }
    return {
        "mb": 20,
        "pairs": 3,
        "floor": bench.DEFAULT_FLOOR,
        "preliminary": preliminary,
        "machine": machine,
        "load_after": (4.0, 2.0, 1.0),
        "commit": "abc1234",
        "rank_name": "bench_ascend_pt",
        "trace_mb": 20.0,
        "rank_mb": 21.0,
        "versions": {"traceanalyzer": "0.1.0", "msprof-analyze": "26.2.0"},
        "command": "python benchmarks/bench_compare.py --mb 20 --repeat 1",
    }


def test_page_gives_ratios_against_goals_and_names_a_missing_anchor(bench: ModuleType) -> None:
    results = {
        bench.OURS: {"seconds": 2.0, "peak_rss_mb": 300.0, "did": "everything"},
        bench.ADVISOR: {"seconds": 50.0, "peak_rss_mb": 400.0, "did": "18 analyzers"},
        bench.HTA: {"skipped": "not installed"},
        bench.DEFAULT_FLOOR: {"seconds": 1.0, "peak_rss_mb": 200.0},
        bench.FLOOR_OUTSIDE: {"seconds": 1.6, "peak_rss_mb": 210.0},
    }
    page = bench.render(results, _meta(bench, preliminary=True))
    assert "**Preliminary**" in page and "`--mb 20`" in page
    assert (
        "| msprof-analyze advisor all | 50.00 | 400 | 20.00 | 25.0x | >= 20x | 18 analyzers |"
        in page
    )
    assert "(goal >= 20x: met)" in page
    assert "| HTA TraceAnalysis load | not installed |" in page
    assert "HolisticTraceAnalysis not installed" in page
    assert "Our run / floor: **2.0x**" in page
    assert "both timed from outside (interpreter start-up and imports in both): " in page
    assert "our run / floor 1.2x." in page
    assert "Preliminary" not in bench.render(results, _meta(bench, preliminary=False))


def test_best_takes_the_fastest_time_the_largest_rss_and_any_failure(bench: ModuleType) -> None:
    runs = [{"seconds": 3.0, "peak_rss_mb": 100.0}, {"seconds": 2.0, "peak_rss_mb": 90.0}]
    assert bench.best(runs) == {"seconds": 2.0, "peak_rss_mb": 100.0}
    assert bench.best([*runs, {"failed": "exit 2: boom"}]) == {"failed": "exit 2: boom"}
