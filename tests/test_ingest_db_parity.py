"""Text and Db exports of one synthetic session fill the same canonical tables, row for row.

The generator writes each session's facts to both views (``synth --export text|db``); ingesting
either must give the same rows at exact ns, so that rules, reports and ``diff`` cannot tell the
formats apart. Where a format genuinely cannot carry a column, the comparison leaves out just
that column, and the comment says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from traceanalyzer.ingest import ingest
from traceanalyzer.schema import TABLES
from traceanalyzer.store import Store
from traceanalyzer.synth import generate

# (scenario, generation, level, ranks, knobs): collectives, copies and waits, every generation
# the Db writer knows, and the levels that change what is recorded.
SESSIONS = {
    "g2-level1-collectives": ("inference-baseline", "g2", 1, 2, {"steps": 2, "tp_comm": 1}),
    "g2-level1-store": ("store-stall", "g2", 1, 2, {"sick": "1"}),
    "current-level2": ("inference-baseline", "current", 2, 2, {"steps": 2, "tp_comm": 1}),
    "g3-level0": ("inference-baseline", "g3", 0, 1, {"steps": 2}),
    "g2-level1-memory": (
        "memory-sawtooth",
        "g2",
        1,
        1,
        {"iterations": 8, "leak_mb": 2.0, "markers": "scopes"},
    ),
}

# Canonical tables only a Text export fills: no Db table holds them.
TEXT_ONLY = {"l2_cache"}
# operator_details.csv's figures are the generator's own (a scenario states each op's device
# time), not derived from its flows as torch_npu derives them and as the Db reader does: the
# derivation is held to the real export (tests/test_ingest_db.py). The texts and spans are
# the same.
OPERATOR_FACTS = ("name", "input_shapes", "call_stack", "host_total_ns")

# Args keys the Db has no column for: CANN_API records no `Mode`/`item_id`, TASK no `Batch Id`
# and no memcpy details (schema 1.0), COMMUNICATION_TASK_INFO no estimate or bandwidth; and a
# plane task's uint64-max `notify_id` is int64 max in SQLite's INTEGER.
UNCARRIED_ARGS = {
    "Mode",
    "item_id",
    "Batch Id",
    "data size(Byte)",
    "memcpy direction",
    "duration estimated(us)",
    "bandwidth(GB/s)",
    "notify_id",
}
# Ascend Hardware tasks whose hardware queue type (`Task Type`) is not the one their runtime
# type (the only type TASK records) implies: device-to-device copies run on SDMA_SQE, and the
# store scenario's transfer waits are `Notify Wait` tasks on NOTIFY_WAIT_SQE.
UNTYPED_TASKS = ("MEMCPY_ASYNC", "Notify Wait")


def _write(root: Path, session: str, export: str) -> Path:
    scenario, generation, level, ranks, knobs = SESSIONS[session]
    out = root / export
    generate(
        scenario,
        out / "in",
        ranks=ranks,
        generation=generation,
        level=level,
        export=export,
        layers=1,
        **knobs,
    )
    result = ingest(out / "in", out / "store")
    assert [o.source_format for o in result.outcomes] == [export] * ranks
    assert not result.partial, [o.error or o.warnings for o in result.outcomes]
    return out / "store"


@pytest.fixture(scope="module", params=sorted(SESSIONS))
def stores(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(request.param)
    return (
        request.param,
        Store.open(_write(root, request.param, "text")),
        Store.open(_write(root, request.param, "db")),
    )


def _args(row: dict[str, Any]) -> str | None:
    if row["args"] is None:
        return None
    args = {k: v for k, v in json.loads(row["args"]).items() if k not in UNCARRIED_ARGS}
    if row["untyped"]:
        args.pop("Task Type", None)
    if row["comm_op"]:
        args.pop("model id", None)  # COMMUNICATION_OP has no model id column
    return json.dumps(args, sort_keys=True)


def _slices(frame: pl.DataFrame) -> pl.DataFrame:
    untyped = (pl.col("process") == "Ascend Hardware") & pl.col("name").is_in(UNTYPED_TASKS)
    comm_op = pl.col("thread").str.ends_with(" Communication")
    frame = frame.with_columns(
        pl.struct("args", untyped.alias("untyped"), comm_op.alias("comm_op"))
        .map_elements(_args, return_dtype=pl.String)
        .alias("args"),
        pl.when(untyped).then(None).otherwise(pl.col("task_type")).alias("task_type"),
    )
    # CANN_API has no `Mode` column; TASK has no memcpy details (schema 1.0).
    return frame.drop("api_mode", "memcpy_direction", "memcpy_size")


def _kernels(frame: pl.DataFrame, generation: str, level: int) -> pl.DataFrame:
    # The PMU metrics: texts in the CSV, numbers in TASK_PMU_INFO; compared as numbers. A
    # metric the CSV prints `N/A` (every one, on a collective's row) has no TASK_PMU_INFO row.
    def metrics(value: str) -> str | None:
        known = {k: float(x) for k, x in json.loads(value).items() if x != "N/A"}
        return json.dumps(known, sort_keys=True) if known else None

    extra = pl.col("extra").map_elements(metrics, return_dtype=pl.String)
    frame = frame.with_columns(extra.alias("extra"))
    if generation == "g2":
        # G2 kernel_details.csv has no Device_id column; the real G2 Db's COMPUTE_TASK_INFO
        # has no opState or hf32Eligible.
        frame = frame.drop("device_id", "op_state", "hf32_eligible")
    if level == 0:
        # Level0 kernel_details.csv has no Task ID, Stream ID or Context ID; TASK has them.
        frame = frame.drop("task_id", "stream_id", "context_id")
    return frame


def _threads(frame: pl.DataFrame, slices: pl.DataFrame, counters: pl.DataFrame) -> pl.DataFrame:
    # The Text export's M events name threads without events (all four Overlap Analysis
    # threads); a Db has no M events: its threads are those of its rows.
    used = pl.concat([slices.select("pid", "tid"), counters.select("pid", "tid")]).unique()
    return frame.join(used, on=["pid", "tid"], how="semi")


def _sessions(frame: pl.DataFrame) -> pl.DataFrame:
    # The format itself, its files and its path differ by nature; a Db's own records are
    # kept under `db.` keys, beside the profiler_metadata.json keys a Text export has.
    def text_keys(value: str) -> str:
        meta = {k: v for k, v in json.loads(value).items() if not k.startswith("db.")}
        return json.dumps(meta, sort_keys=True)

    def other_settings(value: str) -> str:
        config = json.loads(value)
        config.get("experimental_config", {}).pop("_export_type", None)
        return json.dumps(config, sort_keys=True)

    frame = frame.with_columns(
        pl.col("metadata").map_elements(text_keys, return_dtype=pl.String),
        pl.col("config").map_elements(other_settings, return_dtype=pl.String),
    )
    return frame.drop("export_type", "files", "path", "source_format")


def _canonical(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns, nulls_last=True)


def _table(store: Store, name: str, session: str) -> pl.DataFrame:
    _, generation, level, _, _ = SESSIONS[session]
    frame = store.table(name).collect()
    if name == "slices":
        return _slices(frame)
    if name == "kernels":
        return _kernels(frame, generation, level)
    if name == "threads":
        return _threads(frame, store.table("slices").collect(), store.table("counters").collect())
    if name == "module_memory" and generation == "g2":
        return frame.drop("device_id")  # G2 npu_module_mem.csv has no Device_id column
    if name == "comm_ops":
        # `Communication Bandwidth Info`: JSON in communication.json, NUMERIC columns in
        # CommAnalyzerBandwidth (0 and 0.0 alike): compared as values.
        bandwidth = pl.col("bandwidth").map_elements(
            lambda v: json.dumps(_floats(json.loads(v)), sort_keys=True), return_dtype=pl.String
        )
        return frame.with_columns(bandwidth)
    if name == "sessions":
        return _sessions(frame)
    if name == "operators":
        return frame.select("rank", "session", *OPERATOR_FACTS)
    return frame


def _floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value) if isinstance(value, int | float) else value


def test_every_table_both_formats_fill_is_the_same_row_for_row(stores) -> None:
    session, text, db = stores
    differences = []
    for name in TABLES:
        expected, got = _table(text, name, session), _table(db, name, session)
        if name in TEXT_ONLY:
            assert got.is_empty(), name
            continue
        # The statistics' CSVs print µs to 3 decimals; the Db reader computes them from the
        # exact ns: equal to the CSVs' precision. Everything else is exact.
        exact = name not in ("api_stats", "op_stats")
        try:
            assert_frame_equal(
                _canonical(got), _canonical(expected), check_exact=exact, rel_tol=0, abs_tol=1e-3
            )
        except AssertionError as exc:
            differences.append(f"{name}: {exc}")
    assert not differences, "\n".join(differences)


def test_the_tables_are_not_empty(stores) -> None:
    """The comparison has something to compare: each session fills the tables it should."""
    session, text, _ = stores
    _, _, level, _, knobs = SESSIONS[session]
    expected = {"slices", "flows", "kernels", "counters", "step_times", "module_memory"}
    if level > 0:
        expected |= {"api_stats", "op_stats"}
    if knobs.get("tp_comm") or session.endswith("store"):
        expected |= {"comm_ops", "comm_links"}
    if session.endswith("memory"):
        expected |= {"memory_records", "op_memory"}
    empty = {name for name in expected if text.table(name).collect().is_empty()}
    assert not empty
