"""Rank groups: many small ranks stored and analysed together, with the answers of ranks alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ingest_faults
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import STALLED_RANKS as RANKS

from traceanalyzer.cli import main
from traceanalyzer.discover import discover
from traceanalyzer.ingest import groups
from traceanalyzer.ingest.budget import input_bytes
from traceanalyzer.ingest.groups import plan_groups
from traceanalyzer.schema import DERIVED_TABLES, TABLES, TABLES_DIR
from traceanalyzer.store import RankStore, Store, rank_shards


@pytest.fixture(scope="module")
def collection(stalled_collection: Path) -> Path:
    """Eight small store-stall ranks; ranks 2 and 5 stall."""
    return stalled_collection


@pytest.fixture
def grouped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Group from four small ranks on, in groups of four (the defaults need 32 ranks)."""
    monkeypatch.setattr(groups, "GROUP_FROM_RANKS", 4)
    monkeypatch.setattr(groups, "_GROUPS_AT_LEAST", 2)


def _run(root: Path, out: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", str(root), "--out", str(out), "-q", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads((out / "findings.json").read_text())


def _answer(doc: dict) -> dict:
    """What a run concluded: each rule's status and reason, each finding's text and ranks."""
    return {
        "rules": [(r["rule"], r["status"], r["reason"]) for r in doc["rules"]],
        "findings": [(f["rule"], f["ranks"], f["title"]) for f in doc["findings"]],
        "key_figures": doc["key_figures"],
    }


def _table(out: Path, name: str) -> pl.DataFrame:
    frame = Store.open(out).table(name).collect()
    return frame.sort(frame.columns, nulls_last=True)


def _files(out: Path) -> int:
    return sum(1 for path in (out / TABLES_DIR).rglob("*") if path.is_file())


@pytest.fixture(scope="module")
def alone(collection: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("alone") / "out"
    assert _run(collection, out)[0] == 0
    return out


def test_plan_groups_small_ranks_in_rank_order(collection: Path, grouped: None) -> None:
    sessions = discover(collection).sessions
    sizes = {s.key: input_bytes(s) for s in sessions}
    plan = plan_groups(sessions, sizes)
    assert sorted(set(plan.values())) == ["0-3", "4-7"]
    assert {key.split("/")[0] for key, group in plan.items() if group == "0-3"} == set("0123")
    # a large rank is stored on its own; the small ones around it still group, in rank order
    big = next(s for s in sessions if s.rank == 3)
    sizes[big.key] = groups.SMALL_RANK_BYTES + 1
    plan = plan_groups(sessions, sizes)
    assert big.key not in plan and sorted(set(plan.values())) == ["0-4", "5-7"]


def test_plan_groups_needs_many_small_ranks(collection: Path) -> None:
    sessions = discover(collection).sessions
    assert plan_groups(sessions, {s.key: input_bytes(s) for s in sessions}) == {}


def test_groups_answer_as_ranks_alone(
    collection: Path, alone: Path, tmp_path: Path, grouped: None
) -> None:
    out = tmp_path / "out"
    code, doc = _run(collection, out)
    assert code == 0
    assert _answer(doc) == _answer(json.loads((alone / "findings.json").read_text()))
    assert rank_shards(out, range(RANKS)) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert (out / TABLES_DIR / "slices" / "group=0-3").is_dir()
    for name in [*TABLES, *DERIVED_TABLES]:
        assert _table(out, name).equals(_table(alone, name)), name
    # a shard of one rank sees that rank's rows only, from its group's file
    shard = RankStore(out, [5]).table("slices").collect()
    assert (
        set(shard["rank"]) == {5}
        and shard.height == _table(alone, "slices").filter(pl.col("rank") == 5).height
    )
    assert _files(out) < _files(alone) / 3
    # the SQL views read the groups' files too
    query = [
        "query",
        str(out),
        "SELECT rank, count(*) AS n FROM slices GROUP BY rank ORDER BY rank",
    ]
    grouped_rows = CliRunner().invoke(main, [*query, "--format", "csv"]).output
    query[1] = str(alone)
    assert grouped_rows == CliRunner().invoke(main, [*query, "--format", "csv"]).output


def test_groups_rerun_warm_and_follow_the_input(
    collection: Path, alone: Path, tmp_path: Path, grouped: None
) -> None:
    root = tmp_path / "in"
    shutil.copytree(collection, root)
    out = tmp_path / "out"
    first = _answer(_run(root, out)[1])
    ingest_doc = json.loads((out / "ingest.json").read_text())
    assert {s["status"] for s in ingest_doc["sessions"]} == {"ingested"}
    # warm: every group cached, the same answer
    assert _answer(_run(root, out)[1]) == first
    ingest_doc = json.loads((out / "ingest.json").read_text())
    assert {s["status"] for s in ingest_doc["sessions"]} == {"cached"}
    # a rank leaves the input: its group is stored again without it, the other group is kept
    gone = next(s for s in discover(root).sessions if s.rank == 6)
    shutil.rmtree(gone.path)
    _run(root, out)
    statuses = {
        s["rank"]: s["status"] for s in json.loads((out / "ingest.json").read_text())["sessions"]
    }
    assert statuses == {0: "cached", 1: "cached", 2: "cached", 3: "cached", 4: "ingested",
                        5: "ingested", 7: "ingested"}  # fmt: skip
    assert sorted(set(_table(out, "slices")["rank"])) == [0, 1, 2, 3, 4, 5, 7]
    assert sorted(_table(out, "steps")["rank"].unique()) == [0, 1, 2, 3, 4, 5, 7]
    stored = pl.read_parquet(out / TABLES_DIR / "slices" / "group=4-7" / "part-0.parquet")
    assert sorted(stored["rank"].unique()) == [4, 5, 7]
    assert _answer(_run(root, out)[1]) == _answer(_run(root, tmp_path / "fresh")[1])


def test_a_failed_rank_leaves_its_group_stored(
    collection: Path, tmp_path: Path, grouped: None
) -> None:
    root = tmp_path / "in"
    shutil.copytree(collection, root)
    broken = next(s for s in discover(root).sessions if s.rank == 1)
    (broken.output_dir / "trace_view.json").write_bytes(b"\x00\x01 not json at all")
    out = tmp_path / "out"
    code, _ = _run(root, out)
    assert code == 3  # partial
    statuses = {
        s["rank"]: s["status"] for s in json.loads((out / "ingest.json").read_text())["sessions"]
    }
    assert statuses[1] == "failed" and all(v != "failed" for r, v in statuses.items() if r != 1)
    assert 1 not in set(_table(out, "slices")["rank"])
    assert {0, 2, 3} <= set(_table(out, "slices")["rank"])


def test_a_damaged_group_file_is_ingested_again(
    collection: Path, tmp_path: Path, grouped: None
) -> None:
    out = tmp_path / "out"
    first = _answer(_run(collection, out)[1])
    damaged = out / TABLES_DIR / "slices" / "group=4-7" / "part-0.parquet"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    result = CliRunner().invoke(main, ["run", str(collection), "--out", str(out)])
    assert "ranks 4-7: tables/slices: size differs from the one recorded; ingested again" in (
        result.output
    )
    statuses = {
        s["rank"]: s["status"] for s in json.loads((out / "ingest.json").read_text())["sessions"]
    }
    assert [statuses[r] for r in range(RANKS)] == ["cached"] * 4 + ["ingested"] * 4
    assert _answer(json.loads((out / "findings.json").read_text())) == first


def test_a_worker_killed_in_a_group_is_survived(
    collection: Path, alone: Path, tmp_path: Path, grouped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest_faults.arm(monkeypatch, kill_rank=5, once=tmp_path / "killed-once")
    out = tmp_path / "out"
    code, doc = _run(collection, out, "--executor", "processes", "-j", "2")
    assert (tmp_path / "killed-once").exists() and code == 0
    assert _answer(doc) == _answer(json.loads((alone / "findings.json").read_text()))
    for name in ("slices", "steps", "summary_steps"):
        assert _table(out, name).equals(_table(alone, name)), name


def test_derived_ranks_reads_the_keys_of_ranks_and_of_groups(tmp_path: Path) -> None:
    """A derived table's key is written per shard once it is derived (rows or none): a rank
    stored alone by its own key, a rank of a group by the group's."""
    from traceanalyzer.store import DERIVED_KEYS_DIR, TABLES_DIR, derived_ranks

    keys = tmp_path / DERIVED_KEYS_DIR / "moe_layers"
    keys.mkdir(parents=True)
    for label in ("rank=7", "rank=-1", "group=10-19", "rank=x"):
        (keys / f"{label}.key").write_text("k")
    # keys without the table's folder (removed, or an OUT copied without it) count for none
    assert derived_ranks(tmp_path, "moe_layers", [7]) == set()
    (tmp_path / TABLES_DIR / "moe_layers").mkdir(parents=True)
    assert derived_ranks(tmp_path, "moe_layers", [-1, 0, 7, 10, 15, 19, 20]) == {-1, 7, 10, 15, 19}
    assert derived_ranks(tmp_path, "moe_dense", [7]) == set()  # no key of that table
    assert derived_ranks(None, "moe_layers", [7]) == set()  # a store in memory: none
