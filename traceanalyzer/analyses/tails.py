"""Tail iterations: the engine iterations much slower than their phase's typical, each followed
to the rank it waited on (its root) and what that rank did meanwhile.

An iteration is one engine step on every rank of a group (:mod:`traceanalyzer.analyses.cross_rank`
aligns them through the collectives they share; a rank that shares none is a group of its
own). Its time is the median of its ranks' step times; per phase, an iteration is a **tail**
when that time is an outlier among the phase's (robust z-score, median/MAD) and beyond the
median by a share and a floor. Its excess over the median is followed to its root: the rank
the others waited on in its collectives (each instance's last arriver, weighted by what the
others lost; a rank outside the profile when the last profiled one waited on a plane to it),
provided that wait explains most of the excess (else every rank was slower alike: a bigger
batch, a slow link; no rank is the root). On a rank alone, the root is the rank.

What the root did meanwhile, in its **late window** (from its previous collective to the one
it was late at; a rank alone: the whole iteration): kernels longer than their own median
(``device``: the slow kernel named), or the device idle while the host was elsewhere: blocked
in a synchronisation (``sync``), or busy in Python frames, a compile or a garbage collection
(``host``, the frame named); or its own communication took longer (``comm``).

``tail-iteration`` reports it; ``collective-straggler`` and ``slow-rank`` ask it which waits it
owns (:meth:`TailVerdict.owned`), so one finding counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses.cross_rank import (
    ITERATION_KEY,
    Alignment,
    alignment,
    iteration_roots,
    rank_waits,
)
from traceanalyzer.derived.collectives import MC2_PATTERN
from traceanalyzer.derived.phases import STEADY_PHASES
from traceanalyzer.engine.params import Param
from traceanalyzer.engine.rule import RuleContext, helper
from traceanalyzer.intervals import union_intervals
from traceanalyzer.kernels import kernel_tasks
from traceanalyzer.stats import MAD_SCALE, MEANAD_SCALE
from traceanalyzer.vocabulary import (
    CANN_PROCESS,
    COMPILE_CALLS,
    COMPUTE_TASK_TYPES,
    PYTHON_GC_PROCESS,
    PYTHON_PROCESS,
    SYNC_APIS,
)

TAIL_PARAMS = {
    "min_iterations": Param(
        8, "A phase is judged when it has at least this many iterations (a robust median)."
    ),
    "tail_z": Param(
        4.0,
        "An iteration is a tail when its time's robust z-score (median/MAD) among its phase's "
        "exceeds this ...",
    ),
    "min_excess": Param(
        0.2, "... and it is at least this share longer than the phase's median ..."
    ),
    "min_excess_us": Param(100.0, "... and by at least this much (µs)."),
    "max_tail_share": Param(
        0.25,
        "At most this share of a phase's iterations can be tails: more, and the phase runs two "
        "kinds of iteration (its median is no typical), not tails.",
    ),
    "root_share": Param(
        0.5,
        "The others' wait for the root must explain at least this share of the iteration's "
        "excess; else every rank was slower alike (a bigger batch, a slow link): no root.",
    ),
    "compile_frames": Param(
        r"(?i)compil|triton|inductor|dynamo|\bjit\b",
        "Regex on Python frames of a compile (a Triton or torch.compile recompilation).",
    ),
    "gc_frames": Param(
        r"(?i)\bgc\b|garbage|gc\.collect", "Regex on Python frames of a garbage collection."
    ),
}
CAUSES = ("host", "device", "sync", "comm")
JUDGED_PHASES = STEADY_PHASES  # unknown too: a training profile's steps
# what explains a late window: a part of the root's lateness at least this big
EXPLAINS = 0.3


@dataclass
class LateWork:
    """What the root did in a tail iteration while the others waited."""

    cause: str  # host | device | sync | comm
    what: str  # "gc", "compile", "python", the kernel or API: the kind of work
    name: str  # the frame, kernel or call named
    rank: int
    session: str
    process: str | None
    thread: str | None
    start_ns: int
    dur_ns: int


@dataclass
class Tail:
    """One tail iteration, followed to its root."""

    iteration: str
    phase: str
    root: int
    profiled: bool  # the root is a profiled rank
    iteration_ns: float  # the median of its ranks' step times
    median_ns: float  # its phase's median iteration
    lateness_ns: float  # the others' wait for the root (a rank alone: the excess)
    windows: dict[int, tuple[str, int, int]]  # rank -> (session, start, end) of the iteration
    steps: dict[int, int]  # rank -> its step (the steps table's number) that is the iteration
    waits: dict[int, float]  # waiting rank -> its wait beyond the last arrivers
    late_op: dict[str, Any] | None = None  # the root's collective it was late at
    # waiting rank -> its op of that collective (session, name, start_ns, end_ns, skew_ns)
    waiter_ops: dict[int, dict[str, Any]] = field(default_factory=dict)
    work: LateWork | None = None

    @property
    def excess_ns(self) -> float:
        return max(self.iteration_ns - self.median_ns, 0.0)

    @property
    def cause(self) -> str:
        return self.work.cause if self.work is not None else "comm"

    @property
    def what_if_ns(self) -> float:
        """The iteration's time had the root not been late."""
        return self.iteration_ns - min(self.lateness_ns, self.excess_ns)


