"""TA013 kv-transfer-overlap: PD disaggregation's KV transfer serialized with the forward."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    COMPUTE_TASK_TYPES,
    HOST_MARKED_STEPS,
    NOT_HOST_PROCESSES,
    NS,
    SHARE,
    Evidence,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    Requirement,
    RuleContext,
    analysed_window_ns,
    cost_over,
    covered_fraction,
    first_match,
    kernel_tasks,
    outermost,
    phase_windows,
    rule,
    window_of,
    window_share,
)
from traceanalyzer.kit import text as fmt

SEND = r"batch_transfer_(?:sync|async)_write|transfer_sync_write"
RECEIVE = r"batch_transfer_(?:sync|async)_read|transfer_sync_read|pull_blocks"
NO_FORWARD = r"kv_connector_no_forward"
# the iterations whose KV a prefill instance sends (a prefill without a known phase too)
PREFILL_PHASES = ("prefill", "mixed", "unknown")
# the steps a decode instance's wait for KV is made of: no-forward iterations, the gaps between
# them, and the dummy batches a data-parallel engine runs after each
WAIT_PHASES = ("idle", "dummy")
COLLECT = (
    "the Python tracer on the prefill and decode workers (with_modules or with_stack, "
    "vllm-ascend's default; not torch_profiler_with_stack=false), so the KV connector's "
    "threads and kv_connector_no_forward are recorded"
)
EVIDENCE_SHOWN = 5
FIX = {
    "serialized": (
        "send each layer's KV as soon as it is computed: with the layerwise connector "
        "(MooncakeLayerwiseConnector) the forward records one NPU event per layer and the "
        "sending thread pushes that layer while the next ones compute; check that the sending "
        "thread waits on each layer's event, not on the whole forward's, and that nothing in "
        "the connector synchronizes the device before the first send."
    ),
    "blocking": (
        "move the sends off the forward thread: here the forward waits on each layer's event "
        "and sends it itself (a synchronous save_kv_layer / wait_for_save), so the device "
        "idles for every send; the layerwise connector's sending thread does this beside the "
        "forward."
    ),
    "decode": (
        "the decode instance has nothing to run while its requests' KV arrives: overlap the "
        "transfer with decoding (pull while other requests run; async scheduling), speed up "
        "the transfer (Mooncake's ascend transport, ADXL, and the links it uses), and, when "
        "the prefill instances are the bottleneck, rebalance the prefill:decode instance ratio."
    ),
}


@rule(
    id="TA013",
    name="kv-transfer-overlap",
    severity="warning",
    summary="PD disaggregation: KV sends that follow or block the prefill forward, and decode "
    "iterations that wait for KV with no forward to run.",
    fix="Overlap the KV transfer with compute: layerwise sends on the connector's thread on the "
    "prefill side; decoding other requests while the KV arrives on the decode side.",
    params={
        "send_pattern": Param(SEND, "Regex on host span names of the KV connector's sends."),
        "receive_pattern": Param(RECEIVE, "Regex on host span names of its reads (pulls)."),
        "no_forward_pattern": Param(
            NO_FORWARD, "Regex on host span names of an execute_model that runs no forward."
        ),
        "forward_function": Param(
            r"\.py\(\d+\): execute_model$",
            "Regex on host span names that run the forward: a send on their thread blocks it.",
        ),
        "burst_gap_us": Param(
            50.0,
            "Sends on one thread less than this apart (µs) are one burst, placed in the "
            "iteration its first send starts in (a serialized burst runs on into the next one).",
        ),
        "min_after_share": Param(
            0.5,
            "A prefill iteration's sends follow its forward when at least this share of their "
            "time comes after its device work ended.",
        ),
        "min_share": Param(
            0.05,
            "Prefill side: report when the cost is at least this share of the prefill "
            "iterations' time.",
        ),
        "min_wait_share": Param(
            0.02,
            "Decode side: report when the waits for KV are at least this share of the wall "
            "time (every ms of it is added to the waiting requests' TTFT).",
        ),
        "min_iterations": Param(
            2, "... in at least this many prefill iterations, or no-forward waits."
        ),
    },
    requires=[
        Requirement(
            "slices",
            ("name",),
            what="KV connector events (`batch_transfer_sync_write`/`_read`, "
            "`kv_connector_no_forward`)",
            collect_with=COLLECT,
            where=~pl.col("process").is_in(NOT_HOST_PROCESSES)
            & pl.col("name").str.contains(f"{SEND}|{RECEIVE}|{NO_FORWARD}"),
        )
    ],
    units={
        "prefill_share": SHARE,
        "after_ns": NS,
        "blocked_ns": NS,
        "send_ns": NS,
        "wait_ns_max": NS,
    },
)
def kv_transfer_overlap(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    KV-cache transfers of prefill/decode (PD) disaggregation that run serialized with the
    forward instead of beside it (vllm-ascend's Mooncake connectors, `serving_profiles.md` §4).
    - **Prefill side**: the connector's sends (host spans matching `send_pattern`:
      `batch_transfer_sync_write`, which the layerwise connector's sending thread calls after
      waiting on each layer's NPU event) are placed in the prefill iteration they start in
      (a burst of back-to-back sends, less than `burst_gap_us` apart, in the one its first
      send starts in: serialized sends run on while the next iteration begins).
      Their time after the iteration's last compute kernel ended is time the request's first
      token waits for its KV to reach the decode instance: when at least `min_after_share` of
      an iteration's send time comes after its device work, the sends **follow the forward**
      (serialized). A send on the forward's own thread (`forward_function`) **blocks it**: the
      device idles while it runs (the time no compute kernel covers).
    - **Decode side**: iterations that run no forward because their requests wait for KV
      (`kv_connector_no_forward`; the steps table labels them `idle`). The engine loops such
      iterations every few ms while the pull runs, so a **wait** is the whole window from the
      first of them to the start of the forward that follows (the KV has arrived), the idle
      gaps between them included; the pulls (`receive_pattern`: `batch_transfer_sync_read` on
      the receiving thread) during it are shown.
    `cost_ns` is, on the prefill side, the send time after the end of its iteration's device
    work plus the device time blocked by sends on the forward thread; on the decode side, the
    time of the waits; per rank (the finding sums its ranks). It fires when the cost is at
    least `min_share` of the prefill iterations' time, or `min_wait_share` of the decode
    instance's wall time, in at least `min_iterations` iterations or waits.

    ## Why it matters
    On the prefill instance the request's TTFT includes its KV transfer: sends that start only
    after the forward add their whole time to every long prompt (vllm-ascend #16984: prefill
    KV upload serialized with the forward, about 2x TTFT left on the table). On the decode
    instance an iteration without a forward is a whole engine step with nothing to decode.

    ## How to fix
    - Sends follow the forward: send layer by layer as each layer is computed (the layerwise
      connector: one NPU event per layer, the sending thread waits on it and pushes while the
      next layers compute); check that the sending thread waits on each layer's event, not on
      the whole forward.
    - Sends block the forward: move them off the forward thread (no synchronous
      `save_kv_layer` / `wait_for_save` in the forward).
    - Decode waits: overlap the transfer with decoding other requests, speed up the transfer
      (Mooncake's ascend transport, ADXL, the links), or rebalance prefill and decode
      instances when the prefills lag.

    ## Example
    ```
    TA013 kv-transfer-overlap [warning] rank 0 (1/2) (prefill)
    KV sends follow the prefill forward: 100% of the send time comes after the iteration's
    device work ended, in 6 of 6 prefill iterations: each waits 1.78 ms more for its KV (9.6%
    of the prefill time)
    ```
    Silent when the sends overlap the forward (only the last layer's send is left after it),
    when a decode instance never waits for KV, and on a profile without PD disaggregation
    (not evaluated: no connector events, with what to collect).

    ## References
    - vllm-ascend #16984 (prefill-side KV upload serialized with the forward compute,
      MooncakeConnectorV1 + use_ascend_direct).
    - vllm-ascend `mooncake_layerwise_connector.py` (one event per layer, the sending thread's
      `batch_transfer_sync_write`), `mooncake_connector.py` (the decode side's receiving
      thread, `batch_transfer_sync_read`), `model_runner_v1.py` (`kv_connector_no_forward`).
    """
    found = ctx.once(_connector)
    if found is None:
        raise NotEvaluated(
            "missing KV connector events (host spans matching send_pattern, receive_pattern "
            f"or no_forward_pattern) (collect with {COLLECT})"
        )
    sends, reads, waits = found
    windows = analysed_window_ns(ctx)
    steps = phase_windows(ctx)
    ranks = pl.concat([f.select("rank") for f in found])["rank"].unique().sort().to_list()
    for rank in ranks:
        mine = pl.col("rank") == rank
        if not sends.filter(mine).is_empty():
            yield from _prefill_side(ctx, rank, sends.filter(mine), steps.filter(mine), windows)
        if not waits.filter(mine).is_empty():
            yield from _decode_side(
                ctx, rank, waits.filter(mine), reads.filter(mine), steps.filter(mine), windows
            )
        elif not reads.filter(mine).is_empty():
            ctx.note(
                f"rank {rank}: {reads.filter(mine).height} KV reads and no iteration without a "
                "forward: the decode instance did not wait for them",
                rank=rank,
            )


