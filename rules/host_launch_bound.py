"""TA004 host-launch-bound: a compute stream idles because the host had not yet launched its next task."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    ALLOC_APIS,
    CANN_PROCESS,
    COMPILE_CALLS,
    COMPUTE_TASK_TYPES,
    DEQUEUE_PREFIX,
    DISPATCH_LATENCY_US,
    FREE_APIS,
    GRAPH_REPLAY_APIS,
    HARDWARE_PROCESS,
    NS,
    PAUSE_MS,
    PHASES,
    PROFILER_MARKER_TASKS,
    SHARE,
    STEADY_PHASES,
    SYNC_APIS,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
    Cost,
    Evidence,
    FigureContext,
    Finding,
    GapSettings,
    KeyFigure,
    Mark,
    NotEvaluated,
    Param,
    RuleContext,
    analysed_window_ns,
    cann_calls,
    capture_windows,
    device_tasks,
    host_api,
    launched_tasks,
    phase_at,
    phase_windows,
    phases_in,
    rule,
    stream_gaps_of,
    text,
)

WORST_SHOWN = 5  # evidence: the longest host-bound gaps of a stream
SERIES_POINTS = 4000  # figure: at most this many gaps per stream (the longest are kept)
NO_LINKS = (
    "no device task on a compute stream is linked to its host launch (no connection_id, "
    "HostToDevice flow or graph replay; collect with profiler_level=Level1)"
)


@rule(
    id="TA004",
    name="host-launch-bound",
    severity="warning",
    escalates_to="error",
    escalation="when host-bound idle reaches `error_share` of the stream's span",
    summary="A compute stream sits idle between tasks because the host had not launched the next one yet.",
    params={
        "min_share": Param(
            0.3,
            "Fire when host-bound idle covers at least this share of the stream's span "
            "(vllm-ascend #11967: the healthy rank idled 19%, the host-bound one 57%).",
        ),
        "error_share": Param(0.6, "Report as error from this share on."),
        "min_gap_us": Param(
            DISPATCH_LATENCY_US,
            "Ignore shorter gaps: the device's own dispatch latency between queued tasks (µs).",
        ),
        "max_gap_ms": Param(
            PAUSE_MS,
            "Longer gaps are pauses (no work queued: between requests, data loading), not slow "
            "dispatch; they count neither as host-bound nor in the stream's span (ms).",
        ),
        "min_linked": Param(
            0.5,
            "Judge a stream only when at least this fraction of its tasks is linked to a launch.",
        ),
        "compute_task_types": Param(
            COMPUTE_TASK_TYPES, "Task types of kernels: a stream with any is a compute stream."
        ),
        "wait_task_types": Param(WAIT_TASK_TYPES, "Task types of cross-stream waits."),
        "wait_names": Param(
            WAIT_TASK_NAMES,
            "Names of wait tasks; on the communication plane they occupy the stream they name.",
        ),
        "marker_tasks": Param(
            PROFILER_MARKER_TASKS, "Task names the profiler adds (not part of the workload)."
        ),
        "sync_apis": Param(
            SYNC_APIS,
            "Host calls that wait for the device: a gap that opens while the host waits in one "
            "is the synchronisation's cost (sync-in-step), not a slow launch.",
        ),
        "other_cause_apis": Param(
            (*COMPILE_CALLS, *ALLOC_APIS, *FREE_APIS),
            "Host calls whose time inside a gap is another rule's cost (online-compile, "
            "alloc-churn), not slow dispatch.",
        ),
        "replay_apis": Param(
            GRAPH_REPLAY_APIS, "Host calls that replay a captured graph (one launch per graph)."
        ),
        "judged_phases": Param(
            ("prefill", "decode", "mixed", "spec_decode"),
            "Serving phases judged on their own (the steps table's): a stream host-bound in "
            "one of them fires even when the others hide it in the stream's whole span.",
        ),
        "min_phase_steps": Param(3, "Judge a phase on its own only over this many steps."),
    },
    requires=[
        device_tasks(),
        host_api("Node@launch", "aclnn*", "aclmdlRIExecuteAsync", what="CANN launch calls"),
    ],
    uses=[capture_windows],
    units={
        "stream_share": SHARE,
        "idle_ns": NS,
        "after_sync_ns": NS,
        "other_cause_ns": NS,
        "span_ns": NS,
        "pause_ns": NS,
        "linked_fraction": SHARE,
        "phase_cost_share": SHARE,
        **{f"phase_share_{phase}": SHARE for phase in PHASES},
    },
)
def host_launch_bound(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Idle gaps on a compute stream (a stream that runs kernels) where the device had nothing
    queued: the next task's host launch (`Node@launch` under an `aclnn*` call,
    `aclmdlRIExecuteAsync` for a graph replay, any call linked by `connection_id` or a
    HostToDevice flow) ended only *after* the previous task had finished. The part of such a
    gap in which nothing else ran on the device (no other stream's task, no collective) is
    host-bound idle time: the overview's "idle: waiting on the host", one derivation
    (`compute_stream_gaps`). It fires per rank and stream when that time reaches `min_share` of the
    stream's span (its first to last task in each session), and reports the worst gaps
    with the host calls that launched late, and whether the steps ran as graph replays.

    Gaps are not host-bound when the launch was already done when the stream went idle (the
    device waited for something else), and the time a stream spends in `EVENT_WAIT` /
    `Notify Wait` tasks is a device-side dependency, never a gap. A gap during which the host
    waits in a synchronisation (`aclrtSynchronizeStream`, a blocking `aclrtMemcpy`, ...) is
    that synchronisation's cost (`sync-in-step` reports it), a gap that overlaps a graph capture
    (`aclmdlRICaptureBegin` ... `End`) is start-up, and host time spent compiling or
    allocating inside a gap is left to `online-compile` and `alloc-churn`.

    ## Why it matters
    The NPU runs only what the host has queued. When the host takes longer to dispatch an op
    than the device takes to run it (small decode batches, Python per op, a slow or busy CPU),
    the device waits between kernels and throughput follows the host, not the NPU: in
    vllm-ascend #9404 decode without graphs left the device idle 591 µs of every 832 µs layer.

    ## How to fix
    - Decode without graph replays: run it as aclgraph (vLLM
      `--compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}'`, or `PIECEWISE`): one
      `aclmdlRIExecuteAsync` queues the whole step.
    - With graph replays already: the idle falls between replays, in per-step host work;
      cut it (async scheduling, less Python per step).
    - `TASK_QUEUE_ENABLE=1` (or `2`; not `2` together with graph mode in inference) so a
      second thread launches while Python runs on.
    - Bind the host threads to cores (`CPU_AFFINITY_CONF=1` or `2`, IRQ binding) and keep other
      load off those cores.
    The finding's fix says which of these the trace calls for.

    ## Example
    ```
    TA004 host-launch-bound [error] rank 0
    Stream 2 starves for host launches: 82% of the 5.4 ms window idle with nothing queued
    (107 gaps; eager decode, no graph replays)
    ```
    Silent when launches run ahead of the device (gaps exist but the next task was queued),
    when the gaps are filled by `EVENT_WAIT`/`Notify Wait` tasks, and below `min_share`.

    ## References
    - vllm-ascend #9404 (decode without graphs: 591 µs free of 832 µs per layer), #11967
      (host-bound ranks: free 57% vs 19%); verl PR #6562 (`TASK_QUEUE_ENABLE=2` with graph mode).
    - Kunpeng / Atlas 800I tuning guide: `CPU_AFFINITY_CONF`.
    - torch_npu export format: HostToDevice flows and `connection_id` link `Node@launch` to the
      task it launched; captured-graph tasks carry a model id.
    """
    p = ctx.params
    judged = ctx.once(_judged_streams)
    per_stream = judged.per_stream
    if per_stream.is_empty():
        raise NotEvaluated(NO_LINKS)
    start_up = _start_up_only(ctx)
    for row in per_stream.iter_rows(named=True):
        rank, stream = int(row["rank"]), int(row["stream"])
        where = f"rank {rank} stream {stream}"
        if rank in start_up:
            ctx.inconclusive(
                f"{where}: every profiled step is warm-up, dummy or idle ({start_up[rank]}): "
                "host-bound idle there is start-up, not the served workload's; profile steps "
                "past the start-up",
                rank=rank,
            )
            continue
        if row["linked_fraction"] < p.min_linked:
            ctx.note(
                f"{where}: only {row['linked_fraction']:.0%} of its tasks are linked to a host "
                f"launch (min_linked {p.min_linked:.0%}); not judged",
                rank=rank,
                linked_fraction=row["linked_fraction"],
            )
            continue
        share = row["stream_share"]
        phases = judged.phases.filter((pl.col("rank") == rank) & (pl.col("stream") == stream))
        hot = phases.filter(pl.col("share") >= p.min_share)
        if share < p.min_share and hot.is_empty():
            ctx.note(
                f"{where}: host-bound idle {text.duration(row['cost_ns'])} is {share:.0%} of its "
                f"{text.duration(row['span_ns'])} span (threshold {p.min_share:.0%})"
                + (f"; {_phase_text(phases)}" if phases.height else "")
                + (
                    f"; {text.duration(row['after_sync_ns'])} more followed host "
                    "synchronisations (the overview's idle sync; sync-in-step judges those)"
                    if row["after_sync_ns"]
                    else ""
                ),
                rank=rank,
                stream_share=share,
            )
            continue
        fix = _fix_text(judged.replays.get(rank, 0), judged.task_queue.get(rank, False))
        yield _finding(ctx, row, judged, fix, phases)