@dataclass
class TailVerdict:
    """What :func:`tail_iterations` found: the tails with a root (``tails``), the tails every
    rank shared with no late rank (``shared``: iteration, phase, excess), the iterations
    judged per phase, and why a phase was not."""

    tails: list[Tail] = field(default_factory=list)
    shared: list[tuple[str, str, float]] = field(default_factory=list)
    judged: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # phase -> why not judged
    alignment: Alignment | None = None

    def owned(self) -> pl.DataFrame:
        """The windows (rank, session, start_ns, end_ns) of the tail iterations with a root, on
        every rank: the waits inside them are tail-iteration's."""
        rows = [
            (rank, session, start, end)
            for t in self.tails
            for rank, (session, start, end) in t.windows.items()
        ]
        return pl.DataFrame(
            rows,
            schema={"rank": pl.Int32, "session": pl.String, "start_ns": pl.Int64,
                    "end_ns": pl.Int64},
            orient="row",
        )  # fmt: skip


@helper(params=TAIL_PARAMS)
def tail_iterations(ctx: RuleContext) -> TailVerdict:
    """The tail iterations of the ranks in scope and their roots (:class:`TailVerdict`),
    computed once for every rule that asks with the same parameters."""
    return ctx.shared(_verdict, tuple(TAIL_PARAMS))


def _iterations(steps: pl.DataFrame, al: Alignment) -> pl.DataFrame:
    """Per rank step of a judged phase: its iteration (the alignment's), times and phase."""
    return (
        steps.filter(pl.col("step").is_not_null() & pl.col("phase").is_in(JUDGED_PHASES))
        .cast({"rank": pl.Int32})
        .join(al.iterations.select("rank", "session", "step", ITERATION_KEY),
              on=["rank", "session", "step"])
        .select("rank", "session", "step", "start_ns", "end_ns", "step_ns", "phase",
                ITERATION_KEY)
    )  # fmt: skip


