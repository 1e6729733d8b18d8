"""The counters of a Db export (AI Core frequency, HBM, LLC, NPU memory, SoC and accelerator
PMU levels), named as trace_view.json's C events name them."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from traceanalyzer.parse.db.database import CAT, F64, I64, MB, Db, conform, schema_of
from traceanalyzer.parse.db.layout import Layout
from traceanalyzer.parse.db.result import DbResult, collected
from traceanalyzer.parse.rows import stable_order

# --------------------------------------------------------------------------- counters


def _sample(name: pl.Expr, series: pl.Expr, value: pl.Expr) -> list[pl.Expr]:
    return [pl.col("ts_ns"), name.alias("name"), series.alias("series"), value.alias("value")]


def _capitalised(value: pl.Expr) -> pl.Expr:
    return value.str.slice(0, 1).str.to_uppercase() + value.str.slice(1)


def _counter_samples(db: Db) -> list[tuple[str, str, Callable[[], list[pl.DataFrame]]]]:
    """(Db table, the trace's process, its samples as the trace's C events name them)."""

    def freq() -> list[pl.DataFrame]:
        f = db.scan("AICORE_FREQ", ts_ns=("timestampNs", I64), freq=("freq", F64))
        return [f.select(_sample(pl.lit("AI Core Freq"), pl.lit("MHz"), pl.col("freq")))]

    def hbm() -> list[pl.DataFrame]:
        f = db.scan(
            "HBM",
            ts_ns=("timestampNs", I64),
            hbm=("hbmId", I64),
            kind=("type", I64),
            bandwidth=("bandwidth", F64),
        )
        way = _capitalised(db.text(pl.col("kind")))  # read → Read
        name = pl.format("HBM {}/{}", pl.col("hbm"), way)
        return [f.select(_sample(name, way + "(MB/s)", pl.col("bandwidth") / MB))]

    def llc() -> list[pl.DataFrame]:
        f = db.scan(
            "LLC",
            ts_ns=("timestampNs", I64),
            llc=("llcId", I64),
            mode=("mode", I64),
            hit=("hitRate", F64),
            throughput=("throughput", F64),
        )
        prefix = pl.format("LLC {} {}", pl.col("llc"), _capitalised(db.text(pl.col("mode"))))
        # msprof stored the trace's 3-decimal MB/s times 2^20: rounding gives it back.
        throughput = (pl.col("throughput") / MB).round(3)
        return [
            f.select(_sample(prefix + "/Throughput", pl.lit("Throughput(MB/s)"), throughput)),
            f.select(_sample(prefix + "/Hit Rate", pl.lit("Hit Rate(%)"), pl.col("hit") / 100)),
        ]

    def npu_mem() -> list[pl.DataFrame]:
        f = db.scan(
            "NPU_MEM",
            ts_ns=("timestampNs", I64),
            kind=("type", I64),
            ddr=("ddr", F64),
            hbm=("hbm", F64),
        )
        kind = db.text(pl.col("kind"))
        who = pl.when(kind == "app").then(pl.lit("APP")).otherwise(_capitalised(kind))
        return [
            f.select(_sample(who + f"/{label}", pl.lit("KB"), value / 1024))
            for label, value in (
                ("DDR", pl.col("ddr")),
                ("HBM", pl.col("hbm")),
                ("Memory", pl.col("ddr") + pl.col("hbm")),
            )
        ]

    def soc() -> list[pl.DataFrame]:
        f = db.scan(
            "SOC_BANDWIDTH_LEVEL",
            ts_ns=("timestampNs", I64),
            mata=("mataBwLevel", F64),
            l2=("l2BufferBwLevel", F64),
        )
        return [
            f.select(_sample(pl.lit(label), pl.lit(label), pl.col(column)))
            for label, column in (("Mata Bw Level", "mata"), ("L2 Buffer Bw Level", "l2"))
        ]

    def acc_pmu() -> list[pl.DataFrame]:
        levels = {
            "read_bandwidth": "readBwLevel",
            "write_band_width": "writeBwLevel",
            "read_ost": "readOstLevel",
            "write_ost": "writeOstLevel",
        }
        f = db.scan(
            "ACC_PMU",
            ts_ns=("timestampNs", I64),
            acc=("accId", F64),
            **{name: (column, F64) for name, column in levels.items()},
        )
        # Each sample has two series in the trace: the level (`value`) and the accelerator.
        return [
            f.select(_sample(pl.lit(name), pl.lit(series), pl.col(column)))
            for name in levels
            for series, column in (("value", name), ("acc_id", "acc"))
        ]

    return [
        ("AICORE_FREQ", "AI Core Freq", freq),
        ("HBM", "HBM", hbm),
        ("LLC", "LLC", llc),
        ("NPU_MEM", "NPU MEM", npu_mem),
        ("SOC_BANDWIDTH_LEVEL", "Stars Soc Info", soc),
        ("ACC_PMU", "Acc PMU", acc_pmu),
    ]


# Counter names are dictionary-encoded, as the slices' are.
_COUNTERS = schema_of("counters") | dict.fromkeys(("name", "series", "process"), CAT)


def counter_table(db: Db, layout: Layout, result: DbResult) -> pl.DataFrame:
    """One row per (sample, series), named as trace_view.json's C events name them, in
    reading order (:func:`counter_order` is the trace's)."""
    frames = [
        frame.with_columns(
            pl.lit(process).alias("process"),
            pl.lit(layout.pid(process), dtype=I64).alias("pid"),
            pl.lit(0, dtype=I64).alias("tid"),
        )
        for table, process, samples in _counter_samples(db)
        if collected(db, result, table)
        for frame in samples()
    ]
    empty = pl.DataFrame(schema=_COUNTERS)
    return pl.concat([empty, *(conform(f, _COUNTERS) for f in frames)], rechunk=False)


def counter_order(counters: pl.DataFrame) -> pl.Series:
    return stable_order(counters, ["process", "name", "ts_ns", "series", "pid"])