@dataclass(frozen=True)
class _Judged:
    """Every gap of every judged compute stream, classified; the per-stream totals; and per
    rank, how many graph replays its host issued and whether a task-queue thread launched."""

    gaps: pl.DataFrame
    per_stream: pl.DataFrame
    replays: dict[int, int]
    task_queue: dict[int, bool]
    # per rank, stream and judged phase: cost_ns, time_ns (the stream's time in the phase's
    # steps, less pauses), steps, share
    phases: pl.DataFrame


def _judged_streams(ctx: RuleContext) -> _Judged:
    p = ctx.params
    slices = ctx.table("slices")
    keys = ["rank", "session"]
    settings = GapSettings(
        min_gap_us=p.min_gap_us, max_gap_ms=p.max_gap_ms,
        compute_task_types=tuple(p.compute_task_types), wait_task_types=tuple(p.wait_task_types),
        wait_names=tuple(p.wait_names), marker_tasks=tuple(p.marker_tasks),
        sync_apis=tuple(p.sync_apis), other_cause_apis=tuple(p.other_cause_apis),
    )  # fmt: skip
    # the overview's idle host and idle sync are these gaps' cost, at the default parameters:
    # one derivation for both
    found = stream_gaps_of(
        ctx.store,
        ctx.scope_ranks(),
        settings,
        lambda: (slices, launched_tasks(ctx, p.replay_apis), cann_calls(ctx),
                 capture_windows(ctx), None),
        (tuple(p.replay_apis), p.capture_begin, p.capture_end),
    )  # fmt: skip
    tasks, gaps = found.tasks, found.gaps
    window_ns = analysed_window_ns(ctx)
    # The stream's own span (first task to last) is the time it could have been working.
    linked = tasks.group_by(*keys, "stream").agg(
        pl.col("link").is_not_null().mean().alias("linked_fraction"),
        pl.len().alias("tasks"),
        (pl.col("end_ns").max() - pl.col("start_ns").min()).alias("span_ns"),
    )
    per_session = linked.join(
        gaps.group_by(*keys, "stream").agg(
            pl.col("cost_ns").filter(pl.col("host_bound")).sum().alias("cost_ns"),
            pl.col("other_ns").filter(pl.col("host_bound")).sum().alias("other_ns"),
            pl.col("host_bound").sum().alias("host_bound_gaps"),
            pl.col("cost_ns").filter(pl.col("after_sync")).sum().alias("after_sync_ns"),
            pl.col("gap_ns").filter(pl.col("pause")).sum().alias("pause_ns"),
            pl.col("gap_ns").sum().alias("idle_ns"),
        ),
        on=[*keys, "stream"],
        how="left",
    )
    per_stream = (
        per_session.group_by("rank", "stream")
        .agg(
            pl.col("session").unique().sort(),
            (pl.col("linked_fraction") * pl.col("tasks")).sum() / pl.col("tasks").sum(),
            pl.col("tasks").sum(),
            *(
                pl.col(c).fill_null(0).sum()
                for c in (
                    "cost_ns",
                    "other_ns",
                    "host_bound_gaps",
                    "after_sync_ns",
                    "pause_ns",
                    "idle_ns",
                    "span_ns",
                )
            ),
        )
        .with_columns(pl.col("span_ns") - pl.col("pause_ns"))
        .with_columns(
            (pl.col("cost_ns") / pl.col("span_ns").clip(lower_bound=1)).alias("stream_share"),
            pl.col("rank")
            .replace_strict(window_ns, default=None, return_dtype=pl.Int64)
            .alias("window_ns"),
        )
        .with_columns(
            (pl.col("cost_ns") / pl.col("window_ns")).clip(upper_bound=1.0).alias("cost_share")
        )
        .sort("rank", "stream")
    )
    replays = slices.filter(pl.col("api_name").is_in(p.replay_apis)).group_by("rank").len()
    queue = slices.filter(pl.col("name").str.starts_with(DEQUEUE_PREFIX)).group_by("rank").len()
    return _Judged(
        gaps,
        per_stream,
        dict(replays.collect().iter_rows()),
        {rank: n > 0 for rank, n in queue.collect().iter_rows()},
        _per_phase(ctx, gaps, tasks),
    )


