"""Replayed kernels mapped to the launches they were captured from (TraceLens' capture merge).

A graph replay is one host call (``aclmdlRIExecuteAsync``): its kernels have no launch, call
site or module of their own. When the profile also holds the graph's capture (the engine's
start-up in the window: vLLM's ``capture_model`` captures each size, largest first, after one
eager warm-up forward of that size, which vllm-ascend forces (``cudagraph_num_of_warmups = 1``,
``platform.py``); ``aclmdlRICaptureBegin`` ... ``aclmdlRICaptureEnd`` then records the forward's
launches on the host and runs none), the n-th kernel of a FULL replay of size S is the n-th
launch of the capture of size S. The kernel's name checks each pair: ``Node@launch`` names the
kernel it launches (its ``item_id``, in a Text export); else the ``AscendCL@aclnn…`` op around
the launch, whose kernels' names start with it. A mapped kernel takes its launch's call site on
the host: the innermost Python frame and torch op around it, the innermost ``nn.Module``, and
the decoder layer, the ``layer_module`` instance around it, counted in the capture's order.

A capture's size is the token dim (``token_kernels``, first input ``T,H``) of the eager kernels
run just before it (the warm-up; a capture with none before it follows the one before); a FULL
capture holds the attention's launches (``layer_anchor``), a piecewise piece none. Where no
capture of the size is in the profile, or capture and replay disagree (the count of kernels, or
a name), the kernels keep the sequence's layers and ``capture_note`` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import polars as pl

from traceanalyzer.derived.phases import first_dim
from traceanalyzer.engine.params import Param
from traceanalyzer.intervals import asof_join, pair_windows, window_of
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    CANN_PROCESS,
    CAPTURE_BEGIN_API,
    CAPTURE_END_API,
    DEQUEUE_PREFIX,
    HCCL_API_PREFIX,
    MODULE_EVENT_PREFIX,
    PYTHON_PROCESS,
    SITE_CATEGORIES,
)

CAPTURE_PARAMS = {
    "layer_module": Param(
        r"DecoderLayer$|DecoderLayerWithMoE$",
        "Regex on nn.Module class names (the Python tracer's `nn.Module: Class_id` events): the "
        "decoder layer, whose instances around a captured launch give a replayed kernel's layer.",
    ),
}
KEYS = ["rank", "session"]
# the Python events a launch's call site is read from: torch ops, the task queue, frames
PYTHON_CATEGORIES = [*SITE_CATEGORIES, "python_function"]
# the capture's launches, in order, with what the host says of each
LAUNCH_SCHEMA = {
    "rank": pl.Int32, "session": pl.String, "capture": pl.Int64, "size": pl.Int64,
    "full": pl.Boolean, "pos": pl.Int64, "launch": pl.String, "call_site": pl.String,
    "host_op": pl.String, "host_module": pl.String, "capture_layer": pl.Int64,
    "after_layers": pl.Boolean, "layered": pl.Boolean,
}  # fmt: skip
HOST_COLUMNS = ("call_site", "host_op", "host_module")
NO_CAPTURE = (
    "no graph capture in the profile: start the profiler before the engine captures its graphs "
    "to map replayed kernels to their Python call sites"
)
PIECEWISE = "a piecewise replay: only FULL graphs are mapped to their capture"
NO_SIZE = "no graph size (kernel shapes) to find its capture by"


def capture_windows_in(
    calls: pl.DataFrame, begin: str = CAPTURE_BEGIN_API, end: str = CAPTURE_END_API
) -> pl.DataFrame:
    """The graph capture windows (rank, session, start_ns, end_ns) of CANN ``calls``: ``begin``
    ... ``end`` per host thread."""
    calls = calls.filter(
        pl.col("api_name").str.contains(begin) | pl.col("api_name").str.contains(end)
    )
    return pair_windows(
        calls,
        is_begin=pl.col("api_name").str.contains(begin),
        is_end=pl.col("api_name").str.contains(end),
    ).select("rank", "session", "start_ns", "end_ns")


def captured_launches(
    store: Store,
    ranks: Collection[int],
    windows: pl.DataFrame,
    token_kernels: Collection[str],
    anchor: str,
    p: Any,
) -> pl.DataFrame:
    """The launches of every capture in ``windows`` (:func:`capture_windows_in`), in order, with
    their capture's size and kind and their host call site (:data:`LAUNCH_SCHEMA`); none
    without a capture. Reads the store only when there is one: the kernels the warm-ups ran
    (their sizes) and the host events within the captures."""
    if windows.is_empty():
        return pl.DataFrame(schema=LAUNCH_SCHEMA)
    wanted = sorted(ranks)
    windows = _sized(store, wanted, windows, token_kernels).with_columns(
        pl.col("start_ns").alias("capture")
    )
    layer, api = pl.col("api_layer"), pl.col("api_name")
    host = (
        store.scan("slices")
        .filter(
            pl.col("rank").is_in(wanted)
            & pl.col("process").is_in([CANN_PROCESS, PYTHON_PROCESS])
            & pl.col("start_ns").is_between(windows["start_ns"].min(), windows["end_ns"].max())
            & (layer.is_in(["Node", "AscendCL"]) | pl.col("cat").is_in(PYTHON_CATEGORIES))
        )
        .select(
            *KEYS,
            "process",
            "thread",
            "cat",
            "name",
            "api_layer",
            "api_name",
            "start_ns",
            "end_ns",
            pl.when((layer == "Node") & (api == "launch"))
            .then(pl.col("args").str.json_path_match("$.item_id"))
            .alias("item_id"),
        )
        .collect()
    )
    host = window_of(
        host.cast({"rank": windows.schema["rank"]}), windows, by=KEYS, keep=["capture"]
    ).filter(pl.col("capture").is_not_null())
    cann = host.filter(pl.col("process") == CANN_PROCESS)
    launches = _named_launches(cann)
    if launches.is_empty():
        return pl.DataFrame(schema=LAUNCH_SCHEMA)
    python = host.filter(pl.col("process") == PYTHON_PROCESS)
    sites = _call_sites(launches, python, p.layer_module)
    numbered = (
        sites.sort("capture", "start_ns")
        .with_columns(
            pl.int_range(pl.len()).over(*KEYS, "capture").cast(pl.Int64).alias("pos"),
            (pl.col("_layer_at").rank("dense").over(*KEYS, "capture") - 1)
            .cast(pl.Int64)
            .alias("capture_layer"),
            pl.col("launch").str.contains(anchor).any().over(*KEYS, "capture").alias("full"),
        )
        .with_columns(
            pl.col("capture_layer").is_not_null().any().over(*KEYS, "capture").alias("layered"),
            (
                pl.col("capture_layer").is_null()
                & (
                    pl.col("pos")
                    > pl.col("pos")
                    .filter(pl.col("capture_layer").is_not_null())
                    .max()
                    .over(*KEYS, "capture")
                )
            )
            .fill_null(False)
            .alias("after_layers"),
        )
        .join(windows.select(*KEYS, "capture", "size"), on=[*KEYS, "capture"], how="left")
    )
    return numbered.select(list(LAUNCH_SCHEMA)).cast(LAUNCH_SCHEMA)  # type: ignore[arg-type]


def _sized(
    store: Store, ranks: list[int], windows: pl.DataFrame, token_kernels: Collection[str]
) -> pl.DataFrame:
    """``windows`` with ``size``: the most common token dim of the eager token kernels that ran
    between the capture before and this one (the warm-up of its size), else the size of the
    capture before it (a piece of the same forward)."""
    ordered = windows.sort(*KEYS, "start_ns").with_columns(
        pl.col("end_ns").shift(1).over(KEYS).fill_null(0).alias("_after")
    )
    kernels = (
        store.scan("kernels")
        .filter(
            pl.col("rank").is_in(ranks)
            & pl.col("model_id").is_null()
            & pl.col("type").is_in(list(token_kernels))
            & (pl.col("start_ns") < windows["start_ns"].max())
        )
        .select(*KEYS, "start_ns", first_dim(pl.col("input_shapes")).alias("_tokens"))
        .collect()
        .cast({"rank": ordered.schema["rank"]})
        .sort("start_ns")
    )
    warmed = (
        asof_join(
            kernels,
            ordered.select(*KEYS, pl.col("start_ns").alias("_begin"), "_after").sort("_begin"),
            "start_ns",
            "_begin",
            KEYS,
            strategy="forward",
        )
        .filter(pl.col("start_ns") > pl.col("_after"))
        .group_by(*KEYS, "_begin")
        .agg(pl.col("_tokens").drop_nulls().mode().max().alias("size"))
        .rename({"_begin": "start_ns"})
    )
    return (
        ordered.join(warmed, on=[*KEYS, "start_ns"], how="left")
        .with_columns(pl.col("size").forward_fill().over(KEYS))
        .drop("_after")
    )


def _named_launches(cann: pl.DataFrame) -> pl.DataFrame:
    """The kernel launches (``Node@launch``) of the captures, each with ``launch``: the kernel
    it names, else the ``AscendCL`` op around it; those of an HCCL op left out (its tasks are
    the collective's, not kernels)."""
    ops = cann.filter(pl.col("api_layer") == "AscendCL").select(
        *KEYS, "thread", "start_ns", "end_ns", pl.col("api_name").alias("_label"),
        pl.lit("op").alias("_kind"), pl.lit(False).alias("_layer"),
    )  # fmt: skip
    launches = cann.filter((pl.col("api_layer") == "Node") & (pl.col("api_name") == "launch"))
    around = _innermost(launches.select(*KEYS, "thread", "capture", "start_ns", "item_id"), ops)
    named = pl.when(pl.col("item_id").is_not_null() & (pl.col("item_id") != "0"))
    return around.filter(~pl.col("_op").fill_null("").str.starts_with(HCCL_API_PREFIX)).select(
        *KEYS, "thread", "capture", "start_ns",
        named.then(pl.col("item_id")).otherwise(pl.col("_op")).alias("launch"),
    )  # fmt: skip


def _call_sites(launches: pl.DataFrame, python: pl.DataFrame, layer_module: str) -> pl.DataFrame:
    """``launches`` with their call site on the host (the Python events of their thread: the
    CANN and Python processes name the same OS threads alike): ``call_site`` (the innermost
    Python frame), ``host_op`` (the innermost torch op, or the task queue's ``Dequeue@op``),
    ``host_module`` (the innermost nn.Module's class) and ``_layer_at`` (the start of the
    decoder-layer module around it)."""
    name = pl.col("name")
    is_module = name.str.starts_with(MODULE_EVENT_PREFIX)
    module_class = name.str.strip_prefix(MODULE_EVENT_PREFIX).str.replace(r"_\d+$", "")
    events = python.select(
        *KEYS, "thread", "start_ns", "end_ns",
        pl.when(is_module).then(module_class)
        .when(pl.col("cat") == "python_function").then(name)
        .otherwise(name.str.strip_prefix(DEQUEUE_PREFIX)).alias("_label"),
        pl.when(is_module).then(pl.lit("module"))
        .when(pl.col("cat") == "python_function").then(pl.lit("frame"))
        .otherwise(pl.lit("op")).alias("_kind"),
        (is_module & module_class.str.contains(layer_module)).alias("_layer"),
    )  # fmt: skip
    return _innermost(launches, events).rename({"_op": "host_op"})


def _innermost(points: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``points`` (rank, session, thread, start_ns) with the innermost event of each kind
    around each (``events``: their ``_kind``, ``_label`` and ``_layer``; the events of a thread
    nest): ``_op`` (kind ``op``), ``call_site`` (``frame``), ``host_module`` (``module``) and
    ``_layer_at``, the start of the innermost ``_layer`` event. One sweep per thread, the
    events open at each point held on a stack."""
    thread = [*KEYS, "thread"]
    kinds = {"op": "_op", "frame": "call_site", "module": "host_module"}
    found: dict[str, list[Any]] = {column: [] for column in [*kinds.values(), "_layer_at"]}
    order: list[int] = []
    points = points.with_row_index("_point")
    by_thread = {
        tuple(key): part
        for key, part in events.sort(["start_ns", "end_ns"], descending=[False, True])
        .partition_by(thread, as_dict=True)
        .items()
    }
    for key, part in points.sort("start_ns").partition_by(thread, as_dict=True).items():
        mine = by_thread.get(tuple(key))
        starts, ends, kind, label, layer = (
            (mine[c].to_list() for c in ("start_ns", "end_ns", "_kind", "_label", "_layer"))
            if mine is not None
            else ([], [], [], [], [])
        )
        stack: list[int] = []
        i = 0
        for at, index in zip(part["start_ns"].to_list(), part["_point"].to_list(), strict=True):
            while i < len(starts) and starts[i] <= at:
                while stack and ends[stack[-1]] <= starts[i]:
                    stack.pop()
                stack.append(i)
                i += 1
            while stack and ends[stack[-1]] <= at:
                stack.pop()
            inner: dict[str, Any] = dict.fromkeys(found)
            for e in reversed(stack):
                column = kinds[kind[e]]
                if inner[column] is None:
                    inner[column] = label[e]
                if layer[e] and inner["_layer_at"] is None:
                    inner["_layer_at"] = starts[e]
            for column, value in inner.items():
                found[column].append(value)
            order.append(index)
    result = pl.DataFrame(
        {"_point": order, **found},
        schema={"_point": pl.UInt32, "_op": pl.String, "call_site": pl.String,
                "host_module": pl.String, "_layer_at": pl.Int64},
    )  # fmt: skip
    return points.join(result, on="_point", how="left").sort("_point").drop("_point")


def attribute(kernels: pl.DataFrame, captured: Callable[[], pl.DataFrame]) -> pl.DataFrame:
    """``kernels`` (the ``kernel_layers`` rows, with ``_replay``: the replay call a graph's
    kernel ran from, ``graph`` and ``graph_size`` of its step, ``_named_module``: its module by
    name) with the host columns of the launch each replayed kernel of a FULL graph was captured
    from (:data:`HOST_COLUMNS`; ``captured`` reads the captures' launches,
    :func:`captured_launches`, called only when a kernel was replayed), ``attribution``
    (``capture`` where the capture gives its layer, else ``sequence``) and ``capture_note``
    (why a replayed kernel was not mapped)."""
    replayed = pl.col("_replay").is_not_null()
    base = kernels.with_columns(
        *(pl.lit(None, pl.String).alias(c) for c in HOST_COLUMNS),
        pl.lit("sequence").alias("attribution"),
        pl.lit(None, pl.String).alias("capture_note"),
    )
    if not base.select(replayed.any()).item():
        return base
    launches = captured()
    if launches.is_empty():
        return base.with_columns(pl.when(replayed).then(pl.lit(NO_CAPTURE)).alias("capture_note"))
    instance = [*KEYS, "_replay"]
    graphs = (
        base.filter(replayed & (pl.col("graph") == "full") & pl.col("graph_size").is_not_null())
        .sort(*instance, "start_ns")
        .with_columns(
            pl.int_range(pl.len()).over(instance).cast(pl.Int64).alias("pos"),
            pl.len().over(instance).cast(pl.Int64).alias("_kernels"),
        )
    )
    full = launches.filter("full").with_columns(pl.len().over(*KEYS, "capture").alias("_launches"))
    pairs = graphs.select(*instance, "start_ns", "stream_id", "name", "graph_size", "pos",
                          "_kernels").join(
        full.rename({"size": "graph_size"}), on=[*KEYS, "graph_size", "pos"], how="inner"
    )  # fmt: skip
    agrees = (pl.col("name") == pl.col("launch")) | pl.col("name").str.starts_with(
        pl.col("launch") + "_"
    )
    verdicts = (
        pairs.with_columns(agrees.alias("_agrees"))
        .group_by(*instance, "capture")
        .agg(
            (
                pl.col("_agrees").all()
                & (pl.col("_launches").first() == pl.col("_kernels").first())
            ).alias("_fits"),
            pl.col("_launches").first(),
            pl.col("_kernels").first(),
            pl.col("graph_size").first(),
            pl.col("pos").filter(~pl.col("_agrees")).min().alias("_differs"),
        )
        .sort(*instance, pl.col("_fits"), "capture", descending=[False] * 3 + [True, False])
        .unique(instance, keep="first", maintain_order=True)
    )
    differs = pairs.join(
        verdicts.select(*instance, "capture", "_differs").rename({"_differs": "pos"}),
        on=[*instance, "capture", "pos"],
        how="inner",
    ).select(*instance, pl.format(
        "kernel {} of the replay is {}, launch {} of the capture of size {} is {}",
        pl.col("pos") + 1, "name", pl.col("pos") + 1, "graph_size", "launch",
    ).alias("_name_note"))  # fmt: skip
    verdicts = verdicts.join(differs, on=instance, how="left").with_columns(
        pl.when(pl.col("_fits"))
        .then(None)
        .when(pl.col("_launches") != pl.col("_kernels"))
        .then(pl.format(
            "the capture of size {} launched {} kernels, its replay ran {}",
            "graph_size", "_launches", "_kernels",
        ))
        .otherwise(pl.col("_name_note"))
        .alias("_mismatch")
    )  # fmt: skip
    mapped = (
        graphs.select(*instance, "stream_id", "start_ns", "pos")
        .join(verdicts.filter("_fits").select(*instance, "capture"), on=instance, how="inner")
        .join(launches, on=[*KEYS, "capture", "pos"], how="inner")
        .select(
            *KEYS,
            "stream_id",
            "start_ns",
            *(pl.col(c).alias(f"_{c}") for c in HOST_COLUMNS),
            "capture_layer",
            "after_layers",
            "layered",
        )
    )
    out = base.join(mapped, on=[*KEYS, "stream_id", "start_ns"], how="left").join(
        verdicts.select(*instance, "_mismatch"), on=instance, how="left"
    )
    captured_sizes = full.select(*KEYS, pl.col("size").alias("graph_size")).unique()
    out = out.join(
        captured_sizes.with_columns(pl.lit(True).alias("_captured")),
        on=[*KEYS, "graph_size"],
        how="left",
    )
    c = pl.col
    by_capture = c("layered").fill_null(False)
    note = (
        pl.when(~replayed | c("layered").is_not_null())
        .then(None)
        .when(c("graph") != "full")
        .then(pl.lit(PIECEWISE))
        .when(c("graph_size").is_null())
        .then(pl.lit(NO_SIZE))
        .when(c("_captured").is_null())
        .then(pl.format("no FULL capture of size {} in the profile", "graph_size"))
        .otherwise(c("_mismatch"))
    )
    return out.with_columns(
        *(c(f"_{col}").alias(col) for col in HOST_COLUMNS),
        pl.when(by_capture).then(c("capture_layer")).otherwise(c("layer")).alias("layer"),
        pl.when(by_capture)
        .then(pl.when(c("after_layers")).then(pl.lit("sampling")).otherwise(c("_named_module")))
        .otherwise(c("module"))
        .alias("module"),
        pl.when(by_capture).then(pl.lit("capture")).otherwise(pl.lit("sequence"))
        .alias("attribution"),
        note.alias("capture_note"),
    )  # fmt: skip
