"""The cluster view: one row per rank, outliers flagged with the rules' robust statistics
(:mod:`traceanalyzer.stats`), whether or not a rule fired."""

from __future__ import annotations

import polars as pl

from traceanalyzer.overview.breakdown import computing_ns, idle_ns
from traceanalyzer.overview.phases import iterations, whole_session
from traceanalyzer.stats import OUTLIER_EXCESS, OUTLIER_Z, outlier_z

MIN_PEERS = 3  # below this there is no centre to be an outlier from
ALL_SESSIONS = "all"  # the session value of summary_ranks rows: the row covers every session


def cluster_rows(steps: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """``summary_ranks``: per rank the mean step (iteration) and its parts, the top kernel,
    and step_z.

    Means, where the rank-comparison rule takes medians: a rare long step (a stalled transfer, a recompile)
    is time the job lost on that rank, and the view should show it; the robust z-score across
    ranks is taken against a spread of at least 10%/3.5 of the median (:func:`outlier_z`), so
    a score above 3.5 is an outlier.
    """
    steps, kernels = iterations(steps), whole_session(kernels)
    if steps.is_empty():
        return pl.DataFrame(schema={"rank": pl.Int32, "session": pl.String, "steps": pl.Int64})
    per_rank = (
        steps.with_columns(computing_ns().alias("compute"), idle_ns().alias("idle"))
        .group_by("rank")
        .agg(
            pl.len().cast(pl.Int64).alias("steps"),
            pl.col("step_ns").mean(),
            pl.col("compute").mean().alias("compute_ns"),
            pl.col("comm_exposed_ns").mean().alias("comm_wait_ns"),
            pl.col("idle").mean().alias("idle_ns"),
        )
        .sort("rank")
    )
    top = (
        kernels.group_by("rank", "name")
        .agg(pl.col("total_ns").sum())
        .sort(["rank", "total_ns", "name"], descending=[False, True, False])
        .group_by("rank", maintain_order=True)
        .first()
        .select(
            "rank", pl.col("name").alias("top_kernel"), pl.col("total_ns").alias("top_kernel_ns")
        )
    )
    rows = per_rank.join(top, on="rank", how="left")
    if rows.height >= MIN_PEERS:
        times = rows["step_ns"].to_numpy()
        z = pl.Series("step_z", outlier_z(times))
        median = float(rows["step_ns"].median())  # type: ignore[arg-type]
        excess = (rows["step_ns"] - median) / median if median > 0 else rows["step_ns"] * 0
        rows = rows.with_columns(z, ((z > OUTLIER_Z) & (excess >= OUTLIER_EXCESS)).alias("outlier"))
    else:
        rows = rows.with_columns(
            pl.lit(None, dtype=pl.Float64).alias("step_z"), pl.lit(False).alias("outlier")
        )
    return rows.with_columns(pl.lit(ALL_SESSIONS).alias("session"))
