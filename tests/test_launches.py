"""The launches table: each device task's launch, derived once before the rules.

What the store holds is what linking every task gives (on the real export and a serving
profile); the overview and host-launch-bound read it; a run with other graph-replay calls
links again; a warm run derives nothing; a store written before the table existed still reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
from click.testing import CliRunner

from traceanalyzer.cli import main
from traceanalyzer.derived.launches import launches_of
from traceanalyzer.launch_links import host_launches
from traceanalyzer.store import Store
from traceanalyzer.synth import generate


def _run(*args: str) -> None:
    result = CliRunner().invoke(main, ["run", *args])
    assert result.exit_code in (0, 1), result.output


def _linked_now(store: Store, rank: int) -> pl.DataFrame:
    in_rank = pl.col("rank") == rank
    return host_launches(
        store.table("slices").filter(in_rank), store.table("flows").filter(in_rank)
    )


def test_the_stored_launches_are_every_task_linked(real_g2: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(str(real_g2), "--out", str(out))
    store = Store.open(out)
    for rank in store.sessions()["rank"].unique().to_list():
        stored = launches_of(store, [rank])
        assert stored.height > 0 and stored["link"].is_not_null().mean() > 0.9
        assert stored.equals(_linked_now(store, rank).select(stored.columns))


def test_a_serving_profile_and_a_store_without_the_table(tmp_path: Path) -> None:
    generate("serving", tmp_path / "in", ranks=1, iterations=12, layers=1, markers="python")
    out = tmp_path / "out"
    _run(str(tmp_path / "in"), "--out", str(out))
    stored = launches_of(Store.open(out), [0])
    assert stored.equals(_linked_now(Store.open(out), 0).select(stored.columns))
    findings = json.loads((out / "findings.json").read_text())
    files = {p: p.stat().st_mtime_ns for p in (out / "tables" / "launches").rglob("*.parquet")}
    _run(str(tmp_path / "in"), "--out", str(out))  # warm: nothing derived again
    assert files and {p: p.stat().st_mtime_ns for p in files} == files
    # a store written before the table: derived on read, the same rows and overview
    shutil.rmtree(out / "tables" / "launches")
    assert launches_of(Store.open(out), [0]).equals(stored)
    _run(str(tmp_path / "in"), "--out", str(out), "--force")
    again = json.loads((out / "findings.json").read_text())
    assert again["summary"]["overview"] == findings["summary"]["overview"]


def test_other_replay_calls_are_linked_by_the_rule_itself(tmp_path: Path) -> None:
    generate("serving", tmp_path / "in", ranks=1, iterations=12, layers=1, markers="python")
    plain, other = tmp_path / "plain", tmp_path / "other"
    _run(str(tmp_path / "in"), "--out", str(plain))
    _run(
        str(tmp_path / "in"),
        "--out",
        str(other),
        "--set",
        "host-launch-bound.replay_apis=aclmdlRIExecuteAsync,aclmdlExecute",
    )

    def verdict(out: Path) -> tuple:
        doc = json.loads((out / "findings.json").read_text())
        (rule,) = [r for r in doc["rules"] if r["name"] == "host-launch-bound"]
        return rule["status"], rule["findings"], rule["params"]["replay_apis"]

    assert verdict(plain)[:2] == verdict(other)[:2]
    assert verdict(other)[2] == ["aclmdlRIExecuteAsync", "aclmdlExecute"]


def test_to_pandas_gives_stored_and_derived_tables(tmp_path: Path) -> None:
    """``Store.to_pandas``: a stored table and a derived one (derived in-process for a store
    without it) as pandas frames, their times exact int64 ns."""
    import pandas as pd

    import traceanalyzer
    from traceanalyzer.ingest import ingest

    out = tmp_path / "out"
    ingest(Path(__file__).parents[1] / "sample_traces" / "store_healthy", out)
    store = traceanalyzer.open_store(out)
    slices = store.to_pandas("slices")
    assert isinstance(slices, pd.DataFrame) and len(slices) == store.rows("slices")
    assert str(slices["start_ns"].dtype).startswith("int64")
    steps = store.to_pandas("steps", [0])  # not stored: the run's stage did not run
    assert len(steps) and set(steps["rank"]) == {0}
    assert steps["step_ns"].sum() == store.derived("steps", [0]).collect()["step_ns"].sum()
