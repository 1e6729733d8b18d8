"""TA010 collective-straggler: the rank that makes the others wait inside collectives."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.kit import (
    COMMUNICATION_PROCESSES,
    COMPUTE_TASK_TYPES,
    HARDWARE_PROCESS,
    NOTIFY_WAIT_NAMES,
    NS,
    STEP_SPAN_PREFIX,
    AnyOf,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    Requirement,
    RuleContext,
    analysed_window_ns,
    communication_ops,
    cost_over,
    kernel_tasks,
    moe_imbalance,
    rule,
    session_metadata,
    tail_iterations,
    union_intervals,
    window_of,
)
from traceanalyzer.kit import text as fmt

OP_TYPE = r"^hcom_([A-Za-z]+)"  # hcom_allReduce__586_0_1 -> allReduce
INSTANCE_KEY = ("group", "step", "match")
NAMES_AGREE = 0.8  # share of a group's ops named alike on every rank to match them by name
EVIDENCE_INSTANCES, PEERS_SHOWN, SERIES_POINTS = 4, 3, 400
NOT_ENOUGH = (
    "missing the waits inside collectives on at least 2 ranks of a group (collect with "
    "profiler_level=Level1 in a multi-rank job: communication.json, or Notify Wait tasks)"
)
CAUSES = {
    "compute": (
        "longer device compute",
        "its device computes longer before the collective: balance the work across ranks "
        "(MoE expert load, uneven batch or sequence lengths), and check that rank's device "
        "(aicore-freq-throttle, aicpu-ops)",
    ),
    "host": (
        "device idle (host-bound)",
        "its device idles before the collective, waiting for the host to launch work: bind "
        "that rank's process to its NUMA node's cores (CPU_AFFINITY_CONF=1), look for other "
        "load on its host, and cut Python work per step (graph mode)",
    ),
    "launch": (
        "a late launch of the collective itself",
        "the collective starts late although its device did no more work: look at what the "
        "host does before it launches the collective on that rank, and at its links",
    ),
    "moe": (
        "expert load imbalance",
        "it is a hot expert rank: its experts get more routed tokens than its peers' and the "
        "others wait for it in the EP exchange; moe-load-imbalance reports it and counts this "
        "wait (balance the expert load: EPLB)",
    ),
}
OWNED = 0.5  # share of the wait moe-load-imbalance must own for the cause to be the experts


@rule(
    id="TA010",
    name="collective-straggler",
    severity="warning",
    scope="global",
    summary="One rank arrives late at collectives and makes the others wait, step after step.",
    fix="Fix the cause named in the finding on the late rank; the waits on the others are a "
    "symptom, not the problem.",
    params={
        "min_excess_us": Param(
            20.0,
            "An instance counts when the other ranks wait at least this much (µs, median over "
            "them) longer than the rank that waits least ...",
        ),
        "min_excess_share": Param(
            0.1,
            "... and that excess is at least this share of their time in the op (0.1): smaller "
            "differences are the protocol's own jitter.",
        ),
        "min_instances": Param(2, "The late rank must be late in at least this many instances."),
        "min_consistency": Param(
            0.75, "... and in at least this share of the group's instances that count."
        ),
        "min_share": Param(
            0.01, "The others must lose at least this share of their analysed window (0.01)."
        ),
        "wait_source": Param(
            "auto",
            "`tasks`: Notify Wait tasks inside each collective (trace_view.json); "
            "`communication`: communication.json Wait Time; `auto`: both where present, the "
            "stronger verdict wins.",
            choices=("auto", "tasks", "communication"),
        ),
        "notify_wait_names": Param(
            NOTIFY_WAIT_NAMES, "Task names/types of inter-rank waits inside a collective."
        ),
        "op_pattern": Param(r"^hcom_", "Regex on communication op names of collectives."),
    },
    # a hot expert rank's lateness is moe-load-imbalance's, a tail iteration's waits are
    # tail-iteration's: asked who owns which wait
    uses=[moe_imbalance, tail_iterations],
    requires=[
        AnyOf(
            communication_ops(),
            Requirement(
                "slices",
                ("name",),
                what="HCCL collectives in trace_view.json",
                collect_with="ProfilerActivity.NPU in a multi-rank job",
                where=pl.col("process").is_in(COMMUNICATION_PROCESSES),
            ),
        )
    ],
    units={
        "moe_owned_ns": NS,
        "wait_ns_per_step": NS,
        "late_wait_ns_median": NS,
        "peer_wait_ns_median": NS,
        "before_compute_excess_ns": NS,
        "before_idle_excess_ns": NS,
    },
)
def collective_straggler(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    The rank that arrives last at the collectives of its group. Every collective instance (the
    k-th collective of a group in a step, matched across the ranks of the group by sequence and
    checked by op type) is compared across ranks: each rank's **wait inside the op** (the union
    of its `Notify Wait` tasks in the op, or communication.json `Wait Time`) minus the smallest
    wait of the instance is the time that rank lost waiting for the others. The rank whose wait
    is the smallest is the late arriver. It fires when one rank is the late one in at least
    `min_instances` instances and `min_consistency` of the instances that count (the others
    wait at least `min_excess_us` and `min_excess_share` of their time in the op longer: less
    is the protocol's own jitter), and the others lose at least `min_share` of their analysed
    window.
    The finding names the late rank, the ops, the time the others lose per step, and what
    precedes the collective on the late rank compared with its peers (longer compute, device
    idle while the host lags, or neither). When the late rank is a hot expert rank and the
    waits are in the EP exchange after its experts (the all-to-all and all-gather paths),
    `moe-load-imbalance` owns that wait: the cause is the expert load, and this finding's
    `cost_ns` leaves that part out (`moe_owned_ns`), so the wait is counted once. The
    collectives of a tail iteration (`tail-iteration`: a few iterations much slower than their
    phase's typical, followed to the rank the others waited on) are left out: that finding
    owns their waits.

    ## Why it matters
    In synchronous collectives every rank's step time is the same, so the slow rank does not
    show in step times (`slow-rank` cannot see it): it shows as *communication wait on all the
    others*, which points at the network. The late arriver's own wait is the smallest; the
    cause is what it does before the collective.

    ## How to fix
    On the late rank, fix what precedes the collective:
    - longer device compute: balance the work (MoE expert load, uneven batches or sequence
      lengths), check that device's frequency and AI CPU fallbacks;
    - device idle before the collective: the host is late; bind cores (`CPU_AFFINITY_CONF`),
      remove other load on that host, cut Python work per step, use graph mode;
    - neither: the collective itself is launched late on that rank; check its host path and
      links.

    ## Example
    ```
    TA010 collective-straggler [warning] rank 3 (1/8)
    rank 3 arrives late at 46 of 48 allReduce collectives in `tp`: the other 7 ranks wait
    1.9 ms per step for it (12% of their window); before each it computes 41 µs longer
    (aclnnGroupedMatmul_GroupedMatmul_GroupedMatmul +38 µs)
    ```
    Silent on balanced waits (all ranks wait alike, e.g. a slow link for everybody), on waits
    that change rank from instance to instance (jitter), and when step times are equal but no
    rank makes the others wait.

    ## References
    - vllm-ascend #11967 (MTP host-bound fast and slow ranks), #10088 (one `hcom_allReduce` of
      ~1 s per execute_model in FULL graph mode).
    - msprof-analyze `slow_rank` (Dixon test on step times) and the
      `communication_bottleneck` recipe; NCCL "straggler" analyses (Nsight Systems).
    """
    p = ctx.params
    if ctx.sessions()["rank"].n_unique() < 2:  # nothing to compare: skip reading the tasks
        raise NotEvaluated(NOT_ENOUGH)
    sources = []  # the trace's own tasks first: on a tie their events are the evidence
    if p.wait_source in ("auto", "tasks"):
        sources.append(("Notify Wait tasks", ctx.once(_from_tasks)))
    if p.wait_source in ("auto", "communication"):
        sources.append(("communication.json", ctx.once(_from_communication)))
    if len(sources) == 2:  # name the trace's groups (`Group 0 Communication`) by their hash
        sources[0] = (sources[0][0], _same_groups(sources[0][1], sources[1][1]))
    owned = tail_iterations(ctx).owned()
    kept = [(name, *_not_owned(ops, owned)) for name, ops in sources]
    sources = [(name, ops) for name, ops, _ in kept]
    if left := max((n for _, _, n in kept), default=0):
        ctx.note(
            f"{left} collective instance(s) in tail iterations left out: tail-iteration owns "
            "their waits"
        )
    usable = [(name, ops) for name, ops in sources if _comparable(ops)]
    if not usable:
        raise NotEvaluated(NOT_ENOUGH)
    window = analysed_window_ns(ctx)
    # Both sources see the same collectives (under different group names): per late rank, the
    # source that finds the others losing the most time speaks.
    best: dict[int, list[Straggler]] = {}
    for name, ops in usable:
        by_rank: dict[int, list[Straggler]] = {}
        for s in stragglers(ops, p, window, name):
            by_rank.setdefault(s.rank, []).append(s)
        for rank, found in by_rank.items():
            # in whole ns: two sources of the same waits tie, and the trace's own tasks speak
            if round(_lost(found)) > round(_lost(best.get(rank, []))):
                best[rank] = found
    if not best:
        ctx.note(
            "no late rank: waits are balanced or the late rank changes ("
            + ", ".join(name for name, _ in usable)
            + ")"
        )
        return
    labels = _group_labels(ctx)
    involved = {r for found in best.values() for s in found for r in (s.rank, *s.peers)}
    kernels = _kernels(ctx, sorted(involved))
    for rank in sorted(best):
        for s in best[rank]:
            yield _finding(ctx, s, labels.get(s.group, s.group), kernels)


