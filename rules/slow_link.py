"""TA019 slow-link: links whose bandwidth on large transfers is well below their peers' of the
same transport type."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.kit import (
    COMMUNICATION_PROCESSES,
    NOTIFY_WAIT_NAMES,
    RATIO,
    AnyOf,
    Evidence,
    Finding,
    KeyFigure,
    Param,
    Requirement,
    RuleContext,
    analysed_window_ns,
    cost_over,
    rule,
)
from traceanalyzer.kit import text as fmt

LOCAL = "LOCAL"  # a rank's copy to itself: no link
# a plane task that moves no data (the transfers are the rest)
NOT_TRANSFERS = (*NOTIFY_WAIT_NAMES, "Notify_Record", "Notify Record", "Write Value")
# communication_matrix.json's aggregate keys: `allreduce-top1`, ..., `allreduce-total`
OP_KEY_RANK, TOTAL = r"-(?:top\d+|middle|bottom\d+|total)$", "-total"
DST_RANK = r'"dst rank"\s*:\s*"?(-?\d+)'
LINK_TYPE = r'"link type"\s*:\s*"([A-Za-z]+)"'
LINK_SCHEMA = {
    "src_rank": pl.Int64, "dst_rank": pl.Int64, "transport": pl.String, "size_mb": pl.Float64,
    "time_ns": pl.Int64, "transfers": pl.UInt32, "source": pl.String,
}  # fmt: skip
EVIDENCE_LINKS = 6


@rule(
    id="TA019",
    name="slow-link",
    severity="warning",
    scope="global",
    summary="A link moves large transfers well below the bandwidth of its peers of the same "
    "transport type: every collective that crosses it is slow on every rank alike.",
    fix="Check the named links: their HCCS / RDMA port, cable, NIC and switch port, and the "
    "link's error counters (`hccn_tool -i N -link_stat`, `-stat`); compare with a healthy peer.",
    params={
        "min_size_mb": Param(
            1.0,
            "Transfers smaller than this (MB, per link and op) are latency-bound: not judged.",
        ),
        "slow_ratio": Param(
            0.5, "A link is slow below this share of its peers' median bandwidth (0.5)."
        ),
        "min_links": Param(3, "Links of one transport type needed to have peers to compare."),
        "min_transfers": Param(
            2,
            "A link is judged with at least this many entries of large transfers (a step's op "
            "type, or an op).",
        ),
    },
    requires=[
        AnyOf(
            Requirement(
                "comm_links",
                ("transit_size_mb", "transit_ns"),
                what="per-link transfers (communication_matrix.json)",
                collect_with="profiler_level=Level1 in a multi-rank job",
            ),
            Requirement(
                "slices",
                ("memcpy_size",),
                what="the collectives' transfer tasks on the communication planes",
                collect_with="profiler_level=Level1 in a multi-rank job",
                where=pl.col("process").is_in(COMMUNICATION_PROCESSES),
            ),
        )
    ],
    units={"ratio": RATIO},
)
def slow_link(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Links whose bandwidth on **large** transfers is well below their peers' of the same
    transport type (HCCS, RDMA, SIO, PCIE), with no nominal figure needed. Per directed link
    (`src-dst`, from each rank's own export) it sums the size and time of its transfers of at
    least `min_size_mb` (smaller ones are latency-bound and not judged) from
    communication_matrix.json's per-op entries (`CommAnalyzerMatrix` in a Db export), or, for
    a rank without them, from the collectives' transfer tasks on the communication planes
    (their `size(Byte)`, `dst rank` and `link type`). A link is slow when its bandwidth is
    below `slow_ratio` of the median of the links of its transport type (at least
    `min_links` of them, each with `min_transfers` large transfers). `cost_ns` is the time its
    transfers took beyond what the peers' median bandwidth would have taken. One finding per
    transport type names every slow link (`links`: `["1-2", "2-1"]`).

    ## Why it matters
    A collective completes when its slowest transfer is done: one degraded link (a bad cable,
    a port renegotiated at a lower speed, retransmissions) makes every all-reduce, all-to-all
    or MC2 exchange that crosses it slow on **every** rank alike, with no late rank to blame,
    so stragglers and slow ranks stay silent while the whole job runs at that link's pace.

    ## How to fix
    - Check the named links' ports and cables; read their error and retransmission counters
      (`hccn_tool -i N -link_stat` / `-stat`, RoCE NIC counters) against a healthy peer's.
    - On RDMA: the NIC's negotiated speed, PFC / ECN settings, the switch port.
    - Re-run with the job moved off the link to confirm.

    ## Example
    ```
    TA019 slow-link [warning] ranks 1, 2
    HCCS links 1-2, 2-1 move large transfers at 10.7 GB/s, 0.25x the median of the 12 HCCS
    links (42.9 GB/s): their 56 transfers took 8.2 ms more than at the peers' bandwidth
    ```
    Silent on small, latency-bound transfers, and when every link of a type is equally slow
    (nothing to compare it with): that is said as information, with the links' median
    bandwidth, as is a transport with too few links to judge.

    ## References
    - msprof-analyze `slow_link` (cluster analysis: each link's bandwidth against its peers')
      and the advisor's communication checks (packet sizes, bandwidth contention).
    - HCCL `hccn_tool` link statistics.
    """
    p = ctx.params
    links = ctx.once(_links)
    if links.is_empty():
        ctx.note(
            f"no transfer of at least {p.min_size_mb:g} MB on a link to another rank "
            "(latency-bound transfers are not judged)"
        )
        return
    judged = links.filter(pl.col("transfers") >= p.min_transfers).with_columns(
        (pl.col("size_mb") / (pl.col("time_ns") / 1e6)).alias("gbps")  # MB per ms is GB/s
    )
    windows = analysed_window_ns(ctx)
    for (transport,), peers in judged.group_by("transport", maintain_order=True):
        if peers.height < p.min_links:
            ctx.note(
                f"{transport}: {fmt.count(peers.height, 'link')} with large transfers, fewer than "
                f"{p.min_links} to compare (min_links)"
            )
            continue
        median = float(peers["gbps"].median())  # type: ignore[arg-type]
        slow = peers.filter(pl.col("gbps") < p.slow_ratio * median)
        if slow.is_empty():
            ctx.note(
                f"{transport}: {peers.height} links move large transfers at "
                f"{peers['gbps'].min():.3g}-{peers['gbps'].max():.3g} GB/s (median {median:.3g} "
                f"GB/s): no link below {p.slow_ratio:.0%} of its peers'; if that is slow for "
                "the hardware, every link is equally slow (nothing here to compare it with)",
                links=peers.height,
                median_gbps=median,
            )
            continue
        yield _finding(ctx, str(transport), slow, peers, median, windows)


