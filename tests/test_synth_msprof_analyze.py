"""Acceptance: the official msprof-analyze takes our exports (Text and Db) as it takes the real ones.

``cluster -m all`` writes into its input and ``advisor`` drops files into its
working directory, so both run on copies inside a temp dir, with the temp dir as
cwd. Skipped when msprof-analyze is not installed (``pip install msprof-analyze``).
"""

from __future__ import annotations

import csv
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from synth_support import real_export, real_g2_level1, skip_reason

from traceanalyzer.synth import generate

EXE = shutil.which("msprof-analyze") or (
    str(Path(__import__("sys").executable).with_name("msprof-analyze"))
    if Path(__import__("sys").executable).with_name("msprof-analyze").exists()
    else None
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(EXE is None, reason="msprof-analyze not installed"),
]

CASES = {
    "capture-growth-g2-l1": dict(scenario="capture-growth", ranks=2, rounds=1, layers=1),
    "capture-healthy-g2-l2": dict(scenario="capture-healthy", ranks=2, level=2, rounds=1, layers=1),
    "store-stall-g2-l1": dict(scenario="store-stall", ranks=2, sick="1", layers=1),
    "store-stall-session": dict(scenario="store-stall", ranks=2, profile_style="session"),
    "store-healthy-g3-l1": dict(scenario="store-healthy", ranks=2, generation="g3", layers=1),
    "baseline-current-l2": dict(
        scenario="inference-baseline", ranks=2, generation="current", level=2, tp_comm=1, steps=3
    ),
    "baseline-g2-l0": dict(scenario="inference-baseline", ranks=2, level=0, steps=3),
    "baseline-g1-l1": dict(
        scenario="inference-baseline", ranks=2, generation="g1", tp_comm=1, steps=3
    ),
}


def _run(*commands: tuple[list[str], Path]) -> None:
    """Run each (args, cwd) at once (each is one single-threaded process: side by side they
    take half the time on two cores), then check each ended cleanly."""
    procs = [
        subprocess.Popen(
            [EXE, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for args, cwd in commands
    ]
    for proc in procs:
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert "[ERROR]" not in out, [line for line in out.splitlines() if "[ERROR]" in line][:5]


def _check_both(root: Path, ranks: int, rank_dir: Path, tmp_path: Path) -> None:
    """``cluster`` on the collection and ``advisor`` on a copy of one rank (``cluster`` writes
    into its input), side by side, each in a working directory of its own."""
    copy = tmp_path / "advised" / rank_dir.name
    shutil.copytree(rank_dir, copy)
    cwds = [tmp_path / "cwd-cluster", tmp_path / "cwd-advisor"]
    for cwd in cwds:
        cwd.mkdir()
    adv = tmp_path / "adv"
    _run(
        (["cluster", "-m", "all", "-d", str(root)], cwds[0]),
        (["advisor", "all", "-d", str(copy), "-o", str(adv)], cwds[1]),
    )
    _check_cluster_output(root, ranks)
    assert list(adv.glob("mstt_advisor_*.html"))


def _check_cluster_output(root: Path, ranks: int) -> None:
    steps = root / "cluster_analysis_output" / "cluster_step_trace_time.csv"
    assert steps.is_file()
    with open(steps, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Type"] == "rank"]
    assert {int(r["Index"]) for r in rows} == set(range(ranks))


def test_real_export_is_accepted(tmp_path: Path) -> None:
    real = real_g2_level1()
    if real is None:
        pytest.skip(skip_reason("g2_level1"))
    root = tmp_path / "real"
    shutil.copytree(real, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    _check_both(root, 2, root / "rank0_ascend_pt", tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_export_is_accepted(tmp_path: Path, case: str) -> None:
    spec = dict(CASES[case])
    scenario = spec.pop("scenario")
    root = tmp_path / "data"
    dirs = generate(scenario, root, **spec)
    _check_both(root, len(dirs), dirs[-1], tmp_path)


def _check_cluster_db(root: Path, ranks: int, cwd: Path) -> None:
    """A Db export: msprof-analyze reads the databases and writes cluster_analysis.db."""
    _run((["cluster", "-m", "all", "-d", str(root)], cwd))
    out = root / "cluster_analysis_output" / "cluster_analysis.db"
    con = sqlite3.connect(f"{out.as_uri()}?mode=ro", uri=True)
    try:
        steps = con.execute(
            'SELECT DISTINCT "index" FROM ClusterStepTraceTime WHERE type = ?', ["rank"]
        )
        assert {int(r[0]) for r in steps} == set(range(ranks))
        assert con.execute("SELECT count(*) FROM ClusterCommunicationTime").fetchone()[0] > 0
    finally:
        con.close()


def test_real_db_export_is_accepted(tmp_path: Path) -> None:
    real = real_export("g2_db_level1")
    if real is None:
        pytest.skip(skip_reason("g2_db_level1"))
    root = tmp_path / "real"
    shutil.copytree(real, root)
    for p in root.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _check_cluster_db(root, 2, cwd)


@pytest.mark.parametrize("case", ["baseline-current-l2", "store-stall-g2-l1"])
def test_generated_db_export_is_accepted(tmp_path: Path, case: str) -> None:
    spec = dict(CASES[case])
    scenario = spec.pop("scenario")
    root = tmp_path / "data"
    dirs = generate(scenario, root, export="db", **spec)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _check_cluster_db(root, len(dirs), cwd)
