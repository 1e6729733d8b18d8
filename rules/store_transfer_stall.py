"""TA002 store-transfer-stall: other streams sit in cross-stream waits during a KV store transfer."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    COPY_TASK_NAMES,
    COPY_TASK_TYPES,
    DEVICE_PROCESSES,
    HARDWARE_PROCESS,
    NOT_HOST_PROCESSES,
    NS,
    SHARE,
    STORE_TRANSFER_WINDOW,
    TRACE_NS,
    TRANSFER_KEY,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
    WINDOW_KEY,
    Chart,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Mark,
    NotEvaluated,
    Param,
    Params,
    RuleContext,
    Swatch,
    analysed_window_ns,
    cost_over,
    device_tasks,
    evidence_marks,
    outermost,
    overlap_join,
    phase_at,
    phase_windows,
    phases_in,
    rule,
    session_metadata,
    total_length,
)
from traceanalyzer.kit import text as fmt

# Sessions whose whole profiling window is one transfer say so in profiler_metadata.json, via
# `prof.addsession_metadata(WINDOW_KEY, WINDOW_VALUE)` (our recipes do); TRANSFER_KEY names the call.
WINDOW_VALUE = STORE_TRANSFER_WINDOW
NOT_HOST_SPANS = NOT_HOST_PROCESSES
UNNAMED = "profiled session"  # a session-window transfer whose metadata does not name the call
SESSION_SETTING = "--set store-transfer-stall.span_source=session"
NO_SPANS = (
    "no transfer spans found (no host event matches span_pattern and no session is marked as a "
    "transfer window)"
)
STREAMS_SHOWN, WAITS_PER_STREAM, SPANS_SHOWN, SESSIONS_SHOWN = 8, 3, 5, 3
SPAN_SCHEMA = {
    "rank": pl.Int32,
    "session": pl.String,
    "transfer": pl.String,
    "name": pl.String,
    "process": pl.String,
    "thread": pl.String,
    "source": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}

FIX = (
    "Drain the compute streams before the transfer: call `torch.npu.synchronize()` right before "
    "the store call (when profiling, put it outside the profiled region). Then find which "
    "framework stream issues the waits (the stalling streams listed) and fix the ordering there; "
    "in the Mooncake KV-pool TTFT report, vllm-ascend 0.18 queued cross-stream waits that 0.21 "
    "no longer does."
)


@rule(
    id="TA002",
    name="store-transfer-stall",
    severity="warning",
    escalates_to="error",
    escalation="when at least `error_share` of all transfer time is lost to waits",
    summary="Other NPU streams sit in NOTIFY_WAIT/EVENT_WAIT during a KV store transfer, stalling it.",
    fix=FIX,
    params={
        "span_pattern": Param(
            r"batch_get_into_multi_buffers|batch_put_from_multi_buffers"
            r"|MooncakeBackend\.(?:get|put)|kv_store_\w+",
            "Regex (search) on host span names (cpu_op, python_function, mstx range) of transfers.",
        ),
        "span_source": Param(
            "auto",
            "`events`: spans from host events; `session`: each session's whole window is a "
            "transfer; `auto`: events where a session has them, else the session window when its "
            f"metadata has `{WINDOW_KEY}: {WINDOW_VALUE}`.",
            choices=("auto", "events", "session"),
        ),
        "wait_task_types": Param(WAIT_TASK_TYPES, "Device task types that are cross-stream waits."),
        "wait_names": Param(
            WAIT_TASK_NAMES,
            "Device task names that are cross-stream waits.",
        ),
        "own_flow_cats": Param(
            ("HostToDevice", "async_npu"),
            "Flow categories that link the span's host calls to the transfer's own streams.",
        ),
        "own_task_names": Param(COPY_TASK_NAMES, "Task names marking the transfer's copies."),
        "own_task_types": Param(COPY_TASK_TYPES, "Task types marking the transfer's copies."),
        "min_fraction": Param(0.3, "Fire when waits cover at least this fraction of a span."),
        "min_span_ms": Param(10.0, "Ignore spans shorter than this (ms)."),
        "error_share": Param(
            0.8, "Report as error when this share of all transfer time is lost to waits."
        ),
        "hint_copy_tail": Param(
            0.25,
            "Without spans, a session looks like one wrapped transfer when most copy time of its "
            "busiest copy stream falls in this last fraction of the window.",
        ),
        "hint_min_wait_ms": Param(
            10.0,
            "Without spans, only waits on other streams at least this long (ms) count toward "
            "that look (with min_fraction of the window).",
        ),
    },
    requires=[device_tasks()],
    units={
        "transfer_ns": NS,
        "lost_ns": NS,
        "share_lost": SHARE,
        "worst_span_ns": NS,
        "worst_span_fraction": SHARE,
        "worst_span_start_ns": TRACE_NS,
    },
)
def store_transfer_stall(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    KV-cache store transfers (Mooncake `batch_get_into_multi_buffers` /
    `batch_put_from_multi_buffers`, `MooncakeBackend.get/put`, `kv_store_*`) during which
    *other* NPU streams sit in cross-stream waits (`EVENT_WAIT_SQE`/`NOTIFY_WAIT_SQE` tasks,
    `EVENT_WAIT`, `Notify Wait`, `Notify_Wait`). Transfer spans are host spans whose name
    matches `span_pattern`, or, when the profile wraps exactly one transfer call (as in the Mooncake KV-pool report),
    the session window, from the first launch of the thread that issues the transfer's copies
    onto their stream. The transfer's own streams are excluded: the streams carrying its
    MEMCPY_ASYNC/SDMA/PCIE_DMA copies, and the streams that HostToDevice/async_npu flows from
    the transfer's thread land on (the span's thread, or the `aclrtMemcpyAsync` caller). A
    stream is never its own because another thread's flow lands there: in that report the waits
    themselves are launched by the model thread (`aclrtStreamWaitEvent`, `hcom_*`). It fires
    when the union of the other streams' waits covers at least `min_fraction` of a span that
    lasts at least `min_span_ms`.

    ## Why it matters
    A transfer that should take milliseconds takes seconds: the device is busy waiting for
    work queued by the framework on other streams, and TTFT grows with it. In the Mooncake
    KV-pool TTFT report, vLLM 0.18 + Mooncake pooling raised TTFT from 38.5 s to 60.9 s; each
    `batch_get_into_multi_buffers` took seconds while streams 39, 40, 43 and 46 sat in
    Notify Wait / EVENT_WAIT_SQE. The transfer engine itself was fine.

    ## How to fix
    - Call `torch.npu.synchronize()` right before the store transfer so the compute streams
      drain first (when profiling, put the synchronize outside the profiled region).
    - Then find which framework stream issues the waits (the stalling streams in the finding)
      and fix the ordering in the framework; the Mooncake KV-pool report was fixed by a newer
      framework version.

    ## Example
    ```
    TA002 store-transfer-stall [error] rank 0
    Mooncake transfer `batch_get_into_multi_buffers` stalls: streams 39, 40, 43, 46 sit in
    NOTIFY_WAIT/EVENT_WAIT for 92% of the 2.4 s span
    ```
    Silent on waits outside transfer spans and on waits only on the transfer's own stream.
    Severity is `error` when the share of all transfer time lost reaches `error_share`.
    Without any span (and no session marked as a transfer) the rule reports "not evaluated:
    no transfer spans found" instead of guessing. When a session looks like a profile wrapped
    around one transfer call (no ProfilerStep and no step rows, the copies of one stream near
    the end of the window, long waits on other streams), the reason says so and names the
    setting to use: `--set store-transfer-stall.span_source=session`.

    ## References
    - The Mooncake KV-pool TTFT report: vllm 0.18 + Mooncake pooling TTFT regression
      (cross-stream waits on streams 39/40/43/46 during `batch_get_into_multi_buffers`).
    - torch_npu export format: Ascend Hardware task types (`EVENT_WAIT_SQE`, `NOTIFY_WAIT_SQE`),
      HCCL plane tasks (`Notify_Wait`), HostToDevice flows.
    """
    p = ctx.params
    spans = ctx.once(_transfer_spans)
    if spans.is_empty():
        raise NotEvaluated(_no_spans_reason(ctx))
    waits, launches = _waits(ctx), _launches(ctx)
    copies = _copies(ctx, launches)
    threads = _transfer_threads(spans, copies)
    spans = _from_first_launch(spans, threads, copies, launches)
    own = _own_streams(spans, threads, copies, launches)
    stalls = (
        overlap_join(spans, waits, on=("rank", "session"))
        .join(own, on=["span_id", "stream_id"], how="anti")
        .filter(pl.col("overlap_ns") > 0)
    )
    clipped = stalls.select(
        "span_id",
        "stream_id",
        pl.col("overlap_start_ns").alias("start_ns"),
        pl.col("overlap_end_ns").alias("end_ns"),
    )
    per_stream = total_length(clipped, by=["span_id", "stream_id"]).rename(
        {"covered_ns": "wait_ns"}
    )
    per_span = spans.join(
        total_length(clipped, by=["span_id"]), on="span_id", how="left"
    ).with_columns(
        pl.col("covered_ns").fill_null(0),
    )
    per_span = per_span.with_columns(
        (pl.col("covered_ns") / pl.col("dur_ns").clip(lower_bound=1)).alias("fraction"),
        (
            (pl.col("dur_ns") >= p.min_span_ms * 1e6)
            & (pl.col("covered_ns") >= p.min_fraction * pl.col("dur_ns"))
        ).alias("stalled"),
    )
    for (rank, transfer), group in per_span.group_by("rank", "transfer", maintain_order=True):
        stalled = group.filter(pl.col("stalled"))
        if stalled.is_empty():
            worst = group.sort("fraction", descending=True).row(0, named=True)
            ctx.note(
                f"rank {rank}: {group.height} `{transfer}` span(s), waits on other streams cover at "
                f"most {worst['fraction']:.0%} (threshold {p.min_fraction:.0%}, min {p.min_span_ms:g} ms)",
                rank=rank,
                spans=group.height,
                max_fraction=worst["fraction"],
            )
            continue
        yield _finding(
            ctx, int(rank), str(transfer), group, stalled, per_stream, stalls, own, threads
        )


