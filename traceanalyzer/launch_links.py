"""Which host call launched each device task (:func:`host_launches`), by the links a profile
records (a graph replay, connection ids, flows), and the innermost or outermost host call around
a point (:func:`containing_call`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from traceanalyzer.intervals import Frame, asof_join, outermost
from traceanalyzer.vocabulary import CANN_PROCESS, GRAPH_REPLAY_APIS, HARDWARE_PROCESS

LAUNCH_COLUMNS = ("launch_name", "launch_op", "launch_start_ns", "launch_end_ns", "launch_thread")
LAUNCH_LINKS = ("graph_replay", "connection_id", "HostToDevice", "launch_flow", "async_npu")
# When several host calls claim one connection id, the launch layer wins: Node@launch sits inside
# the AscendCL op and above the runtime call it makes.
_LAYER_PREFERENCE = {"Node": 0, "Model": 1, "AscendCL": 2, "Hccl": 3, "Communication": 3}
_THREAD = ("rank", "session", "process", "thread")


def host_calls(
    slices: pl.DataFrame | pl.LazyFrame, host_process: str = CANN_PROCESS
) -> pl.DataFrame:
    """The host calls of ``slices`` that device tasks are linked to (:func:`host_launches`): the
    ``host_process``'s, with their thread, names, connection id and times."""
    frame = slices.lazy() if isinstance(slices, pl.DataFrame) else slices
    return (
        frame.filter(pl.col("process") == host_process)
        .select(*_THREAD, "name", "api_layer", "api_name", "connection_id", "start_ns", "end_ns")
        .collect()
    )


