"""The steps of ranks: their iteration windows, each with its phase and the evidence for it.

Reads only the store's tables (slices, kernels, sessions, launches): the host spans that mark
iterations and phases, the CANN calls that capture and replay graphs, the compute tasks and the
attention kernels with the host time that launched each (the ``launches`` table's call; a
graph's kernels: the replay before them; else their device start).

Every query runs over all the ranks asked for at once (each is by session or over session):
polars' fixed cost per query, most of a small rank's derivation, is paid once for them all.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceanalyzer.derived.launches import CALLS, derive_launches
from traceanalyzer.derived.parameters import NAMESPACE
from traceanalyzer.derived.phases import attention_evidence, classify, marker_counts
from traceanalyzer.derived.windows import (
    compute_tasks,
    host_spans,
    is_host_span,
    session_windows,
    window_index,
)
from traceanalyzer.engine.params import Params
from traceanalyzer.patterns import any_of
from traceanalyzer.stages import Read
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    CANN_PROCESS,
    DEVICE_PROCESSES,
    GRAPH_REPLAY_APIS,
)

# the slices' columns the derivation reads
SLICE_COLUMNS = (
    "rank", "session", "process", "thread", "name", "cat", "start_ns", "end_ns", "dur_ns",
    "stream_id", "task_type", "model_id", "api_name",
)  # fmt: skip
STEP_COLUMNS = (
    "session", "step", "start_ns", "end_ns", "step_ns", "step_source", "phase", "phase_source",
    "phase_reason", "tokens", "requests", "graph", "graph_size", "batch", "batch_source",
    "padded_tokens",
)  # fmt: skip


def _marker_names(p: Params) -> pl.Expr:
    """The host spans the derivation reads: steps, annotations, scopes, python functions."""
    name = pl.col("name")
    patterns = (
        p.step_pattern, p.annotation_pattern, p.detailed_annotation_pattern,
        p.legacy_annotation_pattern, p.execute_function, p.sample_function, p.dummy_function,
        p.draft_function, p.no_forward_function, p.warmup_function,
    )  # fmt: skip
    scopes = [*p.scope_begin, *p.scope_forward, *p.scope_sample, *p.scope_draft]
    return name.str.contains(any_of(patterns)) | name.is_in(scopes)


def _graph_calls(p: Params) -> pl.Expr:
    """The CANN calls that open a graph capture or replay a graph."""
    api = pl.col("api_name")
    return (pl.col("process") == CANN_PROCESS) & (
        api.str.contains(p.capture_begin) | api.is_in(list(p.replay_apis))
    )


def read_slices(
    store: Store, ranks: Collection[int], p: Params, calls: pl.DataFrame | None = None
) -> pl.LazyFrame:
    """The ranks' slices the derivation reads (each of its reads filters this frame in memory):
    every device task (the compute tasks; the communication ops too, for the EP exchanges of
    ``derived.device``), the CANN calls that capture or replay a graph, and the host spans
    named like a marker; only the columns it reads, each kind in the table's order. (A
    kernel's launch is the ``launches`` table's: the CANN calls that launch kernels, most of
    a rank's slices, are not read.) Each kind is a scan of its own, side by side: the table is
    grouped by process, so each reads only its processes' row groups (one scan of every row
    group for all three took half as long again). ``calls``: the ranks' CANN calls
    (``launches.host_calls``) when the caller holds them: the graph calls are taken from them,
    not scanned again."""
    slices = store.scan("slices").filter(pl.col("rank").is_in(sorted(ranks)))
    graph = slices if calls is None else calls.lazy()  # the calls lack the tasks' columns
    kinds = (
        slices.filter(pl.col("process").is_in(DEVICE_PROCESSES)),
        graph.filter(_graph_calls(p)),
        slices.filter(is_host_span() & _marker_names(p)),
    )
    read = [kind.select(c for c in SLICE_COLUMNS if c in kind.collect_schema()) for kind in kinds]
    return pl.concat(read, how="diagonal_relaxed").collect().lazy()  # nulls where a kind has none


def _compute_kernels(
    store: Store, ranks: list[int], params: None, step_slices: pl.LazyFrame
) -> pl.DataFrame:
    return compute_tasks(step_slices)


# What the stages of the steps' task read of the slices, once: the slices the steps read (at
# the steps' parameters, the graph calls taken from the host calls the launches read), and their
# compute kernels. (One read of the slices for both the launches and the steps, split at once,
# took no less time and added a fifth to the task's peak.)
STEP_SLICES = Read("step_slices", read_slices, (CALLS,), params_of=NAMESPACE)
COMPUTE_KERNELS = Read("compute_kernels", _compute_kernels, (STEP_SLICES,))


# the links that place a kernel's launch on the host: a graph replay, or its own launch call
# (a flow's torch op is only a lower bound of it)
HOST_LINKS = ("graph_replay", "connection_id")


def _launched_attention(
    store: Store, ranks: list[int], launches: pl.DataFrame, p: Params
) -> pl.DataFrame:
    """The attention kernels (and the signature and sampler kernels, and the replayed kernels
    that carry the token count) with ``launch_ns``: their launch's host
    time (a graph's kernel: the replay before it), else their device start. ``launches``: the
    ranks' device tasks with their launches (``launches`` table)."""
    kernels = (
        store.scan("kernels")  # one query of a few columns: not held in memory whole
        .filter(
            pl.col("rank").is_in(ranks)
            & (
                pl.col("type").is_in(list(p.attention_types))
                | pl.col("name").str.contains(
                    any_of(
                        (p.decode_kernels, p.prefill_kernels, p.mixed_kernels, p.sampler_kernels)
                    )
                )
                | (pl.col("model_id").is_not_null() & pl.col("type").is_in(list(p.token_kernels)))
            )
        )
        .select(
            "session",
            "name",
            "type",
            "stream_id",
            "start_ns",
            "model_id",
            "input_shapes",
            "input_data_types",
        )  # fmt: skip
        .collect()
    )
    if kernels.is_empty():
        return kernels.with_columns(pl.lit(None, dtype=pl.Int64).alias("launch_ns"))
    # a graph's kernel was launched when the graph was replayed, not when it was captured
    host_link = (
        pl.when(pl.col("model_id").is_not_null())
        .then(pl.col("link") == "graph_replay")
        .otherwise(pl.col("link").is_in(HOST_LINKS))
    )
    keys = ["session", "stream_id", "start_ns"]
    linked = (
        launches.lazy()
        .filter(
            pl.col("rank").is_in(ranks) & pl.col("start_ns").is_in(kernels["start_ns"].implode())
        )
        .filter(host_link)
        .select(
            "session",
            pl.col("stream").alias("stream_id"),
            "start_ns",
            pl.col("launch_start_ns").alias("launch_ns"),
        )
        .unique(keys, keep="first")
        .collect()
    )
    return kernels.join(linked, on=keys, how="left").with_columns(
        pl.coalesce("launch_ns", "start_ns").alias("launch_ns")
    )


def derive_ranks(
    store: Store,
    ranks: Collection[int],
    p: Params,
    launches: pl.DataFrame,
    slices: pl.LazyFrame,
    compute: pl.DataFrame,
) -> pl.DataFrame:
    """Every step of ``ranks``' sessions (``rank`` and :data:`STEP_COLUMNS`), in time order.
    ``launches``: the ranks' launches at the default graph-replay calls (derived again at
    others); ``slices``: what :func:`read_slices` gives (read once for the device tasks too);
    ``compute``: the compute kernels of those slices (:func:`compute_tasks`, which the EP
    exchanges read too)."""
    wanted = sorted(ranks)
    if tuple(p.replay_apis) != GRAPH_REPLAY_APIS:
        launches = derive_launches(store, wanted, p.replay_apis)
    sessions = store.table("sessions").filter(pl.col("rank").is_in(wanted)).collect()
    if len(wanted) == 1:
        steps = _derive(store, wanted, slices, sessions, launches, compute, p)
        return steps.select(pl.lit(wanted[0], pl.Int32).alias("rank"), pl.all())
    owners = pl.concat(
        [sessions.select("session", "rank"), slices.select("session", "rank").unique().collect()],
        how="vertical_relaxed",
    ).unique()
    if owners["session"].n_unique() < owners.height:
        # two ranks with sessions of one name (exports of two hosts): each on its own
        return pl.concat(
            [
                derive_ranks(
                    store,
                    [rank],
                    p,
                    launches,
                    slices.filter(pl.col("rank") == rank),
                    compute.filter(pl.col("rank") == rank),
                )
                for rank in wanted
            ],
            how="vertical_relaxed",
        )
    steps = _derive(store, wanted, slices, sessions, launches, compute, p)
    return (
        steps.join(owners, on="session", how="left")
        .select("rank", *STEP_COLUMNS)
        .sort("rank", "session", "start_ns")
    )


def _derive(
    store: Store,
    ranks: list[int],
    slices: pl.LazyFrame,
    sessions: pl.DataFrame,
    launches: pl.DataFrame,
    tasks: pl.DataFrame,
    p: Params,
) -> pl.DataFrame:
    """The steps of ``ranks``, no two of which have a session of one name, by session;
    ``tasks``: their compute kernels."""
    host = (
        host_spans(slices)
        .filter(_marker_names(p))
        .select("session", "thread", "name", "cat", "start_ns", "end_ns")
        .collect()
    )
    windows = session_windows(host, tasks, sessions, p).with_row_index("_w")
    cann = slices.filter(_graph_calls(p)).select("session", "api_name", "start_ns").collect()
    # Device bursts begin when the device starts: a host marker or launch just before one
    # belongs to it, and so does a kernel's launch (their device start places them).
    device = pl.col("step_source") == "device_activity"
    previous_end = pl.col("end_ns").shift(1).over("session", order_by="start_ns")
    host_windows = windows.with_columns(
        pl.when(device)
        .then(previous_end.fill_null(pl.col("start_ns")))
        .otherwise(pl.col("start_ns"))
        .alias("start_ns")
    )
    evidence = marker_counts(host_windows, host, cann, p)
    bursts = windows.filter(device)["session"].unique()
    kernels = _launched_attention(store, ranks, launches, p).with_columns(
        pl.when(pl.col("session").is_in(bursts.implode()))
        .then(pl.col("start_ns"))
        .otherwise(pl.col("launch_ns"))
        .alias("launch_ns")
    )
    attention = attention_evidence(kernels, windows, p)
    # a window's compute: the kernels that start from its beginning to the next window's
    reach = windows.with_columns(
        pl.col("start_ns")
        .shift(-1)
        .over("session", order_by="start_ns")
        .fill_null(pl.col("end_ns"))
        .alias("end_ns")
    )
    sampling = pl.col("name").str.contains(p.sampler_kernels)
    verifying = pl.col("name").str.contains(p.verify_kernels)
    compute = (
        window_index(tasks.select("session", "name", "start_ns"), reach)
        .group_by("_w")
        .agg(
            pl.len().alias("n_compute"),
            sampling.sum().alias("n_sampler"),
            verifying.sum().alias("n_verify"),
        )
    )
    frame = (
        windows.join(evidence, on="_w", how="left")
        .join(attention, on="_w", how="left")
        .join(compute, on="_w", how="left")
        .with_columns(pl.col("n_compute", "n_sampler", "n_verify").fill_null(0))
    )
    steps = classify(frame, p).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns")
    )
    return steps.select(STEP_COLUMNS).sort("session", "start_ns")