def _device_tasks(ctx: RuleContext) -> pl.LazyFrame:
    """The shard's device tasks on a stream: what the waits and the copies are read from."""
    return ctx.table("slices").filter(
        pl.col("process").is_in(DEVICE_PROCESSES) & pl.col("stream_id").is_not_null()
    )


def _waits(ctx: RuleContext) -> pl.DataFrame:
    """Cross-stream waits (`wait_task_types`/`wait_names`): rank, session, wait_process,
    wait_thread, stream_id, wait_name, task_type, start_ns, end_ns."""
    p = ctx.params
    return (
        _device_tasks(ctx)
        .filter(pl.col("task_type").is_in(p.wait_task_types) | pl.col("name").is_in(p.wait_names))
        .select(
            "rank",
            "session",
            # Renamed so the span's own process/thread (same names) cannot shadow them in the join.
            pl.col("process").alias("wait_process"),
            pl.col("thread").alias("wait_thread"),
            "stream_id",
            pl.col("name").alias("wait_name"),
            "task_type",
            "start_ns",
            "end_ns",
        )
        .collect()
    )


def _transfer_spans(ctx: RuleContext) -> pl.DataFrame:
    """Spans: span_id, rank, session, transfer, name, process, thread, source, start_ns, end_ns,
    dur_ns. `transfer` is the matched pattern, `name` the host event's own name (what the user
    searches the timeline for)."""
    p = ctx.params
    sessions = ctx.sessions()
    events = pl.DataFrame(schema=SPAN_SCHEMA)
    if p.span_source in ("auto", "events"):
        host = ctx.table("slices").filter(
            ~pl.col("process").is_in(NOT_HOST_SPANS) & pl.col("name").str.contains(p.span_pattern)
        )
        events = outermost(
            host.select(
                "rank",
                "session",
                pl.col("name").str.extract(f"({p.span_pattern})", 1).alias("transfer"),
                "name",
                "process",
                "thread",
                pl.lit("events").alias("source"),
                "start_ns",
                "end_ns",
            )
            .collect()
            .cast(SPAN_SCHEMA)
        )
    frames = [events]
    if p.span_source in ("auto", "session"):
        with_events = set(events.select("rank", "session").iter_rows())
        rows = []
        for row in sessions.iter_rows(named=True):
            meta = session_metadata(row.get("metadata"))
            marked = meta.get(WINDOW_KEY) == WINDOW_VALUE
            if (
                (row["rank"], row["session"]) in with_events
                or row["start_ns"] is None
                or row["end_ns"] is None
            ):
                continue
            if p.span_source == "session" or marked:
                transfer = str(meta.get(TRANSFER_KEY) or UNNAMED)
                rows.append(
                    {
                        "rank": row["rank"],
                        "session": row["session"],
                        "transfer": transfer,
                        "name": transfer,
                        "process": None,
                        "thread": None,
                        "source": "session",
                        "start_ns": row["start_ns"],
                        "end_ns": row["end_ns"],
                    }
                )
        frames.append(pl.DataFrame(rows, schema=SPAN_SCHEMA))
    spans = pl.concat(frames).sort("rank", "start_ns")
    return spans.with_row_index("span_id").with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")
    )