def _verdict(ctx: RuleContext) -> TailVerdict:
    p = ctx.params
    ranks = ctx.scope_ranks()
    al = alignment(ctx)
    per_rank = _iterations(al.steps, al)
    verdict = TailVerdict(alignment=al)
    if per_rank.is_empty():
        return verdict
    # each group of ranks that meet (a rank alone is a group) is judged against its own
    # iterations of the phase: "ref:sidx" of the iteration key
    its = (
        per_rank.group_by(ITERATION_KEY)
        .agg(
            pl.col("step_ns").median().alias("iteration_ns"),
            pl.col("phase").mode().sort().first(),
            pl.col("rank").n_unique().alias("ranks"),
        )
        .with_columns(pl.col(ITERATION_KEY).str.replace(r":[^:]*$", "").alias("_group"))
    )
    scored = _scored(p, its)
    per_group = scored.group_by("phase", "_group").agg(
        pl.col("_n").first(), pl.col("_tail").sum().alias("_tails")
    )
    enough = pl.col("_n") >= p.min_iterations
    two_kinds = pl.col("_tails") > p.max_tail_share * pl.col("_n")
    for (phase,), part in per_group.group_by("phase", maintain_order=True):
        phase, judged = str(phase), part.filter(enough)
        if judged.is_empty():
            verdict.skipped[phase] = (
                f"{int(part['_n'].max())} iteration(s) at most per group of ranks, fewer than "
                f"{p.min_iterations} (min_iterations)"
            )
            continue
        verdict.judged[phase] = int(judged["_n"].sum())
        mixed = judged.filter(two_kinds)
        if mixed.height:
            verdict.skipped[phase] = (
                f"{int(mixed['_tails'].sum())} of {int(mixed['_n'].sum())} iterations beyond "
                f"the median: two kinds of iteration, not tails (max_tail_share "
                f"{p.max_tail_share:.0%})"
            )
    kept = per_group.filter(enough & ~two_kinds).select("phase", "_group")
    candidates = scored.filter(pl.col("_tail")).join(kept, on=["phase", "_group"])
    if candidates.is_empty():
        return verdict
    picked = candidates.join(iteration_roots(al), on=ITERATION_KEY, how="left")
    waits = rank_waits(al)
    profiled = set(ranks)
    for row in picked.sort("phase", ITERATION_KEY).iter_rows(named=True):
        mine = per_rank.filter(pl.col(ITERATION_KEY) == row[ITERATION_KEY])
        windows = {
            int(r): (str(s), int(a), int(b))
            for r, s, a, b in mine.select("rank", "session", "start_ns", "end_ns").iter_rows()
        }
        numbers = {int(r): int(n) for r, n in mine.select("rank", "step").iter_rows()}
        excess = row["iteration_ns"] - row["median_ns"]
        if row["ranks"] > 1 or row["root"] is not None:
            lateness = float(row["root_wait_ns"] or 0.0)
            if row["root"] is None or lateness < p.root_share * excess:
                verdict.shared.append((row[ITERATION_KEY], row["phase"], excess))
                continue
            root = int(row["root"])
            waited = waits.filter(pl.col(ITERATION_KEY) == row[ITERATION_KEY])
            rank_wait = {
                int(r): float(w) for r, w in waited.select("rank", "waited_ns").iter_rows()
            }
        else:
            root, lateness, rank_wait = next(iter(windows)), excess, {}
        verdict.tails.append(
            Tail(
                iteration=row[ITERATION_KEY],
                phase=row["phase"],
                root=root,
                profiled=root in profiled,
                iteration_ns=float(row["iteration_ns"]),
                median_ns=float(row["median_ns"]),
                lateness_ns=lateness,
                windows=windows,
                steps=numbers,
                # the ranks that waited for it (not the jitter of the others)
                waits={
                    r: w for r, w in rank_wait.items() if r != root and w >= EXPLAINS * lateness
                },
            )
        )
    verdict.tails = _not_at_once(verdict, per_rank)
    _late_ops(verdict.tails, al)
    _late_work(ctx, verdict.tails, al)
    return verdict


