"""Db exports (ascend_pytorch_profiler_{rank}.db + analysis.db) ingested into the same store.

Checked against the real G2 Level1 Db export, row for row with independent SQL on the file, and
against the Text export of the same workload (another session of it: the same names and
verdicts, not the same numbers).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.executor import make_executor
from traceanalyzer.ingest import ingest
from traceanalyzer.ingest.source import PREFER_FORMAT
from traceanalyzer.pipeline import analyse
from traceanalyzer.store import Store

OUT = "ASCEND_PROFILER_OUTPUT"
TEXT_ONLY = "a Db export has no place for what its Text twin holds: "


def _db(rank_dir: Path) -> sqlite3.Connection:
    path = next((rank_dir / OUT).glob("ascend_pytorch_profiler_*.db"))
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)


def _rank_dirs(root: Path) -> dict[int, Path]:
    return {int(p.name[4]): p for p in sorted(root.glob("rank*_ascend_pt"))}


def _slices(store: Path, rank: int, process: str) -> pl.DataFrame:
    table = Store.open(store).table("slices")
    return table.filter((pl.col("rank") == rank) & (pl.col("process") == process)).collect()


def _pairs(rows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted((int(a), int(b)) for a, b in rows)


def test_python_and_cann_slices_are_the_api_rows_at_exact_ns(
    real_g2_db: Path, real_g2_db_store: Path
) -> None:
    for rank, rank_dir in _rank_dirs(real_g2_db).items():
        con = _db(rank_dir)
        for process, table in (("Python", "PYTORCH_API"), ("CANN", "CANN_API")):
            expected = _pairs(con.execute(f"SELECT startNs, endNs FROM {table}").fetchall())
            got = _slices(real_g2_db_store, rank, process)
            assert _pairs(got.select("start_ns", "end_ns").rows()) == expected, (rank, process)
        names = {
            r[0]
            for r in con.execute(
                "SELECT s.value FROM CANN_API c JOIN STRING_IDS s ON s.id = c.name"
            )
        }
        cann = _slices(real_g2_db_store, rank, "CANN")
        assert set(cann["api_name"].unique()) == names
        assert set(cann["api_layer"].unique()) == {"AscendCL", "Node", "Hccl"}


# The TASK rows msprof writes only to envelop others, which no Text export draws (independent
# SQL): a communication op's own record (no task info, the op's connection id, over the op) and
# a MIX kernel's parent (no task info, over a described task of its stream and task id).
_ENVELOPES = """
SELECT t.globalTaskId FROM TASK t
WHERE t.globalTaskId NOT IN (SELECT globalTaskId FROM COMPUTE_TASK_INFO)
  AND t.globalTaskId NOT IN (SELECT globalTaskId FROM COMMUNICATION_TASK_INFO)
  AND (
    EXISTS (SELECT 1 FROM COMMUNICATION_OP o WHERE o.connectionId = t.connectionId
            AND t.startNs < o.endNs AND t.endNs > o.startNs)
    OR EXISTS (SELECT 1 FROM TASK k JOIN COMPUTE_TASK_INFO USING (globalTaskId)
               WHERE k.streamId = t.streamId AND k.taskId = t.taskId
               AND t.startNs < k.endNs AND t.endNs > k.startNs))
