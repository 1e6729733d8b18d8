"""Ranks that meet in collectives: the same collective and the same engine iteration on every
rank, who arrived last at each, and which rank each iteration waited on.

The ranks of a TP, DP+EP or EP group meet in every collective of their group: an all-reduce,
an all-to-all, the MC2 dispatch and combine of every MoE layer. The op ends on all of them once
the last has arrived, so the others wait for it inside the op (the ``collectives`` table's
``arrival_ns``, the waits before each plane's first transfer; an MC2 kernel's whole time). The
rank that waits least arrived last; what each other rank waited beyond it (``skew_ns``) is the
time it lost to the late one: durations on each rank's own clock, so ranks on hosts whose
clocks differ compare alike.

:func:`align` matches each collective across the ranks of its group (an instance): by name
where the ranks name their ops alike (real exports: ``hcom_allReduce__586_3_1`` on every
rank), else by their order, shifted for a rank whose profile starts some ops earlier or later
(the shift whose op ends keep the steadiest distance to the reference rank's: ranks leave a
collective together). The same iteration on every rank is the one its collectives share with
the reference rank's (the lowest rank of the group), not the one of the same index. Each rank's
clock offset to the reference is the median distance of their op ends.

:func:`iteration_roots` attributes every instance's skews to its last arriver and names, per
iteration, the rank the others waited on most: the iteration's root, the end of its chain of
waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from traceanalyzer.derived.collectives import WAITED_FOR_MIN_NS, collectives_of
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.engine.rule import RuleContext

INSTANCE = ("sidx", "group", "match")
NAMES_AGREE = 0.8  # share of a group's ops named alike on every rank to match them by name
SHIFT_SAMPLE = 400  # op pairs a candidate shift is scored on
MAX_SHIFT = 256
# a shift must keep the op ends this much steadier than none, and by this much (ns), to be
# taken: ranks' clocks drift apart by a few µs over a profile, which no shift explains
SHIFT_GAIN, SHIFT_MIN_GAIN_NS = 0.5, 50_000
ITERATION_KEY = "iteration"


@dataclass
class Alignment:
    """What :func:`align` found.

    ``ops``: each rank's collectives that meet a peer's (the ``collectives`` columns, with
    ``sidx``, ``match``, ``wait_ns``: its arrival wait, the whole op where nothing splits it,
    ``late_rank``: the instance's last arriver (a rank outside the profile when the last
    profiled one waited on a plane to it), ``skew_ns``: its wait beyond the last arriver's,
    ``peers``: the instance's ranks, ``iteration``); ``iterations``: every step of the ranks
    (rank, session, sidx, step, ``iteration``: the reference rank's step it is, as
    ``"rank:sidx:step"``, its own where it shares no collective); ``offsets``: rank -> what to
    add to its times to read them on its reference rank's clock; ``shifts``: (sidx, group,
    rank) -> the ops its profile holds before the reference's first (matched by order)."""

    ops: pl.DataFrame
    iterations: pl.DataFrame
    offsets: dict[int, int] = field(default_factory=dict)
    shifts: dict[tuple[int, str, int], int] = field(default_factory=dict)
    # what it was aligned from: every collective and step of the ranks
    collectives: pl.DataFrame = field(default_factory=pl.DataFrame)
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)

    @property
    def multi_rank(self) -> bool:
        return not self.ops.is_empty()


def session_order(sessions: pl.DataFrame) -> pl.DataFrame:
    """rank, session, ``sidx``: each rank's sessions in time order (the k-th profile of a rank
    meets the k-th of its peers)."""
    return (
        sessions.sort("rank", "start_ns")
        .select("rank", "session", pl.int_range(pl.len()).over("rank").alias("sidx"))
        .cast({"rank": pl.Int32, "sidx": pl.Int64})
    )


def _by_name(ops: pl.DataFrame) -> pl.DataFrame:
    """(sidx, group) whose ops the ranks name alike: each name on every rank of the group once."""
    ranks = ops.group_by("sidx", "group").agg(pl.col("rank").n_unique().alias("_ranks"))
    return (
        ops.group_by("sidx", "group", "name")
        .agg(pl.col("rank").n_unique().alias("_on"), pl.len().alias("_copies"))
        .join(ranks, on=["sidx", "group"])
        .group_by("sidx", "group")
        .agg(
            ((pl.col("_on") == pl.col("_ranks")) & (pl.col("_copies") == pl.col("_on")))
            .mean()
            .alias("_agree"),
            pl.col("_ranks").first(),
        )
        .filter((pl.col("_agree") >= NAMES_AGREE) & (pl.col("_ranks") >= 2))
        .select("sidx", "group")
    )