# --------------------------------------------------------------------------- per-rank ops
# Each source gives one row per (rank, collective): rank, session, group, step, seq, name,
# op_type, start_ns, end_ns, wait_ns.

OP_COLUMNS = (
    "rank",
    "session",
    "group",
    "step",
    "seq",
    "match",
    "name",
    "op_type",
    "process",
    "thread",
    "start_ns",
    "end_ns",
    "wait_ns",
)


def _numbered(ops: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Number each rank's collectives within (group, step) in time order."""
    frame = ops.lazy() if isinstance(ops, pl.DataFrame) else ops
    return (
        frame.with_columns(pl.col("name").str.extract(OP_TYPE, 1).alias("op_type"))
        .sort("rank", "group", "step", "start_ns", "name")
        .with_columns(pl.int_range(pl.len()).over("rank", "group", "step").alias("seq"))
        .pipe(_matched)
        .select(OP_COLUMNS)
        .collect()
    )


def _matched(ops: pl.LazyFrame) -> pl.LazyFrame:
    """The instance each op belongs to (`match`): its name where the ranks of its group name
    their collectives alike (real exports: `hcom_allReduce__586_3_1` on every rank), which
    survives a rank whose profile holds one op more; else its sequence number in the step."""
    ranks = ops.group_by("group").agg(pl.col("rank").n_unique().alias("ranks"))
    named = (
        ops.group_by("group", "step", "name")
        .agg(pl.col("rank").n_unique().alias("on"), pl.len().alias("copies"))
        .join(ranks, on="group")
        .group_by("group")
        .agg(
            ((pl.col("on") == pl.col("ranks")) & (pl.col("copies") == pl.col("on")))
            .mean()
            .alias("agree")
        )
        .filter(pl.col("agree") >= NAMES_AGREE)
        .select("group", pl.lit(True).alias("by_name"))
    )
    return (
        ops.join(named, on="group", how="left")
        .with_columns(
            pl.when(pl.col("by_name"))
            .then(pl.col("name"))
            .otherwise(pl.col("seq").cast(pl.String))
            .alias("match")
        )
        .drop("by_name")
    )


def _from_communication(ctx: RuleContext) -> pl.DataFrame:
    ops = (
        ctx.table("comm_ops")
        .filter(
            (pl.col("kind") == "collective")
            & pl.col("op_name").str.contains(ctx.params.op_pattern)
            & pl.col("wait_ns").is_not_null()
        )
        .select(
            "rank",
            "session",
            pl.col("group").fill_null(""),
            pl.col("step").fill_null(""),
            pl.col("op_name").alias("name"),
            pl.lit(None, pl.String).alias("process"),
            pl.lit(None, pl.String).alias("thread"),
            "start_ns",
            (pl.col("start_ns") + pl.col("elapse_ns").fill_null(0)).alias("end_ns"),
            "wait_ns",
        )
    )
    return _numbered(ops)


def _from_tasks(ctx: RuleContext) -> pl.DataFrame:
    """HCCL ops (the `Group N Communication` rows) and the union of Notify Waits inside each.

    A Notify Wait belongs to the op whose window it starts in on the same stream; the op's
    streams are those of the device tasks that share its connection id (HCCL plane tasks carry
    none, their Ascend Hardware twins do). Ops with no linked task take the waits by time.
    """
    p = ctx.params
    slices = ctx.table("slices")
    ops = (
        slices.filter(
            pl.col("process").is_in(COMMUNICATION_PROCESSES)
            & pl.col("name").str.contains(p.op_pattern)
            & (pl.col("end_ns") > pl.col("start_ns"))
        )
        .select(
            "rank",
            "session",
            pl.col("thread").fill_null("").alias("group"),
            pl.lit("").alias("step"),
            "name",
            "process",
            "thread",
            "start_ns",
            "end_ns",
            "connection_id",
        )
        .collect()
        .with_row_index("op_id")
    )
    if ops.is_empty():
        return pl.DataFrame(schema={c: pl.String for c in OP_COLUMNS})
    device = slices.filter(
        pl.col("process").is_in([HARDWARE_PROCESS, *COMMUNICATION_PROCESSES])
        & pl.col("stream_id").is_not_null()
    )
    linked = (
        device.select("rank", "session", "connection_id", "stream_id")
        .unique()  # a trace whose events repeat (merged copies) would join every copy to every copy
        .join(  # in the scan: only the tasks of collectives are kept
            ops.lazy().select("op_id", "rank", "session", "connection_id"),
            on=["rank", "session", "connection_id"],
        )
        .select("op_id", "stream_id")
        .unique()
        .collect()
    )
    waits = (
        device.filter(
            pl.col("name").is_in(p.notify_wait_names)
            | pl.col("task_type").is_in(p.notify_wait_names)
        )
        .select("rank", "session", "stream_id", "start_ns", "end_ns")
        .collect()
        .sort("start_ns")
    )
    windows = ops.select(
        "op_id",
        "rank",
        "session",
        pl.col("start_ns").alias("op_start"),
        pl.col("end_ns").alias("op_end"),
    )
    assigned = _assign_waits(windows, linked, waits)
    if assigned.is_empty():  # ops without any wait task: the export does not show the waits
        return pl.DataFrame(schema={c: pl.String for c in OP_COLUMNS})
    wait = (
        union_intervals(assigned, by=["op_id"])
        .group_by("op_id")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("wait_ns"))
    )
    return _numbered(
        ops.join(wait, on="op_id", how="left")
        .with_columns(pl.col("wait_ns").fill_null(0))
        .drop("op_id", "connection_id")
    )


