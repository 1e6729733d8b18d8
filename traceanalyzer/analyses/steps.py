r"""Steps, steady state and host call sites: shared by the rules that judge host calls per step.

A step is an engine iteration of the store's ``steps`` table (:mod:`traceanalyzer.derived`:
``ProfilerStep#N``, vLLM's step annotations or scopes, the Python tracer's ``execute_model``,
device bursts; each with its phase). The steady state is every step that served the workload:
not ``warmup`` (the first ``ProfilerStep``\ s, graph captures, start-up), ``dummy`` (a
data-parallel padding batch) or ``idle``. A call belongs to the step it starts in. Its call
site is the torch op around it on the same OS thread: the outermost one under the step (what
the model code called, e.g. ``aten::item``) and the innermost (``aten::_local_scalar_dense``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.analyses.cost import analysed_window_ns, cost_over
from traceanalyzer.analyses.requirements import HOST_MARKED_STEPS
from traceanalyzer.derived.captures import capture_windows_in
from traceanalyzer.derived.launches import launches_of
from traceanalyzer.derived.phases import PHASES, STEADY_PHASES, UNKNOWN_PHASE
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.engine.findings import Evidence, Finding
from traceanalyzer.engine.params import Param
from traceanalyzer.engine.presentation import FigureContext
from traceanalyzer.engine.rule import NotEvaluated, RuleContext, helper
from traceanalyzer.engine.units import SHARE
from traceanalyzer.intervals import outermost, overlap_join, window_of
from traceanalyzer.launch_links import containing_call, host_launches
from traceanalyzer.vocabulary import (
    CANN_PROCESS,
    CAPTURE_BEGIN_API,
    CAPTURE_END_API,
    DEQUEUE_PREFIX,
    GRAPH_REPLAY_APIS,
    PYTHON_PROCESS,
    SITE_CATEGORIES,
    STEP_SPAN_PREFIX,
)

if TYPE_CHECKING:
    from traceanalyzer.chart import Chart

CAPTURE_PARAMS = {
    "capture_begin": Param(
        CAPTURE_BEGIN_API, "Regex on the CANN api_name that opens a graph capture."
    ),
    "capture_end": Param(
        CAPTURE_END_API, "Regex on the CANN api_name that closes a graph capture."
    ),
}
NO_STEPS = (
    "no step windows (no ProfilerStep#N, vLLM step annotation or scope, execute_model python "
    "function or device work; profile with a schedule and prof.step(), or with_stack / "
    "VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 for a vLLM server)"
)


def step_windows(ctx: RuleContext) -> pl.DataFrame:
    """The iterations the host marked of the ranks in scope (the ``steps`` table's
    ``HOST_MARKED_STEPS``: no device burst, whole session or idle gap): rank,
    session, ``step``, ``start_ns``, ``end_ns``, ``dur_ns``, ``phase``, ``tokens`` and
    ``steady`` (it served the workload: not warm-up, dummy or idle)."""
    return ctx.shared(_step_windows)


def _step_windows(ctx: RuleContext) -> pl.DataFrame:
    # only iterations the host marked: a host call cannot be placed in a device burst (a sync
    # or a compile is what ends one)
    steps = steps_of(ctx.store, ctx.ranks).filter(pl.col("step_source").is_in(HOST_MARKED_STEPS))
    return steps.select(
        "rank",
        "session",
        "step",
        "start_ns",
        "end_ns",
        pl.col("step_ns").alias("dur_ns"),
        "phase",
        "tokens",
        pl.col("phase").is_in(list(STEADY_PHASES)).alias("steady"),
    ).sort("rank", "session", "start_ns")


@helper(params=CAPTURE_PARAMS)
def capture_windows(ctx: RuleContext) -> pl.DataFrame:
    """Graph capture windows (``capture_begin`` ... ``capture_end`` per host thread)."""
    return ctx.shared(_capture_windows, tuple(CAPTURE_PARAMS))


def _capture_windows(ctx: RuleContext) -> pl.DataFrame:
    return capture_windows_in(cann_calls(ctx), ctx.params.capture_begin, ctx.params.capture_end)


def phases_in(steps: pl.DataFrame) -> list[str]:
    """The phases of ``steps`` (a frame with a ``phase`` column) that are known, in the order
    of :data:`~traceanalyzer.derived.phases.PHASES`: what a finding on them concerns ("unknown"
    is no phase to name)."""
    present = set(steps["phase"].drop_nulls().to_list()) if "phase" in steps.columns else set()
    return [p for p in PHASES if p in present and p != UNKNOWN_PHASE]


def phase_windows(ctx: RuleContext) -> pl.DataFrame:
    """Every step of the ranks in scope, whatever marks it (device bursts too), with its
    phase: rank, session, step, start_ns, end_ns, step_source, phase."""
    return steps_of(ctx.store, ctx.ranks).select(
        "rank", "session", "step", "start_ns", "end_ns", "step_source", "phase"
    )


def serving_steps(ctx: RuleContext) -> pl.DataFrame:
    """Every step of the ranks in scope with every column of the ``steps`` table (the phase and
    its evidence, tokens, requests, how the forward ran: ``graph``, ``graph_size``, ``batch``,
    ``padded_tokens``), in time order per rank and session."""
    return steps_of(ctx.store, ctx.ranks)


def phase_at(ctx: RuleContext, frame: pl.DataFrame, at: str = "start_ns") -> pl.DataFrame:
    """``frame`` (rank, session, ``at``) with the ``phase`` of the step each row lies in (null
    outside every step)."""
    return window_of(frame, phase_windows(ctx), at=at, keep=["phase"])


def host_calls(
    ctx: RuleContext, names: Sequence[str] = (), pattern: str | None = None
) -> pl.DataFrame:
    """CANN calls named in ``names`` or matching ``pattern`` (on ``api_name``): rank, session,
    process, thread, name, api_name, start_ns, end_ns, dur_ns."""
    match = pl.col("api_name").is_in(list(names))
    if pattern:
        match = match | pl.col("api_name").str.contains(pattern)
    return cann_calls(ctx).filter(match).drop("api_layer")


def cann_calls(ctx: RuleContext) -> pl.DataFrame:
    """Every CANN call of the shard: rank, session, process, thread, name, api_layer, api_name,
    start_ns, end_ns, dur_ns. Read once for all the rules that ask: filter it, rather than
    scan the slices for the calls of each kind (a scan each took four times as long)."""
    return ctx.shared(_read_cann_calls)


def launched_tasks(
    ctx: RuleContext, replay_apis: Sequence[str] = GRAPH_REPLAY_APIS
) -> pl.DataFrame:
    """Every device task of the shard with the host call that launched it
    (:func:`~traceanalyzer.launch_links.host_launches`): the store's ``launches`` table, derived
    once before the rules; linked again here only when ``replay_apis`` are not the default."""
    if tuple(replay_apis) == GRAPH_REPLAY_APIS:
        return launches_of(ctx.store, ctx.scope_ranks())
    return host_launches(ctx.table("slices"), ctx.table("flows"), replay_apis=replay_apis)


def _read_cann_calls(ctx: RuleContext) -> pl.DataFrame:
    return (
        ctx.table("slices")
        .filter(pl.col("process") == CANN_PROCESS)
        .select(
            "rank",
            "session",
            "process",
            "thread",
            "name",
            "api_layer",
            "api_name",
            "start_ns",
            "end_ns",
            "dur_ns",
        )  # fmt: skip
        .collect()
    )


def in_steps(calls: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The calls that start inside a step, with its ``step`` number, ``steady`` flag and bounds."""
    windows = steps.select(
        "rank", "session", "step", "steady", "start_ns", "end_ns",
        pl.col("start_ns").alias("step_start_ns"), pl.col("end_ns").alias("step_end_ns"),
    )  # fmt: skip
    joined = overlap_join(windows, calls, mode="start_within", suffix="_call")
    return joined.select(
        *calls.columns[:2],
        "step", "steady", "step_start_ns", "step_end_ns",
        *(pl.col(f"{c}_call").alias(c) if f"{c}_call" in joined.columns else pl.col(c)
          for c in calls.columns[2:]),
    )  # fmt: skip