def _best_shift(ends: np.ndarray, kinds: np.ndarray, ref: np.ndarray, ref_kinds: np.ndarray,
                limit: int) -> int:  # fmt: skip
    """The shift ``s`` that pairs op ``i`` of a rank with the reference's op ``i + s`` so that
    their ends keep the steadiest distance (mean absolute deviation from its median), kinds
    alike; none (0) unless another is clearly steadier."""
    scores: dict[int, float] = {}
    for s in range(-limit, limit + 1):
        lo, hi = max(0, -s), min(len(ends), len(ref) - s)
        if hi - lo < 3:
            continue
        hi = min(hi, lo + SHIFT_SAMPLE)
        if np.mean(kinds[lo:hi] != ref_kinds[lo + s : hi + s]) > 0.1:
            continue
        d = ends[lo:hi] - ref[lo + s : hi + s]
        scores[s] = float(np.mean(np.abs(d - np.median(d))))
    if not scores:
        return 0
    best = min(scores, key=lambda s: (scores[s], abs(s)))
    if 0 in scores and (
        scores[best] >= SHIFT_GAIN * scores[0] or scores[0] - scores[best] < SHIFT_MIN_GAIN_NS
    ):
        return 0
    return best


def _by_order(ops: pl.DataFrame) -> tuple[pl.DataFrame, dict[tuple[int, str, int], int]]:
    """``ops`` of the groups not matched by name, with ``match``: their order in the rank's
    group, shifted onto the reference rank's (the group's lowest)."""
    ordered = ops.sort("rank", "sidx", "group", "start_ns", "name").with_columns(
        pl.int_range(pl.len()).over("rank", "sidx", "group").alias("_seq"),
        pl.col("kind").cast(pl.Categorical).to_physical().cast(pl.Int64).alias("_kind"),
    )
    shifts: dict[tuple[int, str, int], int] = {}
    for (sidx, group), part in ordered.group_by("sidx", "group", maintain_order=True):
        by_rank = part.partition_by("rank", as_dict=True)
        ranks = sorted(key[0] for key in by_rank)
        if len(ranks) < 2:
            continue
        ref = by_rank[(ranks[0],)]
        per_step = ref.group_by("step").len()["len"].median() if ref.height else None
        limit = int(min(MAX_SHIFT, 3 * (per_step or 20), ref.height))
        ref_ends, ref_kinds = ref["end_ns"].to_numpy(), ref["_kind"].to_numpy()
        for rank in ranks[1:]:
            mine = by_rank[(rank,)]
            shift = _best_shift(
                mine["end_ns"].to_numpy(), mine["_kind"].to_numpy(), ref_ends, ref_kinds,
                min(limit, mine.height),
            )  # fmt: skip
            if shift:
                shifts[(int(sidx), str(group), int(rank))] = shift  # type: ignore[arg-type]
    shift_of = pl.DataFrame(
        {
            "sidx": [k[0] for k in shifts],
            "group": [k[1] for k in shifts],
            "rank": [k[2] for k in shifts],
            "_shift": list(shifts.values()),
        },
        schema={"sidx": pl.Int64, "group": pl.String, "rank": pl.Int32, "_shift": pl.Int64},
    )
    matched = ordered.join(shift_of, on=["sidx", "group", "rank"], how="left").with_columns(
        (pl.col("_seq") + pl.col("_shift").fill_null(0)).cast(pl.String).alias("match")
    )
    return matched.drop("_seq", "_kind", "_shift"), shifts


