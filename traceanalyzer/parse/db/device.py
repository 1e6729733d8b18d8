"""kernel_details.csv, op_statistic.csv and api_statistic.csv of a Db export."""

from __future__ import annotations

import polars as pl

from traceanalyzer.parse.db.database import F64, I64, STR, Db, conform, no_sentinel, schema_of
from traceanalyzer.parse.db.layout import Layout
from traceanalyzer.parse.db.result import DbResult, collected
from traceanalyzer.vocabulary import COMMUNICATION_CORES

# TASK_PMU_INFO metric names → kernel_details.csv column names (the `extra` keys); other
# `*_time` metrics get a `(us)` suffix, as the CSV's do.
_PMU_RENAMED = {"aic_total_time": "aicore_time(us)", "aiv_total_time": "aiv_time(us)"}


# --------------------------------------------------------------------------- device tables


def kernel_table(db: Db, layout: Layout, result: DbResult) -> pl.DataFrame | None:
    """kernel_details.csv's rows: one per compute task (TASK + COMPUTE_TASK_INFO) and one per
    collective (COMMUNICATION_OP), as the CSV lists both."""
    if not collected(db, result, "COMPUTE_TASK_INFO") or db.compute is None:
        return None
    # One row per COMPUTE_TASK_INFO row, timed by its TASK (a row without one keeps nulls).
    tasks = db.compute.join(db.task_rows, on="global_task_id", how="left", maintain_order="left")
    texts = {
        "name": "name_id",
        "type": "type_id",
        "accelerator_core": "compute_type_id",
        "op_state": "op_state_id",
        "hf32_eligible": "hf32_eligible_id",
        "input_shapes": "input_shapes_id",
        "input_data_types": "input_data_types_id",
        "input_formats": "input_formats_id",
        "output_shapes": "output_shapes_id",
        "output_data_types": "output_data_types_id",
        "output_formats": "output_formats_id",
    }
    kernels = tasks.with_columns(
        # `N/A` (Level0 records no op info) is null, as the CSV's `N/A` is
        *(
            db.text(pl.col(source)).replace("N/A", None).alias(name)
            for name, source in texts.items()
        ),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        no_sentinel(pl.col("raw_model_id")).alias("model_id"),
        no_sentinel(pl.col("context_id")).alias("context_id"),
        pl.coalesce("block_num", "block_dim").alias("block_num"),
        pl.coalesce("mix_block_num", "mix_block_dim").alias("mix_block_num"),
    ).with_columns(pl.col("input_shapes", "output_shapes").str.strip_chars('"'))
    kernels = pl.concat([kernels, _collective_rows(db, layout)], how="diagonal_relaxed")
    order = ("start_ns", "stream_id", "task_id")
    kernels = _with_step(db, kernels.sort(*order, nulls_last=True, maintain_order=True))
    kernels = kernels.join(_pmu_extra(db), on="global_task_id", how="left", maintain_order="left")
    return conform(kernels, schema_of("kernels"))