def _not_at_once(verdict: TailVerdict, per_rank: pl.DataFrame) -> list[Tail]:
    """The tails of ranks alone (that share no collective), less those at the same time as a
    tail of most of the other ranks alone: a slowdown they all shared (a bigger batch on every
    data-parallel engine), no rank's own (moved to ``shared``)."""
    alone = [t for t in verdict.tails if not t.waits and len(t.windows) == 1]
    matched = set(verdict.alignment.ops["rank"].to_list()) if verdict.alignment else set()
    ranks = len(set(per_rank["rank"].to_list()) - matched)
    if len(alone) < 2 or ranks < 2:
        return verdict.tails
    spans = [(t, *next(iter(t.windows.values()))[1:], t.root) for t in alone]
    shared = set()
    for t, start, end, rank in spans:
        others = {r for _, a, b, r in spans if r != rank and a < end and b > start}
        if len(others) >= max(1, (ranks - 1) / 2):
            shared.add(id(t))
            verdict.shared.append((t.iteration, t.phase, t.excess_ns))
    return [t for t in verdict.tails if id(t) not in shared]


def _scored(p: Any, its: pl.DataFrame) -> pl.DataFrame:
    """``its`` with, per group of ranks and phase, ``median_ns``, ``_n`` (its iterations) and
    ``_tail``: the iteration's robust z-score (median/MAD, the mean-AD fallback of
    :func:`~traceanalyzer.stats.robust_z`) above ``tail_z`` and its excess above the floor."""
    by = ["_group", "phase"]
    median = pl.col("iteration_ns").median().over(by)
    deviation = pl.col("iteration_ns") - pl.col("median_ns")
    mad = deviation.abs().median().over(by)
    mean_ad = deviation.abs().mean().over(by)
    z = (
        pl.when(mad > 0)
        .then(MAD_SCALE * deviation / mad)
        .when(mean_ad > 0)
        .then(deviation / (MEANAD_SCALE * mean_ad))
        .otherwise(0.0)
    )
    floor = pl.max_horizontal(p.min_excess * pl.col("median_ns"), pl.lit(p.min_excess_us * 1e3))
    return its.with_columns(median.alias("median_ns"), pl.len().over(by).alias("_n")).with_columns(
        ((z > p.tail_z) & (deviation >= floor)).alias("_tail")
    )


def _late_ops(tails: list[Tail], al: Alignment) -> None:
    """Each tail's collective the root was latest at (on the root, or on the reference rank
    for a root outside the profile), and the window before it on the root."""
    if al.ops.is_empty():
        return
    ops = al.ops.with_columns(
        pl.col("skew_ns").mean().over("sidx", "group", "match").alias("_lost")
    )
    for t in tails:
        late = ops.filter((pl.col(ITERATION_KEY) == t.iteration) & (pl.col("late_rank") == t.root))
        if late.is_empty():
            continue
        on = t.root if t.profiled else min(late["rank"].to_list())
        mine = late.filter(pl.col("rank") == on).sort("_lost", descending=True)
        if mine.is_empty():
            continue
        op = mine.row(0, named=True)
        instance = late.filter(
            (pl.col("sidx") == op["sidx"]) & (pl.col("group") == op["group"])
            & (pl.col("match") == op["match"]) & (pl.col("rank") != t.root)
        )  # fmt: skip
        t.waiter_ops = {
            int(w["rank"]): {k: w[k] for k in ("session", "name", "start_ns", "end_ns", "skew_ns")}
            for w in instance.iter_rows(named=True)
            if w["skew_ns"] > 0
        }
        before = al.ops.filter(
            (pl.col("rank") == on) & (pl.col("session") == op["session"])
            & (pl.col("end_ns") <= op["start_ns"])
        )  # fmt: skip
        previous = before["end_ns"].max() if before.height else None
        session, start, _ = t.windows.get(on, (op["session"], op["start_ns"], op["end_ns"]))
        t.late_op = {
            "rank": on, "session": op["session"], "name": op["name"], "kind": op["kind"],
            "group": op["group"],
            "start_ns": op["start_ns"], "end_ns": op["end_ns"],
            "from_ns": max(int(previous), start) if previous is not None else start,
        }  # fmt: skip