def align(collectives: pl.DataFrame, steps: pl.DataFrame, sessions: pl.DataFrame) -> Alignment:
    """Match the ranks' collectives and iterations (see :class:`Alignment`). ``collectives``:
    the ``collectives`` table of the ranks; ``steps``: their steps; ``sessions``: their
    sessions (rank, session, start_ns)."""
    order = session_order(sessions)
    if collectives["rank"].n_unique() < 2:  # no rank meets another
        return Alignment(
            ops=_empty_ops(collectives), iterations=_own_iterations(steps, order),
            collectives=collectives, steps=steps,
        )  # fmt: skip
    ops = (
        collectives.cast({"rank": pl.Int32})
        .join(order, on=["rank", "session"])
        .with_columns(
            pl.coalesce("arrival_ns", pl.col("end_ns") - pl.col("start_ns")).alias("wait_ns")
        )
    )
    named = _by_name(ops)
    keyed = [ops.join(named, on=["sidx", "group"]).with_columns(pl.col("name").alias("match"))]
    rest, shifts = _by_order(ops.join(named, on=["sidx", "group"], how="anti"))
    keyed.append(rest)
    ops = pl.concat(keyed, how="diagonal_relaxed")
    key = list(INSTANCE)
    valid = (
        (pl.col("rank").n_unique().over(key) >= 2)
        & (pl.col("kind").n_unique().over(key) == 1)
        & (pl.len().over(key) == pl.col("rank").n_unique().over(key))
    )
    ops = ops.filter(valid)
    if ops.is_empty():
        return Alignment(
            ops=_empty_ops(collectives), iterations=_own_iterations(steps, order),
            collectives=collectives, steps=steps,
        )  # fmt: skip
    least = pl.col("wait_ns").min().over(key)
    late = pl.col("rank").sort_by("wait_ns", "rank").first().over(key)
    # the last profiled arriver itself waited on a plane to a rank outside the profile: that
    # rank came last, and every profiled rank waited for it
    beyond = pl.col("waited_for").sort_by("wait_ns", "rank").first().over(key)
    outside = (
        beyond.is_not_null()
        & ~beyond.is_in(order["rank"].unique().cast(pl.Int64).implode())
        & (least >= WAITED_FOR_MIN_NS)
    )
    ops = ops.with_columns(
        pl.when(outside).then(beyond.cast(pl.Int32)).otherwise(late).alias("late_rank"),
        pl.when(outside)
        .then(pl.col("wait_ns"))
        .otherwise(pl.col("wait_ns") - least)
        .alias("skew_ns"),
        pl.col("rank").min().over(key).alias("_ref"),
        pl.col("rank").n_unique().over(key).alias("peers"),
    )
    ref = ops.filter(pl.col("rank") == pl.col("_ref")).select(
        *key, pl.col("step").alias("_ref_step"), pl.col("end_ns").alias("_ref_end")
    )
    ops = ops.join(ref, on=key, how="left")
    offsets = (
        ops.group_by("rank")
        .agg((pl.col("_ref_end") - pl.col("end_ns")).median().alias("_offset"))
        .drop_nulls()
    )
    votes = (
        ops.filter(pl.col("step").is_not_null() & pl.col("_ref_step").is_not_null())
        .group_by("rank", "sidx", "step", "_ref", "_ref_step")
        .len()
        .sort("len", "_ref", "_ref_step", descending=[True, False, False])
        .group_by("rank", "sidx", "step", maintain_order=True)
        .first()
        .select(
            "rank", "sidx", "step",
            pl.format("{}:{}:{}", "_ref", "sidx", "_ref_step").alias("_voted"),
        )
    )  # fmt: skip
    iterations = (
        _own_iterations(steps, order)
        .join(votes, on=["rank", "sidx", "step"], how="left")
        .with_columns(pl.coalesce("_voted", ITERATION_KEY).alias(ITERATION_KEY))
        .drop("_voted")
    )
    ops = ops.join(
        iterations.select("rank", "sidx", "step", ITERATION_KEY),
        on=["rank", "sidx", "step"],
        how="left",
    ).drop("_ref", "_ref_step", "_ref_end")
    return Alignment(
        ops=ops,
        iterations=iterations,
        offsets={int(r): int(o) for r, o in offsets.iter_rows()},
        shifts=shifts,
        collectives=collectives,
        steps=steps,
    )


def _own_iterations(steps: pl.DataFrame, order: pl.DataFrame) -> pl.DataFrame:
    """Every step of ``steps`` (idle gaps aside) as an iteration of its own rank."""
    return (
        steps.filter(pl.col("step").is_not_null())
        .cast({"rank": pl.Int32})
        .join(order, on=["rank", "session"])
        .select(
            "rank", "session", "sidx", "step",
            pl.format("{}:{}:{}", "rank", "sidx", "step").alias(ITERATION_KEY),
        )
    )  # fmt: skip


def _empty_ops(collectives: pl.DataFrame) -> pl.DataFrame:
    extra = {
        "sidx": pl.Int64, "match": pl.String, "wait_ns": pl.Int64, "late_rank": pl.Int32,
        "skew_ns": pl.Int64, "peers": pl.UInt32, ITERATION_KEY: pl.String,
    }  # fmt: skip
    return pl.DataFrame(schema={**collectives.schema, **extra})


