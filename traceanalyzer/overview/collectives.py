"""The overview's collectives: where their time goes, per phase and per rank, and which rank
each iteration waited on last (its critical path across the ranks).

From the ``collectives`` table (:mod:`traceanalyzer.derived.collectives`: each op's arrival wait,
transfer, rest and idle, summing to the op) and the iterations aligned across the ranks
through the collectives they share (:mod:`traceanalyzer.analyses.cross_rank`). Computed in the
driver over every rank, from the derived tables (a few rows per collective).
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.analyses.cross_rank import (
    ITERATION_KEY,
    Alignment,
    align,
    iteration_roots,
    with_skews,
)
from traceanalyzer.derived.collectives import SPLIT, collectives_of
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.overview.model import (
    Collectives,
    CriticalPath,
    ExportIdle,
    PhaseCollectives,
    RankCollectives,
    Root,
)
from traceanalyzer.store import Store

# an iteration waited on its root when the others' wait for it is at least this share of the
# iteration and this long; below, no rank held it up (balanced)
ROOT_MIN_SHARE, ROOT_MIN_NS = 0.05, 20_000
# the iterations the strip of roots draws at most (each its root's colour)
ROOTS_SHOWN = 600


def _per_step(ops: pl.DataFrame, steps: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per ``by`` group: its steps, and its collectives' time and split per step."""
    counted = steps.group_by(by).agg(
        pl.len().alias("steps"), pl.col("rank").n_unique().alias("ranks")
    )
    sums = ops.group_by(by).agg(
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("collective_ns"),
        *(
            pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()).alias(c)
            for c in (*SPLIT, "export_idle_ns")
        ),
        pl.col("source").value_counts(sort=True).alias("_sources"),
    )
    return (
        sums.join(counted, on=by)
        .with_columns(
            (pl.col(c) / pl.col("steps")).alias(c)
            for c in ("collective_ns", *SPLIT, "export_idle_ns")
        )
        .with_columns(pl.col("_sources").list.first().struct.field("source").alias("source"))
        .drop("_sources")
        .sort(by)
    )


def collectives_section(store: Store) -> Collectives | None:
    """:func:`section`, or one that says why it failed: the rest of the overview stands."""
    try:
        return section(store)
    except Exception as exc:  # noqa: BLE001 - one part of the picture, not the picture
        failed = f"{type(exc).__name__}: {exc}"
        return Collectives(phases=[], ranks=[], export_idle=None, critical_path=None, error=failed)


def section(store: Store) -> Collectives | None:
    """``summary.overview.collectives``: ``phases`` and ``ranks`` (per step: ``collective_ns``
    and its split ``arrival_ns``, ``transfer_ns``, ``other_ns``, ``idle_ns``, the export's own
    ``export_idle_ns``), ``export_idle`` (communication.json's Idle Time and what the trace
    says it is) and ``critical_path``; None without collectives."""
    ops = collectives_of(store).cast({"rank": pl.Int32})
    if ops.is_empty():
        return None
    steps = (
        steps_of(store)
        .filter(pl.col("step").is_not_null())
        .cast({"rank": pl.Int32})
        .select("rank", "session", "step", "phase", "step_ns")
    )
    found = align(ops, steps_of(store), store.sessions())
    placed = with_skews(ops, found).filter(pl.col("step").is_not_null())
    phases = _per_step(placed, steps, ["phase"])
    ranks = _per_step(placed, steps, ["rank"])
    return Collectives(
        phases=[PhaseCollectives(**r) for r in phases.to_dicts()],
        ranks=[RankCollectives(**r) for r in ranks.drop("ranks").to_dicts()],
        export_idle=_export_idle(ops, set(steps["rank"].unique().to_list())),
        critical_path=_critical_path(found, steps),
    )


def _export_idle(ops: pl.DataFrame, profiled: set[int]) -> ExportIdle | None:
    """communication.json's Idle Time, and how much of it the trace shows as waits before the
    first transfer, for which peers (``peers``: rank -> ns; ``outside``: those not profiled)."""
    listed = ops.filter(pl.col("export_idle_ns").is_not_null())
    if listed.is_empty():
        return None
    idle = int(listed["export_idle_ns"].sum())
    # where the export says idle, the trace's arrival beyond its own Synchronization Time
    traced = listed.filter(pl.col("source") == "tasks")
    peers = (
        traced.filter(pl.col("waited_for").is_not_null())
        .group_by("waited_for")
        .agg(pl.col("arrival_ns").sum())
        .sort("arrival_ns", descending=True)
    )
    return ExportIdle(
        idle_ns=idle,
        ops=listed.height,
        traced_idle_ns=int(traced["idle_ns"].sum()) if traced.height else None,
        traced_arrival_ns=int(traced["arrival_ns"].sum()) if traced.height else None,
        peers={str(int(p)): int(ns) for p, ns in peers.iter_rows()},
        outside=sorted(int(p) for p in peers["waited_for"].to_list() if p not in profiled),
    )


def _critical_path(alignment: Alignment, steps: pl.DataFrame) -> CriticalPath | None:
    """Per iteration of ranks that meet in collectives: the rank it waited on last (the root);
    the share of iterations each rank is the root of, and the roots in time order."""
    if not alignment.multi_rank:
        return None
    roots = iteration_roots(alignment)
    its = (
        alignment.iterations.join(steps.select("rank", "session", "step", "step_ns", "phase"),
                                  on=["rank", "session", "step"])
        .group_by(ITERATION_KEY)
        .agg(pl.col("step_ns").median(), pl.col("phase").mode().sort().first(),
             pl.col("rank").n_unique().alias("ranks"))
        .filter(pl.col("ranks") > 1)
        .join(roots, on=ITERATION_KEY, how="left")
    )  # fmt: skip
    if its.is_empty():
        return None
    held = (pl.col("root_wait_ns") >= ROOT_MIN_SHARE * pl.col("step_ns")) & (
        pl.col("root_wait_ns") >= ROOT_MIN_NS
    )
    its = its.with_columns(pl.when(held).then(pl.col("root")).alias("root"))
    order = alignment.iterations.group_by(ITERATION_KEY).agg(
        pl.col("sidx").min(), pl.col("step").min()
    )
    its = its.join(order, on=ITERATION_KEY).sort("sidx", "step")
    profiled = set(steps["rank"].unique().to_list())
    rooted = its.filter(pl.col("root").is_not_null())
    per_root = (
        rooted.group_by("root")
        .agg(pl.len().alias("iterations"), pl.col("root_wait_ns").sum().alias("wait_ns"))
        .sort("iterations", "root", descending=[True, False])
    )
    return CriticalPath(
        iterations=its.height,
        balanced=its.height - rooted.height,
        roots=[
            Root(
                rank=int(r),
                iterations=int(n),
                share=n / its.height,
                wait_ns=float(w),
                outside=int(r) not in profiled,
            )
            for r, n, w in per_root.iter_rows()
        ],
        # the roots in time order (null: balanced), for the report's strip
        sequence=its["root"].head(ROOTS_SHOWN).to_list(),
    )
