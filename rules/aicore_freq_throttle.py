"""TA009 aicore-freq-throttle: the AI Core frequency is below nominal while kernels run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from traceanalyzer.kit import (
    AI_CORE_FREQ_PROCESS,
    AI_CORE_TASK_TYPES,
    NOT_KERNEL_PATTERN,
    NS,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    RuleContext,
    analysed_window_ns,
    cost_over,
    device_tasks,
    kernel_tasks,
    overlap_join,
    rule,
    union_intervals,
)
from traceanalyzer.kit import text as fmt

NO_FREQ = (
    "missing the AI Core Freq counter (collect with ProfilerActivity.NPU on Atlas A2/A3; msprof "
    "writes it to trace_view.json as process `AI Core Freq`)"
)
EVIDENCE_SEGMENTS, FIGURE_BUCKETS = 5, 200
CAPPED_FIX = (
    "The AI Core never reaches its nominal frequency while kernels run: the device runs under a "
    "power cap or a fixed lower frequency. Check the power cap and draw (`npu-smi info -t power "
    "-i <id>`) and the server's power policy; compare with a rank on another host."
)
UNDER_LOAD_FIX = (
    "The AI Core frequency drops while kernels run: the device throttles for temperature or "
    "power. Check `npu-smi info -t temp -i <id>` and `npu-smi info -t power -i <id>`, the cooling "
    "(fans, airflow, inlet temperature), and compare the ranks on the same host."
)


@dataclass
class Segment:
    """One held counter value and the busy (kernel) time under it."""

    session: str
    start_ns: int
    end_ns: int
    mhz: float
    busy_ns: int


@rule(
    id="TA009",
    name="aicore-freq-throttle",
    severity="warning",
    summary="The AI Core Freq counter is below its nominal value while kernels run.",
    fix=UNDER_LOAD_FIX,
    params={
        "nominal_mhz": Param(
            1800.0,
            "Nominal AI Core frequency (MHz; Atlas A2/A3: 1800). A higher observed value raises it.",
        ),
        "min_drop": Param(
            0.05, "Fire when the busy-time-weighted frequency is this far below nominal (0.05)."
        ),
        "min_lost_us": Param(200.0, "... and the estimated time lost is at least this (µs)."),
        "min_segment_busy_us": Param(
            50.0,
            "A held value with less kernel time under it than this (µs) is not reported as the "
            "lowest (a counter change that lands just after a burst starts).",
        ),
        "counter_names": Param(
            (AI_CORE_FREQ_PROCESS,), "Counter (process or name) of the frequency."
        ),
        "kernel_task_types": Param(
            AI_CORE_TASK_TYPES, "Device task types that run on the AI Core (busy time)."
        ),
        "not_kernel_pattern": Param(
            NOT_KERNEL_PATTERN,
            "In a session without kernel task types: regex on task name/type of tasks that are "
            "no kernel (records, notifies, DMA, profiler markers); the other tasks are busy time.",
        ),
    },
    requires=[
        device_tasks("device kernels (trace_view.json Ascend Hardware)", columns=("task_type",)),
    ],
    units={"busy_ns": NS, "throttled_busy_ns": NS},
)
def aicore_freq_throttle(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    The `AI Core Freq` counter (MHz) below its nominal value (`nominal_mhz`, 1800 on Atlas
    A2/A3) **while kernels run**. The counter is sampled only when it changes, so each sample's
    value holds until the next one. Busy time is the union of AI Core kernels
    (`kernel_task_types`; in an export whose tasks carry no such type, every task that is no
    wait, copy or marker) on all streams; the rule weights the frequency by it and reports the
    busy-time-weighted frequency, the lowest value kernels ran at, and the time lost: each busy
    nanosecond at f MHz would have taken f/nominal of it at nominal, so
    lost = sum(busy x (1 - f/nominal)) (an upper bound: memory-bound kernels slow less). It fires
    when the weighted frequency is at least `min_drop` below nominal and the loss reaches
    `min_lost_us`.

    ## Why it matters
    Every kernel runs slower in proportion: a device at 1300 MHz computes about 28% slower than
    at 1800 MHz, and in a multi-rank job the throttled rank makes all the others wait for it in
    collectives. Nothing in the operator list shows it: the same kernels just take longer.

    ## How to fix
    - Frequency low for the whole run (never nominal while busy): a power cap or a fixed
      frequency. Check `npu-smi info -t power -i <id>` and the server's power policy.
    - Frequency drops under load: thermal or power throttling. Check `npu-smi info -t temp -i
      <id>` / `-t power`, the cooling, and compare the ranks on the same host.

    ## Example
    ```
    TA009 aicore-freq-throttle [warning] rank 3 (1/8)
    AI Core runs at 1300 MHz busy-time-weighted (nominal 1800, lowest 1100 MHz) while kernels
    run: ~4.1 ms lost (11% of the analysed window)
    ```
    Silent when the frequency is low only while the device is idle (power saving between
    bursts) and when it stays at nominal. Not evaluated without the counter.

    ## References
    - msprof-analyze advisor `AICoreFreqChecker` (per-op frequency drop ratio, threshold 5%)
      and the `freq_analysis` cluster recipe.
    - torch_npu export format: `AI Core Freq` counter events (`"args": {"MHz": 1800}`).
    """
    samples = ctx.once(_samples)
    if samples.is_empty():
        raise NotEvaluated(NO_FREQ)
    kernels = ctx.once(_kernels)
    window = analysed_window_ns(ctx)
    for (rank,), rank_samples in samples.group_by("rank", maintain_order=True):
        segments = held_segments(rank_samples, kernels.filter(pl.col("rank") == rank))
        yield from _judge(ctx, int(rank), segments, kernels, window.get(int(rank)))


