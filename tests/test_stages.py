"""Derived tables as declared stages: a table is one schema entry, one declaration and one
function, and the one runner derives it per shard, keys it (a warm run derives nothing; a
changed setting, or a changed input stage, derives it again), removes what a crashed task left
and the shards no longer in the store; its reader derives it in-process for a store without it.
"""

from __future__ import annotations

import shutil
import weakref
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from traceanalyzer import derived, overview, stages
from traceanalyzer.engine.config import namespace_params
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.executor import LocalExecutor
from traceanalyzer.ingest import ingest
from traceanalyzer.schema import DERIVED_TABLES, I64, Column, Table
from traceanalyzer.stages import (
    READS,
    STAGES,
    Read,
    Stage,
    declare,
    rows_of,
    rule_input_tables,
    run_stages,
)
from traceanalyzer.store import DERIVED_KEYS_DIR, DERIVED_READERS, TABLES_DIR, Store
from traceanalyzer.synth.generate import generate

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
    registered, readers, reads = dict(STAGES), dict(DERIVED_READERS), dict(READS)
    busy = declare(Stage(BUSY, (BUSY,), derive_stream_busy, ("slices",), BUSY, stream_busy_params))
    wide = declare(Stage(WIDE, (WIDE,), derive_wide, (BUSY,)))
    yield busy, wide
    CRASHING.clear()
    for registry, was in ((STAGES, registered), (DERIVED_READERS, readers), (READS, reads)):
        registry.clear()
        registry.update(was)  # type: ignore[attr-defined]


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
    # its reads: what they read is among its inputs (its key holds theirs), one read a name
    with pytest.raises(ValueError, match="read stream_busy is no table of its inputs"):
        declare(Stage(WIDE, (WIDE,), derive_wide, ("slices",), reads=(rows_of(BUSY),)))
    at_steps = Read("test_at_steps", read_calls, params_of="steps")
    with pytest.raises(ValueError, match="parameters of steps, which is not among its inputs"):
        declare(Stage(WIDE, (WIDE,), derive_wide, (BUSY,), reads=(at_steps,)))
    with pytest.raises(ValueError, match="test_rows is computed from a table's rows"):
        declare(Stage(WIDE, (WIDE,), derive_wide, (BUSY,),
                      reads=(Read("test_rows", read_calls, (rows_of(BUSY),)),)))  # fmt: skip
    with pytest.raises(ValueError, match="read test_calls is another read's name"):
        declare(Stage(WIDE, (WIDE,), derive_wide, (BUSY,),
                      reads=(CALLS, Read("test_calls", read_tasks))))  # fmt: skip


def test_every_derived_table_is_one_declared_stage_s() -> None:
    assert derived.stage and overview.stage  # the packages declare their stages on import
    made = [table for stage in STAGES.values() for table in stage.tables]
    assert sorted(made) == sorted(DERIVED_TABLES)
    # the rules read the derived package's, derived before them; the overview's come after
    before = [stage for stage in STAGES.values() if stage.before_rules]
    assert {stage.derive.__module__.rpartition(".")[0] for stage in before} == {derived.__name__}
    assert set(rule_input_tables()) == {t for t in DERIVED_TABLES if not t.startswith("summary")}


class Token:
    """A read's value, which a weak reference sees let go."""


MADE: Counter[str] = Counter()  # by read, how often it was computed
SEEN: dict[str, Any] = {}


def read_calls(store: Store, ranks: list[int], params: None) -> Token:
    MADE["calls"] += 1
    token = Token()
    SEEN["calls"] = weakref.ref(token)
    return token


def read_tasks(store: Store, ranks: list[int], params: None, test_calls: Token) -> pl.DataFrame:
    MADE["tasks"] += 1
    return store.table("slices").filter(pl.col("rank").is_in(ranks)).collect()


def read_windows(store: Store, ranks: list[int], params: None, test_calls: Token) -> Token:
    MADE["windows"] += 1
    return Token()


CALLS = Read("test_calls", read_calls)
TASKS = Read("test_tasks", read_tasks, (CALLS,))
WINDOWS = Read("test_windows", read_windows, (CALLS,))


def derive_busy_shared(
    store: Store, ranks: list[int], params: Params, *, test_tasks: pl.DataFrame
) -> pl.DataFrame:
    # the calls were made into the windows the next stage reads, and let go, before this ran
    SEEN["calls held"] = SEEN["calls"]() is not None
    SEEN[BUSY] = (
        test_tasks.filter(pl.col("stream_id").is_not_null())
        .group_by("rank", "session", "stream_id")
        .agg(pl.len().alias("tasks"), pl.col("dur_ns").sum().alias("busy_ns"))
    )
    return SEEN[BUSY]