def call_sites(ctx: RuleContext, calls: pl.DataFrame) -> pl.DataFrame:
    """Add ``site`` (outermost torch op around each call, under the step) and ``site_op``
    (the innermost one); null when the call runs outside any torch op.

    A call on the task-queue thread sits in the ``Dequeue@op`` of the op it runs for.
    """
    ops, outer_ops = ctx.shared(_site_ops), ctx.shared(_outer_site_ops)
    points = calls.with_columns(pl.col("start_ns").alias("_at"))
    inner = containing_call(points, ops, at="_at", outer_calls=outer_ops)["_op"]
    outer = containing_call(points, ops, at="_at", outer=True, outer_calls=outer_ops)["_op"]
    return calls.with_columns(site=outer, site_op=inner)


def _outer_site_ops(ctx: RuleContext) -> pl.DataFrame:
    """The outermost of :func:`_site_ops` on each thread, in start order."""
    thread = ("rank", "session", "process", "thread")
    return outermost(ctx.shared(_site_ops), by=thread).sort("start_ns")


def _site_ops(ctx: RuleContext) -> pl.DataFrame:
    """The torch ops a call can run in, on the CANN threads' names (the same OS threads)."""
    return (
        ctx.table("slices")
        .filter(
            (pl.col("process") == PYTHON_PROCESS)
            & pl.col("cat").is_in(SITE_CATEGORIES)
            & ~pl.col("name").str.starts_with(STEP_SPAN_PREFIX)
        )
        .select(
            "rank",
            "session",
            "thread",
            pl.col("name").str.strip_prefix(DEQUEUE_PREFIX).alias("_op"),
            "start_ns",
            "end_ns",
        )
        .with_columns(pl.lit(CANN_PROCESS).alias("process"))  # CANN threads are the OS threads
        .sort("start_ns")  # each lookup of a call around a point then finds them in order
        .collect()
    )


