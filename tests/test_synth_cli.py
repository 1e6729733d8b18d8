"""``traceanalyzer synth``: arguments reach generate(); mistakes are usage errors, not tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.synth.cli import synth_command


def test_writes_rank_dirs(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        synth_command,
        [
            "store-stall",
            "--out",
            str(tmp_path),
            "--ranks",
            "2",
            "--set",
            "sick=1",
            "--profile-style",
            "session",
            "--set",
            "mark_transfer=1",
        ],
    )
    assert res.exit_code == 0, res.output
    dirs = [Path(line) for line in res.output.split()]
    assert len(dirs) == 2 and all(d.name.endswith("_ascend_pt") for d in dirs)
    meta = json.loads((dirs[1] / "profiler_metadata.json").read_text())
    assert meta["traceanalyzer.window"] == "store_transfer"


def test_unknown_scenario_and_knob_are_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    for args in (
        ["nope"],
        ["store-stall", "--set", "bogus=1"],
        ["store-stall", "--set", "spans=x"],
        ["store-stall", "--set", "novalue"],
        ["capture-growth", "--profile-style", "session"],
    ):
        res = runner.invoke(synth_command, [*args, "--out", str(tmp_path)])
        assert res.exit_code == 2, (args, res.output)
        assert "Error:" in res.output and "Traceback" not in res.output


def test_profiled_rounds_write_one_session_per_round(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        synth_command,
        ["capture-growth", "--out", str(tmp_path), "--set", "profiled_rounds=1, 3"]
        + ["--set", "captures=2", "--set", "layers=1"],
    )
    assert res.exit_code == 0, res.output
    dirs = [Path(line) for line in res.output.split()]
    assert len(dirs) == 2 and dirs == sorted(dirs)
    assert sorted(p.name for p in tmp_path.iterdir()) == [d.name for d in dirs]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0,2", "numbered from 1"),
        ("-1", "numbered from 1"),
        ("3,2", "strictly increasing"),
        ("2,2", "strictly increasing"),
        ("1,x", "comma-separated round numbers"),
        ("1,,2", "comma-separated round numbers"),
        ("1.5", "comma-separated round numbers"),
    ],
)
def test_bad_profiled_rounds_are_usage_errors(tmp_path: Path, value: str, message: str) -> None:
    out = tmp_path / "out"
    for scenario in ("capture-growth", "capture-healthy"):
        res = CliRunner().invoke(
            synth_command, [scenario, "--out", str(out), "--set", f"profiled_rounds={value}"]
        )
        assert res.exit_code == 2, (value, res.output)
        assert "profiled_rounds" in res.output and message in res.output
        assert "Traceback" not in res.output
    assert not out.exists()  # validated before anything is written