def _assign_waits(windows: pl.DataFrame, linked: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """Each wait to the latest op that started at or before it on its stream (or, for ops
    without linked streams, on its rank), kept when it starts inside that op; clipped to it."""
    by_stream = (windows.join(linked, on="op_id"), ["rank", "session", "stream_id"])
    by_rank = (windows.join(linked, on="op_id", how="anti"), ["rank", "session"])
    parts = [
        waits.join_asof(
            ops.sort("op_start"),
            left_on="start_ns",
            right_on="op_start",
            by=by,
            check_sortedness=False,  # sorted by time overall, hence within each group
        )
        for ops, by in (by_stream, by_rank)
        if ops.height
    ]
    if not parts:
        return pl.DataFrame(schema={"op_id": pl.UInt32, "start_ns": pl.Int64, "end_ns": pl.Int64})
    cols = ["op_id", "start_ns", "end_ns", "op_start", "op_end"]
    matched = pl.concat([part.select(cols) for part in parts]).filter(
        pl.col("op_id").is_not_null() & (pl.col("start_ns") < pl.col("op_end"))
    )
    return matched.select(
        "op_id", "start_ns", pl.min_horizontal("end_ns", "op_end").alias("end_ns")
    )


def _not_owned(ops: pl.DataFrame, owned: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """``ops`` less the instances that lie in a tail iteration (``owned``: its windows on every
    rank), and how many: tail-iteration owns those waits, and reports the rank the others
    waited on there."""
    if owned.is_empty() or ops.is_empty():
        return ops, 0
    inside = window_of(
        ops.select("rank", "session", *INSTANCE_KEY, "start_ns").cast({"rank": pl.Int32}),
        owned.with_columns(pl.lit(True).alias("_owned")),
        keep=["_owned"],
    )
    taken = inside.filter(pl.col("_owned").fill_null(False)).select(INSTANCE_KEY).unique()
    return ops.join(taken, on=list(INSTANCE_KEY), how="anti"), taken.height


def _same_groups(tasks: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """``tasks`` with each group renamed to the communication.json group whose ops it shares
    most (both name an op `hcom_allReduce__586_0_1`); unmatched groups keep their name."""
    if tasks.is_empty() or comm.is_empty():
        return tasks
    pairs = (
        tasks.select("rank", "session", "name", "group")
        .join(
            comm.select("rank", "session", "name", pl.col("group").alias("hash")),
            on=["rank", "session", "name"],
        )
        .group_by("group", "hash")
        .agg(pl.len().alias("shared"))
        .sort(["shared", "hash"], descending=[True, False])
        .group_by("group", maintain_order=True)
        .first()
    )
    alias = dict(zip(pairs["group"].to_list(), pairs["hash"].to_list(), strict=True))
    return tasks.with_columns(pl.col("group").replace(alias))


def _comparable(ops: pl.DataFrame) -> bool:
    return (
        ops.height > 0
        and ops.group_by("group").agg(pl.col("rank").n_unique()).get_column("rank").max() >= 2
    )  # type: ignore[operator]


# --------------------------------------------------------------------------- verdict


@dataclass
class Straggler:
    """A late rank of one group, with the instances it was late in."""

    group: str
    rank: int
    source: str
    peers: list[int]
    late: pl.DataFrame  # instances it was late in: key, lost_ns, peer and late waits
    rows: pl.DataFrame  # every rank's op in the group's comparable instances
    counted: int  # the group's instances that count (min_excess_us)
    instances: int  # all comparable instances of the group
    lost_ns: float  # mean over the others of their excess wait, summed over every instance
    # the rank is last at (those that count and the smaller ones)
    window_ns: float  # the others' median analysed window

    @property
    def consistency(self) -> float:
        return self.late.height / self.counted if self.counted else 0.0


def instances(ops: pl.DataFrame) -> pl.DataFrame:
    """Per collective instance (group, step, seq) present on >= 2 ranks with one op type: the
    rank that waits least (`late_rank`), its wait, and each rank's excess over it."""
    agree = (
        ops.group_by(INSTANCE_KEY)
        .agg(pl.col("rank").n_unique().alias("ranks"), pl.col("op_type").n_unique().alias("types"))
        .filter((pl.col("ranks") >= 2) & (pl.col("types") == 1))
        .select(INSTANCE_KEY)
    )
    matched = ops.join(agree, on=INSTANCE_KEY)
    least = (
        matched.sort("wait_ns", "rank")
        .group_by(INSTANCE_KEY, maintain_order=True)
        .first()
        .select(
            *INSTANCE_KEY,
            pl.col("rank").alias("late_rank"),
            pl.col("wait_ns").alias("late_wait_ns"),
        )
    )
    return matched.join(least, on=INSTANCE_KEY).with_columns(
        (pl.col("wait_ns") - pl.col("late_wait_ns")).alias("excess_ns")
    )


def counts(p: Any) -> pl.Expr:
    """Whether an instance's lateness is more than jitter: large in absolute terms and as a
    share of the time the waiting ranks spend in the op."""
    excess = pl.col("median_excess_ns")
    return (
        (excess >= p.min_excess_us * 1e3) & (excess >= p.min_excess_share * pl.col("peer_op_ns"))
    ).alias("counts")


def _lost(found: list[Straggler]) -> float:
    return sum(s.lost_ns for s in found)


def stragglers(ops: pl.DataFrame, p: Any, window: dict[int, int], source: str) -> list[Straggler]:
    """The late ranks that pass every threshold, per group."""
    per_rank = instances(ops)
    if per_rank.is_empty():
        return []
    peers = per_rank.filter(pl.col("rank") != pl.col("late_rank"))
    summary = (
        peers.group_by(INSTANCE_KEY)
        .agg(
            pl.col("late_rank").first(),
            pl.col("seq").min(),
            pl.col("excess_ns").median().alias("median_excess_ns"),
            pl.col("excess_ns").mean().alias("lost_ns"),
            pl.col("wait_ns").median().alias("peer_wait_ns"),
            (pl.col("end_ns") - pl.col("start_ns")).median().alias("peer_op_ns"),
            pl.col("late_wait_ns").first(),
        )
        .with_columns(counts(p))
        # in a fixed order: the float sums below, and so which source speaks, are the same
        # every run
        .sort(INSTANCE_KEY)
    )
    out = []
    for (group,), g in summary.group_by("group", maintain_order=True):
        counted = g.filter(pl.col("counts"))
        if counted.is_empty():
            continue
        group_ranks = sorted(per_rank.filter(pl.col("group") == group)["rank"].unique().to_list())
        for (late_rank,), late in counted.group_by("late_rank", maintain_order=True):
            others = [r for r in group_ranks if r != late_rank]
            windows = [window[r] for r in others if r in window]
            s = Straggler(
                group=str(group),
                rank=int(late_rank),
                source=source,
                peers=others,
                late=late.sort("step", "seq"),
                rows=per_rank.filter(pl.col("group") == group),
                counted=counted.height,
                instances=g.height,
                # every instance it is last at costs the others, small ones too
                lost_ns=float(g.filter(pl.col("late_rank") == late_rank)["lost_ns"].sum()),
                window_ns=float(np.median(windows)) if windows else 0.0,
            )
            share = s.lost_ns / s.window_ns if s.window_ns else 0.0
            if (
                late.height >= p.min_instances
                and s.consistency >= p.min_consistency
                and share >= p.min_share
            ):
                out.append(s)
    return out


# --------------------------------------------------------------------------- what precedes


def _kernels(ctx: RuleContext, ranks: list[int]) -> pl.DataFrame:
    """Compute kernels of ``ranks`` (what a rank does on its device before a collective)."""
    return kernel_tasks(ctx.table("slices"), COMPUTE_TASK_TYPES, ranks=ranks)


@dataclass
class Before:
    """What the device did between the previous collective and this one, per rank."""

    compute_ns: float  # late rank, summed over its late instances
    idle_ns: float
    peer_compute_ns: float  # median over the peers, summed the same way
    peer_idle_ns: float
    kernels: list[tuple[str, float]]  # kernels the late rank runs longer than its peers (delta)
    windows: pl.DataFrame  # per (rank, instance): window start/end, compute, idle
    instances: int  # late instances with a window on the late rank

    @property
    def extra_compute_ns(self) -> float:
        """Per collective: how much longer the late rank computes than its peers."""
        return (self.compute_ns - self.peer_compute_ns) / max(self.instances, 1)

    @property
    def extra_idle_ns(self) -> float:
        """Per collective: how much longer the late rank's device idles than its peers'."""
        return (self.idle_ns - self.peer_idle_ns) / max(self.instances, 1)


def preceding(s: Straggler, kernels: pl.DataFrame) -> Before | None:
    """Device compute and idle time in each rank's window before the late instances."""
    rows = s.rows.sort("rank", "session", "start_ns").with_columns(
        pl.col("end_ns").cum_max().shift(1).over("rank", "session").alias("prev_end_ns")
    )
    keys = s.late.select(INSTANCE_KEY)
    windows = (
        rows.join(keys, on=INSTANCE_KEY)
        .filter(pl.col("prev_end_ns").is_not_null() & (pl.col("start_ns") > pl.col("prev_end_ns")))
        .select(
            *INSTANCE_KEY, "rank", "session", "prev_end_ns", pl.col("start_ns").alias("op_start")
        )
    )
    if windows.is_empty() or kernels.is_empty():
        return None
    ranks = windows["rank"].unique().to_list()
    inside = (
        kernels.filter(pl.col("rank").is_in(ranks))
        .join_asof(
            windows.sort("op_start"),
            left_on="start_ns",
            right_on="op_start",
            by=["rank", "session"],
            strategy="forward",
            check_sortedness=False,
        )
        .filter(pl.col("op_start").is_not_null() & (pl.col("start_ns") >= pl.col("prev_end_ns")))
        .with_columns(pl.min_horizontal("end_ns", "op_start").alias("end_ns"))
    )
    keyed = [*INSTANCE_KEY, "rank"]
    busy = (
        union_intervals(inside, by=keyed)
        .group_by(keyed)
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("compute_ns"))
    )
    per = (
        windows.join(busy, on=keyed, how="left")
        .with_columns(pl.col("compute_ns").fill_null(0))
        .with_columns(
            (pl.col("op_start") - pl.col("prev_end_ns") - pl.col("compute_ns")).alias("idle_ns")
        )
    )
    late = per.filter(pl.col("rank") == s.rank)
    peers = (
        per.filter(pl.col("rank") != s.rank)
        .group_by(INSTANCE_KEY)
        .agg(pl.col("compute_ns").median(), pl.col("idle_ns").median())
        .join(late.select(INSTANCE_KEY), on=INSTANCE_KEY)
    )
    if late.is_empty() or peers.is_empty():
        return None
    by_name = (
        inside.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur"))
        .group_by("rank", "name")
        .agg(pl.col("dur").sum())
    )
    mine = by_name.filter(pl.col("rank") == s.rank).select("name", pl.col("dur").alias("mine"))
    theirs = (
        by_name.filter(pl.col("rank") != s.rank)
        .group_by("name")
        .agg(pl.col("dur").median().alias("theirs"))
    )
    deltas = (
        mine.join(theirs, on="name", how="full", coalesce=True)
        .fill_null(0)
        .with_columns((pl.col("mine") - pl.col("theirs")).alias("delta"))
        .filter(pl.col("delta") > 0)
        .sort(["delta", "name"], descending=[True, False])
        .head(3)
    )
    return Before(
        compute_ns=float(late["compute_ns"].sum()),
        idle_ns=float(late["idle_ns"].sum()),
        peer_compute_ns=float(peers["compute_ns"].sum()),
        peer_idle_ns=float(peers["idle_ns"].sum()),
        kernels=[(n, float(d)) for n, d in deltas.select("name", "delta").iter_rows()],
        windows=per,
        instances=late.height,
    )


def cause_of(before: Before | None, lost_per_instance_ns: float) -> str:
    """The part of the late rank's window that grew most: compute, idle, or neither (less than
    a quarter of what the others lose)."""
    if before is None:
        return "launch"
    grown = max(before.extra_compute_ns, before.extra_idle_ns)
    if grown < 0.25 * lost_per_instance_ns:
        return "launch"
    return "compute" if before.extra_compute_ns >= before.extra_idle_ns else "host"


def signed(ns: float) -> str:
    """``+240 µs`` / ``-5 µs``."""
    return ("+" if ns >= 0 else "-") + fmt.duration(abs(ns))


# --------------------------------------------------------------------------- the finding


def _group_labels(ctx: RuleContext) -> dict[str, str]:
    """Group hash -> name from profiler_metadata.json `parallel_group_info` (G3+)."""
    labels: dict[str, str] = {}
    for raw in ctx.sessions()["metadata"].to_list():
        info = session_metadata(raw).get("parallel_group_info")
        if isinstance(info, dict):
            for key, value in info.items():
                if isinstance(value, dict) and value.get("group_name"):
                    labels.setdefault(str(key), str(value["group_name"]))
    return labels


def _steps(ctx: RuleContext, s: Straggler) -> int:
    """Steps the profile covers on the late rank: ProfilerStep spans, else step keys, else 1."""
    spans = (
        ctx.table("slices")
        .filter((pl.col("rank") == s.rank) & pl.col("name").str.starts_with(STEP_SPAN_PREFIX))
        .select(pl.len())
        .collect()
        .item()
    )
    keys = s.rows.filter((pl.col("rank") == s.rank) & (pl.col("step") != ""))["step"].n_unique()
    return max(int(spans), int(keys), 1)


def _finding(ctx: RuleContext, s: Straggler, group: str, kernels: pl.DataFrame) -> Finding:
    p = ctx.params
    steps = _steps(ctx, s)
    per_step = s.lost_ns / steps
    cost_share = s.lost_ns / s.window_ns if s.window_ns else None
    ops = sorted(
        s.rows.join(s.late.select(INSTANCE_KEY), on=INSTANCE_KEY)["op_type"].unique().to_list()
    )
    names = s.rows.join(s.late.select(INSTANCE_KEY), on=INSTANCE_KEY).filter(
        pl.col("rank") == s.rank
    )
    before = preceding(s, kernels)
    cause = cause_of(before, s.lost_ns / max(s.late.height, 1))
    lines = [
        f"{s.late.height} of the group's {s.counted} collective instances in which the others "
        f"wait at least {p.min_excess_us:g} µs and {p.min_excess_share:.0%} of their time in the "
        f"op longer than the rank waiting least have rank "
        f"{s.rank} as that rank ({s.consistency:.0%}; {s.instances} comparable instances in "
        f"all; waits from {s.source}).",
        f"In them rank {s.rank} waits {fmt.duration(float(s.late['late_wait_ns'].median()))} "
        f"(median) while its peers wait {fmt.duration(float(s.late['peer_wait_ns'].median()))}: "
        f"each other rank loses {fmt.duration(s.lost_ns)} in all, "
        f"{fmt.duration(per_step)} per step over {steps} step(s)"
        + (f", {cost_share:.1%} of its analysed window." if cost_share is not None else "."),
    ]
    if before is not None:
        kernel_text = ", ".join(
            f"{n} {signed(d / max(before.instances, 1))}" for n, d in before.kernels
        )
        lines.append(
            f"Before those collectives (from the previous collective's end) rank {s.rank}'s "
            f"device computes {fmt.duration(before.compute_ns)} and idles "
            f"{fmt.duration(before.idle_ns)} in all; its peers (median) compute "
            f"{fmt.duration(before.peer_compute_ns)} and idle {fmt.duration(before.peer_idle_ns)}"
            + (
                f". Kernels longer on rank {s.rank}, per collective: {kernel_text}."
                if kernel_text
                else "."
            )
        )
    else:
        lines.append("No device kernels before the collectives to compare (the trace has none).")
    owned = _moe_owned(ctx, s)
    if owned >= OWNED * s.lost_ns:
        cause = "moe"
    cause_name, advice = CAUSES[cause]
    cost = max(s.lost_ns - owned, 0.0)
    if owned:
        lines.append(
            f"Of the others' wait, {fmt.duration(owned)} (mean over them) is in EP exchanges "
            f"after rank {s.rank}'s longer expert compute: moe-load-imbalance counts it, this "
            f"finding's cost is the remaining {fmt.duration(cost)}."
        )
    lines.append(f"Cause: {cause_name} -- {advice}.")
    their = "its" if len(s.peers) == 1 else "their"
    title = (
        f"rank {s.rank} arrives late at {s.late.height} of {s.counted} {'/'.join(ops)} "
        f"collectives in `{group}`: {_others(s.peers)} {fmt.duration(per_step)} per step for it"
        + (f" ({cost_share:.0%} of {their} window)" if cost_share is not None else "")
        + f"; {_headline(cause, before)}"
    )
    return ctx.finding(
        rank=s.rank,
        sessions=sorted(names["session"].unique().to_list()),
        title=title,
        message="\n".join(lines),
        location={"group": s.group, "cause": cause},
        cost=cost_over(cost, s.window_ns),
        metrics={
            "moe_owned_ns": owned,
            "wait_ns_per_step": per_step,
            "late_instances": s.late.height,
            "counted_instances": s.counted,
            "consistency": s.consistency,
            "steps": steps,
            "late_wait_ns_median": float(s.late["late_wait_ns"].median()),
            "peer_wait_ns_median": float(s.late["peer_wait_ns"].median()),
            **(
                {
                    "before_compute_excess_ns": before.extra_compute_ns,
                    "before_idle_excess_ns": before.extra_idle_ns,
                }
                if before is not None
                else {}
            ),
        },
        evidence=_evidence(s, before),
        fix=f"On rank {s.rank}: {advice}.",
        series=_series(s),
        score=s.lost_ns,
    )


def _moe_owned(ctx: RuleContext, s: Straggler) -> float:
    """The part of ``s.lost_ns`` (mean over the others) that moe-load-imbalance owns: the
    peers' waits in EP exchanges it attributes to ``s.rank``'s longer expert compute."""
    verdict = moe_imbalance(ctx)
    if s.rank not in verdict.hot_ranks:
        return 0.0
    owned = verdict.owned_ops()
    peers = s.rows.filter(pl.col("rank") != s.rank).select(
        pl.col("rank").cast(pl.Int32), "session", "name"
    )
    total = float(peers.join(owned, on=["rank", "session", "name"])["owned_ns"].sum())
    return min(total / max(len(s.peers), 1), s.lost_ns)


def _headline(cause: str, before: Before | None) -> str:
    """What precedes the collectives on the late rank, in a few words."""
    if cause == "moe":
        return "it is a hot expert rank (moe-load-imbalance counts this wait)"
    if cause == "compute" and before is not None:
        top = f" ({before.kernels[0][0]} {signed(before.kernels[0][1] / max(before.instances, 1))})"
        return f"before each it computes {fmt.duration(before.extra_compute_ns)} longer" + (
            top if before.kernels else ""
        )
    if cause == "host" and before is not None:
        return (
            f"before each its device idles {fmt.duration(before.extra_idle_ns)} longer (host-bound)"
        )
    return "it launches each collective late without more device work before it"


def _others(peers: list[int]) -> str:
    if len(peers) == 1:
        return f"rank {peers[0]} waits"
    return f"the other {len(peers)} ranks wait"


def _evidence(s: Straggler, before: Before | None) -> list[Evidence]:
    """The worst instances: the late rank's op, the peers that wait longest, and the window
    before the op on the late rank."""
    worst = s.late.sort("lost_ns", descending=True).head(EVIDENCE_INSTANCES).select(INSTANCE_KEY)
    rows = s.rows.join(worst, on=INSTANCE_KEY)
    out: list[Evidence] = []
    for key in worst.iter_rows():
        inst = rows.filter(
            pl.all_horizontal(pl.col(c) == v for c, v in zip(INSTANCE_KEY, key, strict=True))
        )
        mine = inst.filter(pl.col("rank") == s.rank).row(0, named=True)
        out.append(
            Evidence(
                rank=s.rank,
                session=mine["session"],
                name=mine["name"],
                process=mine["process"],
                thread=mine["thread"],
                start_ns=mine["start_ns"],
                dur_ns=mine["end_ns"] - mine["start_ns"],
                detail=f"late arriver: waits {fmt.duration(mine['wait_ns'])} in the op",
            )
        )
        if before is not None:
            w = before.windows.filter(
                (pl.col("rank") == s.rank)
                & pl.all_horizontal(pl.col(c) == v for c, v in zip(INSTANCE_KEY, key, strict=True))
            )
            if w.height:
                row = w.row(0, named=True)
                out.append(
                    Evidence(
                        rank=s.rank,
                        session=row["session"],
                        name=f"before {mine['name']}",
                        process=HARDWARE_PROCESS,
                        start_ns=row["prev_end_ns"],
                        dur_ns=row["op_start"] - row["prev_end_ns"],
                        detail=f"device computes {fmt.duration(row['compute_ns'])}, idles "
                        f"{fmt.duration(row['idle_ns'])}",
                    )
                )
        for peer in (
            inst.filter(pl.col("rank") != s.rank)
            .sort("excess_ns", descending=True)
            .head(PEERS_SHOWN)
            .iter_rows(named=True)
        ):
            out.append(
                Evidence(
                    rank=peer["rank"],
                    session=peer["session"],
                    name=peer["name"],
                    process=peer["process"],
                    thread=peer["thread"],
                    start_ns=peer["start_ns"],
                    dur_ns=peer["end_ns"] - peer["start_ns"],
                    detail=f"waits {fmt.duration(peer['wait_ns'])} in the op "
                    f"({fmt.duration(peer['excess_ns'])} for rank {s.rank})",
                )
            )
    return out


def _series(s: Straggler) -> dict[str, list[Any]]:
    """Per instance of the group: the late rank's wait and its peers' (median, max)."""
    per = (
        s.rows.group_by(INSTANCE_KEY)
        .agg(
            pl.col("seq").min(),
            pl.col("wait_ns").filter(pl.col("rank") == s.rank).first().alias("rank_wait_ns"),
            pl.col("wait_ns").filter(pl.col("rank") != s.rank).median().alias("peer_wait_ns"),
            pl.col("wait_ns").filter(pl.col("rank") != s.rank).max().alias("peer_max_wait_ns"),
        )
        .sort("step", "seq")
        .head(SERIES_POINTS)
    )
    return {
        "instance": list(range(per.height)),
        "rank_wait_ns": per["rank_wait_ns"].to_list(),
        "peer_wait_ns": per["peer_wait_ns"].to_list(),
        "peer_max_wait_ns": per["peer_max_wait_ns"].to_list(),
    }


# --------------------------------------------------------------------------- presentation


@collective_straggler.figure(
    caption="Wait inside each collective instance of the group: the late rank (red) waits "
    "least, its peers (median, and the longest in grey) wait for it."
)
def _figure(fig: FigureContext) -> Any:
    series = fig.finding.get("series") or {}
    if not series.get("instance"):
        return None
    rank = (fig.finding.get("ranks") or ["?"])[0]
    figure_, (ax,) = fig.new(8.0, 3.0)
    x = series["instance"]

    def ms(values: list[Any]) -> list[float]:
        return [float("nan") if v is None else v / 1e6 for v in values]

    ax.plot(x, ms(series["peer_max_wait_ns"]), color="#9ca3af", linewidth=0.8, label="peers (max)")
    ax.plot(x, ms(series["peer_wait_ns"]), color="#4f81bd", label="peers (median)")
    ax.plot(x, ms(series["rank_wait_ns"]), color="#c0504d", label=f"rank {rank}")
    ax.set_xlabel("collective instance (in order)")
    ax.set_ylabel("wait inside the op (ms)")
    ax.legend(fontsize=7, frameon=False)
    return figure_


@collective_straggler.key_figures(
    KeyFigure(
        "straggler_wait_ns_per_step",
        "wait for the group's latest rank, per step",
        better="lower",
        unit="ns",
    ),
    KeyFigure("late_instances", "collectives this rank arrives last at", unit="count"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame | list[dict[str, Any]]:
    """Per rank: its excess wait over the rank waiting least, per step; how often it is last."""
    p = ctx.params
    for ops in (
        ctx.once(_from_tasks) if p.wait_source != "communication" else None,
        ctx.once(_from_communication),
    ):
        if ops is None or not _comparable(ops):
            continue
        per = instances(ops)
        counted = (
            per.filter(pl.col("rank") != pl.col("late_rank"))
            .group_by(INSTANCE_KEY)
            .agg(
                pl.col("excess_ns").median().alias("median_excess_ns"),
                (pl.col("end_ns") - pl.col("start_ns")).median().alias("peer_op_ns"),
            )
            .select(*INSTANCE_KEY, counts(p))
        )
        per = per.join(counted, on=INSTANCE_KEY, how="left")
        steps = pl.max_horizontal(pl.col("step").filter(pl.col("step") != "").n_unique(), pl.lit(1))
        return per.group_by("rank").agg(
            (pl.col("excess_ns").sum() / steps).alias("straggler_wait_ns_per_step"),
            ((pl.col("rank") == pl.col("late_rank")) & pl.col("counts").fill_null(False))
            .sum()
            .alias("late_instances"),
        )
    return []
