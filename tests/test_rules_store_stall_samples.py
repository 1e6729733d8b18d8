"""store-transfer-stall on the committed samples: what sample_traces/README.md says `run` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceanalyzer.engine import evaluate
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
SESSION = "store-transfer-stall.span_source=session"
HINT = f"rerun with --set {SESSION}"


def _status(tmp_path: Path, sample: str, *overrides: str) -> tuple[str, str | None, list]:
    out = tmp_path / sample
    ingest(SAMPLES / sample, out, jobs=1)
    result = evaluate(Store.open(out), overrides=list(overrides))
    (status,) = [s for s in result.rules if s.name == "store-transfer-stall"]
    found = [f for f in result.findings if f.name == "store-transfer-stall"]
    return status.status, status.reason, found


def test_session_sample_hints_the_setting_under_auto(tmp_path: Path) -> None:
    status, reason, found = _status(tmp_path, "store_stall_session")
    assert status == "not_evaluated" and not found
    assert reason is not None and HINT in reason
    assert "waits on streams 39, 40, 43, 46" in reason


def test_session_sample_fires_with_the_setting(tmp_path: Path) -> None:
    """The waits on 39/40/43/46 are launched by the model thread with flows: not the transfer's."""
    _, _, (finding,) = _status(tmp_path, "store_stall_session", SESSION)
    assert "streams 39, 40, 43, 46 sit in NOTIFY_WAIT/EVENT_WAIT" in finding.title
    assert "own stream(s) 9 are excluded" in finding.message


@pytest.mark.parametrize("sample", ["inference_baseline", "capture_healthy"])
def test_ordinary_sessions_get_no_hint(tmp_path: Path, sample: str) -> None:
    status, reason, _ = _status(tmp_path, sample)
    assert status == "not_evaluated" and reason is not None
    assert "no transfer spans found" in reason and "span_source=session" not in reason