def task_time_table(db: Db, layout: Layout) -> pl.DataFrame | None:
    """task_time.csv's rows (msprof's every-task list, which current torch_npu exports as
    Text): each TASK row with its runtime type and, for a kernel, its name. Earlier
    generations write no such file, and their Db twins fill no such table."""
    if layout.generation != "current" or not db.has("TASK"):
        return None
    name = pl.lit(None, dtype=STR)
    if "name_id" in db.tasks.columns:
        name = db.text(pl.col("name_id")).replace("N/A", None)
    tasks = db.tasks.sort("start_ns", "stream_id", "task_id", nulls_last=True, maintain_order=True)
    return conform(
        tasks.select(
            pl.col("device_id"),
            name.alias("kernel_name"),
            db.text(pl.col("runtime_type_id")).alias("kernel_type"),
            "stream_id",
            "task_id",
            (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
            "start_ns",
            "end_ns",
        ),
        schema_of("task_times"),
    )


def _collective_rows(db: Db, layout: Layout) -> pl.DataFrame:
    """kernel_details.csv's row of each collective: the op's name, type and time, its wait,
    `Accelerator Core` HCCL (COMMUNICATION from G3 on), no stream or task."""
    core = COMMUNICATION_CORES[0] if layout.comm_process == "HCCL" else COMMUNICATION_CORES[1]
    return db.comm_ops.select(
        db.text(pl.col("name_id")).alias("name"),
        db.text(pl.col("op_type_id")).alias("type"),
        pl.lit(core).alias("accelerator_core"),
        pl.lit(layout.device, dtype=I64).alias("device_id"),
        "start_ns",
        "end_ns",
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        "wait_ns",
        pl.lit(0, dtype=I64).alias("block_num"),
    )


def _with_step(db: Db, tasks: pl.DataFrame) -> pl.DataFrame:
    """The last STEP_TIME id started at each task's start (tasks sorted by start). STEP_TIME
    holds the host's ProfilerStep windows; a task the step launched can start on the device
    after its window closed, and kernel_details.csv still counts it in that step."""
    if not db.has("STEP_TIME"):
        return tasks.with_columns(pl.lit(None, dtype=I64).alias("step"))
    steps = db.scan("STEP_TIME", step=("id", I64), step_start=("startNs", I64))
    steps = steps.drop_nulls("step_start").sort("step_start")
    timed = tasks.filter(pl.col("start_ns").is_not_null())
    joined = timed.join_asof(steps, left_on="start_ns", right_on="step_start", strategy="backward")
    untimed = tasks.filter(pl.col("start_ns").is_null())  # no TASK row: no step either
    return pl.concat([joined, untimed], how="diagonal_relaxed")


def _pmu_extra(db: Db) -> pl.DataFrame:
    """TASK_PMU_INFO metrics of each task as a JSON object, keyed as kernel_details.csv is."""
    empty = pl.DataFrame(schema={"global_task_id": I64, "extra": STR})
    if not db.has("TASK_PMU_INFO"):
        return empty
    pmu = db.scan(
        "TASK_PMU_INFO",
        global_task_id=("globalTaskId", I64),
        metric_id=("name", I64),
        value=("value", F64),
    )
    if pmu.is_empty():
        return empty
    # Named once per metric, not per row: a task has a row per metric (27 on Level1).
    ids = pmu.select(pl.col("metric_id").unique(maintain_order=True))
    metric = db.text(pl.col("metric_id"))
    metric = (
        pl.when(metric.is_in(list(_PMU_RENAMED)))
        .then(metric.replace(_PMU_RENAMED))
        .when(metric.str.ends_with("_time"))
        .then(metric + "(us)")
        .otherwise(metric)
    )
    names = ids.with_columns(metric.alias("metric"))
    if names["metric"].is_null().any() or names["metric"].is_duplicated().any():
        # two ids of one name (or none): their values are one key, the first one kept
        pmu = pmu.join(names, on="metric_id", maintain_order="left")
        key = "metric"
    else:
        pmu = pmu.with_columns(pl.col("metric_id").cast(STR))
        key = "metric_id"
    wide = pmu.pivot(on=key, index="global_task_id", values="value", aggregate_function="first")
    if key == "metric_id":
        wide = wide.rename(dict(zip(names["metric_id"].cast(STR), names["metric"], strict=True)))
    metrics = pl.struct(pl.exclude("global_task_id")).struct.json_encode()
    return wide.select("global_task_id", metrics.alias("extra"))


def _stats_device(layout: Layout, host: bool) -> pl.Expr:
    """The statistics' `Device_id` column, which G3+ CSVs lead with (`host` for the APIs)."""
    device = (
        ("host" if host else str(layout.device)) if layout.generation in ("g3", "current") else None
    )
    return pl.lit(device, dtype=STR).alias("device_id")


def api_stats(slices: pl.DataFrame, layout: Layout) -> pl.DataFrame:
    """api_statistic.csv's figures, from the CANN API events (µs, population variance)."""
    cann = slices.select("process", "api_level", "api_name", "dur_ns").filter(
        pl.col("process") == "CANN"
    )
    cann = cann.with_columns(us=pl.col("dur_ns") / 1000)
    stats = cann.group_by(pl.col("api_level").alias("level"), "api_name").agg(
        pl.len().cast(I64).alias("count"),
        pl.col("us").sum().alias("total_us"),
        pl.col("us").mean().alias("avg_us"),
        pl.col("us").min().alias("min_us"),
        pl.col("us").max().alias("max_us"),
        pl.col("us").var(ddof=0).alias("variance"),
    )
    stats = stats.with_columns(_stats_device(layout, host=True))
    return stats.sort("total_us", "level", "api_name", descending=[True, False, False])


def op_stats(kernels: pl.DataFrame, layout: Layout) -> pl.DataFrame:
    """op_statistic.csv's figures, from the compute tasks (µs; share of the total task time)."""
    # Sums of integer ns: the same in any order (the groups come in no fixed order, and float
    # sums of them differed in their last bits from run to run).
    total_ns = pl.col("dur_ns").sum()
    compute = kernels.filter(
        ~pl.col("accelerator_core").is_in(COMMUNICATION_CORES).fill_null(False)
    )
    stats = compute.group_by(
        pl.col("type").alias("op_type"), pl.col("accelerator_core").alias("core_type")
    ).agg(
        pl.len().cast(I64).alias("count"),
        (total_ns / 1000).alias("total_us"),
        (pl.col("dur_ns").min() / 1000).alias("min_us"),
        (total_ns / pl.col("dur_ns").count() / 1000).alias("avg_us"),
        (pl.col("dur_ns").max() / 1000).alias("max_us"),
        total_ns.alias("_total_ns"),
    )
    ratio = pl.col("_total_ns") / pl.col("_total_ns").sum() * 100
    return (
        stats.with_columns(ratio.alias("ratio_pct"), _stats_device(layout, host=False))
        .drop("_total_ns")
        .sort("total_us", "op_type", descending=[True, False])
    )