def _start_up_only(ctx: RuleContext) -> dict[int, str]:
    """The ranks whose steps are all warm-up, dummy or idle, with how many of each."""
    steps = phase_windows(ctx)
    out = {}
    for (rank,), part in steps.group_by("rank"):
        if not part.is_empty() and not part["phase"].is_in(list(STEADY_PHASES)).any():
            counts = part["phase"].value_counts(sort=True).iter_rows()
            out[int(rank)] = ", ".join(f"{n} {ph}" for ph, n in counts)  # type: ignore[arg-type]
    return out


def _per_phase(ctx: RuleContext, gaps: pl.DataFrame, tasks: pl.DataFrame) -> pl.DataFrame:
    """Host-bound idle per serving phase: a decode of small graph replays can wait on the host
    for half its time while long prefills keep the stream's whole span busy. The phase's time
    on a stream is its steps' time inside the stream's span (first task to last), less the
    pauses in them; a gap is in the phase of the step it opens in."""
    p = ctx.params
    empty = pl.DataFrame(
        schema={"rank": pl.Int32, "stream": pl.Int64, "phase": pl.String, "cost_ns": pl.Int64,
                "time_ns": pl.Int64, "steps": pl.UInt32, "share": pl.Float64}
    )  # fmt: skip
    steps = phase_windows(ctx).filter(pl.col("phase").is_in(list(p.judged_phases)))
    if steps.is_empty() or gaps.is_empty():
        return empty
    keys = ["rank", "session"]
    spans = tasks.group_by(*keys, "stream").agg(
        pl.col("start_ns").min().alias("_s0"), pl.col("end_ns").max().alias("_s1")
    )
    inside = (
        spans.join(steps, on=keys)
        .with_columns(
            (pl.min_horizontal("end_ns", "_s1") - pl.max_horizontal("start_ns", "_s0"))
            .clip(lower_bound=0)
            .alias("time_ns")
        )
        .filter(pl.col("time_ns") > 0)
        .group_by("rank", "stream", "phase")
        .agg(pl.col("time_ns").sum(), pl.len().alias("steps"))
    )
    placed = phase_at(
        ctx, gaps.select(*keys, "stream", "prev_end_ns", "gap_ns", "cost_ns", "host_bound", "pause"),
        at="prev_end_ns",
    ).filter(pl.col("phase").is_not_null())  # fmt: skip
    cost = placed.group_by("rank", "stream", "phase").agg(
        pl.col("cost_ns").filter(pl.col("host_bound")).sum(),
        pl.col("gap_ns").filter(pl.col("pause")).sum().alias("_pause"),
    )
    return (
        inside.join(cost, on=["rank", "stream", "phase"], how="left")
        .with_columns(
            pl.col("cost_ns").fill_null(0),
            (pl.col("time_ns") - pl.col("_pause").fill_null(0)).alias("time_ns"),
        )
        .filter((pl.col("steps") >= p.min_phase_steps) & (pl.col("time_ns") > 0))
        .with_columns((pl.col("cost_ns") / pl.col("time_ns")).alias("share"))
        .select(empty.columns)
        .sort("rank", "stream", "time_ns", descending=[False, False, True])
    )


