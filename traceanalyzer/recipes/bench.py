"""Find and summarise ``vllm bench serve`` result JSON next to profiling data.

``traceanalyzer run`` can call :func:`find_bench_results` on its input root and show
:func:`format_bench_table` beside the findings (TTFT/TPOT per arm). Reads only
the keys it knows and ignores the rest (the result schema grows between vLLM versions).
Its files are input: read as :mod:`traceanalyzer.json_shape` reads them, found by a walk
that never leaves the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceanalyzer import json_shape
from traceanalyzer.discover import walk_input

__all__ = ["BenchResult", "load_bench_result", "find_bench_results", "format_bench_table"]

_BENCH_FILE = re.compile(r"bench.*\.json")
_METRIC = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


@dataclass(frozen=True)
class BenchResult:
    """One saved result. ``metrics[(stat, metric)]`` in ms, e.g. ``("p99", "ttft")``."""

    path: Path
    arm: str
    completed: int | None
    num_prompts: int | None
    request_throughput: float | None
    metrics: dict[tuple[str, str], float] = field(default_factory=dict)

    def get(self, metric: str, stat: str = "mean") -> float | None:
        return self.metrics.get((stat, metric))


def load_bench_result(path: str | Path, arm: str | None = None) -> BenchResult | None:
    """Parse one result file (a regular file of a bench result's size); ``None`` if it is not
    a ``vllm bench serve`` result."""
    path = Path(path)
    try:
        data: Any = json_shape.load_json(path)
    except json_shape.InputFileError:
        return None
    if not isinstance(data, dict):
        return None
    metrics = {}
    for key, value in data.items():
        m = _METRIC.match(key)
        if m and isinstance(value, (int, float)):
            metrics[(m.group(1), m.group(2))] = float(value)
    if not metrics:
        return None

    def num(key: str) -> Any:
        v = data.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return BenchResult(
        path=path,
        arm=arm or path.parent.name,
        completed=num("completed"),
        num_prompts=num("num_prompts"),
        request_throughput=num("request_throughput"),
        metrics=metrics,
    )


def find_bench_results(root: str | Path) -> list[BenchResult]:
    """Every ``bench*.json`` below ``root`` that is a bench result, sorted by path; the walk
    stays inside ``root`` (:func:`traceanalyzer.discover.walk_input`)."""
    found = [
        Path(entry.path)
        for _, entries in walk_input(Path(root), lambda _, subdirs: subdirs)
        for entry in entries
        if _BENCH_FILE.fullmatch(entry.name)
    ]
    return [result for path in sorted(found) if (result := load_bench_result(path)) is not None]


# the figures of a bench result the reports show: (column, metric, statistic)
COLUMNS = (
    ("mean TTFT", "ttft", "mean"),
    ("p99 TTFT", "ttft", "p99"),
    ("mean TPOT", "tpot", "mean"),
    ("p99 TPOT", "tpot", "p99"),
)


def format_bench_table(results: list[BenchResult]) -> str:
    """A small fixed-width table: arm, completed, mean/p99 TTFT, mean/p99 TPOT (ms)."""
    if not results:
        return ""

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    rows = [("arm", "completed", *(name for name, _, _ in COLUMNS))]
    for r in results:
        completed = "-" if r.completed is None else str(r.completed)
        rows.append((r.arm, completed, *(cell(r.get(m, s)) for _, m, s in COLUMNS)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )
