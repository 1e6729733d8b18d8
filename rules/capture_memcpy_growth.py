"""TA001 capture-memcpy-growth: host memcpy calls per aclgraph capture grow capture after capture."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.kit import (
    NOT_HOST_PROCESSES,
    NS,
    P_VALUE,
    PALETTE,
    RATIO,
    AnyOf,
    ApiLayer,
    Chart,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Mark,
    Param,
    RuleContext,
    api_statistics,
    cann_calls,
    count_in_windows,
    evidence_marks,
    host_api,
    one_api_layer,
    outermost,
    pair_windows,
    phase_at,
    phases_in,
    rule,
    series_by_rank,
    spearman,
    trend,
)
from traceanalyzer.kit import text as fmt

HOST_PROCESSES_EXCLUDED = NOT_HOST_PROCESSES
EVIDENCE_EDGE = 5  # capture windows shown at each end of the series

FIX = (
    "Work around it with `export HCCL_OP_EXPANSION_MODE=AIV` (communication ops expand on the AI "
    "Vector cores, so capture skips the AICPU resource refresh and its H2D memcpy), or fix it by "
    "upgrading to CANN >= 9.1.0, which releases the resources of earlier captures. Caveat: AIV "
    "expansion has known issues with graph task groups (vllm-ascend #13688); re-check graph "
    "capture with task groups after switching."
)


@rule(
    id="TA001",
    name="capture-memcpy-growth",
    severity="warning",
    summary="Host memcpy calls per aclgraph capture grow with every capture, so capture slows down.",
    fix=FIX,
    params={
        "memcpy_pattern": Param(
            r"^(aclrtMemcpy|aclrtMemcpy2d|MemCopySync|rtMemcpy)$",
            "Regex on the CANN api_name of *synchronous* host memcpy calls. aclrtMemcpyAsync and "
            "MemcpyAsync are not counted: they do not block the capturing host thread.",
        ),
        "layer": Param(
            "auto",
            "Which CANN layer to count: `auto` = runtime when present (Level2), else AscendCL; "
            "never both, since each aclrtMemcpy also appears as a runtime MemCopySync.",
            choices=("auto", "acl", "runtime", "all"),
        ),
        "capture_begin": Param(
            r"^aclmdl(RI)?CaptureBegin$",
            "Regex on the CANN api_name that opens a capture window: aclmdlRICaptureBegin, or "
            "aclmdlCaptureBegin in early torch_npu NPUGraph builds.",
        ),
        "capture_end": Param(
            r"^aclmdl(RI)?CaptureEnd$",
            "Regex on the CANN api_name that closes a capture window (see capture_begin).",
        ),
        "window_marker": Param(
            "",
            "Regex on host-side span names (Python/mstx ranges) that also mark capture windows, "
            "for captures made outside aclmdlRICaptureBegin/End. Empty = none.",
        ),
        "across_sessions": Param(
            True,
            "Treat all sessions of a rank as one series ordered by time (rounds 1, 45, 100 "
            "profiled into separate directories). False = one series per session.",
        ),
        "min_captures": Param(5, "Fewer captures than this is too little to call a trend."),
        "min_slope": Param(0.05, "Theil-Sen slope (calls per capture) must exceed this."),
        "alpha": Param(0.01, "Mann-Kendall one-sided p-value (upward trend) must be below this."),
        "min_ratio": Param(1.5, "Last/first count ratio (edge means) must exceed this."),
        "edge": Param(3, "Captures averaged at each end for the first/last counts and ratios."),
    },
    requires=[
        AnyOf(
            host_api(
                what="CANN API events (process `CANN` in trace_view.json)",
                collect_with="profiler_level=Level1 or Level2",
            ),
            api_statistics(collect_with="profiler_level=Level1 or Level2"),
        )
    ],
    units={
        "mann_kendall_p": P_VALUE,
        "growth_ratio": RATIO,
        "capture_time_first_ns": NS,
        "capture_time_last_ns": NS,
        "capture_time_ratio": RATIO,
    },
)
def capture_memcpy_growth(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    aclgraph (NPUGraph) captures that issue more and more synchronous host memcpy calls
    (`aclrtMemcpy`, runtime `MemCopySync`/`rtMemcpy`) as captures repeat, so that every capture
    takes longer than the one before. Capture windows are `AscendCL@aclmdlRICaptureBegin` ...
    `AscendCL@aclmdlRICaptureEnd` pairs on one host thread (`aclmdlCaptureBegin/End` in early
    torch_npu builds; plus optional user marker ranges);
    the memcpy calls starting inside each window are counted, and the series, ordered by time
    across all sessions of a rank, must show a robust positive Theil-Sen slope, a significant
    Mann-Kendall upward trend and a last/first ratio above a threshold. Without per-event CANN
    data it falls back to `api_statistic.csv`: memcpy calls per capture per session.

    ## Why it matters
    In vLLM FULL-graph mode every capture size is captured at start-up, and some flows re-capture
    repeatedly. With aclgraph each communication op has its own tag; capture triggers an AICPU
    resource refresh that does one host-to-device memcpy per resource on a list, and HCCL cannot
    tell when an earlier captured graph's resources may be freed. The list only grows, so capture
    N copies N times as much: model loading slows down linearly (in the aclgraph capture slowdown
    report, capture time grew steadily from round 1 to round 100).

    ## How to fix
    - Workaround: `export HCCL_OP_EXPANSION_MODE=AIV`. Communication ops expand on the AI Vector
      cores, which skips the AICPU resource refresh and its memcpy.
    - Fix: upgrade to CANN >= 9.1.0 (released 26Q2), which releases the resources.
    - Caveat: AIV expansion mode has known issues with graph task groups (vllm-ascend #13688);
      verify your graph mode after switching.

    ## Example
    ```
    TA001 capture-memcpy-growth [warning] rank 0
    aclgraph capture slows down: host memcpy calls per capture grow from 12 to 96 over 33
    captures (+2.5/capture, Mann-Kendall p=1e-9); capture time grows 3.1x
    ```
    Silent when counts are flat with noise, or when there are fewer than `min_captures`
    captures (the rule then leaves a note with the count).

    ## References
    - The aclgraph capture slowdown report: MT FSDP aclgraph capture degradation (rtMemcpy
      count grows per capture).
    - `HCCL_OP_EXPANSION_MODE` in the CANN environment variable reference.
    - vllm-ascend#13688 (AIV mode and graph task groups).
    - Mann-Kendall test: Kendall, *Rank Correlation Methods* (1975); Theil-Sen: Sen (1968).
    """
    p = ctx.params
    sessions = ctx.sessions()
    cann_ranks = set(cann_calls(ctx)["rank"].unique().to_list())
    memcpy, series = ctx.once(_counted)
    counted = memcpy.group_by("rank").agg(pl.col("api_name").unique().sort())
    counted_names = dict(zip(counted["rank"].to_list(), counted["api_name"].to_list(), strict=True))

    stats_ranks = sorted(
        set(ctx.table("api_stats").select(pl.col("rank").unique()).collect()["rank"].to_list())
        - cann_ranks
    )
    for rank in sorted(cann_ranks):
        rows = series.filter(pl.col("rank") == rank).sort("start_ns")
        groups = (
            [rows]
            if p.across_sessions
            else [g for _, g in rows.group_by("session", maintain_order=True)]
        )
        for group in groups:
            yield from _judge(ctx, rank, group, counted_names.get(rank, []), source="events")
    for rank in stats_ranks:
        points, names = _api_stats_series(ctx, rank, sessions)
        yield from _judge(ctx, rank, points, names, source="api_stats")


