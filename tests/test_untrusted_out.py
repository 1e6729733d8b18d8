"""An output folder someone sent you is data too (issue [untrusted-input-2]): `annotate`,
`query`, `diff` and a warm `run` validate what they read of an OUT they did not necessarily
write. Session ids and groups in its tables, manifest and ingest.json are names, never paths;
nothing walks or writes outside the input and OUT; a FIFO is refused, never waited on; a
damaged document is exit 2 with the reason. And two rank directories never become one
session."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result

from traceanalyzer.cli import main
from traceanalyzer.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
SECONDS = 60  # a case that takes longer hangs


@contextlib.contextmanager
def _within(seconds: float = SECONDS) -> Iterator[None]:
    """Fail, rather than hang the suite, when the block takes longer than ``seconds``."""

    def over(signum: int, frame: object) -> None:
        raise TimeoutError(f"over {seconds} s: it hangs")

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cli(*args: object) -> Result:
    with _within():
        result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def _run(root: Path, out: Path, *args: str) -> Result:
    return _cli("run", root, "--out", out, "--executor", "local", *args)


# --------------------------------------------------------------------------- one id per rank dir


def test_two_rank_dirs_whose_names_clean_alike_stay_two_sessions(tmp_path: Path) -> None:
    """`job 1_ascend_pt` and `job_1_ascend_pt` once cleaned to one id: the store kept one of
    them, and a warm run called both cached."""
    root = tmp_path / "in"
    sick = next((SAMPLES / "store_stall_session").iterdir())
    healthy = next((SAMPLES / "inference_baseline").iterdir())
    shutil.copytree(sick, root / "job 1_ascend_pt")
    shutil.copytree(healthy, root / "job_1_ascend_pt")
    out = tmp_path / "out"
    cold = _run(root, out)
    assert cold.exit_code in (0, 3), cold.output
    sessions = Store.open(out).sessions()
    ids = sessions["session"].to_list()
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    assert "job_1_ascend_pt" in ids  # a safe name that no other directory shares is kept
    paths = {Path(p).name for p in sessions["path"]}
    assert paths == {"job 1_ascend_pt", "job_1_ascend_pt"}
    slices = Store.open(out).table("slices").group_by("session").len().collect()
    assert slices.height == 2
    warm = _run(root, out)
    assert "2 cached" in warm.output, warm.output
    assert sorted(Store.open(out).sessions()["session"]) == sorted(ids)
    assert Store.open(out).table("slices").group_by("session").len().collect().height == 2