def _launches(ctx: RuleContext) -> pl.DataFrame:
    """Flows of `own_flow_cats` from a host thread onto a device stream: rank, session, thread
    (the host end; `Thread <tid>` in both Python and CANN), stream_id, start_ns = end_ns (the host
    call), land_ns (the device task)."""
    p = ctx.params
    return (
        ctx.table("flows")
        .filter(pl.col("cat").is_in(p.own_flow_cats) & pl.col("start_ns").is_not_null())
        .select(
            "rank",
            "session",
            pl.col("src_thread").alias("thread"),
            pl.coalesce(
                pl.when(pl.col("dst_process") == "Ascend Hardware").then(pl.col("dst_tid")),
                pl.col("dst_thread").str.extract(r"^Stream (\d+)$", 1).cast(pl.Int64),
            ).alias("stream_id"),
            "start_ns",
            pl.col("start_ns").alias("end_ns"),  # the launch is a point in host time
            pl.col("end_ns").alias("land_ns"),
        )
        .filter(pl.col("stream_id").is_not_null())
        .collect()
    )


def _copies(ctx: RuleContext, launches: pl.DataFrame) -> pl.DataFrame:
    """Copy tasks (`own_task_names`/`own_task_types`): rank, session, stream_id, start_ns, end_ns,
    issuer. `issuer` is the host thread whose flow lands on the copy (one row per issuing thread),
    null when no flow does."""
    p = ctx.params
    copies = (
        _device_tasks(ctx)
        .filter(
            pl.col("name").is_in(p.own_task_names) | pl.col("task_type").is_in(p.own_task_types)
        )
        .select("rank", "session", "stream_id", "start_ns", "end_ns")
        .collect()
        .with_row_index("copy_id")
    )
    keys = ["rank", "session", "stream_id"]
    # A flow lands on the task of its stream that starts last at or before the landing time.
    landed = (
        launches.filter(pl.col("land_ns").is_not_null())
        .select(*keys, pl.col("thread").alias("issuer"), "land_ns")
        .cast({"stream_id": pl.Int64})
        .sort("land_ns")
        .join_asof(
            copies.select("copy_id", *keys, pl.col("start_ns").alias("copy_start"), "end_ns")
            .cast({"stream_id": pl.Int64})
            .sort("copy_start"),
            left_on="land_ns",
            right_on="copy_start",
            by=keys,
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("land_ns") <= pl.col("end_ns"))
        .select("copy_id", "issuer")
        .unique()
    )
    return copies.join(landed, on="copy_id", how="left").drop("copy_id")