def host_launches(
    slices: pl.DataFrame | pl.LazyFrame,
    flows: pl.DataFrame | pl.LazyFrame | None = None,
    *,
    device_process: str = HARDWARE_PROCESS,
    host_process: str = CANN_PROCESS,
    replay_apis: Sequence[str] = GRAPH_REPLAY_APIS,
    calls: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Each device task joined to the host call that launched it (launch columns null when unknown).

    ``slices`` is the store's slices table (device tasks and host calls), ``flows`` its flows
    table, ``calls`` its :func:`host_calls` when the caller read them (else read here). Links,
    in order of trust (the ``link`` column says which one was used):

    - ``graph_replay``: a task of a captured graph (``model_id`` set) runs when the host replays
      the graph, so its launch is the last ``replay_apis`` call (``aclmdlRIExecuteAsync``) that
      started before it, on any thread.
    - ``connection_id``: the CANN call with the task's ``connection_id`` arg (Text exports put it
      on both ends; for a kernel it is ``Node@launch``).
    - ``HostToDevice``: a flow whose ``f`` end is the task start on its stream; its ``s`` end lies
      inside the launching CANN call, on the same thread.
    - ``launch_flow``: such a flow whose ``s`` end lies in no recorded call (Level0 records no
      CANN layer but still draws these flows): the launch is the instant the flow starts
      (``launch_name`` and ``launch_op`` null).
    - ``async_npu``: a ``torch_to_npu`` flow from a torch op (Level0 has no CANN layer). With the
      task queue the op returns before the real launch, so this link is only a lower bound.

    Returns the tasks' ``rank``, ``session``, ``stream``, ``start_ns``, ``end_ns``, ``name``,
    ``task_type``, ``task_id``, ``model_id``, ``connection_id`` plus ``launch_name`` (the linked
    call, e.g. ``Node@launch``), ``launch_op`` (the AscendCL op around a ``Node@launch``, e.g.
    ``AscendCL@aclnnMm``; else the call itself), ``launch_start_ns``, ``launch_end_ns``,
    ``launch_thread`` and ``link``, ordered by stream and start.
    """
    frame = slices.lazy() if isinstance(slices, pl.DataFrame) else slices
    keys = ["rank", "session"]
    tasks = (
        frame.filter((pl.col("process") == device_process) & pl.col("stream_id").is_not_null())
        .select(
            *keys,
            pl.col("stream_id").alias("stream"),
            "start_ns",
            "end_ns",
            "name",
            "task_type",
            "task_id",
            "model_id",
            "connection_id",
            pl.col("thread").alias("_stream_thread"),
        )
        .with_row_index("_task")
        .collect()
    )
    if calls is None:
        calls = host_calls(frame, host_process)

    def cpu_ops(threads: pl.DataFrame) -> pl.DataFrame:
        """The torch ops on ``threads``: only where a flow starts (most are never read)."""
        ops = frame.filter(pl.col("cat") == "cpu_op").join(threads.lazy(), on=_THREAD, how="semi")
        return ops.select(
            *_THREAD, "name", pl.lit(None, dtype=pl.String).alias("api_layer"), "start_ns", "end_ns"
        ).collect()

    flow_frame = None if flows is None else flows.lazy()
    linkers: list[Callable[[pl.DataFrame], pl.DataFrame]] = [
        lambda todo: _replay_links(todo, calls.filter(pl.col("api_name").is_in(list(replay_apis)))),
        lambda todo: _connection_links(todo, calls),
    ]
    if flow_frame is not None:
        linkers.append(lambda todo: _flow_links(todo, lambda _: calls, flow_frame, "HostToDevice"))
        linkers.append(lambda todo: _flow_links(todo, cpu_ops, flow_frame, "async_npu"))
    # In order of trust (LAUNCH_LINKS), each link looks up only the tasks the ones before it
    # left unlinked: where connection ids link every task, no flow (and no Python op) is read.
    found: list[pl.DataFrame] = []
    todo = tasks
    for linker in linkers:
        found.append(linker(todo))  # (the first runs on no tasks too: it gives the columns)
        todo = todo.join(found[-1].select("_task"), on="_task", how="anti")
        if todo.is_empty():
            break
    best = pl.concat(found, how="vertical_relaxed")
    launched = tasks.join(best, on="_task", how="left")
    # by rank, session, stream and time: the numbers first, then the keys stably (one sort with
    # the text key took three times as long; ``_task`` makes the order total either way)
    return (
        _with_launch_op(launched, calls, host_process)
        .sort(["stream", "start_ns", "_task"])
        .sort(keys, maintain_order=True)
        .drop("_task", "_stream_thread", "_launch_layer")
    )


def _as_launch(calls: pl.DataFrame) -> pl.DataFrame:
    """Host calls renamed to the launch columns (``launch_op`` the call itself until
    :func:`_with_launch_op`; ``_launch_layer`` its ``api_layer``)."""
    return calls.select(
        pl.col("name").alias("launch_name"),
        pl.col("name").alias("launch_op"),
        pl.col("start_ns").alias("launch_start_ns"),
        pl.col("end_ns").alias("launch_end_ns"),
        pl.col("thread").alias("launch_thread"),
        pl.col("api_layer").alias("_launch_layer"),
    )


# what each link returns (_link)
_LINK_SCHEMA = {
    "_task": pl.UInt32,
    **dict.fromkeys(("launch_name", "launch_op"), pl.String),
    **dict.fromkeys(("launch_start_ns", "launch_end_ns"), pl.Int64),
    **dict.fromkeys(("launch_thread", "_launch_layer", "link"), pl.String),
}


def _link(found: pl.DataFrame, link: str) -> pl.DataFrame:
    return found.select("_task", *LAUNCH_COLUMNS, "_launch_layer", link=pl.lit(link))


def containing_call(
    points: Frame,
    calls: Frame,
    *,
    at: str = "ts_ns",
    outer: bool = False,
    outer_calls: Frame | None = None,
) -> pl.DataFrame:
    """For each point (timestamp column ``at`` on a host thread), the innermost call around it.

    Both frames carry ``rank``, ``session``, ``process`` and ``thread``; ``calls`` has
    ``start_ns``/``end_ns`` (returned as ``call_start_ns``/``call_end_ns``) and any other columns,
    which must not clash with the points' columns. A point inside no call keeps nulls; points
    come back in their order. Calls of one thread nest (an AscendCL op around its
    ``Node@launch``): the latest call that started at or before the point holds it, unless it
    ended first, and then the outermost call around the point does. ``outer`` asks for the
    outermost call around the point instead (``aten::item`` rather than the
    ``aten::_local_scalar_dense`` inside it). ``outer_calls``: ``outermost(calls)`` by thread,
    when the caller holds it (a rule that asks for both the inner and the outer call of the
    same calls derives it once); derived here otherwise.
    """
    thread = list(_THREAD)
    ordered = points.lazy().with_row_index("_point").sort(at).collect()

    def latest_started(candidates: pl.LazyFrame) -> pl.DataFrame:
        """Each point's latest call of ``candidates`` started at or before it, in the points'
        order (a left as-of join keeps it: the tiers line up row by row, no join back)."""
        ordered_calls = (
            candidates.rename({"start_ns": "call_start_ns", "end_ns": "call_end_ns"})
            .sort("call_start_ns")
            .collect()
        )
        return asof_join(ordered, ordered_calls, at, "call_start_ns", thread)

    def outer_tier() -> pl.DataFrame:
        tier = outer_calls if outer_calls is not None else outermost(calls.lazy(), by=thread)
        return latest_started(tier.lazy())

    # in order of preference: the first that holds the point wins
    tiers = [outer_tier() if outer else latest_started(calls.lazy())]
    extra = [c for c in tiers[0].columns if c not in ordered.columns]
    # A point the latest call before it does not hold may lie in an outer call; where every
    # point is held or has no call before it (the outer calls are some of the calls), the outer
    # tier would pick nothing, and is not derived.
    first_held = (pl.col("call_end_ns") >= pl.col(at)).fill_null(False)
    if (
        not outer
        and tiers[0].select((pl.col("call_start_ns").is_not_null() & ~first_held).any()).item()
    ):
        tiers.append(outer_tier())
    frame = ordered
    for i, hit in enumerate(tiers):
        frame = frame.hstack(hit.select(pl.col(c).alias(f"{c}#{i}") for c in extra))
    holds = [pl.col(f"call_end_ns#{i}") >= pl.col(at) for i in range(len(tiers))]

    def pick(column: str) -> pl.Expr:
        chosen = pl.when(holds[0]).then(pl.col(f"{column}#0"))
        for i in range(1, len(tiers)):
            chosen = chosen.when(holds[i]).then(pl.col(f"{column}#{i}"))
        return chosen.alias(column)  # null where no call holds the point

    return frame.select(*ordered.columns, *map(pick, extra)).sort("_point").drop("_point")


def _with_launch_op(launched: pl.DataFrame, calls: pl.DataFrame, host_process: str) -> pl.DataFrame:
    """``launch_op`` of the tasks a ``Node@launch`` launched: the AscendCL op around it (else
    the call's name, as for every other launch). Looked up for those launches only, not for
    every host call: most calls launch nothing."""
    is_node = pl.col("_launch_layer") == "Node"
    nodes = launched.filter(is_node)
    if nodes.is_empty():
        return launched
    ops = calls.filter(pl.col("api_layer") == "AscendCL").select(
        *_THREAD, pl.col("name").alias("_op"), "start_ns", "end_ns"
    )
    points = nodes.select(
        "_task",
        "rank",
        "session",
        pl.lit(host_process, dtype=pl.String).alias("process"),
        pl.col("launch_thread").alias("thread"),
        pl.col("launch_start_ns").alias("_at"),
    )
    around = containing_call(points, ops, at="_at").select("_task", "_op")
    return (
        launched.join(around, on="_task", how="left")
        .with_columns(
            pl.when(is_node)
            .then(pl.col("_op").fill_null(pl.col("launch_name")))
            .otherwise(pl.col("launch_op"))
            .alias("launch_op")
        )
        .drop("_op")
    )


def _replay_links(tasks: pl.DataFrame, replays: pl.DataFrame) -> pl.DataFrame:
    graph_tasks = tasks.filter(pl.col("model_id").is_not_null()).sort("start_ns")
    launches = pl.concat([replays.select("rank", "session"), _as_launch(replays)], how="horizontal")
    hit = asof_join(
        graph_tasks,
        launches.sort("launch_start_ns"),
        "start_ns",
        "launch_start_ns",
        ["rank", "session"],
    )
    return _link(hit.filter(pl.col("launch_name").is_not_null()), "graph_replay")


def _connection_links(tasks: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    keys = ["rank", "session", "connection_id"]
    # several calls with one id (a repeated id, merged traces): the preferred layer, then the
    # earliest, whatever order the calls came in (a sort with ties left open kept any of them)
    ranked = calls.filter(pl.col("connection_id").is_not_null()).sort(
        pl.col("api_layer").replace_strict(_LAYER_PREFERENCE, default=9, return_dtype=pl.Int64),
        "start_ns",
        "end_ns",
        "thread",
        "name",
        nulls_last=True,
        maintain_order=True,
    )
    by_conn = pl.concat([ranked.select(keys), _as_launch(ranked)], how="horizontal").unique(
        keys, keep="first"
    )
    return _link(tasks.join(by_conn, on=keys), "connection_id")


def _flow_links(
    tasks: pl.DataFrame,
    calls_on: Callable[[pl.DataFrame], pl.DataFrame],
    flows: pl.LazyFrame,
    cat: str,
) -> pl.DataFrame:
    """Tasks linked by flows of ``cat``: ``f`` at the task start, ``s`` inside the launching call,
    one of ``calls_on(threads)`` (the calls on the threads the flows start on, or more)."""
    at_start = pl.col("end_ns").is_in(tasks["start_ns"].unique().implode())
    ends = (
        flows.filter((pl.col("cat") == cat) & at_start)
        .select(
            "rank",
            "session",
            pl.col("src_process").alias("process"),
            pl.col("src_thread").alias("thread"),
            pl.col("start_ns").alias("ts_ns"),
            pl.col("dst_thread").alias("_stream_thread"),
            pl.col("end_ns").alias("start_ns"),
        )
        .collect()
    )
    # One task starts at a given ns on a stream, so one flow end there is enough: a trace whose
    # events repeat (merged or tiled copies) would otherwise join every copy to every copy.
    at_task = ["rank", "session", "_stream_thread", "start_ns"]
    linked = tasks.join(ends.unique(at_task, keep="first", maintain_order=True), on=at_task)
    if linked.is_empty():  # no call read: the tasks connection ids leave are seldom flow-linked
        return pl.DataFrame(schema=_LINK_SCHEMA)
    calls = calls_on(linked.select(_THREAD).unique())
    launches = pl.concat([calls.select(*_THREAD), _as_launch(calls)], how="horizontal").rename(
        {"launch_start_ns": "start_ns", "launch_end_ns": "end_ns"}
    )
    hit = containing_call(linked.drop("start_ns", "end_ns"), launches).rename(
        {"call_start_ns": "launch_start_ns", "call_end_ns": "launch_end_ns"}
    )
    in_call = _link(hit.filter(pl.col("launch_name").is_not_null()), cat)
    if cat != "HostToDevice":
        return in_call
    # Level0 records no CANN calls, yet draws the HostToDevice flows from the launching thread:
    # the launch happened at the flow's start.
    bare = hit.filter(pl.col("launch_name").is_null()).with_columns(
        pl.col("ts_ns").alias("launch_start_ns"),
        pl.col("ts_ns").alias("launch_end_ns"),
        pl.col("thread").alias("launch_thread"),
    )
    return pl.concat([in_call, _link(bare, "launch_flow")], how="vertical_relaxed")