def iteration_roots(alignment: Alignment) -> pl.DataFrame:
    """Per iteration with instances on several ranks: ``root`` (the rank the others waited on
    most in it), ``root_wait_ns`` (their mean wait for it, summed over its instances),
    ``waited_ns`` per waiting rank (``waits``: rank -> its wait beyond the last arriver's,
    summed) and ``instances``."""
    ops = alignment.ops
    schema = {
        ITERATION_KEY: pl.String, "root": pl.Int32, "root_wait_ns": pl.Float64,
        "instances": pl.UInt32,
    }  # fmt: skip
    if ops.is_empty():
        return pl.DataFrame(schema=schema)
    key = list(INSTANCE)
    # each instance's lateness: what its other ranks waited beyond the last arriver, on average
    per_instance = (
        ops.filter(pl.col("rank") != pl.col("late_rank"))
        .group_by(key)
        .agg(
            pl.col("late_rank").first(),
            pl.col("skew_ns").mean().alias("_lost"),
            pl.col(ITERATION_KEY).filter(pl.col("rank") == pl.col("rank").min()).first(),
        )
    )
    by_rank = per_instance.group_by(ITERATION_KEY, "late_rank").agg(
        pl.col("_lost").sum().alias("root_wait_ns"), pl.len().alias("instances")
    )
    return (
        by_rank.sort("root_wait_ns", "late_rank", descending=[True, False])
        .group_by(ITERATION_KEY, maintain_order=True)
        .first()
        .select(ITERATION_KEY, pl.col("late_rank").alias("root"), "root_wait_ns", "instances")
        .cast(schema)  # type: ignore[arg-type]
    )


def rank_waits(alignment: Alignment) -> pl.DataFrame:
    """Per rank and iteration: ``waited_ns``, its waits beyond each instance's last arriver,
    summed (what it lost to the late ranks in that iteration)."""
    return alignment.ops.group_by("rank", ITERATION_KEY).agg(
        pl.col("skew_ns").sum().alias("waited_ns")
    )


def alignment(ctx: RuleContext) -> Alignment:
    """:func:`align` of the ranks in scope (their ``collectives`` and steps), once per shard for
    every rule that asks."""
    return ctx.shared(_alignment)


def _alignment(ctx: RuleContext) -> Alignment:
    ranks = ctx.scope_ranks()
    return align(collectives_of(ctx.store, ranks), steps_of(ctx.store, ranks), ctx.sessions())


SPLIT_FIGURES = {
    "arrival_ns": "collective_arrival_ns",
    "transfer_ns": "collective_transfer_ns",
    "idle_ns": "collective_idle_ns",
}


def with_skews(collectives: pl.DataFrame, found: Alignment) -> pl.DataFrame:
    """``collectives`` with the ops nothing splits on their rank (an MC2 kernel) split by the
    peers' comparison: ``arrival_ns`` its wait beyond the instance's last arriver, ``other_ns``
    the rest of the op (the data moving, and the kernel's own work)."""
    if found.ops.is_empty():
        return collectives
    keys = ["rank", "session", "name", "start_ns"]
    skews = found.ops.filter(pl.col("source") == "kernel").select(*keys, "skew_ns")
    split = collectives.cast({"rank": pl.Int32}).join(skews, on=keys, how="left")
    elapse = pl.col("end_ns") - pl.col("start_ns")
    kernel = pl.col("arrival_ns").is_null() & pl.col("skew_ns").is_not_null()
    return split.with_columns(
        pl.when(kernel).then(pl.col("skew_ns")).otherwise(pl.col("arrival_ns")).alias("arrival_ns"),
        pl.when(kernel).then(elapse - pl.col("skew_ns")).otherwise(pl.col("other_ns"))
        .alias("other_ns"),
    ).drop("skew_ns")  # fmt: skip


def collective_split(ctx: RuleContext) -> pl.DataFrame:
    """Per rank in scope: its collectives' time per step (mean over its iterations) waiting for
    the last rank, moving data and with no task running (``collective_arrival_ns``,
    ``collective_transfer_ns``, ``collective_idle_ns``; null where nothing measured it)."""
    found = alignment(ctx)
    steps = (
        found.steps.filter(pl.col("step").is_not_null())
        .group_by("rank")
        .agg(pl.len().alias("_steps"))
        .cast({"rank": pl.Int32})
    )
    ops = with_skews(found.collectives, found)
    measured = {
        c: pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()) for c in SPLIT_FIGURES
    }
    return (
        ops.filter(pl.col("step").is_not_null())
        .cast({"rank": pl.Int32})
        .group_by("rank")
        .agg(expr.alias(c) for c, expr in measured.items())
        .join(steps, on="rank")
        .select(
            "rank",
            *(
                (pl.col(column) / pl.col("_steps")).alias(name)
                for column, name in SPLIT_FIGURES.items()
            ),
        )
    )