def _samples(ctx: RuleContext) -> pl.DataFrame:
    names = ctx.params.counter_names
    return (
        ctx.table("counters")
        .filter(pl.col("process").is_in(names) | pl.col("name").is_in(names))
        .select("rank", "session", "ts_ns", "value")
        .drop_nulls()
        .collect()
    )


def _kernels(ctx: RuleContext) -> pl.DataFrame:
    p = ctx.params
    return kernel_tasks(
        ctx.table("slices"), p.kernel_task_types, not_kernel_pattern=p.not_kernel_pattern
    )


def held_segments(samples: pl.DataFrame, kernels: pl.DataFrame) -> list[Segment]:
    """Counter values held from each sample to the next (the last to the last kernel's end),
    with the union of kernel time under each; busy time before the first sample is unknown."""
    out: list[Segment] = []
    for (session,), s in samples.group_by("session", maintain_order=True):
        s = s.sort("ts_ns").unique("ts_ns", keep="last", maintain_order=True)
        busy = union_intervals(kernels.filter(pl.col("session") == session), by=[])
        starts = busy["start_ns"].to_numpy().astype(np.int64)
        ends = busy["end_ns"].to_numpy().astype(np.int64)
        ts = s["ts_ns"].to_numpy().astype(np.int64)
        last = max(int(ends.max()) if ends.size else 0, int(ts[-1]))
        bounds = np.append(ts, last)
        covered = _cumulative_busy(starts, ends, bounds)
        for i, value in enumerate(s["value"].to_list()):
            out.append(
                Segment(
                    str(session),
                    int(bounds[i]),
                    int(bounds[i + 1]),
                    float(value),
                    int(covered[i + 1] - covered[i]),
                )
            )
    return out