def _transfer_threads(spans: pl.DataFrame, copies: pl.DataFrame) -> pl.DataFrame:
    """span_id, thread: the host threads that issue each span's transfer.

    An event span's own thread; when that thread issues none of the copies inside the span (the
    store library copies from a worker thread), also the thread whose copies inside the span take
    the most device time. A session window has no thread of its own: the latter only.
    """
    linked = overlap_join(
        spans.select("span_id", "rank", "session", "start_ns", "end_ns", "thread"),
        copies.filter(pl.col("issuer").is_not_null()),
        on=("rank", "session"),
    )
    ranked = (
        linked.group_by("span_id", "thread", "issuer")
        .agg(pl.col("overlap_ns").sum())
        .sort(["span_id", "overlap_ns", "issuer"], descending=[False, True, False])
    )
    busiest = ranked.group_by("span_id", maintain_order=True).agg(
        pl.col("issuer").first().alias("busiest"),
        (pl.col("issuer") == pl.col("thread")).any().alias("span_thread_copies"),
    )
    return pl.concat(
        [
            spans.filter(pl.col("thread").is_not_null()).select("span_id", "thread"),
            busiest.filter(~pl.col("span_thread_copies")).select(
                "span_id", pl.col("busiest").alias("thread")
            ),
        ]
    ).unique(maintain_order=True)


def _from_first_launch(
    spans: pl.DataFrame, threads: pl.DataFrame, copies: pl.DataFrame, launches: pl.DataFrame
) -> pl.DataFrame:
    """Session-window spans start at the first launch of the transfer's thread onto a stream that
    carries its copies: device work queued before it, and waits that end before it, cannot have
    stalled the transfer. They end with the window, as the wrapped call does."""
    windows = (
        spans.filter(pl.col("source") == "session")
        .select("span_id", "rank", "session", "start_ns", "end_ns")
        .join(threads, on="span_id")
    )
    keys = ("rank", "session", "thread")
    copy_streams = (
        overlap_join(windows, copies.rename({"issuer": "thread"}), on=keys)
        .select("span_id", "stream_id")
        .unique()
    )
    first = (
        overlap_join(windows, launches, on=keys, mode="start_within")
        .join(copy_streams, on=["span_id", "stream_id"])
        .group_by("span_id")
        .agg(pl.col("start_ns_task").min().alias("first_ns"))
    )
    return (
        spans.join(first, on="span_id", how="left")
        .with_columns(
            pl.max_horizontal("start_ns", pl.col("first_ns").fill_null(0)).alias("start_ns")
        )
        .drop("first_ns")
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    )


