"""``traceanalyzer synth``: arguments reach generate(); mistakes are usage errors, not tracebacks."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from writer_support import plant, user_state

from traceanalyzer.cli import main
from traceanalyzer.ingest import ingest
from traceanalyzer.synth.cli import synth_command

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


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
        res = runner.invoke(main, ["synth", *args, "--out", str(tmp_path)])
        assert res.exit_code == 2, (args, res.output)
        assert "error:" in res.output and "Traceback" not in res.output
        assert "Error:" not in res.output  # one spelling (README)


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


def _export(tmp_path: Path, export: str, *extra: str) -> list[Path]:
    res = CliRunner().invoke(
        synth_command,
        ["inference-baseline", "--out", str(tmp_path / export), "--export", export]
        + ["--set", "steps=2", "--set", "layers=1", *extra],
    )
    assert res.exit_code == 0, res.output
    return [Path(line) for line in res.output.split()]


def test_export_db_writes_the_databases_and_no_text_files(tmp_path: Path) -> None:
    (rank_dir,) = _export(tmp_path, "db")
    out = rank_dir / "ASCEND_PROFILER_OUTPUT"
    assert sorted(p.name for p in out.iterdir()) == ["analysis.db", "ascend_pytorch_profiler_0.db"]
    # as torch_npu's Db export: profiler_info, no profiler_metadata.json (META_DATA holds it)
    assert sorted(p.name for p in rank_dir.iterdir()) == [
        "ASCEND_PROFILER_OUTPUT",
        "profiler_info_0.json",
    ]
    info = json.loads((rank_dir / "profiler_info_0.json").read_text())
    assert info["config"]["experimental_config"]["_export_type"] == "db"
    con = sqlite3.connect(f"{(out / 'ascend_pytorch_profiler_0.db').as_uri()}?mode=ro", uri=True)
    meta = dict(con.execute("SELECT name, value FROM META_DATA").fetchall())
    assert meta["SCHEMA_VERSION"] == "1.0.0" and "ENV_VARIABLES" in meta
    assert con.execute("SELECT count(*) FROM TASK").fetchone()[0] > 0
    con.close()


def test_export_both_is_one_session_read_from_its_db(tmp_path: Path) -> None:
    (rank_dir,) = _export(tmp_path, "both")
    out = rank_dir / "ASCEND_PROFILER_OUTPUT"
    assert {"trace_view.json", "kernel_details.csv", "ascend_pytorch_profiler_0.db"} <= {
        p.name for p in out.iterdir()
    }
    info = json.loads((rank_dir / "profiler_info_0.json").read_text())
    assert info["config"]["experimental_config"]["_export_type"] == ["text", "db"]
    result = ingest(tmp_path / "both", tmp_path / "store")
    (outcome,) = result.outcomes
    assert (outcome.status, outcome.source_format, outcome.formats_present) == (
        "ingested",
        "db",
        ["text", "db"],
    )
    # ingest.json says which
    assert [s["source_format"] for s in result.to_dict()["sessions"]] == ["db"]


def test_export_db_is_byte_identical_for_a_seed(tmp_path: Path) -> None:
    first = _export(tmp_path / "a", "db")[0] / "ASCEND_PROFILER_OUTPUT"
    second = _export(tmp_path / "b", "db")[0] / "ASCEND_PROFILER_OUTPUT"
    for name in ("ascend_pytorch_profiler_0.db", "analysis.db"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    assert not [p for p in first.iterdir() if p.name.startswith(".")]  # no temp file left


def test_export_db_of_a_generation_without_one_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        synth_command,
        ["inference-baseline", "--out", str(tmp_path), "--export", "db"] + ["--generation", "g1"],
    )
    assert res.exit_code == 2 and "no Db export" in res.output
    assert not list(tmp_path.iterdir())


def _rank_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith("_ascend_pt"))


def test_a_second_scenario_never_mixes_into_an_out_with_ranks(tmp_path: Path) -> None:
    """`synth moe-ep --ranks 4` then `synth store-stall --ranks 1` into one folder gave a mixed
    collection, with no word: refused, or with --force only synth's rank dirs replaced."""
    out = tmp_path / "out"
    user = plant(out)
    small = ["--set", "steps_before=1", "--set", "steps_after=1"]
    first = CliRunner().invoke(main, ["synth", "inference-baseline", "--ranks", "2",
                                      "--set", "steps=1", "--out", str(out)])  # fmt: skip
    assert first.exit_code == 0, first.output
    before = _rank_dirs(out)
    assert len(before) == 2
    refused = CliRunner().invoke(main, ["synth", "store-stall", "--out", str(out), *small])
    assert refused.exit_code == 2, refused.output
    assert "already holds 2 rank director(ies)" in refused.output and before[0] in refused.output
    assert _rank_dirs(out) == before
    replaced = CliRunner().invoke(
        main, ["synth", "store-stall", "--out", str(out), "--force", "--seed", "1", *small]
    )
    assert replaced.exit_code == 0, replaced.output
    after = _rank_dirs(out)
    assert [Path(line).name for line in replaced.output.split()] == after and len(after) == 1
    assert user_state(out) == user
    foreign = out / "job_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    foreign.mkdir(parents=True)
    refused = CliRunner().invoke(
        main, ["synth", "store-stall", "--out", str(out), "--force", *small]
    )
    assert refused.exit_code == 2 and "synth did not write (job_ascend_pt)" in refused.output
    assert foreign.is_dir() and _rank_dirs(out) == sorted([*after, "job_ascend_pt"])


def test_an_invalid_knob_removes_nothing_even_with_force(tmp_path: Path) -> None:
    first = CliRunner().invoke(synth_command, ["inference-baseline", "--set", "steps=1",
                                               "--out", str(tmp_path)])  # fmt: skip
    assert first.exit_code == 0
    before = _rank_dirs(tmp_path)
    res = CliRunner().invoke(synth_command, ["store-stall", "--set", "spans=x", "--force",
                                             "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2 and _rank_dirs(tmp_path) == before


def test_a_default_synth_rank_misses_no_peer(tmp_path: Path) -> None:
    """`synth SCENARIO` writes one rank, a group of one: no parallel_group_info naming a rank 1
    that was never written, so its run warns of no missing rank (the bundled samples neither)."""
    result = CliRunner().invoke(
        main, ["synth", "inference-baseline", "--out", str(tmp_path / "in")]
    )
    assert result.exit_code == 0, result.output
    for folder in (tmp_path / "in", *SAMPLES.iterdir()):
        if not folder.is_dir():
            continue
        for meta in folder.glob("*/profiler_metadata.json"):
            groups = json.loads(meta.read_text("utf-8")).get("parallel_group_info") or {}
            ranks = {
                int(p.name.split("_")[-1].split(".")[0])
                for p in folder.glob("*/profiler_info_*.json")
            }
            for group in groups.values():
                assert set(group["global_ranks"]) <= ranks, (meta, group)
    run = CliRunner().invoke(
        main, ["run", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "-q"]
    )
    assert "missing ranks" not in run.output, run.output
