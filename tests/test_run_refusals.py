"""A run refused before its first rank writes nothing and says only why; a run that waits for
another one says so, naming it (README "Exit codes")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from traceanalyzer.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def test_a_run_without_a_rank_session_writes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    fresh = tmp_path / "fresh"
    result = CliRunner().invoke(main, ["run", str(empty), "--out", str(fresh)])
    assert result.exit_code == 2, result.output
    assert not fresh.exists()
    assert "no *_ascend_pt" in result.output
    # progress starts only once there is work
    assert "ingesting" not in result.output and "executor" not in result.output
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("mine")
    again = CliRunner().invoke(main, ["run", str(empty), "--out", str(kept)])
    assert again.exit_code == 2 and _tree(kept) == ["mine.txt"]


def test_refusals_before_the_ingest_leave_out_as_found(tmp_path: Path) -> None:
    """A bad --set, a rule that does not load, --out inside the input: exit 2, nothing written."""
    broken = tmp_path / "broken_rules"
    broken.mkdir()
    (broken / "half.py").write_text("from traceanalyzer.kit import rule\n\nrule(\n")
    inside = tmp_path / "input"
    inside.mkdir()
    (inside / "a_ascend_pt").symlink_to(next(SAMPLE.glob("*_ascend_pt")))
    cases = {
        "bad value": ["run", str(SAMPLE), "--set", "slow-rank.min_ranks=abc"],
        "unknown rule": ["run", str(SAMPLE), "--set", "slow-rnk.min_ranks=2"],
        "broken rule": ["run", str(SAMPLE), "--rules", str(broken)],
        "inside": ["run", str(inside), "--out", str(inside / "out")],
    }
    said = {
        "bad value": "slow-rank.min_ranks: expected a whole number (default 4), got 'abc'",
        "unknown rule": "unknown rule 'slow-rnk'; did you mean 'slow-rank'?",
        "broken rule": f"{broken / 'half.py'}: SyntaxError",
        "inside": "never writes into its input",
    }
    for name, args in cases.items():
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        result = CliRunner().invoke(main, [*args, *(["--out", str(out)] * ("--out" not in args))])
        assert result.exit_code == 2, (name, result.output)
        assert said[name] in result.output, (name, result.output)
        assert "ingesting" not in result.output, name
        assert not out.exists() and not (inside / "out").exists(), name


_HOLD = """
import sys, time
from pathlib import Path
from traceanalyzer import outdir
with outdir.locked(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_waiting_for_another_run_is_said_with_its_pid_and_start(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = json.loads((out / ".lock").read_text())
        assert lock["pid"] == holder.pid and lock["started"]
        result = CliRunner().invoke(
            main, ["run", str(SAMPLE), "--out", str(out), "--lock-wait", "0.3"]
        )
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 2, result.output
    who = f"pid {holder.pid}, started {lock['started']}"
    waiting, refused = result.output.strip().splitlines()
    assert waiting.startswith("waiting up to 0.3 s (--lock-wait) for another traceanalyzer run")
    assert who in waiting
    assert refused.startswith("error: --out") and who in refused and "waited 0.3 s" in refused
    assert _tree(out) == [".lock"]


def test_store_upkeep_is_said_only_with_verbose(tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "out"
    assert CliRunner().invoke(main, ["run", str(SAMPLE), "--out", str(out), "-q"]).exit_code == 0
    part = next((out / "tables" / "slices").glob("rank=0/session=*"))
    shutil.copytree(part, part.parent.parent / "rank=7" / part.name)  # as a killed run leaves
    quiet = CliRunner().invoke(main, ["run", str(SAMPLE), "--out", str(out)])
    assert quiet.exit_code == 0 and "manifest does not list" not in quiet.output
    assert json.loads((out / "ingest.json").read_text())["removed_unlisted"] == [
        f"7/{part.name.removeprefix('session=')}"
    ]
    shutil.copytree(part, part.parent.parent / "rank=7" / part.name)
    verbose = CliRunner().invoke(main, ["run", str(SAMPLE), "--out", str(out), "-v"])
    assert "removed stored tables the manifest does not list: 7/" in verbose.output


def test_annotate_refuses_a_rule_that_does_not_load(tmp_path: Path) -> None:
    from report_support import run_sample

    broken = tmp_path / "broken_rules"
    broken.mkdir()
    (broken / "half.py").write_text("raise ImportError('no such helper')\n")
    out = run_sample("capture_growth_2rank")
    result = CliRunner().invoke(main, ["annotate", str(out), "--rules", str(broken)])
    assert result.exit_code == 2, result.output
    assert f"{broken / 'half.py'}: line 1: ImportError: no such helper" in result.output
    assert not (out / "annotated").exists()
