"""Files of one rank directory that do not belong together: a side file whose times lie far
from the session's (a kernel_details.csv of November beside a trace of January) is another
session's: said, and left out rather than mixed in."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import polars as pl
from click.testing import CliRunner
from report_support import SAMPLES

from traceanalyzer.cli import main
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store

DAYS_50_US = 50 * 86_400 * 10**6


def _shift_kernel_details(rank_dir: Path, by_us: int) -> None:
    path = rank_dir / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    column = rows[0].index("Start Time(us)")
    for row in rows[1:]:
        whole, _, frac = row[column].partition(".")
        row[column] = f"{int(whole) - by_us}.{frac}"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows(rows)


def test_a_side_file_of_another_session_is_said_and_left_out(tmp_path: Path) -> None:
    shutil.copytree(SAMPLES / "inference_baseline", tmp_path / "in")
    (rank_dir,) = (tmp_path / "in").glob("*_ascend_pt")
    _shift_kernel_details(rank_dir, DAYS_50_US)
    (outcome,) = ingest(tmp_path / "in", tmp_path / "out", jobs=1).outcomes
    (warning,) = [w for w in outcome.warnings if "does not belong" in w]
    assert warning.startswith("kernel_details.csv does not belong to this session: its times")
    assert "lie 50 days before the session's (2025-01-09" in warning
    assert "kernel_details.csv (another session's: left out)" in outcome.incomplete_files
    store = Store.open(tmp_path / "out")
    assert store.table("kernels").collect().height == 0  # not mixed into the session
    assert store.table("slices").filter(pl.col("process") == "Ascend Hardware").collect().height
    result = CliRunner().invoke(main, ["run", str(tmp_path / "in"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 3, result.output  # partial: a file was left out
    assert "kernel_details.csv does not belong to this session" in result.output
    assert "Traceback" not in result.output


def test_files_of_one_session_belong_together(tmp_path: Path) -> None:
    """A healthy sample and a small clock offset (a minute) leave every file in."""
    shutil.copytree(SAMPLES / "inference_baseline", tmp_path / "in")
    (rank_dir,) = (tmp_path / "in").glob("*_ascend_pt")
    _shift_kernel_details(rank_dir, 60 * 10**6)
    (outcome,) = ingest(tmp_path / "in", tmp_path / "out", jobs=1).outcomes
    assert not [w for w in outcome.warnings if "does not belong" in w]
    assert Store.open(tmp_path / "out").table("kernels").collect().height