def _links(ctx: RuleContext) -> pl.DataFrame:
    """Per directed link: its large transfers' size and time, from communication_matrix.json
    where a rank has it, else from its planes' transfer tasks."""
    p = ctx.params
    from_matrix = _from_matrix(ctx, p.min_size_mb)
    listed = from_matrix["rank"].unique().to_list() if from_matrix.height else []
    from_tasks = _from_tasks(ctx, p.min_size_mb, listed)
    frames = [f.drop("rank") for f in (from_matrix, from_tasks) if f.height]
    if not frames:
        return pl.DataFrame(schema=LINK_SCHEMA)
    return (
        pl.concat(frames, how="vertical_relaxed")
        .group_by("src_rank", "dst_rank", "transport", "source")
        .agg(pl.col("size_mb", "time_ns", "transfers").sum())
        .sort("transport", "src_rank", "dst_rank")
        .select(list(LINK_SCHEMA))
        .cast(LINK_SCHEMA)  # type: ignore[arg-type]
    )


def _from_matrix(ctx: RuleContext, min_mb: float) -> pl.DataFrame:
    """communication_matrix.json's links to another rank: per step, op type and group, the
    ``-total`` entry (every op of the type) where its per-op entries (top1, middle, bottom...)
    are large transfers; else those entries themselves (an op listed twice counted once)."""
    rows = (
        ctx.table("comm_links")
        .filter(
            (pl.col("src_rank") != pl.col("dst_rank"))
            & (pl.col("transport_type") != LOCAL)
            & (pl.col("transit_ns") > 0)
        )
        .with_columns(pl.col("op_key").str.replace(OP_KEY_RANK, "").alias("_type"))
        .collect()
    )
    key = ["rank", "session", "step", "group", "_type", "src_rank", "dst_rank"]
    per_op = rows.filter(pl.col("op_name").is_not_null()).unique(
        ["rank", "session", "step", "op_name", "src_rank", "dst_rank"]
    )
    large = (
        per_op.group_by(key)
        .agg(pl.col("transit_size_mb").median().alias("_op_mb"), pl.len().alias("_ops"))
        .filter(pl.col("_op_mb") >= min_mb)
    )
    totals = rows.filter(pl.col("op_key").str.ends_with(TOTAL)).join(
        large, on=key, nulls_equal=True
    )
    alone = per_op.filter(pl.col("transit_size_mb") >= min_mb).join(
        totals.select(key), on=key, how="anti", nulls_equal=True
    )
    columns = [
        "rank", "src_rank", "dst_rank", pl.col("transport_type").alias("transport"),
        pl.col("transit_size_mb").alias("size_mb"), pl.col("transit_ns").alias("time_ns"),
        pl.lit("communication_matrix.json").alias("source"),
    ]  # fmt: skip
    return pl.concat(
        [
            totals.select(*columns, pl.col("_ops").alias("transfers")),
            alone.select(*columns, pl.lit(1, pl.UInt32).alias("transfers")),
        ]
    )


