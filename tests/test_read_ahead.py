"""The scan of a run's one large trace, started before the libraries load (read_ahead)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from traceanalyzer import read_ahead
from traceanalyzer.parse import native_scan, trace_native

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "inference_baseline"

pytestmark = pytest.mark.skipif(not native_scan.available(), reason="native scanner not built")


def _rank(tmp_path: Path) -> Path:
    rank = tmp_path / "in" / SAMPLE.name
    shutil.copytree(next(p for p in SAMPLE.iterdir() if p.name.endswith("_ascend_pt")), rank)
    return rank


def _trace(rank: Path) -> Path:
    return rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"


def _frames(path: Path) -> dict[str, pl.DataFrame]:
    events = trace_native.scan_trace(path, 2)
    frames = {t: getattr(events, t) for t in ("slices", "flat", "counters", "samples", "others")}
    frames.update({f"words {t} {c}": w.to_frame() for (t, c), w in events.words.items()})
    return frames


def test_a_scan_ahead_gives_the_tables_a_scan_gives(tmp_path: Path) -> None:
    trace = _trace(_rank(tmp_path))
    expected = _frames(trace)
    native_scan.scan_ahead(trace, 2)
    got = _frames(trace)  # takes the scan started ahead
    assert native_scan.take_ahead(trace) is None  # taken once
    assert got.keys() == expected.keys()
    for name, frame in expected.items():
        assert_frame_equal(got[name], frame, check_row_order=True), name


def test_a_trace_changed_after_its_scan_ahead_is_scanned_again(tmp_path: Path) -> None:
    trace = _trace(_rank(tmp_path))
    native_scan.scan_ahead(trace, 1)
    events = json.loads(trace.read_text())
    trace.write_text(json.dumps(events[: len(events) // 2]))  # other events, other offsets
    assert native_scan.take_ahead(trace) is None
    native_scan.scan_ahead(trace, 1)
    assert trace_native.scan_trace(trace, 1).slices.height < len(events)


def _started(trace: Path) -> bool:
    return native_scan.take_ahead(trace) is not None


def test_only_a_run_that_will_parse_the_trace_here_first_scans_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank = _rank(tmp_path)
    trace, out = _trace(rank), tmp_path / "out"
    read_ahead.start(rank, out, executor="auto", force=False)
    assert not _started(trace)  # a small trace: nothing to overlap
    monkeypatch.setattr(read_ahead, "MIN_TRACE_BYTES", 0)
    read_ahead.start(rank, out, executor="processes", force=False)
    assert not _started(trace)  # a worker will parse it
    read_ahead.start(rank, out, executor="local", force=False)
    assert _started(trace)
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    read_ahead.start(rank, out, executor="auto", force=False)
    assert not _started(trace)  # a re-run: the session may be cached
    read_ahead.start(rank, out, executor="auto", force=True)
    assert _started(trace)
    shutil.copytree(rank, tmp_path / "in" / "second_ascend_pt")
    read_ahead.start(tmp_path / "in", tmp_path / "out2", executor="auto", force=False)
    assert not _started(trace) and not _started(tmp_path / "in" / "second_ascend_pt")


def test_a_run_parses_the_trace_scanned_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traceanalyzer.cli import main

    rank, taken = _rank(tmp_path), []
    take = native_scan.take_ahead

    def recording_take(path: Path):  # noqa: ANN202
        result = take(path)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(read_ahead, "MIN_TRACE_BYTES", 0)
    monkeypatch.setattr(trace_native, "take_ahead", recording_take)
    result = CliRunner().invoke(main, ["run", str(rank), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code in (0, 1), result.output
    assert taken == [True]
    assert (tmp_path / "out" / "report.html").is_file()


def test_a_scan_ahead_no_parse_took_is_not_held_after_the_ingest(tmp_path: Path) -> None:
    from traceanalyzer.ingest import ingest

    rank = _rank(tmp_path)
    other = tmp_path / "other.json"
    shutil.copy(_trace(rank), other)
    native_scan.scan_ahead(other, 1)  # a file this ingest never reads
    ingest(rank, tmp_path / "out")
    assert native_scan.take_ahead(other) is None
