"""benchmarks/bench_startup.py's page, from given figures (nothing is timed here)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_startup")


def test_the_page_states_the_goal_the_floor_ratios_and_heavy_imports(bench: ModuleType) -> None:
    results = {
        bench.INTERPRETER: {"seconds": 0.02, "peak_rss_mb": 10.0},
        bench.LIBRARIES: {"seconds": 0.4, "peak_rss_mb": 90.0},
        "sample_traces/a": {"seconds": 1.2, "peak_rss_mb": 200.0},
        "sample_traces/b": {"error": "exit 3"},
    }
    meta = {
        "command": "python benchmarks/bench_startup.py --repeat 1",
        "machine": {
            "cores": 2,
            "cpu": "cpu",
            "memory_gb": 24.0,
            "os": "Linux",
            "python": "3.11",
            "load_average": (1.0, 1.0, 1.0),
        },  # fmt: skip
        "load_after": (1.0, 1.0, 1.0),
        "commit": "abc1234",
    }
    page = bench.render(results, {"sample_traces/a": [], "sample_traces/b": ["matplotlib"]}, meta)
    assert "| sample_traces/a | 1.20 | 3.0x | 200 | none |" in page
    assert "| sample_traces/b | exit 3 |" in page
    assert "Slowest sample: **1.20 s** (goal <= 1.5 s: not met; 1 sample(s) failed)." in page
    assert bench.samples(), "the bundled samples are found"