def _from_tasks(ctx: RuleContext, min_mb: float, listed: list[int]) -> pl.DataFrame:
    """The planes' transfer tasks of the ranks without communication_matrix.json."""
    if set(ctx.scope_ranks()) <= set(listed):
        return pl.DataFrame()
    return (
        ctx.table("slices")
        .filter(
            pl.col("process").is_in(COMMUNICATION_PROCESSES)
            & ~pl.col("rank").is_in(listed)
            & pl.col("task_type").is_not_null()
            & ~pl.col("name").is_in(NOT_TRANSFERS)
            & (pl.col("memcpy_size") >= min_mb * 1e6)
            & (pl.col("dur_ns") > 0)
        )
        .select(
            "rank",
            pl.col("rank").cast(pl.Int64).alias("src_rank"),
            pl.col("args").str.extract(DST_RANK, 1).cast(pl.Int64, strict=False).alias("dst_rank"),
            pl.col("args").str.extract(LINK_TYPE, 1).alias("transport"),
            (pl.col("memcpy_size") / 1e6).alias("size_mb"),
            pl.col("dur_ns").alias("time_ns"),
            pl.lit("transfer tasks").alias("source"),
            pl.lit(1, pl.UInt32).alias("transfers"),
        )
        .filter(
            pl.col("dst_rank").is_not_null()
            & (pl.col("dst_rank") != pl.col("src_rank"))
            & pl.col("transport").is_not_null()
            & (pl.col("transport") != LOCAL)
        )
        .collect()
    )


def _finding(
    ctx: RuleContext,
    transport: str,
    slow: pl.DataFrame,
    peers: pl.DataFrame,
    median: float,
    windows: dict[int, int],
) -> Finding:
    p = ctx.params
    slow = slow.with_columns(
        (pl.col("time_ns") - pl.col("size_mb") / median * 1e6).clip(0).alias("extra_ns")
    ).sort("gbps")
    names = [f"{s}-{d}" for s, d in slow.select("src_rank", "dst_rank").iter_rows()]
    ranks = sorted(set(slow["src_rank"].to_list()))
    cost = float(slow["extra_ns"].sum())
    bandwidth = float(slow["size_mb"].sum() / (slow["time_ns"].sum() / 1e6))
    transfers = int(slow["transfers"].sum())
    window = sum(windows.get(r, 0) for r in ranks)
    many = len(names) > 1
    title = (
        f"{transport} link{'s' if many else ''} {fmt.join(names, 6)} move{'' if many else 's'} large "
        f"transfers at {bandwidth:.3g} GB/s, {bandwidth / median:.2g}x the median of the "
        f"{peers.height} {transport} links ({median:.3g} GB/s): {'their' if many else 'its'} transfers took "
        f"{fmt.duration(cost)} more than at the peers' bandwidth"
    )
    lines = [
        f"Per directed link, the transfers of at least {p.min_size_mb:g} MB (smaller ones are "
        f"latency-bound), from {fmt.join(sorted(set(peers['source'].to_list())))}:",
        *(
            f"- {s}-{d}: {g:.3g} GB/s ({mb:.4g} MB in {fmt.duration(t)})"
            for s, d, g, n, mb, t in slow.select(
                "src_rank", "dst_rank", "gbps", "transfers", "size_mb", "time_ns"
            ).iter_rows()
        ),
        f"Its peers ({transport}, {peers.height} links): {peers['gbps'].min():.3g}-"
        f"{peers['gbps'].max():.3g} GB/s, median {median:.3g} GB/s.",
        "Every collective that crosses the link waits for it on every rank: no rank is late, "
        "the link is.",
    ]
    return ctx.finding(
        rank=ranks,
        title=title,
        message="\n".join(lines),
        location={"transport": transport, "links": ",".join(names)},
        metrics={
            "links": names,
            "transport": transport,
            "bandwidth_gbps": bandwidth,
            "peers_gbps": median,
            "ratio": bandwidth / median if median else None,
            "transfers": transfers,
        },
        cost=cost_over(cost, window),
        evidence=[
            Evidence(
                rank=int(s),
                session="",
                name=f"link {s}-{d} ({transport})",
                detail=f"{g:.3g} GB/s against the peers' {median:.3g} GB/s",
            )  # fmt: skip
            for s, d, g in slow.select("src_rank", "dst_rank", "gbps")
            .head(EVIDENCE_LINKS)
            .iter_rows()
        ],
        score=cost,
    )


@slow_link.key_figures(
    KeyFigure(
        "link_gbps_min",
        "its slowest link's bandwidth on large transfers",
        better="higher",
        unit="GB/s",
    ),  # fmt: skip
    KeyFigure(
        "link_gbps_median",
        "its links' median bandwidth on large transfers",
        better="higher",
        unit="GB/s",
    ),  # fmt: skip
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Per rank (a link's source): its links' slowest and median bandwidth on large transfers."""
    links = ctx.once(_links).with_columns(
        (pl.col("size_mb") / (pl.col("time_ns") / 1e6)).alias("gbps")
    )
    return links.group_by(pl.col("src_rank").cast(pl.Int32).alias("rank")).agg(
        pl.col("gbps").min().alias("link_gbps_min"),
        pl.col("gbps").median().alias("link_gbps_median"),
    )