def _own_streams(
    spans: pl.DataFrame, threads: pl.DataFrame, copies: pl.DataFrame, launches: pl.DataFrame
) -> pl.DataFrame:
    """(span_id, stream_id) of the transfer's own streams.

    Copy-carrying: the stream runs one of the transfer's copies inside the span, i.e. a copy issued
    by the transfer's thread, or any copy when no copy inside the span is linked to a host thread
    (no flows, e.g. Level0). Flow-linked: a flow from the transfer's thread, leaving inside the
    span, lands on the stream. Another thread's flow never makes a stream own.
    """
    bounds = spans.select("span_id", "rank", "session", "start_ns", "end_ns")
    inside = overlap_join(bounds, copies, on=("rank", "session"))
    linked_spans = inside.filter(pl.col("issuer").is_not_null()).select("span_id").unique()
    carrying = pl.concat(
        [
            inside.join(threads, left_on=["span_id", "issuer"], right_on=["span_id", "thread"]),
            inside.join(linked_spans, on="span_id", how="anti"),
        ],
        how="diagonal_relaxed",
    )
    launched = overlap_join(bounds, launches, on=("rank", "session"), mode="start_within").join(
        threads, on=["span_id", "thread"]
    )
    return pl.concat(
        [
            carrying.select("span_id", pl.col("stream_id").cast(pl.Int64)),
            launched.select("span_id", pl.col("stream_id").cast(pl.Int64)),
        ]
    ).unique()


def _no_spans_reason(ctx: RuleContext) -> str:
    """NO_SPANS; under `auto`, plus the sessions that look like a profile wrapped around one
    transfer call, with the setting that evaluates them. Never a finding: only the user knows.
    (The copies and waits are read only when a session has no steps: most have.)"""
    p = ctx.params
    if p.span_source != "auto":
        return NO_SPANS
    stepped = set(
        phase_windows(ctx)
        .filter(pl.col("step_source") == "profiler_step")
        .select("rank", "session")
        .unique()
        .iter_rows()
    ) | set(
        ctx.table("step_times")
        .filter(pl.col("step").is_not_null())
        .select("rank", "session")
        .unique()
        .collect()
        .iter_rows()
    )
    unstepped = [
        row
        for row in ctx.sessions().iter_rows(named=True)
        if (row["rank"], row["session"]) not in stepped
        and row["start_ns"] is not None
        and row["end_ns"] is not None
    ]
    if not unstepped:
        return NO_SPANS
    copies, waits = _copies(ctx, _launches(ctx)), _waits(ctx)
    looks = [look for row in unstepped if (look := _looks_like_one_transfer(p, row, copies, waits))]
    if not looks:
        return NO_SPANS
    more = (
        f" (and {len(looks) - SESSIONS_SHOWN} more sessions)" if len(looks) > SESSIONS_SHOWN else ""
    )
    return (
        f"{NO_SPANS}; but {'; '.join(looks[:SESSIONS_SHOWN])}{more}. That is what a profiler wrapped "
        f"around one transfer call looks like: if it is, rerun with {SESSION_SETTING}"
    )


def _looks_like_one_transfer(
    p: Params, session: dict[str, Any], copies: pl.DataFrame, waits: pl.DataFrame
) -> str | None:
    """Why a session without steps looks like one wrapped transfer: the copies of its busiest copy
    stream run near the end of the window (they waited), while other streams sit in long waits."""
    start, end = session["start_ns"], session["end_ns"]
    window = max(end - start, 1)
    tail = end - int(p.hint_copy_tail * window)
    mine = pl.col("rank").eq(session["rank"]) & pl.col("session").eq(session["session"])

    def inside(lo: int) -> pl.Expr:
        """Copy time inside [lo, end)."""
        clipped = pl.min_horizontal("end_ns", end) - pl.max_horizontal("start_ns", lo)
        return clipped.clip(lower_bound=0).sum()

    per_stream = (
        copies.filter(mine)
        .unique(["stream_id", "start_ns", "end_ns"])
        .group_by("stream_id")
        .agg(inside(start).alias("copy_ns"), inside(tail).alias("tail_ns"))
        .filter(pl.col("copy_ns") > 0)
        .sort(["copy_ns", "stream_id"], descending=[True, False])
    )
    if per_stream.is_empty():
        return None
    stream, copy_ns, tail_ns = per_stream.row(0)
    if tail_ns * 2 < copy_ns:
        return None
    long_waits = waits.filter(
        mine
        & (pl.col("stream_id") != stream)
        & ((pl.col("end_ns") - pl.col("start_ns")) >= p.hint_min_wait_ms * 1e6)
        & (pl.col("start_ns") < end)
        & (pl.col("end_ns") > start)
    ).with_columns(
        pl.max_horizontal("start_ns", start).alias("start_ns"),
        pl.min_horizontal("end_ns", end).alias("end_ns"),
    )
    if long_waits.is_empty():
        return None
    covered = total_length(long_waits.select("start_ns", "end_ns"), by=[]).item()
    if covered < p.min_fraction * window:
        return None
    streams = fmt.join(sorted(long_waits["stream_id"].unique().to_list()), STREAMS_SHOWN)
    return (
        f"rank {session['rank']} session `{session['session']}` has no ProfilerStep or step rows, "
        f"its copies on stream {stream} run in the last {p.hint_copy_tail:.0%} of the window, and "
        f"waits on streams {streams} cover {covered / window:.0%} of it"
    )