"""


def test_every_task_row_but_the_envelopes_is_a_device_slice(
    real_g2_db: Path, real_g2_db_store: Path, real_g2_store: Path
) -> None:
    for rank, rank_dir in _rank_dirs(real_g2_db).items():
        con = _db(rank_dir)
        envelopes = con.execute(f"SELECT count(*) FROM ({_ENVELOPES})").fetchone()[0]
        assert envelopes == 17  # 4 allReduce records, 13 MIX parents
        rows = con.execute(
            f"SELECT startNs, endNs, streamId, taskId FROM TASK WHERE globalTaskId NOT IN ({_ENVELOPES})"
        ).fetchall()
        hw = _slices(real_g2_db_store, rank, "Ascend Hardware")
        got = sorted(hw.select("start_ns", "end_ns", "stream_id", "task_id").rows())
        assert got == sorted(rows)
        assert (hw["thread"] == "Stream " + hw["tid"].cast(pl.String)).all()

    # the same device tasks as the Text export of the workload: by stream and task type
    def kinds(store: Path) -> set[tuple[str, str]]:
        hw = _slices(store, 0, "Ascend Hardware")
        return set(hw.select("thread", "task_type").unique().rows())

    assert kinds(real_g2_db_store) - {
        ("Stream 2", "SDMA_SQE"),
        ("Stream 2", "PLACE_HOLDER_SQE"),
    } == kinds(real_g2_store) - {("Stream 2", "SDMA_SQE"), ("Stream 2", "PLACE_HOLDER_SQE")}


def test_kernels_are_the_compute_task_rows_and_the_collectives(
    real_g2_db: Path, real_g2_db_store: Path, real_g2_store: Path
) -> None:
    kernels = Store.open(real_g2_db_store).table("kernels").collect()
    for rank, rank_dir in _rank_dirs(real_g2_db).items():
        con = _db(rank_dir)
        rows = con.execute(
            "SELECT t.startNs, t.endNs - t.startNs, t.streamId, t.taskId, s.value, ci.blockDim "
            "FROM COMPUTE_TASK_INFO ci JOIN TASK t USING (globalTaskId) "
            "JOIN STRING_IDS s ON s.id = ci.name"
        ).fetchall()
        ops = con.execute(
            "SELECT o.startNs, o.endNs - o.startNs, NULL, NULL, s.value, 0 "
            "FROM COMMUNICATION_OP o JOIN STRING_IDS s ON s.id = o.opName"
        ).fetchall()
        mine = kernels.filter(pl.col("rank") == rank)
        got = mine.select("start_ns", "dur_ns", "stream_id", "task_id", "name", "block_num").rows()
        assert sorted(got, key=str) == sorted(rows + ops, key=str)
        assert mine["step"].unique().to_list() == [50]
        assert (
            mine["accelerator_core"]
            .is_in(["AI_CORE", "AI_VECTOR_CORE", "MIX_AIV", "DSA_SQE", "HCCL"])
            .all()
        )
        assert "aiv_vec_time(us)" in json.loads(mine["extra"][0])
    # as kernel_details.csv lists them: the collectives with Accelerator Core HCCL, typed
    text = Store.open(real_g2_store).table("kernels").collect()
    for frame in (kernels, text):
        hccl = frame.filter(pl.col("accelerator_core") == "HCCL")
        assert hccl.height == 8 and (hccl["type"] == "hcom_allReduce_").all()
        assert hccl["stream_id"].is_null().all()
    # rank 1's COMMUNICATION_OP has no waitNs column (this export's rank 0 has): unknown there
    waits = (
        kernels.filter(pl.col("accelerator_core") == "HCCL")
        .group_by("rank")
        .agg(pl.col("wait_ns").is_not_null().all())
    )
    assert dict(waits.iter_rows()) == {0: True, 1: False}


def _naming(store: Path) -> dict[str, object]:
    threads = Store.open(store).table("threads").collect()
    by_process = {
        p: g for p, g in ((k[0], v) for k, v in threads.group_by("process", maintain_order=True))
    }
    return {
        "processes": sorted(by_process),
        "sort": sorted(
            set(threads.select("process", "process_label", "process_sort_index").rows())
        ),
        "hw_streams": sorted(set(by_process["Ascend Hardware"]["thread"])),
        "hccl": sorted(set(by_process["HCCL"].select("tid", "thread").rows())),
        "overlap": sorted(set(by_process["Overlap Analysis"].select("tid", "thread").rows())),
        # host threads: `Thread <tid>`, sorted by tid except the dequeue thread, which comes last
        "python_sort": sorted(
            (r[1] - r[0]) for r in by_process["Python"].select("tid", "thread_sort_index").rows()
        )[:2],
    }


def test_processes_threads_and_streams_named_as_the_text_export(
    real_g2_db_store: Path, real_g2_store: Path
) -> None:
    db, text = _naming(real_g2_db_store), _naming(real_g2_store)
    text["processes"] = [p for p in text["processes"] if p != "QoS"]  # no QoS table in this Db
    text["sort"] = [s for s in text["sort"] if s[0] != "QoS"]
    assert db == text
    threads = Store.open(real_g2_db_store).table("threads").collect()
    for row in threads.filter(pl.col("process").is_in(["Python", "CANN"])).iter_rows(named=True):
        assert row["thread"] == f"Thread {row['tid']}"
    # msprof's pids: (os pid << 10) | (sort index << 5) | device
    for row in threads.filter(pl.col("process") != "Python").iter_rows(named=True):
        assert (row["pid"] >> 5) & 31 == row["process_sort_index"], row


def test_flows_link_host_to_device_as_the_text_export(
    real_g2_db_store: Path, real_g2_store: Path
) -> None:
    def kinds(store: Path) -> set[tuple[str, str, str]]:
        flows = Store.open(store).table("flows").collect()
        assert flows["src_process"].null_count() == 0 and flows["dst_process"].null_count() == 0
        return set(flows.select("cat", "src_process", "dst_process").unique().rows())

    assert kinds(real_g2_db_store) == kinds(real_g2_store)


def test_counters_and_side_tables_named_as_the_text_export(
    real_g2_db_store: Path, real_g2_store: Path
) -> None:
    def names(store: Path) -> dict[str, set]:
        s = Store.open(store)
        return {
            "counters": set(
                s.table("counters").select("process", "name", "series").unique().collect().rows()
            ),
            "module_memory": set(
                s.table("module_memory").select("component").collect()["component"]
            ),
            "memory_records": set(
                s.table("memory_records").select("component").collect()["component"]
            ),
            "comm_ops": set(s.table("comm_ops").select("step", "kind").unique().collect().rows()),
            "comm_links": set(
                s.table("comm_links").select("op_key", "transport_type").unique().collect().rows()
            ),
            "step_times": set(s.table("step_times").select("step").collect()["step"]),
        }

    db, text = names(real_g2_db_store), names(real_g2_store)
    text["counters"] = {c for c in text["counters"] if c[0] != "QoS"}
    # The Db's own ENUM_MODULE names module 74 `AMP` where this msprof's CSV says `AML`.
    text["module_memory"] = {"AMP" if c == "AML" else c for c in text["module_memory"]}
    assert db == text


def test_a_null_number_stays_null(real_g2_db: Path, real_g2_db_store: Path) -> None:
    """An op not yet released has NULL release figures: null, as operator_memory.csv's empty
    cells read, never 0."""
    memory = Store.open(real_g2_db_store).table("op_memory").collect()
    for rank, rank_dir in _rank_dirs(real_g2_db).items():
        (nulls,) = (
            _db(rank_dir)
            .execute("SELECT count(*) FROM OP_MEMORY WHERE releaseTotalAllocated IS NULL")
            .fetchone()
        )
        released = memory.filter(pl.col("rank") == rank)["release_total_allocated_mb"]
        assert nulls and released.null_count() == nulls


def test_timestamps_stay_exact_int64(real_g2_db: Path, real_g2_db_store: Path) -> None:
    con = _db(_rank_dirs(real_g2_db)[0])
    (latest,) = con.execute("SELECT max(CAST(endNs AS INTEGER)) FROM PYTORCH_API").fetchone()
    python = _slices(real_g2_db_store, 0, "Python")
    assert python["end_ns"].max() == latest  # ns digits a float64 round trip would lose
    comm = Store.open(real_g2_db_store).table("comm_ops").filter(pl.col("rank") == 0).collect()
    assert comm["start_ns"].dtype == pl.Int64 and comm["elapse_ns"].min() > 0


def test_sessions_record_the_db_and_its_schema_version(real_g2_db: Path, tmp_path: Path) -> None:
    result = ingest(real_g2_db, tmp_path / "out")
    assert [(o.source_format, o.trace_reader, o.db_schema_version) for o in result.outcomes] == [
        ("db", "db", "1.0.0")
    ] * 2
    sessions = Store.open(tmp_path / "out").table("sessions").collect()
    assert sessions["device_id"].to_list() == [0, 1]
    assert all(json.loads(m)["db.SCHEMA_VERSION"] == "1.0.0" for m in sessions["metadata"])
    assert sessions["generation"].to_list() == ["g2", "g2"]


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    )


def test_the_database_is_opened_read_only(real_g2_db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "in"
    shutil.copytree(real_g2_db, copy)
    before = _listing(copy)
    for path in copy.rglob("*.db"):  # even a read-only file is read, without a journal
        path.chmod(0o444)
    ingest(copy, tmp_path / "out")
    for path in copy.rglob("*.db"):
        path.chmod(0o644)
    assert _listing(copy) == before


def _field_verdicts(out: Path) -> dict[str, object]:
    doc = json.loads((out / "findings.json").read_text("utf-8"))
    return {
        "rules": sorted((r["name"], r["status"]) for r in doc["rules"]),
        "findings": sorted((f["rule"], tuple(f.get("ranks") or ())) for f in doc["findings"]),
    }


def test_field_rules_give_the_same_verdicts_on_db_and_text(
    real_g2_db: Path, real_g2: Path, tmp_path: Path
) -> None:
    verdicts = []
    for name, root in (("db", real_g2_db), ("text", real_g2)):
        with make_executor("local") as executor:
            analyse(root, tmp_path / name, executor=executor)
        verdicts.append(_field_verdicts(tmp_path / name))
    assert verdicts[0] == verdicts[1]


def _mixed(real_g2: Path, real_g2_db: Path, root: Path) -> None:
    """rank 0 as Text and (another session) as Db; rank 1 exported as both."""
    shutil.copytree(real_g2 / "rank0_ascend_pt", root / "text_rank0_ascend_pt")
    shutil.copytree(real_g2_db / "rank0_ascend_pt", root / "db_rank0_ascend_pt")
    both = root / "both_rank1_ascend_pt"
    shutil.copytree(real_g2 / "rank1_ascend_pt", both)
    for db in (real_g2_db / "rank1_ascend_pt" / OUT).iterdir():
        shutil.copy2(db, both / OUT / db.name)


def test_a_mixed_collection_analyses_in_one_run(
    real_g2: Path, real_g2_db: Path, tmp_path: Path
) -> None:
    _mixed(real_g2, real_g2_db, tmp_path / "in")
    with make_executor("local") as executor:
        run = analyse(tmp_path / "in", tmp_path / "out", executor=executor)
    got = {
        Path(o.path).name: (o.status, o.source_format, o.formats_present)
        for o in run.ingest.outcomes
    }
    assert got == {
        "text_rank0_ascend_pt": ("ingested", "text", ["text"]),
        "db_rank0_ascend_pt": ("ingested", "db", ["db"]),
        "both_rank1_ascend_pt": ("ingested", "db", ["text", "db"]),
    }
    assert not run.ingest.partial and run.findings is not None
    report = json.loads((tmp_path / "out" / "ingest.json").read_text("utf-8"))
    assert {s["source_format"] for s in report["sessions"]} == {"text", "db"}
    # a [Text, Db] rank is one session: the Db's tables, plus the Text files the Db has no table for
    store = Store.open(tmp_path / "out")
    l2 = store.table("l2_cache").filter(pl.col("session") == "both_rank1_ascend_pt").collect()
    assert l2.height > 0
    # what the Db cannot hold: the Text beside it has it, else a profile that writes both
    notes = {
        s["session"]: [n for n in s["notes"] if n.startswith(TEXT_ONLY)] for s in report["sessions"]
    }
    assert not notes["text_rank0_ascend_pt"]
    assert notes["db_rank0_ascend_pt"][0].endswith("; export_type=[Text, Db] writes both")
    assert "TRACEANALYZER_PREFER_FORMAT=text reads it" in notes["both_rank1_ascend_pt"][0]


def test_the_db_reader_says_what_its_text_twin_holds_and_it_cannot(
    real_g2_store: Path, real_g2_db: Path, real_g2_db_store: Path, tmp_path: Path
) -> None:
    """What the real Text export yields and its Db twin does not is named, once per rank."""
    text, db = Store.open(real_g2_store), Store.open(real_g2_db_store)

    def rows(store: Store, table: str, where: pl.Expr) -> int:
        return store.table(table).filter(where).select(pl.len()).collect().item()

    qos = pl.col("name") == "QoS OTHERS"
    mode = pl.col("api_mode").is_not_null()
    op_state = pl.col("op_state").is_not_null()
    to_copies = (pl.col("cat") == "async_npu") & pl.col("flow_id").is_in(
        text.table("slices").filter(pl.col("name") == "MEMCPY_ASYNC").select(
            pl.col("start_ns").cast(pl.String)
        ).collect()["start_ns"].implode()
    )  # fmt: skip
    said = {
        "the QoS counters (`QoS OTHERS`, ...)": ("counters", qos),
        "the CANN APIs' `Mode` (slices.api_mode)": ("slices", mode),
        "the kernels' `OP State` and `HF32 Eligible`": ("kernels", op_state),
        "the torch ops' async_npu flows to their copies": ("flows", to_copies),
    }
    for table, where in said.values():
        assert rows(text, table, where) > 0 and rows(db, table, where) == 0, table
    outcomes = ingest(real_g2_db, tmp_path / "out", jobs=1).outcomes
    assert len(outcomes) == 2
    for outcome in outcomes:  # one note per rank, naming each
        (note,) = [n for n in outcome.notes if n.startswith(TEXT_ONLY)]
        assert all(what in note for what in said) and "SDMA or PCIe DMA" in note, note


def test_text_only_names_only_what_the_profile_recorded() -> None:
    from traceanalyzer.parse.db.text_only import text_only

    assert text_only([], copies=False, absent_kernel_columns=[]) == []
    only_cann = text_only(["CANN", "Python"], copies=False, absent_kernel_columns=["opState"])
    assert only_cann == [
        "the CANN APIs' `Mode` (slices.api_mode)",
        "the kernels' `OP State` (COMPUTE_TASK_INFO has no opState)",
    ]


def test_both_formats_read_from_text_on_request(
    real_g2: Path, real_g2_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mixed(real_g2, real_g2_db, tmp_path / "in")
    monkeypatch.setenv(PREFER_FORMAT, "text")
    result = ingest(tmp_path / "in" / "both_rank1_ascend_pt", tmp_path / "out")
    (outcome,) = result.outcomes
    assert outcome.source_format == "text" and outcome.trace_reader in ("native", "duckdb")
    assert outcome.formats_present == ["text", "db"]


def _damage(root: Path, how: str) -> Path:
    db = next((root / OUT).glob("ascend_pytorch_profiler_*.db"))
    if how == "truncated":
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3])
    elif how == "torn pages":  # the header intact, pages in the middle overwritten
        data = bytearray(db.read_bytes())
        data[len(data) // 2 : len(data) // 2 + len(data) // 10] = b"\xff" * (len(data) // 10)
        db.write_bytes(bytes(data))
    elif how == "garbage":
        db.write_bytes(b"<html>not a database</html>" * 100)
    elif how == "unknown schema":
        con = sqlite3.connect(db)
        con.execute("UPDATE META_DATA SET value = '9.0.0' WHERE name = 'SCHEMA_VERSION'")
        con.commit()
        con.close()
    return db


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("truncated", "damaged"),
        ("torn pages", "damaged"),
        ("garbage", "not a readable SQLite database"),
        ("unknown schema", "unknown schema version 9.0.0"),
    ],
)
def test_an_unreadable_db_fails_its_rank_and_the_batch_goes_on(
    real_g2_db: Path, tmp_path: Path, how: str, reason: str
) -> None:
    root = tmp_path / "in"
    shutil.copytree(real_g2_db, root)
    db = _damage(root / "rank1_ascend_pt", how)
    result = ingest(root, tmp_path / "out")
    outcomes = {o.rank: o for o in result.outcomes}
    assert outcomes[0].status == "ingested"
    assert outcomes[1].status == "failed" and result.partial
    assert reason in outcomes[1].error and db.name in outcomes[1].error, outcomes[1].error


def test_an_unreadable_db_beside_a_text_export_falls_back_to_it(
    real_g2: Path, real_g2_db: Path, tmp_path: Path
) -> None:
    _mixed(real_g2, real_g2_db, tmp_path / "in")
    rank = tmp_path / "in" / "both_rank1_ascend_pt"
    _damage(rank, "garbage")
    result = ingest(rank, tmp_path / "out")
    (outcome,) = result.outcomes
    assert (outcome.status, outcome.source_format) == ("ingested", "text")
    assert any("read the Text export instead" in w for w in outcome.warnings)


def test_absent_tables_are_not_collected_and_extra_columns_ignored(
    real_g2_db: Path, tmp_path: Path
) -> None:
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    db = next((rank / OUT).glob("*_0.db"))
    con = sqlite3.connect(db)
    for table in (
        "COMPUTE_TASK_INFO",
        "HBM",
        "connectionCats",
        "PYTORCH_CALLCHAINS",
        "ENUM_API_TYPE",
    ):
        con.execute(f"DROP TABLE {table}")
    con.execute("ALTER TABLE TASK ADD COLUMN someFutureField INTEGER")
    for table, column in (
        ("CANN_API", "depth"),
        ("COMMUNICATION_OP", "groupName"),
        ("TASK", "modelId"),
        ("PYTORCH_API", "callchainId"),
        ("COMMUNICATION_TASK_INFO", "linkType"),
        ("HOST_INFO", "hostName"),
    ):
        con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    con.execute("DELETE FROM META_DATA")
    con.commit()
    con.close()
    (rank / OUT / "analysis.db").unlink()
    result = ingest(rank, tmp_path / "out")
    (outcome,) = result.outcomes
    assert outcome.status == "ingested", outcome.error
    assert any("COMPUTE_TASK_INFO" in n for n in outcome.not_collected)
    assert outcome.rows["kernels"] == 0 and outcome.rows["slices"] > 0
    assert outcome.db_schema_version is None


def test_flows_without_connection_cats_are_the_same_flows(
    real_g2_db: Path, real_g2_db_store: Path, tmp_path: Path
) -> None:
    """rank 1 of the real export has no connectionCats (torch_npu's connection step did not
    run): the categories are inferred; on rank 0, which has it, the inference is exact."""
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    con = sqlite3.connect(next((rank / OUT).glob("*_0.db")))
    con.execute("DROP TABLE connectionCats")
    con.commit()
    con.close()
    ingest(rank, tmp_path / "out")
    inferred = Store.open(tmp_path / "out").table("flows").collect().drop("session")
    stored = Store.open(real_g2_db_store).table("flows").filter(pl.col("rank") == 0)
    assert inferred.equals(stored.collect().drop("session"))
    rank1 = Store.open(real_g2_db_store).table("flows").filter(pl.col("rank") == 1).collect()
    assert set(rank1["cat"]) == {"HostToDevice", "async_npu", "async_task_queue", "fwdbwd"}


def test_rank_and_device_from_the_database_without_profiler_info(
    real_g2_db: Path, tmp_path: Path
) -> None:
    """A single-rank Db export without its info file or a rank in its name: RANK_DEVICE_MAP."""
    out = tmp_path / "in" / "job_ascend_pt" / OUT
    out.mkdir(parents=True)
    source = real_g2_db / "rank1_ascend_pt" / OUT
    shutil.copy2(source / "ascend_pytorch_profiler_1.db", out / "ascend_pytorch_profiler.db")
    from traceanalyzer.discover import discover

    (session,) = discover(tmp_path / "in").sessions
    assert (session.rank, session.rank_source, session.device_id) == (1, "rank_device_map", 1)
    result = ingest(tmp_path / "in", tmp_path / "out")
    assert [o.status for o in result.outcomes] == ["ingested"]


@pytest.mark.parametrize(
    "level",
    [
        # Level0: no CANN layer, no communication detail; Level_none-like: tables present, empty
        ("CANN_API", "COMMUNICATION_TASK_INFO", "CommAnalyzer"),
        "empty",
    ],
)
def test_other_levels_tables_absent_or_empty(real_g2_db: Path, tmp_path: Path, level) -> None:
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    con = sqlite3.connect(next((rank / OUT).glob("*_0.db")))
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        if level == "empty" and table not in ("STRING_IDS", "sqlite_sequence"):
            con.execute(f'DELETE FROM "{table}"')
        elif level != "empty" and table in level[:2]:
            con.execute(f'DROP TABLE "{table}"')
    con.commit()
    con.close()
    if level != "empty":
        analysis = sqlite3.connect(rank / OUT / "analysis.db")
        for table in ("CommAnalyzerTime", "CommAnalyzerBandwidth", "CommAnalyzerMatrix"):
            analysis.execute(f"DROP TABLE {table}")
        analysis.commit()
        analysis.close()
    with make_executor("local") as executor:
        run = analyse(rank, tmp_path / "out", executor=executor)
    (outcome,) = run.ingest.outcomes
    assert outcome.status == "ingested", outcome.error
    assert run.findings is not None and not run.findings.errors
    if level == "empty":
        assert outcome.rows["slices"] == 0
    else:
        assert any(n.startswith("CANN_API") for n in outcome.not_collected)
        assert outcome.rows["comm_ops"] == 0 and outcome.rows["slices"] > 0


def test_a_damaged_analysis_db_only_empties_its_tables(real_g2_db: Path, tmp_path: Path) -> None:
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    (rank / OUT / "analysis.db").chmod(0o644)
    (rank / OUT / "analysis.db").write_bytes(b"garbage" * 100)
    (outcome,) = ingest(rank, tmp_path / "out").outcomes
    assert outcome.status == "ingested" and outcome.rows["step_times"] == 0
    assert any("analysis.db" in w for w in outcome.warnings)
    assert outcome.incomplete_files == ["analysis.db (unreadable)"]
    assert outcome.rows["slices"] > 0


def test_every_compute_task_info_row_is_a_kernel(real_g2_db: Path, tmp_path: Path) -> None:
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    con = sqlite3.connect(next((rank / OUT).glob("*_0.db")))
    (compute,) = con.execute("SELECT count(*) FROM COMPUTE_TASK_INFO").fetchone()
    (collectives,) = con.execute("SELECT count(*) FROM COMMUNICATION_OP").fetchone()
    con.execute(
        "DELETE FROM TASK WHERE globalTaskId IN (SELECT globalTaskId FROM COMPUTE_TASK_INFO LIMIT 3)"
    )
    (tasks,) = con.execute(
        f"SELECT count(*) FROM TASK WHERE globalTaskId NOT IN ({_ENVELOPES})"
    ).fetchone()
    con.commit()
    con.close()
    (outcome,) = ingest(rank, tmp_path / "out").outcomes
    assert outcome.rows["kernels"] == compute + collectives
    hardware = (
        Store.open(tmp_path / "out").table("slices").filter(pl.col("process") == "Ascend Hardware")
    )
    assert hardware.select(pl.len()).collect().item() == tasks


def test_two_pmu_metric_ids_of_one_name_are_one_key(real_g2_db: Path, tmp_path: Path) -> None:
    """`aicore_time` is named `aicore_time(us)`, as `aic_total_time` is: a task with both keeps
    the first, as kernel_details.csv has one such column."""
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    con = sqlite3.connect(next((rank / OUT).glob("*_0.db")))
    (metric,) = con.execute("SELECT id FROM STRING_IDS WHERE value = 'aic_total_time'").fetchone()
    (task,) = con.execute(
        f"SELECT globalTaskId FROM TASK_PMU_INFO WHERE name = {metric} LIMIT 1"
    ).fetchone()
    con.execute("INSERT INTO STRING_IDS VALUES (999999, 'aicore_time')")
    con.execute(f"INSERT INTO TASK_PMU_INFO VALUES ({task}, 999999, 123456.0)")
    con.commit()
    con.close()
    ingest(rank, tmp_path / "out")
    extras = Store.open(tmp_path / "out").table("kernels").select("extra").collect()["extra"]
    decoded = [json.loads(e) for e in extras.drop_nulls()]
    assert decoded and all(list(d).count("aicore_time(us)") == 1 for d in decoded)
    assert not any(d["aicore_time(us)"] == 123456.0 for d in decoded)


def test_op_statistics_are_the_same_figures_every_time() -> None:
    """The share of each op type comes from integer sums: group order must not move its bits."""
    from traceanalyzer.parse.db.device import op_stats as _op_stats
    from traceanalyzer.parse.db.layout import Layout as _Layout

    rows = 5_000
    kernels = pl.DataFrame(
        {
            "type": [f"Op{i % 400}" for i in range(rows)],
            "accelerator_core": ["AI_CORE" if i % 3 else "AI_VECTOR_CORE" for i in range(rows)],
            "dur_ns": [(i * 7919) % 100_003 + 1 for i in range(rows)],
        }
    )
    layout = _Layout(os_pid=1, device=0, generation="current", comm_process="Communication")
    first = _op_stats(kernels, layout)
    assert first["count"].sum() == rows
    assert abs(first["ratio_pct"].sum() - 100) < 1e-9
    for _ in range(20):
        assert _op_stats(kernels, layout).equals(first)


def test_side_files_other_sqlite_clients_leave_are_read(real_g2_db: Path, tmp_path: Path) -> None:
    """An empty -wal and -shm (what the sqlite3 shell leaves after reading) change nothing; the
    input is never written to; one note at most, no failure."""
    root = tmp_path / "in"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", root / "rank0_ascend_pt")
    db = next((root / "rank0_ascend_pt" / OUT).glob("ascend_pytorch_profiler_*.db"))
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).write_bytes(b"")
    before = _listing(root)
    (outcome,) = ingest(root, tmp_path / "out").outcomes
    assert outcome.status == "ingested" and not outcome.warnings
    assert not [n for n in outcome.notes if not n.startswith(TEXT_ONLY)], outcome.notes
    assert _listing(root) == before


def _wal_pair(source: Path, target: Path, statement: str) -> None:
    """``target``: a copy of ``source`` in WAL mode with ``statement`` committed to its -wal
    and not checkpointed (copied while the writer still had it open)."""
    work = target.parent / "work"
    work.mkdir()
    shutil.copyfile(source, work / source.name)
    con = sqlite3.connect(work / source.name)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute(statement)
    con.commit()
    shutil.copyfile(work / source.name, target)
    shutil.copyfile(work / (source.name + "-wal"), target.with_name(target.name + "-wal"))
    con.close()
    shutil.rmtree(work)


def test_committed_frames_in_a_wal_are_read_and_the_input_stays_untouched(
    real_g2_db: Path, tmp_path: Path
) -> None:
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    db = next((rank / OUT).glob("ascend_pytorch_profiler_*.db"))
    source = tmp_path / db.name
    shutil.move(db, source)
    _wal_pair(
        source,
        db,
        "UPDATE STRING_IDS SET value = 'renamed_in_the_wal' WHERE id = "
        "(SELECT name FROM COMPUTE_TASK_INFO LIMIT 1)",
    )
    assert db.with_name(db.name + "-wal").stat().st_size > 0
    before = _listing(rank)
    (outcome,) = ingest(rank, tmp_path / "out").outcomes
    assert outcome.status == "ingested", outcome.error
    assert any("-wal" in n and "private copy" in n for n in outcome.notes), outcome.notes
    kernels = Store.open(tmp_path / "out").table("kernels").collect()
    assert "renamed_in_the_wal" in kernels["name"].to_list()
    assert _listing(rank) == before  # the copy took the WAL; the input is as it was


def test_an_unfinished_transaction_in_a_journal_is_rolled_back(
    real_g2_db: Path, tmp_path: Path
) -> None:
    """A hot -journal (a writer killed mid-transaction, its pages already spilled into the file)
    is rolled back in the private copy: the uncommitted rename is not read."""
    rank = tmp_path / "in" / "rank0_ascend_pt"
    shutil.copytree(real_g2_db / "rank0_ascend_pt", rank)
    db = next((rank / OUT).glob("ascend_pytorch_profiler_*.db"))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(db, work / db.name)
    con = sqlite3.connect(work / db.name, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")  # the real export is in WAL mode
    con.execute("PRAGMA cache_size=1")  # spill the changed pages into the file before commit
    con.execute("BEGIN")
    con.execute("UPDATE STRING_IDS SET value = 'never_committed'")
    shutil.copyfile(work / db.name, db)
    shutil.copyfile(work / (db.name + "-journal"), db.with_name(db.name + "-journal"))
    con.close()
    assert db.with_name(db.name + "-journal").stat().st_size > 0
    before = _listing(rank)
    (outcome,) = ingest(rank, tmp_path / "out").outcomes
    assert outcome.status == "ingested", outcome.error
    assert any("-journal" in n and "rolled back" in n for n in outcome.notes), outcome.notes
    kernels = Store.open(tmp_path / "out").table("kernels").collect()
    assert "never_committed" not in kernels["name"].to_list() and kernels.height
    assert _listing(rank) == before


def test_only_a_live_writer_fails_the_rank(real_g2_db: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "in"
    shutil.copytree(real_g2_db, root)
    db = next((root / "rank1_ascend_pt" / OUT).glob("ascend_pytorch_profiler_*.db"))
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            f"con = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "con.execute('PRAGMA journal_mode=WAL'); con.execute('PRAGMA wal_autocheckpoint=0')\n"
            "con.execute('CREATE TABLE w (x)'); con.execute('INSERT INTO w VALUES (1)')\n"
            "con.execute('BEGIN IMMEDIATE'); con.execute('INSERT INTO w VALUES (2)')\n"
            "print('holding', flush=True); sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "holding"
        result = ingest(root, tmp_path / "out")
    finally:
        writer.communicate("")
    outcomes = {o.rank: o for o in result.outcomes}
    assert outcomes[0].status == "ingested"
    assert outcomes[1].status == "failed" and "being written" in outcomes[1].error
    assert db.name in outcomes[1].error and "Traceback" not in str(outcomes[1].warnings)
