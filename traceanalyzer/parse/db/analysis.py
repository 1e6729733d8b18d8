"""analysis.db: step_trace_time.csv, communication.json and communication_matrix.json."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from traceanalyzer.parse.db.database import F64, I64, STR, Db, conform, schema_of
from traceanalyzer.parse.db.result import DbResult, collected
from traceanalyzer.parse.sink import TableSink, arrow_table
from traceanalyzer.timeutil import float_ms_to_ns, float_us_to_ns, us_expr_to_ns

# --------------------------------------------------------------------------- analysis.db


ANALYSIS_TABLES = ("step_times", "comm_ops", "comm_links")


def analysis_tables(db: Db, sink: TableSink, result: DbResult) -> None:
    for table, source, build in zip(
        ANALYSIS_TABLES,
        ("StepTraceTime", "CommAnalyzerTime", "CommAnalyzerMatrix"),
        (_step_times, _comm_ops, _comm_links),
        strict=True,
    ):
        if collected(db, result, source):
            result.rows[table] = sink.arrow(table, arrow_table(build(db)))


# StepTraceTime's column of each step_times duration: its name without the unit, but for one
_STEP_COLUMNS = {
    name: name.removesuffix("_ns") for name in schema_of("step_times") if name.endswith("_ns")
} | {
    "communication_not_overlapped_exclude_receive_ns": "communication_not_overlapped_and_exclude_receive"
}


def _step_times(db: Db) -> pl.DataFrame:
    f = db.scan(
        "StepTraceTime",
        device_id=("deviceId", I64),
        step=("step", I64),
        **{name: (column, F64) for name, column in _STEP_COLUMNS.items()},
    )
    return conform(
        f.with_columns(float_us_to_ns(pl.col(name)).alias(name) for name in _STEP_COLUMNS),
        schema_of("step_times"),
    )


def _comm_ops(db: Db) -> pl.DataFrame:
    times = ("elapse_time", "transit_time", "wait_time", "synchronization_time", "idle_time")
    f = db.scan(
        "CommAnalyzerTime",
        step=("step", STR),
        kind=("type", STR),
        op_name=("hccl_op_name", STR),
        group=("group_name", STR),
        start=("start_timestamp", F64),
        **{column: (column, F64) for column in times},
    )
    wait, sync, transit = map(pl.col, ("wait_time", "synchronization_time", "transit_time"))
    f = f.with_columns(
        # µs as a REAL: its shortest decimal, as communication.json prints it, to ns exactly.
        us_expr_to_ns(pl.col("start")).alias("start_ns"),
        *(float_ms_to_ns(pl.col(c)).alias(c.replace("_time", "_ns")) for c in times),
        # msprof's ratios, rounded as communication.json writes them.
        (wait / (wait + transit)).round(4).fill_nan(0).alias("wait_ratio"),
        (sync / (sync + transit)).round(4).fill_nan(0).alias("synchronization_ratio"),
    )
    f = f.join(
        _bandwidth(db), on=["step", "kind", "op_name", "group"], how="left", maintain_order="left"
    )
    return conform(f, schema_of("comm_ops"))


def _bandwidth(db: Db) -> pl.DataFrame:
    """communication.json's `Communication Bandwidth Info` per op, from CommAnalyzerBandwidth:
    one object per transport type, with its packet size distribution."""
    keys = {"step": STR, "kind": STR, "op_name": STR, "group": STR}
    rows = db.scan(
        "CommAnalyzerBandwidth",
        step=("step", STR),
        kind=("type", STR),
        op_name=("hccl_op_name", STR),
        group=("group_name", STR),
        transport=("transport_type", STR),
        size=("transit_size", F64),
        time=("transit_time", F64),
        bandwidth=("bandwidth", F64),
        large=("large_packet_ratio", F64),
        package=("package_size", F64),
        count=("count", F64),
        total=("total_duration", F64),
    )
    ops: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in rows.iter_rows(named=True):
        key = (r["step"], r["kind"], r["op_name"], r["group"])
        info = ops.setdefault(key, {}).setdefault(
            r["transport"],
            {
                "Transit Size(MB)": r["size"],
                "Transit Time(ms)": r["time"],
                "Bandwidth(GB/s)": r["bandwidth"],
                "Large Packet Ratio": r["large"],
                "Size Distribution": {},
            },
        )
        if r["count"]:
            info["Size Distribution"][repr(r["package"])] = [r["count"], r["total"]]
    return pl.DataFrame(
        [(*key, json.dumps(value, sort_keys=True)) for key, value in ops.items()],
        schema=keys | {"bandwidth": STR},
        orient="row",
    )


def _comm_links(db: Db) -> pl.DataFrame:
    f = db.scan(
        "CommAnalyzerMatrix",
        step=("step", STR),
        kind=("type", STR),
        op_key=("hccl_op_name", STR),
        group=("group_name", STR),
        src_rank=("src_rank", I64),
        dst_rank=("dst_rank", I64),
        transport_type=("transport_type", STR),
        transit_size_mb=("transit_size", F64),
        transit=("transit_time", F64),
        bandwidth_gbps=("bandwidth", F64),
        op_name=("op_name", STR),
    )
    return conform(
        f.with_columns(float_ms_to_ns(pl.col("transit")).alias("transit_ns")),
        schema_of("comm_links"),
    )