def _connector(ctx: RuleContext) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The connector's sends and reads (outermost per thread) and no-forward iterations;
    None when the trace has none of them."""
    p = ctx.params
    spans = (
        ctx.table("slices")
        .filter(
            ~pl.col("process").is_in(NOT_HOST_PROCESSES)
            & (
                pl.col("name").str.contains(p.send_pattern)
                | pl.col("name").str.contains(p.receive_pattern)
                | pl.col("name").str.contains(p.no_forward_pattern)
            )
        )
        .select("rank", "session", "thread", "name", "start_ns", "end_ns")
        .collect()
    )
    if spans.is_empty():
        return None
    return (
        _outer(spans.filter(pl.col("name").str.contains(p.send_pattern))),
        _outer(spans.filter(pl.col("name").str.contains(p.receive_pattern))),
        spans.filter(pl.col("name").str.contains(p.no_forward_pattern)),
    )


def _outer(spans: pl.DataFrame) -> pl.DataFrame:
    """The outermost span per thread (a wrapper and the call it makes count once)."""
    if spans.is_empty():
        return spans
    return outermost(spans, by=("rank", "session", "thread")).join(
        spans.select("rank", "session", "thread", "start_ns", "end_ns", "name").unique(
            ["rank", "session", "thread", "start_ns", "end_ns"]
        ),
        on=["rank", "session", "thread", "start_ns", "end_ns"],
        how="left",
    )


# --------------------------------------------------------------------------- prefill side


def _sent(
    ctx: RuleContext, rank: int, sends: pl.DataFrame, steps: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, float] | str:
    """The rank's sends placed in their prefill iterations (``after_ns``, ``blocked_ns``), the
    iterations' sums, and the prefill iterations' time; or why they cannot be placed."""
    p = ctx.params
    iterations = (
        steps.filter(
            pl.col("step_source").is_in(HOST_MARKED_STEPS) & pl.col("phase").is_in(PREFILL_PHASES)
        )
        .select("rank", "session", "step", "phase", "start_ns", "end_ns")
        .sort("start_ns")
    )
    if iterations.is_empty():
        return (
            f"rank {rank}: {sends.height} KV sends but no prefill iteration marked on the host "
            "to place them in"
        )
    kernels = kernel_tasks(ctx.table("slices"), COMPUTE_TASK_TYPES, ranks=[rank])
    device = (
        _placed(kernels, iterations)
        .group_by("session", "step")
        .agg(pl.col("end_ns").max().alias("device_end"))
    )
    iterations = iterations.join(device, on=["session", "step"], how="left")
    forward_threads = set(
        ctx.table("slices")
        .filter((pl.col("rank") == rank) & pl.col("name").str.contains(p.forward_function))
        .select("thread")
        .unique()
        .collect()["thread"]
        .to_list()
    )
    gap = int(p.burst_gap_us * 1e3)
    bursts = (
        sends.sort("thread", "start_ns")
        .with_columns(
            (pl.col("start_ns") - pl.col("end_ns").shift(1).over("session", "thread") > gap)
            .fill_null(True)
            .cum_sum()
            .alias("_burst")
        )
        .with_columns(pl.col("start_ns").min().over("session", "thread", "_burst").alias("_first"))
    )
    placed = (
        bursts.sort("_first")
        .join_asof(
            iterations.select(
                "session",
                "step",
                "phase",
                pl.col("start_ns").alias("it_start"),
                pl.col("end_ns").alias("it_end"),
                "device_end",
            ),
            left_on="_first",
            right_on="it_start",
            by="session",
            strategy="backward",
            check_sortedness=False,
        )
        .drop("_burst", "_first")
        .filter(pl.col("device_end").is_not_null())
        .with_columns(
            (pl.col("end_ns") - pl.max_horizontal("start_ns", "device_end"))
            .clip(0)
            .alias("after_ns"),
            (pl.col("end_ns") - pl.col("start_ns")).alias("send_ns"),
            pl.col("thread").is_in(list(forward_threads)).alias("on_forward"),
        )
    )
    if placed.is_empty():
        return f"rank {rank}: {sends.height} KV sends, none in a prefill iteration with device work"
    placed = placed.with_columns(_blocked(placed, kernels).alias("blocked_ns"))
    per = (
        placed.group_by("session", "step")
        .agg(
            pl.col("phase").first(),
            pl.len().alias("sends"),
            pl.col("send_ns").sum(),
            pl.col("after_ns").sum(),
            pl.col("blocked_ns").sum(),
            (pl.col("it_end") - pl.col("it_start")).first().alias("it_ns"),
        )
        .with_columns((pl.col("after_ns") / pl.col("send_ns")).alias("after_share"))
        .sort("session", "step")
    )
    prefill_ns = float(
        (iterations["end_ns"] - iterations["start_ns"]).sum()  # type: ignore[operator]
    )
    return placed, per, prefill_ns


def _prefill_side(
    ctx: RuleContext, rank: int, sends: pl.DataFrame, steps: pl.DataFrame, windows: dict
) -> Iterator[Finding]:
    p = ctx.params
    sent = _sent(ctx, rank, sends, steps)
    if isinstance(sent, str):
        ctx.inconclusive(sent, rank=rank)
        return
    placed, per, prefill_ns = sent
    after, blocked = float(per["after_ns"].sum()), float(per["blocked_ns"].sum())
    serialized = per.filter(pl.col("after_share") >= p.min_after_share)
    blocking = per.filter(pl.col("blocked_ns") > 0)
    cost = after + blocked
    share = cost / prefill_ns if prefill_ns else 0.0
    how = "blocking" if blocked >= after else "serialized"
    counted = blocking if how == "blocking" else serialized
    if share < p.min_share or counted.height < p.min_iterations:
        ctx.note(
            f"rank {rank}: KV sends overlap the prefill forward: {fmt.duration(after)} of "
            f"{fmt.duration(float(per['send_ns'].sum()))} send time after the device work in "
            f"{per.height} prefill iterations ({serialized.height} with at least "
            f"{p.min_after_share:.0%} after it), {fmt.duration(blocked)} blocking the forward; "
            f"{share:.1%} of the prefill time (min_share {p.min_share:.0%})",
            rank=rank,
            cost_share=share,
        )
        return
    n = per.height
    sends_per = float(per["sends"].mean())  # type: ignore[arg-type]
    per_it = cost / n
    if how == "blocking":
        title = (
            f"KV sends block the prefill forward: the forward thread sends each layer's KV "
            f"itself and the device idles {fmt.duration(blocked / n)} per iteration for it, in "
            f"{blocking.height} of {n} prefill iterations ({share:.1%} of the prefill time)"
        )
    else:
        title = (
            f"KV sends follow the prefill forward: "
            f"{after / float(per['send_ns'].sum()):.0%} of the send time comes after the "
            f"iteration's device work ended, in {serialized.height} of {n} prefill iterations: "
            f"each waits {fmt.duration(per_it)} more for its KV ({share:.1%} of the prefill "
            "time)"
        )
    started = placed.filter(pl.col("start_ns") < pl.col("device_end")).height
    lines = [
        f"{placed.height} KV sends ({sends_per:.0f} per iteration, "
        f"{fmt.duration(float(per['send_ns'].sum()) / n)} per iteration) in {n} prefill "
        f"iterations; {started} of them start before the iteration's device work ends.",
        f"After the device work: {fmt.duration(after)} in all ({fmt.duration(after / n)} per "
        f"iteration): the request's first token waits for it.",
        f"Blocking the forward (sends on the forward's thread while the device idles): "
        f"{fmt.duration(blocked)} in all.",
        f"Cost: {fmt.duration(cost)}, {share:.1%} of the {n} prefill iterations' time "
        f"({fmt.duration(prefill_ns)}).",
    ]
    yield ctx.finding(
        rank=rank,
        sessions=sorted(placed["session"].unique().to_list()),
        title=title,
        message="\n".join(lines),
        location={"side": "prefill", "how": how},
        phases=sorted({ph for ph in per["phase"].to_list() if ph != "unknown"}),
        cost=cost_over(cost, windows.get(rank)),
        metrics={
            "prefill_share": share,
            "after_ns": after,
            "blocked_ns": blocked,
            "send_ns": float(per["send_ns"].sum()),
            "iterations": n,
            "serialized_iterations": serialized.height,
            "blocking_iterations": blocking.height,
            "sends": placed.height,
        },
        evidence=_send_evidence(placed),
        fix=FIX[how],
        series={
            "step": per["step"].to_list(),
            "after_ns": per["after_ns"].to_list(),
            "blocked_ns": per["blocked_ns"].to_list(),
            "send_ns": per["send_ns"].to_list(),
        },
        score=cost,
    )


def _placed(kernels: pl.DataFrame, iterations: pl.DataFrame) -> pl.DataFrame:
    """Kernels with the iteration (session, step) they start in."""
    return (
        kernels.sort("start_ns")
        .join_asof(
            iterations.select(
                "session", "step", pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we")
            ),
            left_on="start_ns",
            right_on="_ws",
            by="session",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("start_ns") < pl.col("_we"))
    )


def _blocked(placed: pl.DataFrame, kernels: pl.DataFrame) -> pl.Series:
    """Per send (in ``placed``' order): its time on the forward's thread, inside its iteration
    before the device work ends, that no compute kernel covers (the device waits for it)."""
    inside = placed.with_row_index("_send").select(
        "_send",
        "rank",
        "session",
        pl.max_horizontal("start_ns", "it_start").alias("start_ns"),
        pl.when(pl.col("on_forward"))
        .then(pl.min_horizontal("end_ns", "device_end"))
        .otherwise(pl.max_horizontal("start_ns", "it_start"))
        .alias("end_ns"),
    )
    inside = inside.with_columns(pl.max_horizontal("start_ns", "end_ns").alias("end_ns"))
    covered = covered_fraction(
        inside, kernels.select("rank", "session", "start_ns", "end_ns"), span_id="_send"
    ).sort("_send")
    return covered["end_ns"] - covered["start_ns"] - covered["covered_ns"]


def _send_evidence(placed: pl.DataFrame) -> list[Evidence]:
    """The sends that leave most time after (or block) their iteration's forward."""
    worst = placed.with_columns((pl.col("after_ns") + pl.col("blocked_ns")).alias("_cost"))
    return [
        Evidence(
            rank=r["rank"],
            session=r["session"],
            name=r["name"],
            thread=r["thread"],
            start_ns=r["start_ns"],
            dur_ns=r["send_ns"],
            detail=f"step {r['step']}: {fmt.duration(r['after_ns'])} after the device work "
            f"ended, {fmt.duration(r['blocked_ns'])} blocking the forward",
        )
        for r in worst.sort("_cost", descending=True).head(EVIDENCE_SHOWN).iter_rows(named=True)
    ]


# --------------------------------------------------------------------------- decode side


def _decode_side(
    ctx: RuleContext,
    rank: int,
    waits: pl.DataFrame,
    reads: pl.DataFrame,
    steps: pl.DataFrame,
    windows: dict,
) -> Iterator[Finding]:
    p = ctx.params
    periods = _waits(waits, steps)
    wall = windows.get(rank)
    cost = float(periods["wait_ns"].sum()) if periods.height else 0.0
    share = window_share(cost, wall) or 0.0
    if share < p.min_wait_share or periods.height < p.min_iterations:
        ctx.note(
            f"rank {rank}: {waits.height} iterations without a forward in {periods.height} "
            f"wait(s) for KV, {fmt.duration(cost)}: {share:.1%} of the wall time "
            f"(min_wait_share {p.min_wait_share:.0%}, min_iterations {p.min_iterations})",
            rank=rank,
            cost_share=share,
        )
        return
    during = (
        reads.join_where(
            periods.select("session", pl.col("start_ns").alias("w0"), pl.col("end_ns").alias("w1")),
            pl.col("session") == pl.col("session_right"),
            pl.col("start_ns") < pl.col("w1"),
            pl.col("end_ns") > pl.col("w0"),
            suffix="_right",
        )
        if reads.height
        else reads
    )
    found = first_match(p.receive_pattern, str(reads["name"][0])) if reads.height else None
    read = found or "KV reads"
    pulls = (
        f"; KV reads ({read}) overlap them: {during.height}, "
        f"{fmt.duration(float((during['end_ns'] - during['start_ns']).mean()))} each (mean)"
        if during.height
        else "; no KV read on this rank (pushed by the prefill instance, or not recorded)"
    )
    n = int(periods["iterations"].sum())
    title = (
        f"the decode instance waits for KV: {n} iterations without a forward "
        f"(kv_connector_no_forward) in {periods.height} waits, {fmt.duration(cost)} "
        f"({share:.1%} of the wall time)"
    )
    lines = [
        f"{n} iterations ran no forward because their requests waited for their KV cache; "
        f"between two forwards they make {periods.height} waits of "
        f"{fmt.duration(cost / periods.height)} on average (longest "
        f"{fmt.duration(float(periods['wait_ns'].max()))}){pulls}.",  # type: ignore[arg-type]
        f"Cost: {fmt.duration(cost)}, {share:.1%} of the rank's wall time"
        + (f" ({fmt.duration(wall)})." if wall else "."),
    ]
    yield ctx.finding(
        rank=rank,
        sessions=sorted(periods["session"].unique().to_list()),
        title=title,
        message="\n".join(lines),
        location={"side": "decode"},
        phases=["idle"],
        cost=cost_over(cost, wall),  # unknown without a window: n/a, not the 0 judged above
        metrics={
            "no_forward_iterations": n,
            "waits": periods.height,
            "wait_ns_max": float(periods["wait_ns"].max()),  # type: ignore[arg-type]
            "reads": during.height,
        },
        evidence=[
            Evidence(
                rank=rank,
                session=w["session"],
                name="waiting for KV",
                start_ns=w["start_ns"],
                dur_ns=w["wait_ns"],
                detail=f"{w['iterations']} iterations without a forward",
            )
            for w in periods.sort("wait_ns", descending=True)
            .head(EVIDENCE_SHOWN)
            .iter_rows(named=True)
        ],
        fix=FIX["decode"],
        series={
            "start_ns": periods["start_ns"].to_list(),
            "wait_ns": periods["wait_ns"].to_list(),
        },
        score=cost,
    )


def _waits(waits: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """The no-forward iterations merged into waits for KV: each from the first no-forward
    iteration of a run of idle steps to the start of the forward that follows it (the KV has
    arrived), the idle gaps between them included: the engine loops without a forward every
    few ms while the pull runs (a data-parallel engine a dummy batch after each), and all of
    that time the requests wait. A run the profile ends in ends with its last step. session, start_ns, end_ns, wait_ns, iterations."""
    # a run ends at a forward that serves requests: with data parallelism a dummy batch
    # follows each no-forward iteration (execute_dummy_batch), and it is part of the wait
    serving = ~pl.col("phase").is_in(WAIT_PHASES)
    ordered = steps.sort("session", "start_ns").with_columns(
        serving.cum_sum().over("session").alias("_run")
    )
    # the forward that ends a run: the next run's first step
    forwards = ordered.filter(serving).select(
        "session", (pl.col("_run") - 1).alias("_run"), pl.col("start_ns").alias("_next")
    )
    last_idle = ordered.group_by("session", "_run").agg(pl.col("end_ns").max().alias("_last"))
    marked = window_of(
        waits, ordered, by=["session"], keep=["_run", "phase"], bounds=("_ws", "_we")
    ).filter(pl.col("phase").is_in(WAIT_PHASES))
    return (
        marked.group_by("session", "_run")
        .agg(pl.col("_ws").min().alias("start_ns"), pl.len().alias("iterations"))
        .join(forwards, on=["session", "_run"], how="left")
        .join(last_idle, on=["session", "_run"], how="left")
        .with_columns(pl.coalesce("_next", "_last").alias("end_ns"))
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("wait_ns"))
        .select("session", "start_ns", "end_ns", "wait_ns", "iterations")
        .sort("session", "start_ns")
    )


# --------------------------------------------------------------------------- presentation


@kv_transfer_overlap.key_figures(
    KeyFigure(
        "kv_exposed_ns_per_prefill",
        "KV send time after (or blocking) the forward, per prefill iteration",
        better="lower",
        unit="ns",
    ),
    KeyFigure(
        "kv_wait_share", "wall time waiting for KV with no forward", better="lower", unit="ratio"
    ),
)
def _key_figures(ctx: RuleContext) -> list[dict[str, Any]]:
    """Per rank: the prefill side's exposed send time per iteration, the decode side's share
    of the wall time in no-forward waits."""
    found = ctx.once(_connector)
    if found is None:
        return []
    sends, _reads, waits = found
    steps, windows = phase_windows(ctx), analysed_window_ns(ctx)
    rows = []
    for rank in sorted(set(sends["rank"].to_list()) | set(waits["rank"].to_list())):
        mine = pl.col("rank") == rank
        exposed = wait = None
        if sends.filter(mine).height:
            sent = _sent(ctx, rank, sends.filter(mine), steps.filter(mine))
            if not isinstance(sent, str):
                per = sent[1]
                exposed = float(per["after_ns"].sum() + per["blocked_ns"].sum()) / per.height
        if waits.filter(mine).height:
            periods = _waits(waits.filter(mine), steps.filter(mine))
            wait = window_share(float(periods["wait_ns"].sum()), windows.get(rank))
        rows.append({"rank": rank, "kv_exposed_ns_per_prefill": exposed, "kv_wait_share": wait})
    return rows