def _late_window(t: Tail) -> tuple[str, int, int] | None:
    """Where the root's late work is: before its late collective, else its whole iteration."""
    if t.late_op is not None and t.late_op["rank"] == t.root:
        return t.late_op["session"], t.late_op["from_ns"], t.late_op["start_ns"]
    return t.windows.get(t.root)


def _late_work(ctx: RuleContext, tails: list[Tail], al: Alignment) -> None:
    """What each profiled root did in its late window (:class:`LateWork`)."""
    p = ctx.params
    windows = {id(t): _late_window(t) for t in tails if t.profiled}
    windows = {k: w for k, w in windows.items() if w is not None and w[2] > w[1]}
    if not windows:
        return
    roots = sorted({t.root for t in tails if id(t) in windows})
    kernels = kernel_tasks(ctx.table("slices"), COMPUTE_TASK_TYPES, ranks=roots).filter(
        ~pl.col("name").str.contains(MC2_PATTERN)
    )
    typical = kernels.group_by("rank", "name").agg(
        (pl.col("end_ns") - pl.col("start_ns")).median().alias("_typical")
    )
    ops = al.collectives.filter(pl.col("rank").is_in(roots))
    host = _host_spans(ctx, roots, [w for w in windows.values()])
    for t in tails:
        window = windows.get(id(t))
        if window is None:
            continue
        t.work = _explain(p, t, window, kernels, typical, ops, host)


def _host_spans(ctx: RuleContext, ranks: list[int], windows: list[tuple[str, int, int]]):
    """The roots' host work that can keep a device waiting: Python frames and torch ops,
    garbage collections, CANN synchronisations and compiles, within the late windows."""
    lo = min(w[1] for w in windows)
    hi = max(w[2] for w in windows)
    kinds = pl.col("process").is_in([PYTHON_PROCESS, PYTHON_GC_PROCESS]) | (
        (pl.col("process") == CANN_PROCESS) & pl.col("api_name").is_in([*SYNC_APIS, *COMPILE_CALLS])
    )
    return (
        ctx.table("slices")
        .filter(
            pl.col("rank").is_in(ranks) & kinds
            & (pl.col("end_ns") > lo) & (pl.col("start_ns") < hi) & (pl.col("dur_ns") > 0)
        )
        .select("rank", "session", "process", "thread", "name", "cat", "api_name", "start_ns",
                "end_ns")
        .collect()
    )  # fmt: skip


def _overlap(frame: pl.DataFrame, start: int, end: int) -> pl.DataFrame:
    """``frame``'s rows overlapping ``[start, end)``, with ``_in``: how much."""
    return frame.with_columns(
        (
            pl.min_horizontal("end_ns", pl.lit(end)) - pl.max_horizontal("start_ns", pl.lit(start))
        ).alias("_in")
    ).filter(pl.col("_in") > 0)


