"""Derived tables as declared stages: a table is one schema entry, one declaration and one
function, and the one runner derives it per shard, keys it (a warm run derives nothing; a
changed setting, or a changed input stage, derives it again), removes what a crashed task left
and the shards no longer in the store; its reader derives it in-process for a store without it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from traceanalyzer import overview, stages, steps
from traceanalyzer.engine.config import namespace_params
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.executor import LocalExecutor
from traceanalyzer.ingest import ingest
from traceanalyzer.schema import DERIVED_TABLES, I64, Column, Table
from traceanalyzer.stages import STAGES, Stage, declare, rule_input_tables, run_stages
from traceanalyzer.store import DERIVED_KEYS_DIR, DERIVED_READERS, TABLES_DIR, Store

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "store_stall_2rank_rank1_sick"
BUSY = "stream_busy"
WIDE = "stream_wide"
CRASHING: set[int] = set()  # ranks whose task dies


def _table(name: str, *columns: Column) -> Table:
    key = DERIVED_TABLES["steps"].columns[:2]  # rank, session
    return Table(name, "A test's table.", "derived: slices", (*key, *columns))


BUSY_PARAMS = {"min_tasks": Param(1, "Streams of this many device tasks or more.")}


def stream_busy_params(settings: dict | None) -> Params:
    return namespace_params(BUSY, BUSY_PARAMS, settings)


def derive_stream_busy(store: Store, ranks: list[int], params: Params) -> pl.DataFrame:
    """Per session and stream, the device tasks and their time (docs/architecture.md's)."""
    if CRASHING & set(ranks):
        raise RuntimeError("the task died")
    return (
        store.table("slices")
        .filter(pl.col("rank").is_in(ranks) & pl.col("stream_id").is_not_null())
        .group_by("rank", "session", "stream_id")
        .agg(pl.len().alias("tasks"), pl.col("dur_ns").sum().alias("busy_ns"))
        .filter(pl.col("tasks") >= params.min_tasks)
        .collect()
    )


def derive_wide(store: Store, ranks: list[int], params: None) -> pl.DataFrame:
    """The streams of the busy ones with more tasks than the median's (reads another stage)."""
    busy = store.derived(BUSY, ranks).collect()
    return busy.filter(pl.col("tasks") > pl.col("tasks").median()).select(
        "rank", "session", "stream_id"
    )


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Stage, Stage]]:
    """The two stages, declared for the test only (the registries as they were after it)."""
    monkeypatch.setitem(DERIVED_TABLES, BUSY, _table(BUSY, Column("stream_id", I64, "Stream."),
                        Column("tasks", I64, "Tasks."), Column("busy_ns", I64, "Their time.")))  # fmt: skip
    monkeypatch.setitem(DERIVED_TABLES, WIDE, _table(WIDE, Column("stream_id", I64, "Stream.")))
    registered, readers = dict(STAGES), dict(DERIVED_READERS)
    busy = declare(Stage(BUSY, (BUSY,), derive_stream_busy, ("slices",), BUSY, stream_busy_params))
    wide = declare(Stage(WIDE, (WIDE,), derive_wide, (BUSY,)))
    yield busy, wide
    CRASHING.clear()
    for registry, was in ((STAGES, registered), (DERIVED_READERS, readers)):
        registry.clear()
        registry.update(was)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stages") / "out"
    ingest(SAMPLE, out)
    return out


@pytest.fixture
def out(ingested: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(ingested, copy)
    return copy


def _run(out: Path, *declared: Stage, **settings: Any) -> stages.StageRun:
    return run_stages(out, LocalExecutor(), declared, settings)


def _mtimes(out: Path, table: str) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (out / TABLES_DIR / table).rglob("*.parquet")}