def _phase_text(phases: pl.DataFrame) -> str:
    """``decode 41% of 20 ms, prefill 3% of 80 ms``: host-bound share of each phase's time."""
    return ", ".join(
        f"{r['phase']} {r['share']:.0%} of {text.duration(r['time_ns'])}"
        for r in phases.iter_rows(named=True)
    )


def _fix_text(replays: int, task_queue: bool) -> str:
    """The fix that fits the trace: graph replays or not, task queue or not."""
    if replays:
        first = (
            f"The steps already run as graph replays ({replays} `aclmdlRIExecuteAsync`): the idle "
            "falls between replays, in host work per step. Cut it (vLLM async scheduling, less "
            "Python per step)."
        )
    else:
        first = (
            "Decode runs eagerly (no `aclmdlRIExecuteAsync` graph replay in the trace): enable "
            'aclgraph, e.g. vLLM `--compilation-config \'{"cudagraph_mode": '
            '"FULL_DECODE_ONLY"}\'` (or `PIECEWISE`), so one call queues the whole step.'
        )
    queue = (
        " Launches run on a task-queue thread already (`Dequeue@` events)"
        + (
            "; keep `TASK_QUEUE_ENABLE` at 1 with graph mode (2 conflicts with it)."
            if replays
            else "."
        )
        if task_queue
        else " Launches run on the Python thread (no `Dequeue@` events): set `TASK_QUEUE_ENABLE=1`."
    )
    return (
        first
        + queue
        + " Bind the host threads to cores (`CPU_AFFINITY_CONF=1` or `2`) and keep other load off them."
    )


