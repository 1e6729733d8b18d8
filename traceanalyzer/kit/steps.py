"""Steps, steady state and host call sites: shared by the rules that judge host calls per step.

A step is a host span matching ``step_pattern`` (``ProfilerStep#N``, one per ``prof.step()``).
Steps numbered up to ``warmup_steps`` are warm-up (the first iterations allocate, compile and
cache), and so is a step that captures a graph (``aclmdlRICaptureBegin`` ... ``End``: vLLM's
start-up, where the device idles while the host records); the others are the steady state. A call belongs to the step it starts in. Its call
site is the torch op around it on the same OS thread: the outermost one under the step (what
the model code called, e.g. ``aten::item``) and the innermost (``aten::_local_scalar_dense``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from traceanalyzer.engine.findings import Evidence
from traceanalyzer.engine.params import Param
from traceanalyzer.engine.presentation import FigureContext
from traceanalyzer.engine.rule import NotEvaluated, RuleContext
from traceanalyzer.kit.cost import analysed_window_ns, share
from traceanalyzer.kit.primitives import (
    containing_call,
    outermost,
    overlap_join,
    pair_windows,
)
from traceanalyzer.vocabulary import CANN_PROCESS, NOT_HOST_PROCESSES, PYTHON_PROCESS

if TYPE_CHECKING:
    from traceanalyzer.chart import Chart

STEP_PARAMS = {
    "step_pattern": Param(
        r"^ProfilerStep#(\d+)$",
        "Regex on host span names that mark steps; group 1, when present, is the step number.",
    ),
    "warmup_steps": Param(
        1, "Steps numbered up to this are warm-up, not steady state (ProfilerStep#1 ...)."
    ),
}
CAPTURE_PARAMS = {
    "capture_begin": Param(
        r"^aclmdl(RI)?CaptureBegin$", "Regex on the CANN api_name that opens a graph capture."
    ),
    "capture_end": Param(
        r"^aclmdl(RI)?CaptureEnd$", "Regex on the CANN api_name that closes a graph capture."
    ),
}
STEP_PARAMS = {**STEP_PARAMS, **CAPTURE_PARAMS}
NO_STEPS = (
    "no step windows (`ProfilerStep#N` spans; profile with a schedule and call prof.step() "
    "every iteration, or set step_pattern)"
)
SITE_CATEGORIES = ("cpu_op", "dequeue")  # torch ops, and the task queue running them
DEQUEUE_PREFIX = "Dequeue@"
STEP_SCHEMA = {
    "rank": pl.Int32,
    "session": pl.String,
    "step": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}


def step_windows(ctx: RuleContext) -> pl.DataFrame:
    """Steps per rank and session: ``step``, ``start_ns``, ``end_ns``, ``dur_ns``, ``steady``
    (derived once per rank shard for every rule with the same step parameters)."""
    return ctx.shared(_step_windows, tuple(STEP_PARAMS))


def _step_windows(ctx: RuleContext) -> pl.DataFrame:
    p = ctx.params
    spans = (
        ctx.table("slices")
        .filter(
            ~pl.col("process").is_in(NOT_HOST_PROCESSES)
            & pl.col("name").str.contains(p.step_pattern)
        )
        .select(
            "rank",
            "session",
            pl.col("name")
            .str.extract(p.step_pattern, 1)
            .cast(pl.Int64, strict=False)
            .alias("step"),
            "start_ns",
            "end_ns",
        )
        .collect()
        .cast(STEP_SCHEMA)
    )
    steps = outermost(spans).sort("rank", "session", "start_ns")
    # A pattern without a number (an `execute_model` span): number the steps from 1 per session.
    ordinal = pl.int_range(1, pl.len() + 1).over("rank", "session")
    steps = steps.with_columns(
        pl.col("step").fill_null(ordinal),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
    ).with_row_index("_step")
    captures = capture_windows(ctx)
    capturing = overlap_join(steps, captures, mode="overlap", suffix="_capture")["_step"]
    return steps.with_columns(
        ((pl.col("step") > p.warmup_steps) & ~pl.col("_step").is_in(capturing.implode())).alias(
            "steady"
        )
    ).drop("_step")


def capture_windows(ctx: RuleContext) -> pl.DataFrame:
    """Graph capture windows (``capture_begin`` ... ``capture_end`` per host thread)."""
    return ctx.shared(_capture_windows, tuple(CAPTURE_PARAMS))


def _capture_windows(ctx: RuleContext) -> pl.DataFrame:
    p = ctx.params
    calls = ctx.table("slices").filter(
        (pl.col("process") == CANN_PROCESS)
        & (
            pl.col("api_name").str.contains(p.capture_begin)
            | pl.col("api_name").str.contains(p.capture_end)
        )
    )
    return pair_windows(
        calls,
        is_begin=pl.col("api_name").str.contains(p.capture_begin),
        is_end=pl.col("api_name").str.contains(p.capture_end),
    ).select("rank", "session", "start_ns", "end_ns")


def host_calls(
    ctx: RuleContext, names: Sequence[str] = (), pattern: str | None = None
) -> pl.DataFrame:
    """CANN calls named in ``names`` or matching ``pattern`` (on ``api_name``)."""
    match = pl.col("api_name").is_in(list(names))
    if pattern:
        match = match | pl.col("api_name").str.contains(pattern)
    return (
        ctx.table("slices")
        .filter((pl.col("process") == CANN_PROCESS) & match)
        .select(
            "rank",
            "session",
            "process",
            "thread",
            "name",
            "api_name",
            "start_ns",
            "end_ns",
            "dur_ns",
        )
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
    ops = ctx.shared(_site_ops, ("step_pattern",))
    points = calls.with_columns(pl.col("start_ns").alias("_at"))
    inner = containing_call(points, ops, at="_at")["_op"]
    outer = containing_call(points, ops, at="_at", outer=True)["_op"]
    return calls.with_columns(site=outer, site_op=inner)


def _site_ops(ctx: RuleContext) -> pl.DataFrame:
    """The torch ops a call can run in, on the CANN threads' names (the same OS threads)."""
    return (
        ctx.table("slices")
        .filter(
            (pl.col("process") == PYTHON_PROCESS)
            & pl.col("cat").is_in(SITE_CATEGORIES)
            & ~pl.col("name").str.contains(ctx.params.step_pattern)
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

    def metrics(self) -> dict[str, Any]:
        t, n = self.totals, self.steps
        return {
            "cost_ns": int(t["cost_ns"]),
            "cost_share": share(t["cost_ns"], self.window_ns),
            "steady_share": round(t["cost_share"], 4),
            "calls": int(t["calls"]),
            "calls_per_step": round(t["calls"] / n, 3),
            "steady_steps": n,
            "steps_with": int(t["steps_with"]),
            "warmup_calls": int(t["warmup_calls"]),
        }

    def evidence(self, limit: int = 5) -> list[Evidence]:
        """The longest calls, with their step and call site."""
        return [
            Evidence(
                self.rank,
                c["session"],
                c["name"],
                CANN_PROCESS,
                c["thread"],
                None,
                c["start_ns"],
                c["dur_ns"],
                f"step {c['step']}, call site {c['site'] or 'no torch op'}",
            )  # fmt: skip
            for c in self.calls.sort("dur_ns", descending=True).head(limit).iter_rows(named=True)
        ]

    def series(self) -> dict[str, list[Any]]:
        """Per step: time in the calls (µs) and whether the step is steady (for the figure)."""
        return {
            "step": self.per_step["step"].to_list(),
            "value": [v / 1e3 for v in self.per_step["call_ns"]],
            "steady": self.per_step["steady"].to_list(),
        }


def recurring_calls(
    ctx: RuleContext, calls: pl.DataFrame, what: str, aside: Mapping[int, str] | None = None
) -> Iterator[SteadyUse]:
    """The ranks whose steady steps keep making ``calls`` (host calls of one kind).

    A rank qualifies when at least ``min_step_share`` of its steady steps have a call and the
    calls take at least ``min_share`` of their time; every other rank gets a note naming
    ``what`` was counted (plus ``aside[rank]``, e.g. what was left out). Without steps the
    rule is not evaluated.
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
            ctx.note(f"rank {rank}: only warm-up steps profiled{extra}", rank=rank)
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