def steady_state_usage(
    steps: pl.DataFrame, calls: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """How much of each step the ``calls`` (from :func:`in_steps`) take, and its steady-state sum.

    Returns ``(per_step, per_rank)``. ``per_step``: every step with ``calls`` and ``call_ns``
    (0 when none). ``per_rank``: ``steady_steps``, ``steps_with`` (steady steps with a call),
    ``step_share`` (their fraction), ``calls``, ``cost_ns`` and ``step_ns`` (steady steps only),
    ``cost_share`` (``cost_ns / step_ns``) and ``warmup_calls`` (calls in warm-up steps).
    """
    keys = ["rank", "session", "step"]
    per_step = (
        steps.join(
            calls.group_by(keys).agg(
                pl.len().alias("calls"), pl.col("dur_ns").sum().alias("call_ns")
            ),
            on=keys,
            how="left",
        )
        .with_columns(pl.col("calls").fill_null(0), pl.col("call_ns").fill_null(0))
        .sort("rank", "start_ns")
    )
    steady = pl.col("steady")
    per_rank = (
        per_step.group_by("rank")
        .agg(
            steady.sum().alias("steady_steps"),
            (steady & (pl.col("calls") > 0)).sum().alias("steps_with"),
            pl.col("calls").filter(steady).sum().alias("calls"),
            pl.col("call_ns").filter(steady).sum().alias("cost_ns"),
            pl.col("dur_ns").filter(steady).sum().alias("step_ns"),
            pl.col("calls").filter(~steady).sum().alias("warmup_calls"),
        )
        .with_columns(
            (pl.col("steps_with") / pl.col("steady_steps").clip(lower_bound=1)).alias("step_share"),
            (pl.col("cost_ns") / pl.col("step_ns").clip(lower_bound=1)).alias("cost_share"),
        )
        .sort("rank")
    )
    return per_step, per_rank


def per_step_figure(fig: FigureContext, ylabel: str) -> Chart | None:
    """Bars of a finding's per-step series (``step``, ``value``, ``steady``); warm-up in grey."""
    (ranks, series), *_ = fig.series_by_rank()
    if not series.get("step"):
        return None
    figure, (ax,) = fig.new(6.0, 2.4)
    colours = ["#dc2626" if s else "#9ca3af" for s in series["steady"]]
    ax.bar([str(s) for s in series["step"]], series["value"], color=colours, width=0.7)
    ax.set_xlabel("step (grey: warm-up)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(f"rank {', '.join(map(str, ranks))}", fontsize=9)
    return figure


@dataclass(frozen=True)
class SteadyUse:
    """A rank whose steady steps keep making some host call, with what its finding reports."""

    rank: int
    totals: dict[str, Any]  # its row of steady_state_usage's per_rank
    calls: pl.DataFrame  # its steady-state calls, with call sites
    per_step: pl.DataFrame  # its steps (steady and warm-up), for the figure
    window_ns: int | None  # its analysed window

    @property
    def steps(self) -> int:
        return int(self.totals["steady_steps"])

    @property
    def sites(self) -> list[str]:
        """Call sites by time spent, the call itself where no torch op is around it."""
        return (
            self.calls.group_by(pl.col("site").fill_null(pl.col("name")))
            .agg(pl.col("dur_ns").sum())
            .sort("dur_ns", "site", descending=[True, False])["site"]
            .to_list()
        )

    @property
    def phases(self) -> list[str]:
        """The phases of the steady steps that made the calls."""
        return phases_in(self.per_step.filter(pl.col("steady") & (pl.col("calls") > 0)))

    def finding(
        self,
        ctx: RuleContext,
        *,
        title: str,
        message: str,
        location: Mapping[str, Any],
        fix: str,
        shown: int = 5,
    ) -> Finding:
        """Its finding: the steady calls' numbers and cost (their share of the analysed window),
        the ``shown`` longest calls with their step and call site as evidence, and per step the
        time in the calls (µs) and whether the step is steady, for the figure."""
        t, n = self.totals, self.steps
        longest = self.calls.sort("dur_ns", descending=True).head(shown)
        return ctx.finding(
            rank=self.rank,
            sessions=sorted(set(self.per_step["session"])),
            title=title,
            message=message,
            location=location,
            metrics={
                "steady_share": round(t["cost_share"], 4),
                "calls": int(t["calls"]),
                "calls_per_step": round(t["calls"] / n, 3),
                "steady_steps": n,
                "steps_with": int(t["steps_with"]),
                "warmup_calls": int(t["warmup_calls"]),
            },
            cost=cost_over(int(t["cost_ns"]), self.window_ns),
            evidence=[
                Evidence(
                    rank=self.rank,
                    session=c["session"],
                    name=c["name"],
                    process=CANN_PROCESS,
                    thread=c["thread"],
                    start_ns=c["start_ns"],
                    dur_ns=c["dur_ns"],
                    detail=f"step {c['step']}, call site {c['site'] or 'no torch op'}",
                )  # fmt: skip
                for c in longest.iter_rows(named=True)
            ],
            fix=fix,
            series={
                "step": self.per_step["step"].to_list(),
                "value": [v / 1e3 for v in self.per_step["call_ns"]],
                "steady": self.per_step["steady"].to_list(),
            },
            phases=self.phases,
            score=float(t["cost_ns"]),
        )


RECURRING_PARAMS = {
    "min_step_share": Param(
        0.5, "Fire when at least this fraction of the steady steps makes the calls."
    ),
    "min_share": Param(0.002, "...and the calls take at least this share of their time."),
}


@helper(params=RECURRING_PARAMS, units={"steady_share": SHARE})  # SteadyUse.finding
def recurring_calls(
    ctx: RuleContext, calls: pl.DataFrame, what: str, aside: Mapping[int, str] | None = None
) -> Iterator[SteadyUse]:
    """The ranks whose steady steps keep making ``calls`` (host calls of one kind).

    A rank qualifies when at least ``min_step_share`` of its steady steps have a call and the
    calls take at least ``min_share`` of their time; every other rank gets a note naming
    ``what`` was counted (plus ``aside[rank]``, e.g. what was left out). Without steps the
    rule is not evaluated; a rank with no steady step is inconclusive (its status,
    never clean).
    """
    p = ctx.params
    steps = step_windows(ctx)
    if steps.is_empty():
        raise NotEvaluated(NO_STEPS)
    placed = in_steps(calls, steps)
    per_step, per_rank = steady_state_usage(steps, placed)
    windows = analysed_window_ns(ctx)
    for t in per_rank.iter_rows(named=True):
        rank = int(t["rank"])
        extra = f"; {aside[rank]}" if aside and rank in aside else ""
        if not t["steady_steps"]:
            ctx.inconclusive(
                f"rank {rank}: no steady step to judge: only warm-up, dummy or idle steps were "
                f"profiled ({t['warmup_calls']} {what} there){extra}; profile steps past the "
                "start-up",
                rank=rank,
            )
            continue
        if t["step_share"] < p.min_step_share or t["cost_share"] < p.min_share:
            ctx.note(
                f"rank {rank}: {t['calls']} {what} in {t['steps_with']} of {t['steady_steps']} "
                f"steady steps, {t['cost_share']:.1%} of their time (thresholds "
                f"{p.min_step_share:.0%} of steps, {p.min_share:.1%}); {t['warmup_calls']} in "
                f"warm-up steps{extra}",
                rank=rank,
                cost_share=t["cost_share"],
            )
            continue
        mine = placed.filter((pl.col("rank") == rank) & pl.col("steady"))
        yield SteadyUse(
            rank, t, call_sites(ctx, mine), per_step.filter(pl.col("rank") == rank),
            windows.get(rank),
        )  # fmt: skip


def steady_key_figures(
    ctx: RuleContext, calls: pl.DataFrame, calls_name: str, time_name: str
) -> pl.DataFrame:
    """Per rank: ``calls_name`` (calls per steady step) and ``time_name`` (ns per steady step)."""
    steps = step_windows(ctx)
    _, per_rank = steady_state_usage(steps, in_steps(calls, steps))
    n = pl.col("steady_steps")
    return per_rank.filter(n > 0).select(
        "rank", (pl.col("calls") / n).alias(calls_name), (pl.col("cost_ns") / n).alias(time_name)
    )