def _finding(
    ctx: RuleContext, row: dict[str, Any], judged: _Judged, fix: str, phases: pl.DataFrame
) -> Finding:
    p = ctx.params
    rank, stream = int(row["rank"]), int(row["stream"])
    gaps = judged.gaps.filter((pl.col("rank") == rank) & (pl.col("stream") == stream))
    bound = gaps.filter(pl.col("host_bound"))
    worst = bound.sort("gap_ns", descending=True).head(WORST_SHOWN)
    replays = judged.replays.get(rank, 0)
    mode = f"{replays} graph replays" if replays else "eager decode, no graph replays"
    share = row["stream_share"]
    hot = phases.filter(pl.col("share") >= p.min_share)
    others = phases.filter(pl.col("share") < p.min_share)
    if hot.height:  # judged per phase: say which, and that the others are not
        worst_share = float(hot["share"].max())  # type: ignore[arg-type]
        title = (
            f"Stream {stream} starves for host launches in {text.join(hot['phase'].to_list())}: "
            + ", ".join(
                f"{r['share']:.0%} of its {r['phase']} time" for r in hot.iter_rows(named=True)
            )
            + " idle with nothing queued"
            + (f"; {_phase_text(others)}" if others.height else "")
            + f" ({row['host_bound_gaps']} gaps; {mode})"
        )
    else:
        worst_share = share
        title = (
            f"Stream {stream} starves for host launches: {share:.0%} of its "
            f"{text.duration(row['span_ns'])} span idle with nothing queued "
            f"({row['host_bound_gaps']} gaps; {mode})"
        )
    top = worst.row(0, named=True) if worst.height else None
    message = (
        f"On rank {rank}, stream {stream} ran {row['tasks']} tasks; "
        f"{row['host_bound_gaps']} idle gaps ({text.duration(row['cost_ns'])}) opened before a task "
        "whose host launch ended only after the previous task had finished, so nothing was queued."
        + (
            f" The longest: {text.duration(top['gap_ns'])} before `{top['name']}`, launched by "
            f"`{top['launch_op']}` {text.duration(top['late_ns'])} after the stream went idle."
            if top
            else ""
        )
        + (
            f" Another {text.duration(row['after_sync_ns'])} of idle followed host "
            "synchronisations (see sync-in-step)."
            if row["after_sync_ns"]
            else ""
        )
        + (
            f" {text.duration(row['other_ns'])} more, spent compiling or allocating inside "
            "these gaps, is left to online-compile and alloc-churn."
            if row["other_ns"]
            else ""
        )
        + (
            f" Per phase, host-bound idle is {_phase_text(phases)} of its time on the stream."
            if phases.height
            else ""
        )
    )
    hot_cost, hot_time = int(hot["cost_ns"].sum()), int(hot["time_ns"].sum())
    evidence = []
    for g in worst.iter_rows(named=True):
        evidence.append(
            Evidence(
                rank=rank,
                session=g["session"],
                name=f"idle before {g['name']}",
                process=HARDWARE_PROCESS,
                thread=f"Stream {stream}",
                stream=stream,
                start_ns=g["prev_end_ns"],
                dur_ns=g["gap_ns"],
                detail=f"after {g['prev_name']}; launch {g['launch_op']} ended "
                f"{text.duration(g['late_ns'])} after the stream went idle",
            )
        )
        evidence.append(
            Evidence(
                rank=rank,
                session=g["session"],
                name=g["launch_op"],
                process=CANN_PROCESS,
                thread=g["launch_thread"],
                start_ns=g["launch_start_ns"],
                dur_ns=g["launch_end_ns"] - g["launch_start_ns"],
                detail=f"late launch of {g['name']} ({g['launch_name']})",
            )
        )
    shown = gaps.sort("gap_ns", descending=True).head(SERIES_POINTS).sort("start_ns")
    origin = int(gaps["prev_end_ns"].min()) if gaps.height else 0
    return ctx.finding(
        rank=rank,
        sessions=row["session"],
        title=title,
        message=message,
        location={"stream": stream},
        cost=Cost(
            int(row["cost_ns"]),
            None if row["cost_share"] is None else round(row["cost_share"], 4),
        ),
        metrics={
            "stream_share": round(share, 4),
            "host_bound_gaps": int(row["host_bound_gaps"]),
            "idle_ns": int(row["idle_ns"]),
            "after_sync_ns": int(row["after_sync_ns"]),
            "other_cause_ns": int(row["other_ns"]),
            "span_ns": int(row["span_ns"]),
            "pause_ns": int(row["pause_ns"]),
            "linked_fraction": round(row["linked_fraction"], 4),
            "graph_replays": replays,
            # the cost against the time of the phases it concerns (the cost's share: the whole)
            "phase_cost_share": round(hot_cost / hot_time, 4) if hot_time else None,
            **{
                f"phase_share_{r['phase']}": round(r["share"], 4)
                for r in phases.iter_rows(named=True)
            },
        },
        evidence=evidence,
        fix=fix,
        severity="error" if worst_share >= p.error_share else None,
        phases=phases_in(hot),
        series={
            "gap_start_ms": [(v - origin) / 1e6 for v in shown["prev_end_ns"]],
            "gap_us": [v / 1e3 for v in shown["gap_ns"]],
            "host_bound": [int(v) for v in shown["host_bound"]],
        },
        score=float(row["cost_ns"]),
    )