def _cumulative_busy(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Busy time before each instant of ``at``, for sorted disjoint intervals."""
    if starts.size == 0:
        return np.zeros(at.size, dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(ends - starts)])
    i = np.searchsorted(starts, at, side="right") - 1
    inside = np.where(i >= 0, np.clip(at - starts[np.maximum(i, 0)], 0, None), 0)
    inside = np.minimum(inside, np.where(i >= 0, (ends - starts)[np.maximum(i, 0)], 0))
    return before[np.maximum(i, 0)] * (i >= 0) + inside


@dataclass
class Verdict:
    nominal: float
    busy_ns: int
    weighted_mhz: float | None
    lowest_mhz: float | None
    lost_ns: float
    throttled_busy_ns: int


def verdict(segments: list[Segment], p: Mapping[str, Any]) -> Verdict:
    """Busy-weighted frequency, lowest busy value and estimated time lost, for one rank."""
    nominal = max([p["nominal_mhz"], *(s.mhz for s in segments)])
    busy = [s for s in segments if s.busy_ns > 0]
    busy_ns = sum(s.busy_ns for s in busy)
    weighted = sum(s.busy_ns * s.mhz for s in busy) / busy_ns if busy_ns else None
    lost = sum(s.busy_ns * (1 - s.mhz / nominal) for s in busy if s.mhz < nominal)
    low = [s for s in busy if s.mhz < nominal * (1 - p["min_drop"])]
    held = [s.mhz for s in busy if s.busy_ns >= p["min_segment_busy_us"] * 1e3]
    return Verdict(
        nominal,
        busy_ns,
        weighted,
        min(held or [s.mhz for s in busy], default=None),
        lost,
        sum(s.busy_ns for s in low),
    )


def _judge(
    ctx: RuleContext,
    rank: int,
    segments: list[Segment],
    kernels: pl.DataFrame,
    window_ns: int | None,
) -> Iterator[Finding]:
    p = ctx.params
    v = verdict(segments, p)
    if v.weighted_mhz is None:
        ctx.inconclusive(
            f"rank {rank}: no kernel ran while the AI Core Freq counter was known", rank=rank
        )
        return
    drop = 1 - v.weighted_mhz / v.nominal
    if drop < p.min_drop or v.lost_ns < p.min_lost_us * 1e3:
        ctx.note(
            f"rank {rank}: busy-time-weighted AI Core frequency {v.weighted_mhz:.0f} MHz "
            f"({drop:.1%} below {v.nominal:.0f}; threshold {p.min_drop:.0%}), "
            f"~{fmt.duration(v.lost_ns)} lost",
            rank=rank,
            busy_weighted_mhz=v.weighted_mhz,
            lost_ns=v.lost_ns,
        )
        return
    busy = [s for s in segments if s.busy_ns > 0]
    capped = all(s.mhz < v.nominal * (1 - p.min_drop) for s in busy)
    worst = sorted(busy, key=lambda s: s.busy_ns * (1 - s.mhz / v.nominal), reverse=True)
    worst = [s for s in worst if s.mhz < v.nominal][:EVIDENCE_SEGMENTS]
    cost = cost_over(v.lost_ns, window_ns)
    where = f" ({cost.share:.0%} of the analysed window)" if cost.share is not None else ""
    message = "\n".join(
        [
            f"Kernels ran {fmt.duration(v.busy_ns)} on rank {rank} while the counter was known; "
            f"busy-time-weighted frequency {v.weighted_mhz:.0f} MHz, {drop:.0%} below nominal "
            f"{v.nominal:.0f} MHz (threshold {p.min_drop:.0%}); lowest value while busy "
            f"{v.lowest_mhz:.0f} MHz.",
            f"{fmt.duration(v.throttled_busy_ns)} of kernel time ran more than "
            f"{p.min_drop:.0%} below nominal. At nominal frequency it would have taken "
            f"~{fmt.duration(v.lost_ns)} less (an upper bound: memory-bound kernels slow less).",
            "The frequency stays below nominal for the whole busy time (a cap)."
            if capped
            else "The frequency drops below nominal during busy periods (throttling under load).",
        ]
    )
    yield ctx.finding(
        rank=rank,
        sessions=sorted({s.session for s in busy}),
        title=(
            f"AI Core runs at {v.weighted_mhz:.0f} MHz busy-time-weighted (nominal "
            f"{v.nominal:.0f}, lowest {v.lowest_mhz:.0f} MHz) while kernels run: "
            f"~{fmt.duration(v.lost_ns)} lost{where}"
        ),
        message=message,
        location={"counter": "AI Core Freq"},
        cost=cost,
        metrics={
            "busy_weighted_mhz": v.weighted_mhz,
            "lowest_busy_mhz": v.lowest_mhz,
            "nominal_mhz": v.nominal,
            "busy_ns": v.busy_ns,
            "throttled_busy_ns": v.throttled_busy_ns,
            "drop": drop,
        },
        evidence=_evidence(rank, worst, kernels.filter(pl.col("rank") == rank)),
        fix=CAPPED_FIX if capped else UNDER_LOAD_FIX,
        series=_series(segments, kernels.filter(pl.col("rank") == rank)),
        score=v.lost_ns,
    )


def _evidence(rank: int, worst: list[Segment], kernels: pl.DataFrame) -> list[Evidence]:
    """The throttled stretches that cost most, with the kernels that ran in them."""
    if not worst:
        return []
    spans = pl.DataFrame(
        {
            "seg": list(range(len(worst))),
            "session": [s.session for s in worst],
            "start_ns": [s.start_ns for s in worst],
            "end_ns": [s.end_ns for s in worst],
        }
    )
    top = (
        overlap_join(spans, kernels.select("session", "name", "start_ns", "end_ns"), on=["session"])
        .group_by("seg", "name")
        .agg(pl.col("overlap_ns").sum(), pl.len().alias("n"))
        .sort(["seg", "overlap_ns"], descending=[False, True])
        .group_by("seg", maintain_order=True)
        .head(3)
    )
    names: dict[int, list[str]] = {}
    for row in top.iter_rows(named=True):
        names.setdefault(row["seg"], []).append(f"{row['name']} x{row['n']}")
    return [
        Evidence(
            rank=rank,
            session=s.session,
            name=f"AI Core Freq {s.mhz:.0f} MHz",
            process=AI_CORE_FREQ_PROCESS,
            start_ns=s.start_ns,
            dur_ns=s.end_ns - s.start_ns,
            detail=f"kernels busy {fmt.duration(s.busy_ns)}: " + ", ".join(names.get(i, [])),
        )
        for i, s in enumerate(worst)
    ]


def _series(segments: list[Segment], kernels: pl.DataFrame) -> dict[str, list[Any]]:
    """Frequency steps and the busy fraction of the kernels in fixed buckets, for the figure."""
    if not segments:
        return {}
    t0 = min(s.start_ns for s in segments)
    t1 = max(s.end_ns for s in segments)
    edges = np.linspace(t0, t1, FIGURE_BUCKETS + 1).astype(np.int64)
    busy = union_intervals(kernels.select("start_ns", "end_ns"), by=[])
    covered = _cumulative_busy(
        busy["start_ns"].to_numpy().astype(np.int64),
        busy["end_ns"].to_numpy().astype(np.int64),
        edges,
    )
    width = np.maximum(np.diff(edges), 1)
    return {
        "freq_ts_ns": [s.start_ns for s in segments] + [segments[-1].end_ns],
        "freq_mhz": [s.mhz for s in segments] + [segments[-1].mhz],
        "bucket_start_ns": edges[:-1].tolist(),
        "busy_fraction": (np.diff(covered) / width).round(3).tolist(),
    }


# --------------------------------------------------------------------------- presentation


@aicore_freq_throttle.figure(
    caption="AI Core frequency over time (held between samples; dotted: nominal) above the "
    "share of time kernels run (green)."
)
def _figure(fig: FigureContext) -> Any:
    """AI Core frequency over time (held steps) above the kernels' busy fraction."""
    series = fig.finding.get("series") or {}
    if not series.get("freq_ts_ns"):
        return None
    figure_, (ax,) = fig.new(8.0, 3.0)
    t0 = series["freq_ts_ns"][0]
    ms = [(t - t0) / 1e6 for t in series["bucket_start_ns"]]
    busy = ax.twinx()
    busy.fill_between(ms, series["busy_fraction"], step="post", color="#9bbb59", alpha=0.4)
    busy.set_ylim(0, 1)
    busy.set_ylabel("kernels busy (fraction)")
    ax.step([(t - t0) / 1e6 for t in series["freq_ts_ns"]], series["freq_mhz"], where="post")
    ax.axhline(fig.finding["metrics"]["nominal_mhz"], color="grey", linestyle=":")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("AI Core Freq (MHz)")
    return figure_


@aicore_freq_throttle.key_figures(
    KeyFigure("busy_weighted_mhz", "AI Core MHz (busy-weighted)", better="higher", unit="MHz"),
    KeyFigure("lowest_busy_mhz", "lowest AI Core MHz while busy", better="higher", unit="MHz"),
    KeyFigure("freq_lost_ns", "time lost to low AI Core frequency", better="lower", unit="ns"),
)
def _key_figures(ctx: RuleContext) -> list[dict[str, Any]]:
    """Per rank: busy-time-weighted MHz, lowest busy MHz and estimated time lost."""
    p = ctx.params
    samples = ctx.once(_samples)
    kernels = ctx.once(_kernels)
    rows = []
    for (rank,), rank_samples in samples.group_by("rank"):
        v = verdict(held_segments(rank_samples, kernels.filter(pl.col("rank") == rank)), p)
        rows.append(
            {
                "rank": int(rank),
                "busy_weighted_mhz": v.weighted_mhz,
                "lowest_busy_mhz": v.lowest_mhz,
                "freq_lost_ns": v.lost_ns if v.weighted_mhz is not None else None,
            }
        )
    return rows