def _counted(ctx: RuleContext) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The memcpy calls, and the capture windows with the count of them in each
    (``memcpy_calls``): detection and key figures count them once."""
    p = ctx.params
    cann = cann_calls(ctx).lazy()
    memcpy = _memcpy_calls(cann, p.memcpy_pattern, p.layer)
    windows = _capture_windows(ctx, cann)
    return memcpy, count_in_windows(windows, memcpy, window_id="window_id", name="memcpy_calls")


def _memcpy_calls(cann: pl.LazyFrame, pattern: str, layer: ApiLayer) -> pl.DataFrame:
    calls = cann.filter(pl.col("api_name").str.contains(pattern)).select(
        "rank", "session", "api_layer", "api_name", "start_ns", "end_ns"
    )
    return one_api_layer(calls, layer).collect()


def _capture_windows(ctx: RuleContext, cann: pl.LazyFrame) -> pl.DataFrame:
    """Outermost capture windows per rank+session (CANN Begin/End pairs, plus marker ranges)."""
    p = ctx.params
    api = pl.col("api_name")
    is_begin, is_end = api.str.contains(p.capture_begin), api.str.contains(p.capture_end)
    paired = pair_windows(cann.filter(is_begin | is_end), is_begin=is_begin, is_end=is_end).select(
        "rank", "session", "thread", "start_ns", "end_ns"
    )
    marker = p.window_marker
    frames = [paired.with_columns(pl.lit("CANN").alias("process"))]
    if marker:
        marked = (
            ctx.table("slices")
            .filter(
                ~pl.col("process").is_in(HOST_PROCESSES_EXCLUDED)
                & pl.col("name").str.contains(marker)
            )
            .select("rank", "session", "thread", "start_ns", "end_ns", "process")
            .collect()
        )
        frames.append(marked.select(frames[0].columns))
    windows = pl.concat(frames, how="vertical_relaxed")
    return (
        outermost(windows)
        .sort("rank", "start_ns")
        .with_row_index("window_id")
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    )


def _api_stats_series(
    ctx: RuleContext, rank: int, sessions: pl.DataFrame
) -> tuple[pl.DataFrame, list[str]]:
    """One point per session: memcpy calls / captures, from api_statistic.csv."""
    p = ctx.params
    stats = ctx.table("api_stats").filter(pl.col("rank") == rank).collect()
    memcpy = stats.filter(pl.col("api_name").str.contains(p.memcpy_pattern))
    if p.layer in ("auto", "runtime") and (memcpy["level"] == "runtime").any():
        memcpy = memcpy.filter(pl.col("level") == "runtime")
    elif p.layer != "all":
        memcpy = memcpy.filter(pl.col("level") != "runtime")
    calls = memcpy.group_by("session").agg(pl.col("count").sum().alias("calls"))
    captures = (
        stats.filter(pl.col("api_name").str.contains(p.capture_begin))
        .group_by("session")
        .agg(pl.col("count").sum().alias("captures"))
    )
    starts = sessions.filter(pl.col("rank") == rank).select("session", "start_ns", "end_ns")
    series = (
        calls.join(captures, on="session")
        .filter(pl.col("captures") > 0)
        .join(starts, on="session", how="left")
        .sort("start_ns", nulls_last=True)
        .with_columns(
            (pl.col("calls") / pl.col("captures")).alias("memcpy_calls"),
            pl.lit(rank).alias("rank"),
            pl.lit(None, dtype=pl.String).alias("thread"),
            pl.lit(None, dtype=pl.Int64).alias("dur_ns"),
        )
    )
    return series, sorted(memcpy["api_name"].unique().to_list())


def _judge(
    ctx: RuleContext, rank: int, series: pl.DataFrame, api_names: list[str], *, source: str
) -> Iterator[Finding]:
    p = ctx.params
    point = "capture" if source == "events" else "session"
    unit = "captures" if source == "events" else "sessions (api_statistic.csv, one point each)"
    n = series.height
    if n == 0:
        ctx.note(f"rank {rank}: no aclgraph capture windows", rank=rank, captures=0)
        return
    if n < p.min_captures:
        ctx.inconclusive(
            f"only {n} {unit}; a trend needs at least {p.min_captures} (min_captures)",
            rank=rank,
            captures=n,
            min_captures=p.min_captures,
        )
        return
    counts = series["memcpy_calls"].cast(pl.Float64).to_numpy()
    t = trend(counts, edge=p.edge)
    k = max(1, min(p.edge, n // 2))
    first, last = float(counts[:k].mean()), float(counts[-k:].mean())
    verdict = (
        f"slope {t.slope:+.3g}/{point}, Mann-Kendall {fmt.p_value(t.mk.p_increasing)}, "
        f"last/first {fmt.ratio(t.ratio)}"
    )
    if not t.grows(min_slope=p.min_slope, alpha=p.alpha, min_ratio=p.min_ratio):
        ctx.note(
            f"rank {rank}: memcpy calls per capture do not grow over {n} {unit} ({verdict})",
            rank=rank,
            captures=n,
            slope=t.slope,
            mann_kendall_p=t.mk.p_increasing,
            growth_ratio=t.ratio,
        )
        return

    durations = series["dur_ns"].cast(pl.Float64).to_numpy()
    has_dur = source == "events" and np.isfinite(durations).all() and n > 1
    dur_first = float(durations[:k].mean()) if has_dur else None
    dur_last = float(durations[-k:].mean()) if has_dur else None
    dur_ratio = dur_last / dur_first if has_dur and dur_first else float("nan")
    rho, rho_p = spearman(counts, durations) if has_dur else (float("nan"), 1.0)
    session_names = series["session"].unique(maintain_order=True).to_list()

    apis = ", ".join(f"`{name}`" for name in api_names) or "host memcpy"
    title = (
        f"aclgraph capture slows down: host memcpy calls per capture grow from "
        f"{fmt.number(t.first)} to {fmt.number(t.last)} over {n} {unit.split(' ')[0]} "
        f"({t.slope:+.2g}/{point}, Mann-Kendall {fmt.p_value(t.mk.p_increasing)})"
    )
    if has_dur:
        title += f"; capture time grows {fmt.ratio(dur_ratio)}"
    lines = [
        f"Rank {rank} ({len(session_names)} session{'s' if len(session_names) != 1 else ''}): "
        f"{apis} calls inside each aclgraph capture "
        f"window go from {fmt.number(t.first)} (first capture) to {fmt.number(t.last)} (last) "
        f"over {n} {unit}, in time order.",
        f"Trend: Theil-Sen slope {t.slope:+.3g} calls/{point}; Mann-Kendall tau {t.mk.tau:.2f}, "
        f"one-sided {fmt.p_value(t.mk.p_increasing)}; mean of the last {k} / first {k}: "
        f"{fmt.ratio(t.ratio)}.",
    ]
    if has_dur:
        lines.append(
            f"Capture time grows {fmt.ratio(dur_ratio)} ({fmt.duration(dur_first)} -> "
            f"{fmt.duration(dur_last)}, means of {k}); Spearman rho(memcpy calls, capture time) "
            f"= {rho:.2f} ({fmt.p_value(rho_p)})."
        )
    lines.append(
        "Each capture re-copies the resources of all earlier captures: the HCCL/AICPU resource "
        "list is never released, so the copies per capture keep growing."
    )
    numbered = series.with_row_index("capture")
    shown = (
        numbered
        if n <= 2 * EVIDENCE_EDGE
        else pl.concat([numbered.head(EVIDENCE_EDGE), numbered.tail(EVIDENCE_EDGE)])
    )
    evidence = [
        Evidence(
            rank=rank,
            session=row["session"],
            name=f"capture #{row['capture']}"
            if source == "events"
            else "session (api_statistic.csv)",
            process=row.get("process") or ("CANN" if source == "events" else None),
            thread=row.get("thread"),
            start_ns=row.get("start_ns"),
            dur_ns=row.get("dur_ns") if source == "events" else _session_len(row),
            detail=f"{fmt.number(round(row['memcpy_calls'], 1))} host memcpy calls",
        )
        for row in shown.iter_rows(named=True)
    ]
    yield ctx.finding(
        rank=rank,
        sessions=session_names,
        title=title,
        message="\n".join(lines),
        location={"series": "host memcpy calls per aclgraph capture", "source": source},
        # captures run at start-up: the warm-up steps, where the steps table has any
        phases=phases_in(phase_at(ctx, series.filter(pl.col("start_ns").is_not_null())))
        if source == "events"
        else [],
        metrics={
            "captures": n,
            "first_count": t.first,
            "last_count": t.last,
            "first_mean": first,
            "last_mean": last,
            "slope_per_capture": t.slope,
            "mann_kendall_tau": t.mk.tau,
            "mann_kendall_p": t.mk.p_increasing,
            "growth_ratio": t.ratio,
            "capture_time_first_ns": dur_first,
            "capture_time_last_ns": dur_last,
            "capture_time_ratio": dur_ratio,
            "spearman_count_vs_time": rho,
        },
        evidence=evidence,
        series={
            "capture_index": list(range(n)),
            "session": series["session"].to_list(),
            "start_ns": series["start_ns"].to_list(),
            "memcpy_calls": counts.tolist(),
            "capture_ns": series["dur_ns"].to_list(),
        },
        score=t.slope * n,
    )


def _session_len(row: dict) -> int | None:
    start, end = row.get("start_ns"), row.get("end_ns")
    return end - start if start is not None and end is not None else None


# --------------------------------------------------------------------------------------------
# Presentation: memcpy calls and capture time per capture and rank; key figures; capture marks
# --------------------------------------------------------------------------------------------

MAX_RANK_LINES = 12  # more lines than this is unreadable; the rest are drawn thin and grey


@capture_memcpy_growth.figure(
    caption="Host memcpy calls and capture duration per aclgraph capture, in time order, per rank."
)
def _figure(fig: FigureContext) -> Chart | None:
    series = [(ranks, s) for ranks, s in fig.series_by_rank() if s.get("memcpy_calls")]
    if not series:
        return None
    figure, (left, right) = fig.new(9.0, 3.1, cols=2)
    per_session = fig.finding.get("location", {}).get("source") == "api_stats"
    has_time = False
    for i, (ranks, s) in enumerate(series):
        bold = i < MAX_RANK_LINES
        style = {
            "color": PALETTE[i % len(PALETTE)] if bold else "#9ca3af",
            "linewidth": 1.6 if bold else 0.6,
            "marker": "o" if bold else None,
            "markersize": 3,
            "label": "rank " + ", ".join(map(str, ranks)) if bold else None,
        }
        x = s.get("capture_index") or list(range(len(s["memcpy_calls"])))
        left.plot(x, s["memcpy_calls"], **style)
        times = s.get("capture_ns") or []
        points = [(xi, t / 1e6) for xi, t in zip(x, times, strict=False) if t is not None]
        if points:
            has_time = True
            right.plot([p[0] for p in points], [p[1] for p in points], **style)
    unit = "session" if per_session else "capture"
    left.set_title(f"host memcpy calls per {unit}", fontsize=10)
    left.set_xlabel(f"{unit} index (time order)", fontsize=9)
    left.set_ylabel("calls", fontsize=9)
    left.set_ylim(bottom=0)
    right.set_title("capture duration", fontsize=10)
    right.set_xlabel("capture index (time order)", fontsize=9)
    right.set_ylabel("ms", fontsize=9)
    if has_time:
        right.set_ylim(bottom=0)
    else:
        right.text(0.5, 0.5, "no per-capture times\n(api_statistic.csv only)", ha="center",
                   va="center", transform=right.transAxes, color="#6b7280", fontsize=9)  # fmt: skip
    if len(series) > 1:
        left.legend(fontsize=8, frameon=False)
    return figure


@capture_memcpy_growth.key_figures(
    KeyFigure("captures", "aclgraph captures", unit="count"),
    KeyFigure("capture_ns_mean", "capture time (mean per capture)", better="lower", unit="ns"),
    KeyFigure("memcpy_per_capture", "host memcpy per capture (mean)", better="lower", unit="count"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Capture windows per rank, their mean duration and mean memcpy calls, counted exactly as
    the rule counts them (CANN events; null on ranks without capture windows)."""
    _, counted = ctx.once(_counted)
    return counted.group_by("rank").agg(
        pl.len().alias("captures"),
        pl.col("dur_ns").mean().alias("capture_ns_mean"),
        pl.col("memcpy_calls").mean().alias("memcpy_per_capture"),
    )


@capture_memcpy_growth.marks
def _marks(finding: Mapping[str, Any]) -> Iterator[Mark]:
    """Every capture window of every rank with its memcpy count (evidence keeps only the first
    and last few), then the evidence rows that are not capture windows."""
    windows = 0
    for ranks, s in series_by_rank(finding):
        starts, durs = s.get("start_ns") or [], s.get("capture_ns") or []
        counts, sessions = s.get("memcpy_calls") or [], s.get("session") or []
        for i, start in enumerate(starts):
            if start is None or i >= len(durs) or durs[i] is None:
                continue  # api_statistic.csv points have no window on the clock
            calls = counts[i] if i < len(counts) else None
            windows += 1
            yield Mark(
                rank=ranks[0],
                session=sessions[i] if i < len(sessions) else "",
                name=f"capture #{i}: {'?' if calls is None else f'{calls:g}'} memcpy",
                start_ns=int(start),
                dur_ns=int(durs[i]),
                args={"memcpy_calls": calls, "capture_index": i},
                category="capture",
            )
    for mark in evidence_marks(finding):
        if not (windows and mark.name.startswith("capture #")):  # already drawn from the series
            yield mark