def test_a_declared_stage_is_derived_per_shard_keyed_and_read(
    declared: tuple[Stage, Stage], out: Path
) -> None:
    busy, wide = declared
    assert _run(out, busy, wide).computed == {BUSY: [0, 1], WIDE: [0, 1]}
    store = Store.open(out)
    stored = store.table(BUSY).collect().sort("rank", "session", "stream_id")
    every = derive_stream_busy(store, [0, 1], stream_busy_params(None)).sort(
        "rank", "session", "stream_id"
    )
    assert stored.height > 4 and stored.equals(every.cast(stored.schema))  # type: ignore[arg-type]
    read = store.derived(BUSY, [1]).collect().sort("session", "stream_id")
    assert read.equals(stored.filter(pl.col("rank") == 1))
    # warm: nothing derived, nothing written
    files = _mtimes(out, BUSY) | _mtimes(out, WIDE)
    assert _run(out, busy, wide).computed == {BUSY: [], WIDE: []}
    assert _mtimes(out, BUSY) | _mtimes(out, WIDE) == files
    # a setting of the first changes its key, and so the key of the stage that reads it
    again = _run(out, busy, wide, **{BUSY: {"min_tasks": 10}})
    assert again.computed == {BUSY: [0, 1], WIDE: [0, 1]}
    assert Store.open(out).table(BUSY).select(pl.col("tasks").min()).collect().item() >= 10


def test_a_crashed_task_leaves_nothing_and_stale_shards_go(
    declared: tuple[Stage, Stage], out: Path
) -> None:
    busy, _ = declared
    _run(out, busy)
    stale = out / TABLES_DIR / BUSY / "rank=7"
    shutil.copytree(out / TABLES_DIR / BUSY / "rank=1", stale)  # a rank no longer in the store
    CRASHING.add(1)
    run = _run(out, busy, **{BUSY: {"min_tasks": 10}})
    assert list(run.failed) == [1] and "the task died" in run.failed[1]
    assert not (out / TABLES_DIR / BUSY / "rank=1").exists() and not stale.exists()
    assert not (out / DERIVED_KEYS_DIR / BUSY / "rank=1.key").exists()
    assert (out / DERIVED_KEYS_DIR / BUSY / "rank=0.key").is_file()
    # its reader derives the rank's rows in-process (at the defaults) rather than show none
    CRASHING.clear()
    alone = Store.open(out).derived(BUSY, [1]).collect()
    assert alone.height and alone["tasks"].min() < 10
    assert _run(out, busy, **{BUSY: {"min_tasks": 10}}).computed == {BUSY: [1]}


def test_a_derive_gives_only_its_tables(declared: tuple[Stage, Stage], out: Path) -> None:
    def other(store: Store, ranks: list[int], params: None) -> Iterator[tuple[str, Any]]:
        yield WIDE, pl.DataFrame()

    run = _run(out, Stage("wrong", (BUSY,), other))
    assert set(run.failed) == {0, 1} and "not one of its tables" in run.failed[0]
    # a table the derivation gives no rows of holds none (nothing left of an earlier run)
    _run(out, declared[0])
    assert _run(out, Stage(BUSY, (BUSY,), lambda *_: {})).computed == {BUSY: [0, 1]}
    assert Store.open(out).table(BUSY).collect().is_empty()


def test_declarations_are_checked(declared: tuple[Stage, Stage]) -> None:
    with pytest.raises(ValueError, match="stepz is no derived table"):
        declare(Stage("typo", ("stepz",), derive_wide))
    with pytest.raises(ValueError, match="stream_busy is another stage's"):
        declare(Stage("twice", (BUSY,), derive_wide))
    STAGES.pop(WIDE)
    with pytest.raises(ValueError, match="input wide is no table derived before it"):
        declare(Stage("early", (WIDE,), derive_wide, ("slices", "wide")))
    with pytest.raises(ValueError, match="derives no table"):
        declare(Stage("idle", (), derive_wide))


def test_every_derived_table_is_one_declared_stage_s() -> None:
    assert steps.stage and overview.stage  # the packages declare their stages on import
    made = [table for stage in STAGES.values() for table in stage.tables]
    assert sorted(made) == sorted(DERIVED_TABLES)
    # the rules read the steps' package's, derived before them; the overview's come after
    before = [stage for stage in STAGES.values() if stage.before_rules]
    assert {stage.derive.__module__.rpartition(".")[0] for stage in before} == {steps.__name__}
    assert set(rule_input_tables()) == {t for t in DERIVED_TABLES if not t.startswith("summary")}