def _explain(
    p: Any,
    t: Tail,
    window: tuple[str, int, int],
    kernels: pl.DataFrame,
    typical: pl.DataFrame,
    ops: pl.DataFrame,
    host: pl.DataFrame,
) -> LateWork:
    session, start, end = window
    root = t.root
    lateness = max(t.lateness_ns, 1.0)
    mine = _overlap(
        kernels.filter((pl.col("rank") == root) & (pl.col("session") == session)), start, end
    )
    # kernels beyond their own typical time
    slow = (
        mine.join(typical.filter(pl.col("rank") == root), on=["rank", "name"], how="left")
        .with_columns((pl.col("end_ns") - pl.col("start_ns") - pl.col("_typical")).alias("_over"))
        .filter(pl.col("_over") > 0)
        .sort("_over", descending=True)
    )
    device_ns = float(slow["_over"].sum()) if slow.height else 0.0
    # the device's longest idle stretch in the window (no kernel, no collective)
    own_ops = _overlap(
        ops.filter((pl.col("rank") == root) & (pl.col("session") == session)), start, end
    )
    busy = union_intervals(
        pl.concat(
            [
                mine.select("start_ns", "end_ns"),
                own_ops.select("start_ns", "end_ns"),
                pl.DataFrame({"start_ns": [start, end], "end_ns": [start, end]}),
            ]
        ).with_columns(pl.col("start_ns").clip(start, end), pl.col("end_ns").clip(start, end)),
        by=[],
    ).sort("start_ns")
    edges = [start, *[v for a, b in busy.iter_rows() for v in (a, b)], end]
    gaps = [(edges[i], edges[i + 1]) for i in range(0, len(edges) - 1, 2)]
    gap = max(gaps, key=lambda g: g[1] - g[0], default=(start, start))
    idle_ns = float(gap[1] - gap[0])
    if device_ns >= idle_ns and device_ns >= EXPLAINS * lateness:
        k = slow.row(0, named=True)
        return LateWork(
            "device", k["name"], k["name"], root, session, "Ascend Hardware",
            f"Stream {k['stream_id']}" if k.get("stream_id") is not None else None,
            int(k["start_ns"]), int(k["end_ns"] - k["start_ns"]),
        )  # fmt: skip
    if idle_ns >= EXPLAINS * lateness:
        return _host_work(p, root, session, gap, host)
    comm_ns = float(own_ops["_in"].sum()) if own_ops.height else 0.0
    cause = "comm" if comm_ns >= max(device_ns, idle_ns) else "host"
    return LateWork(cause, "not told", "", root, session, None, None, start, end - start)


def _host_work(p: Any, root: int, session: str, gap: tuple[int, int], host: pl.DataFrame):
    """What the host did while the device idled through ``gap``."""
    start, end = gap
    length = max(end - start, 1)
    spans = _overlap(
        host.filter((pl.col("rank") == root) & (pl.col("session") == session)), start, end
    ).with_columns((pl.col("_in") / length).alias("_share"))

    def work(cause: str, what: str, row: dict[str, Any]) -> LateWork:
        return LateWork(
            cause, what, row["api_name"] or row["name"], root, session, row["process"],
            row["thread"], int(row["start_ns"]), int(row["end_ns"] - row["start_ns"]),
        )  # fmt: skip

    def best(frame: pl.DataFrame) -> dict[str, Any] | None:
        """The innermost of those covering the gap (the latest start), else the widest."""
        covering = frame.filter(pl.col("_share") >= 0.5)
        pick = (
            covering.sort("start_ns", descending=True)
            if covering.height
            else frame.sort("_in", descending=True)
        )
        return pick.row(0, named=True) if pick.height else None

    syncs = spans.filter(
        (pl.col("process") == CANN_PROCESS) & pl.col("api_name").is_in(SYNC_APIS)
        & (pl.col("_share") >= 0.5)
    )  # fmt: skip
    if syncs.height:
        return work("sync", "synchronisation", best(syncs) or {})
    gc = spans.filter(
        ((pl.col("process") == PYTHON_GC_PROCESS) | pl.col("name").str.contains(p.gc_frames))
        & (pl.col("_share") >= EXPLAINS)
    )
    if gc.height:
        return work("host", "gc", best(gc) or {})
    compiles = spans.filter(
        (
            ((pl.col("process") == CANN_PROCESS) & pl.col("api_name").is_in(COMPILE_CALLS))
            | ((pl.col("process") == PYTHON_PROCESS) & pl.col("name").str.contains(
                p.compile_frames))
        )
        & (pl.col("_share") >= EXPLAINS)
    )  # fmt: skip
    if compiles.height:
        return work("host", "compile", best(compiles) or {})
    frames = spans.filter((pl.col("process") == PYTHON_PROCESS) & (pl.col("_share") >= 0.5))
    found = best(frames.filter(pl.col("cat") == "python_function")) or best(frames)
    if found is not None:
        return work("host", "python", found)
    return LateWork("host", "not told", "", root, session, None, None, start, end - start)