def _worst_span_line(worst: dict[str, Any], issuers: list[str]) -> str:
    """Where to find the worst span on the timeline: its host event, or who issued the transfer."""
    if worst["source"] == "events":
        return f"Worst span's host event: `{worst['name']}` on {worst['thread']}."
    if issuers:
        return (
            f"The span starts at the first launch of {fmt.join(issuers)} onto the copy stream "
            "(that thread issues the transfer's copies) and ends with the window."
        )
    return "The whole window is the span (no copy inside it is linked to a host thread)."


def _wait_kind(name: str | None, task_type: str | None) -> str:
    text = f"{name or ''} {task_type or ''}".lower()
    return (
        "NOTIFY_WAIT"
        if "notify" in text
        else "EVENT_WAIT"
        if "event" in text
        else (task_type or name or "?")
    )


def _finding(
    ctx: RuleContext,
    rank: int,
    transfer: str,
    spans: pl.DataFrame,
    stalled: pl.DataFrame,
    per_stream: pl.DataFrame,
    stalls: pl.DataFrame,
    own: pl.DataFrame,
    threads: pl.DataFrame,
) -> Finding:
    p = ctx.params
    stalled_ids = stalled["span_id"].to_list()
    worst = stalled.sort("covered_ns", descending=True).row(0, named=True)
    streams = (
        per_stream.filter(pl.col("span_id").is_in(stalled_ids))
        .group_by("stream_id")
        .agg(pl.col("wait_ns").sum())
        .sort(["wait_ns", "stream_id"], descending=[True, False])
    )
    waits = stalls.filter(pl.col("span_id").is_in(stalled_ids))
    kinds = sorted(
        {_wait_kind(n, t) for n, t in waits.select("wait_name", "task_type").iter_rows()},
        reverse=True,
    )
    stream_kinds = {
        s: "/".join(
            sorted(
                {_wait_kind(n, t) for n, t in g.select("wait_name", "task_type").iter_rows()},
                reverse=True,
            )
        )
        for (s,), g in waits.group_by("stream_id")
    }
    total_ns = int(spans["dur_ns"].sum())
    lost_ns = int(stalled["covered_ns"].sum())
    share = lost_ns / total_ns if total_ns else 0.0
    stream_ids = sorted(streams["stream_id"].to_list())
    own_ids = sorted(set(own.filter(pl.col("span_id").is_in(stalled_ids))["stream_id"].to_list()))
    issuers = {
        span_id: sorted(group["thread"].to_list())
        for (span_id,), group in threads.filter(pl.col("span_id").is_in(stalled_ids)).group_by(
            "span_id"
        )
    }
    if transfer == UNNAMED:
        subject = "The profiled transfer"
    elif "multi_buffers" in transfer or "Mooncake" in transfer:
        subject = f"Mooncake transfer `{transfer}`"
    else:
        subject = f"KV store transfer `{transfer}`"
    if len(stream_ids) > STREAMS_SHOWN:
        where = f"{len(stream_ids)} streams sit"
    elif len(stream_ids) == 1:
        where = f"stream {stream_ids[0]} sits"
    else:
        where = f"streams {fmt.join(stream_ids)} sit"
    title = f"{subject} stalls: {where} in {'/'.join(kinds)} for {worst['fraction']:.0%} of the "
    if spans.height == 1:
        title += f"{fmt.duration(worst['dur_ns'])} span"
    else:
        title += (
            f"worst {fmt.duration(worst['dur_ns'])} span; {share:.0%} of {spans.height} spans' "
            "time is lost"
        )
    source = "the profiled session window" if worst["source"] == "session" else "host span events"
    lines = [
        f"Rank {rank}: {spans.height} `{transfer}` span(s) from {source}, "
        f"{stalled.height} stalled (waits on other streams cover >= {p.min_fraction:.0%}).",
        f"Worst span: {fmt.duration(worst['dur_ns'])}, {worst['fraction']:.0%} covered by waits "
        f"({fmt.duration(worst['covered_ns'])}).",
        "Stalling streams (wait time inside stalled spans): "
        + fmt.join(
            (
                f"{s} {fmt.duration(w)} {stream_kinds.get(s, '')}".rstrip()
                for s, w in streams.iter_rows()
            ),
            STREAMS_SHOWN,
        )
        + ".",
        f"Transfer time lost to waits: {fmt.duration(lost_ns)} of {fmt.duration(total_ns)} ({share:.0%}).",
        (
            f"The transfer's own stream(s) {fmt.join(own_ids)} are excluded."
            if own_ids
            else "No own stream was identified (no flow-linked or copy task inside the span)."
        ),
        _worst_span_line(worst, issuers.get(worst["span_id"], [])),
        "Work queued by the framework on other streams waits on events/notifies while the "
        "transfer runs, and the transfer waits behind it.",
    ]
    evidence = [
        Evidence(
            rank=rank,
            session=row["session"],
            name=row["name"],
            process=row["process"],
            thread=row["thread"] or ", ".join(issuers.get(row["span_id"], [])) or None,
            start_ns=row["start_ns"],
            dur_ns=row["dur_ns"],
            detail=f"transfer span, {row['fraction']:.0%} covered by waits",
        )
        for row in stalled.sort("covered_ns", descending=True)
        .head(SPANS_SHOWN)
        .iter_rows(named=True)
    ]
    longest = (
        waits.sort("overlap_ns", descending=True)
        .group_by("stream_id", maintain_order=True)
        .head(WAITS_PER_STREAM)
        .filter(pl.col("stream_id").is_in(streams["stream_id"].head(STREAMS_SHOWN).to_list()))
        .sort("stream_id", "start_ns_task")
    )
    evidence += [
        Evidence(
            rank=rank,
            session=row["session"],
            name=row["wait_name"],
            process=row["wait_process"],
            thread=row["wait_thread"],
            stream=row["stream_id"],
            start_ns=row["start_ns_task"],
            dur_ns=row["end_ns_task"] - row["start_ns_task"],
            detail=f"{fmt.duration(row['overlap_ns'])} inside the transfer span",
        )
        for row in longest.iter_rows(named=True)
    ]
    worst_streams = per_stream.filter(pl.col("span_id") == worst["span_id"]).sort("stream_id")
    return ctx.finding(
        rank=rank,
        sessions=sorted(set(stalled["session"].to_list())),
        title=title,
        message="\n".join(lines),
        location={"transfer": transfer, "span_source": worst["source"]},
        severity="error" if share >= p.error_share else None,
        metrics={
            "spans": spans.height,
            "stalled_spans": stalled.height,
            "transfer_ns": total_ns,
            "lost_ns": lost_ns,
            "share_lost": share,
            "worst_span_ns": worst["dur_ns"],
            "worst_span_fraction": worst["fraction"],
            "worst_span_start_ns": worst["start_ns"],
            "stalling_streams": len(stream_ids),
        },
        # the stalled span time is lost to the rank's window: the overview places it there
        cost=cost_over(lost_ns, analysed_window_ns(ctx).get(rank)),
        evidence=evidence,
        phases=_phases(ctx, rank, stalled),
        series={
            "stream": worst_streams["stream_id"].to_list(),
            "wait_ns_in_worst_span": worst_streams["wait_ns"].to_list(),
        },
        score=float(lost_ns),
    )