def derive_wide_shared(
    store: Store, ranks: list[int], params: None, *, test_windows: Token, stream_busy: pl.DataFrame
) -> pl.DataFrame:
    SEEN["in memory"] = stream_busy is SEEN.get(BUSY)  # the frame the stage before derived
    return stream_busy.filter(pl.col("tasks") > pl.col("tasks").median()).select(
        "rank", "session", "stream_id"
    )


def test_stages_of_a_shard_run_in_one_task_sharing_their_reads(
    declared: tuple[Stage, Stage], out: Path
) -> None:
    """Each read is computed once per task, only for the stages out of date there, and let go
    as soon as no stage left needs it; a table one stage derived is the next one's, in memory."""
    STAGES.clear()
    busy = declare(Stage(BUSY, (BUSY,), derive_busy_shared, ("slices",), reads=(TASKS,)))
    wide = declare(
        Stage(WIDE, (WIDE,), derive_wide_shared, (BUSY,), reads=(WINDOWS, rows_of(BUSY)))
    )
    MADE.clear()
    assert _run(out, busy, wide).computed == {BUSY: [0, 1], WIDE: [0, 1]}
    assert MADE == {"calls": 2, "tasks": 2, "windows": 2}  # once in each rank's task
    assert SEEN["in memory"] and not SEEN["calls held"]
    stored = Store.open(out).table(WIDE).collect()
    # only the stage out of date runs, given only its reads; the table it reads is the store's
    shutil.rmtree(out / TABLES_DIR / WIDE / "rank=1")
    MADE.clear()
    SEEN.clear()
    files = _mtimes(out, BUSY)
    assert _run(out, busy, wide).computed == {BUSY: [], WIDE: [1]}
    assert MADE == {"calls": 1, "windows": 1} and not SEEN["in memory"]
    assert _mtimes(out, BUSY) == files
    assert (
        Store.open(out)
        .table(WIDE)
        .collect()
        .sort(stored.columns)
        .equals(stored.sort(stored.columns))
    )


@pytest.fixture(scope="module")
def moe_ep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks of an MoE model served with expert parallelism: every table before the rules
    has rows."""
    tmp = tmp_path_factory.mktemp("moe")
    generate("moe-ep", tmp / "in", ranks=2, iterations=4, layers=2)
    ingest(tmp / "in", tmp / "out")
    return tmp / "out"


def test_a_stage_whose_code_changed_is_derived_again_with_its_readers_only(
    moe_ep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    shutil.copytree(moe_ep, out)
    before = stages.declared(before_rules=True)
    every = {stage.name: [0, 1] for stage in before}
    assert run_stages(out, LocalExecutor(), before).computed == every
    rows = {table: Store.open(out).table(table).collect() for table in rule_input_tables()}
    assert all(frame.height for frame in rows.values())
    real = stages.code_key

    def changed(module: str) -> None:
        def code_key(*names: str) -> str:
            return real(*names) + (module if f"traceanalyzer.derived.{module}" in names else "")

        monkeypatch.setattr(stages, "code_key", code_key)

    changed("collectives")
    files = {table: _mtimes(out, table) for table in rows}
    done = run_stages(out, LocalExecutor(), before).computed
    assert done == {**dict.fromkeys(every, []), "collectives": [0, 1]}
    assert all(_mtimes(out, t) == files[t] for t in rows if t != "collectives")
    # the steps changed: every stage that reads them is derived again, not the launches
    changed("stage")
    assert run_stages(out, LocalExecutor(), before).computed == {**every, "launches": []}
    for table, frame in rows.items():  # the same code: the same rows
        again = Store.open(out).table(table).collect()
        assert again.sort(again.columns).equals(frame.sort(frame.columns)), table


def test_a_warm_run_derives_no_stage_again_those_without_rows_included(out: Path) -> None:
    """A stage whose table has no rows for a rank (no MoE here: no exchanges) is cached like
    one with rows: a shard without its table's folder counts as removed by hand."""
    before = stages.declared(before_rules=True)
    first = run_stages(out, LocalExecutor(), before).computed
    assert first["exchanges"] and not Store.open(out).table("exchanges").collect().height
    again = run_stages(out, LocalExecutor(), before).computed
    assert again == {stage.name: [] for stage in before}


def test_each_table_s_reader_derives_it_as_its_stage_does(moe_ep: Path, tmp_path: Path) -> None:
    """A store without a derived table (a fixture's, an older one's) reads it derived in-process
    by the same stage and reads as a run's task derives it."""
    out = tmp_path / "out"
    shutil.copytree(moe_ep, out)
    run_stages(out, LocalExecutor(), stages.declared(before_rules=True))
    stored = {table: Store.open(out).derived(table).collect() for table in rule_input_tables()}
    shutil.rmtree(out / TABLES_DIR)
    shutil.copytree(moe_ep / TABLES_DIR, out / TABLES_DIR)  # the ingested tables only
    store = Store.open(out)
    for table, frame in stored.items():
        derived = store.derived(table, [0, 1]).collect()
        assert derived.equals(frame), table