@host_launch_bound.figure(
    caption="Idle gaps on the compute stream over time; host-bound ones (nothing queued) in red."
)
def _figure(fig: FigureContext) -> Any:
    figure, (ax,) = fig.new(7.5, 2.6)
    drawn = False
    for ranks, series in fig.series_by_rank()[:1]:
        starts, gaps, bound = (
            series.get(k) or [] for k in ("gap_start_ms", "gap_us", "host_bound")
        )
        for flag, colour, label in ((0, "#9ca3af", "queued / other"), (1, "#dc2626", "host-bound")):
            xs = [x for x, b in zip(starts, bound, strict=True) if b == flag]
            ys = [y for y, b in zip(gaps, bound, strict=True) if b == flag]
            if xs:
                ax.vlines(xs, 0, ys, colors=colour, linewidth=1.0, label=label)
                drawn = True
        stream = (fig.finding.get("location") or {}).get("stream")
        ax.set_title(f"rank {', '.join(map(str, ranks))}, stream {stream}: idle gaps", fontsize=9)
    if not drawn:
        return None
    ax.set_xlabel("time since first gap (ms)", fontsize=8)
    ax.set_ylabel("gap (µs)", fontsize=8)
    ax.legend(fontsize=7, frameon=False)
    return figure


@host_launch_bound.key_figures(
    KeyFigure("host_bound_idle_ns", "host-bound idle (worst compute stream)", "lower", "ns"),
    KeyFigure(
        "host_bound_share", "host-bound share of the stream's span (worst)", "lower", "ratio"
    ),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    per_stream = ctx.once(_judged_streams).per_stream
    return (
        per_stream.sort("cost_ns", descending=True)
        .group_by("rank", maintain_order=True)
        .first()
        .select(
            "rank",
            pl.col("cost_ns").alias("host_bound_idle_ns"),
            pl.col("stream_share").alias("host_bound_share"),
        )
    )


@host_launch_bound.marks
def _marks(finding: Mapping[str, Any]) -> Iterable[Mark]:
    for e in finding.get("evidence") or []:
        if e.get("start_ns") is None:
            continue
        gap = e.get("process") == HARDWARE_PROCESS
        yield Mark(
            rank=int(e["rank"]),
            session=str(e.get("session") or ""),
            name=(
                f"host-bound gap {text.duration(e['dur_ns'])}"
                if gap
                else f"late launch {e['name']}"
            ),
            start_ns=int(e["start_ns"]),
            dur_ns=e.get("dur_ns"),
            track=None if gap else "late host launches",
            args={"stream": e.get("stream"), "detail": e.get("detail")},
        )