def _phases(ctx: RuleContext, rank: int, spans: pl.DataFrame) -> list[str]:
    """The phases of the steps the stalled spans start in (a KV load before a prefill, ...)."""
    starts = spans.select(pl.lit(rank).alias("rank"), "session", "start_ns")
    return phases_in(phase_at(ctx, starts))


# --------------------------------------------------------------------------------------------
# Presentation: a stream Gantt of the worst span, key figures of transfer time, marks
# --------------------------------------------------------------------------------------------

WAIT_COLORS = {"NOTIFY_WAIT": "#dc2626", "EVENT_WAIT": "#f97316"}
SPAN_COLOR, TASK_COLOR = "#1d4ed8", "#94a3b8"
MAX_STREAM_ROWS = 24
PAD = 0.06  # share of the span shown before and after it


def _worst_span(finding: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """rank, session, start_ns, dur_ns, name of the worst stalled span (an evidence row)."""
    start = (finding.get("metrics") or {}).get("worst_span_start_ns")
    spans = [e for e in finding.get("evidence") or [] if e.get("stream") is None]
    return next((e for e in spans if start is None or e.get("start_ns") == start), None) or (
        spans[0] if spans else None
    )


@store_transfer_stall.figure(
    caption="Device streams during the worst transfer span (shaded). Red: NOTIFY_WAIT, "
    "orange: EVENT_WAIT; ◀ marks the streams that stall the transfer."
)
def _figure(fig: FigureContext) -> Chart | None:
    span = _worst_span(fig.finding)
    if span is None or span.get("start_ns") is None or fig.store is None:
        return None
    p = fig.params
    start, dur = int(span["start_ns"]), int(span["dur_ns"] or 1)
    lo, hi = start - int(dur * PAD), start + dur + int(dur * PAD)  # what happens around it
    tasks = (
        fig.store.table("slices")
        .filter(
            (pl.col("rank") == span["rank"])
            & (pl.col("session") == span["session"])
            & pl.col("process").is_in(DEVICE_PROCESSES)
            & pl.col("stream_id").is_not_null()
            & (pl.col("start_ns") < hi)
            & (pl.col("end_ns") > lo)
        )
        .select("process", "stream_id", "name", "task_type", "start_ns", "end_ns")
        .collect()
    )
    stalling = set((fig.finding.get("series") or {}).get("stream") or [])
    scale = 1e6 if dur < 5e9 else 1e9  # ms for short spans, s for long ones
    unit = "ms" if scale == 1e6 else "s"

    def rel(ns: int) -> float:
        return (ns - start) / scale

    rows: dict[tuple[str, int], list[tuple[str, float, float]]] = {}
    copying: set[tuple[str, int]] = set()
    for process, stream, name, task_type, s, e in tasks.iter_rows():
        is_wait = task_type in p.wait_task_types or name in p.wait_names
        kind = _wait_kind(name, task_type) if is_wait else "task"
        s, e = max(s, lo), min(e, hi)  # a wait of the previous span must not stretch the axis
        rows.setdefault((process, int(stream)), []).append((kind, rel(s), (e - s) / scale))
        if name in p.own_task_names or task_type in p.own_task_types:
            copying.add((process, int(stream)))
    # stalling streams first, then the others by id; cap the row count
    keys = sorted(rows, key=lambda k: (k[1] not in stalling, k[1], k[0]))[:MAX_STREAM_ROWS]
    fig_h = min(1.2 + 0.32 * (len(keys) + 1), 9.0)
    figure, (ax,) = fig.new(9.0, fig_h)  # the margins fit the stream labels and the legend
    ax.grid(axis="y", visible=False)
    labels = [f"host: {span.get('name') or 'transfer'}"]
    ax.broken_barh([(0, dur / scale)], (-0.35, 0.7), facecolors=SPAN_COLOR)
    for y, key in enumerate(keys, start=1):
        process, stream = key
        prefix = "" if process == HARDWARE_PROCESS else f"{process} "
        mark = "  ◀ stalls" if stream in stalling else "  (copies)" if key in copying else ""
        labels.append(f"{prefix}stream {stream}{mark}")
        by_kind: dict[str, list[tuple[float, float]]] = {}
        for kind, x, w in rows[key]:
            by_kind.setdefault(kind, []).append((x, max(w, dur / scale / 800)))
        for kind, bars in by_kind.items():
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=WAIT_COLORS.get(kind, TASK_COLOR))
    ax.axvspan(0, dur / scale, color="#fde68a", alpha=0.35, zorder=0)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.4, -0.6)
    ax.set_xlim(rel(lo), rel(hi))
    ax.set_xlabel(f"{unit} from span start (rank {span['rank']})", fontsize=9)
    ax.set_title(f"worst transfer span: {span.get('name')} ({dur / 1e6:,.1f} ms)", fontsize=10)
    legend = [
        ("transfer span (host)", SPAN_COLOR),
        *WAIT_COLORS.items(),
        ("other task", TASK_COLOR),
    ]
    ax.legend(
        handles=[Swatch(color, label) for label, color in legend],
        fontsize=7,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    if len(rows) > len(keys):
        ax.text(1.0, 1.02, f"{len(rows) - len(keys)} more streams not shown", ha="right",
                transform=ax.transAxes, fontsize=7, color="#6b7280")  # fmt: skip
    return figure


@store_transfer_stall.key_figures(
    KeyFigure("transfer_spans", "transfer spans", unit="count"),
    KeyFigure("transfer_ns_mean", "transfer span time (mean)", better="lower", unit="ns"),
    KeyFigure("transfer_ns_total", "transfer span time (total)", better="lower", unit="ns"),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """The transfer spans the rule judges (host spans, or marked session windows), per rank."""
    return (
        ctx.once(_transfer_spans)
        .group_by("rank")
        .agg(
            pl.len().alias("transfer_spans"),
            pl.col("dur_ns").mean().alias("transfer_ns_mean"),
            pl.col("dur_ns").sum().alias("transfer_ns_total"),
        )
    )


@store_transfer_stall.marks
def _marks(finding: Mapping[str, Any]) -> Iterator[Mark]:
    """The evidence rows: transfer spans, and the waits on the stalling streams."""
    for mark in evidence_marks(finding):
        yield replace(mark, category="span" if mark.args.get("stream") is None else "wait")
