"""memory_record.csv, operator_memory.csv and npu_module_mem.csv of a Db export."""

from __future__ import annotations

import polars as pl

from traceanalyzer.parse.db.database import F64, I64, MB, Db, conform, schema_of
from traceanalyzer.parse.db.result import DbResult, collected


def _device_type(device: pl.Expr) -> pl.Expr:
    return pl.format("NPU:{}", device)


def memory_records(db: Db, result: DbResult) -> pl.DataFrame | None:
    """memory_record.csv's rows: PTA/GE totals from MEMORY_RECORD, APP from NPU_MEM."""
    frames = []
    if db.has("MEMORY_RECORD"):
        f = db.scan(
            "MEMORY_RECORD",
            component_id=("component", I64),
            ts_ns=("timestamp", I64),
            allocated=("totalAllocated", F64),
            reserved=("totalReserved", F64),
            active=("totalActive", F64),
            stream_ptr=("streamPtr", I64),
            device=("deviceId", I64),
        )
        frames.append(
            f.select(
                db.text(pl.col("component_id")).alias("component"),
                pl.col("ts_ns"),
                (pl.col("allocated") / MB).alias("total_allocated_mb"),
                (pl.col("reserved") / MB).alias("total_reserved_mb"),
                (pl.col("active") / MB).alias("total_active_mb"),
                pl.col("stream_ptr"),
                _device_type(pl.col("device")).alias("device_type"),
            )
        )
    if db.has("NPU_MEM"):
        f = db.scan(
            "NPU_MEM",
            kind=("type", I64),
            ts_ns=("timestampNs", I64),
            ddr=("ddr", F64),
            hbm=("hbm", F64),
            device=("deviceId", I64),
        )
        frames.append(
            f.filter(db.text(pl.col("kind")) == "app").select(
                pl.lit("APP").alias("component"),
                pl.col("ts_ns"),
                ((pl.col("ddr") + pl.col("hbm")) / MB).alias("total_reserved_mb"),
                _device_type(pl.col("device")).alias("device_type"),
            )
        )
    if not frames:
        collected(db, result, "MEMORY_RECORD")
        return None
    schema = schema_of("memory_records")
    records = pl.concat([conform(f, schema) for f in frames])
    return records.sort("ts_ns", maintain_order=True)


def op_memory(db: Db, result: DbResult) -> pl.DataFrame | None:
    if not collected(db, result, "OP_MEMORY"):
        return None
    bytes_columns = {
        "alloc_total_allocated_mb": "allocationTotalAllocated",
        "alloc_total_reserved_mb": "allocationTotalReserved",
        "alloc_total_active_mb": "allocationTotalActive",
        "release_total_allocated_mb": "releaseTotalAllocated",
        "release_total_reserved_mb": "releaseTotalReserved",
        "release_total_active_mb": "releaseTotalActive",
    }
    f = db.scan(
        "OP_MEMORY",
        name_id=("name", I64),
        size=("size", F64),
        alloc_ns=("allocationTime", I64),
        release_ns=("releaseTime", I64),
        active_release_ns=("activeReleaseTime", I64),
        dur_ns=("duration", I64),
        active_dur_ns=("activeDuration", I64),
        stream_ptr=("streamPtr", I64),
        device=("deviceId", I64),
        **{name: (column, F64) for name, column in bytes_columns.items()},
    )
    f = f.with_columns(
        db.text(pl.col("name_id")).alias("name"),
        (pl.col("size") / 1024).alias("size_kb"),
        *((pl.col(name) / MB) for name in bytes_columns),
        _device_type(pl.col("device")).alias("device_type"),
    )
    return conform(f, schema_of("op_memory")).sort("alloc_ns", maintain_order=True)


def module_memory(db: Db, result: DbResult) -> pl.DataFrame | None:
    if not collected(db, result, "NPU_MODULE_MEM"):
        return None
    f = db.scan(
        "NPU_MODULE_MEM",
        module=("moduleId", I64),
        ts_ns=("timestampNs", I64),
        reserved=("totalReserved", F64),
        device_id=("deviceId", I64),
    )
    f = f.with_columns(
        db.enum("ENUM_MODULE", pl.col("module")).alias("component"),
        (pl.col("reserved") / MB).alias("total_reserved_mb"),
        _device_type(pl.col("device_id")).alias("device"),
    )
    return conform(f.sort("ts_ns", "module", maintain_order=True), schema_of("module_memory"))
