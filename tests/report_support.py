"""Shared helpers for tests/test_report_*.py: run a sample once per test session, cached."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
SICK = {
    "capture_growth_2rank": "capture-memcpy-growth",
    "capture_growth_level2": "capture-memcpy-growth",
    "store_stall_2rank_rank1_sick": "store-transfer-stall",
    "store_stall_session_marked": "store-transfer-stall",
}

_ROOT = Path(tempfile.mkdtemp(prefix="ta-report-tests-"))
atexit.register(shutil.rmtree, _ROOT, True)


@cache
def run_sample(name: str) -> Path:
    """``traceanalyzer run sample_traces/<name>`` into a session-wide temp dir; returns OUT."""
    from traceanalyzer.cli import main

    out = _ROOT / name
    result = CliRunner().invoke(
        main, ["run", str(SAMPLES / name), "--out", str(out), "-q", "-j", "1"]
    )
    assert result.exit_code in (0, 3), result.output
    return out


def findings(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "findings.json").read_text("utf-8"))["findings"]


def assert_typed_round_trip(overview: dict[str, Any]) -> None:
    """``summary.overview`` reads back as typed values with no problem and writes the same JSON,
    key order included: :mod:`traceanalyzer.overview.model` describes every field written."""
    from traceanalyzer.json_shape import to_json
    from traceanalyzer.overview.model import overview_problems, read_overview

    assert overview_problems(overview) == []
    assert json.dumps(to_json(read_overview(overview))) == json.dumps(overview)
