"""Where each engine iteration starts and ends, from the best evidence a session has.

Most reliable first (one source per session; the first that has any):

1. ``profiler_step``: ``ProfilerStep#N`` spans (a profiler schedule, or msMonitor);
2. ``annotation``: upstream vLLM's step annotation (``execute_context_N(T)_generation_M(G)``,
   its detailed form, or ``execute_new_N_cached_M``);
3. ``scope``: the model runner's scopes (``prepare input`` ... ``post process``, then
   ``sample_token``), recorded with ``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1``;
4. ``python_function``: the Python tracer's ``execute_model``, ``sample_tokens`` and
   ``_dummy_run`` (a default vllm-ascend profile, ``with_stack`` or ``with_modules``);
5. ``device_activity``: without any host marker, the device's compute bursts;
6. ``session``: nothing at all: the whole session is one window (as before steps were known).

An iteration's window covers its forward and its sampling: a sample that follows a forward
before the next one begins closes that forward's window. Gaps of ``idle_gap_ms`` or more between
two iterations become ``idle`` windows (source ``gap``): the scheduler had nothing to run, and
that is no iteration's time. ``ProfilerStep#N`` windows are kept as the profile drew them.
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.engine.params import Params
from traceanalyzer.intervals import asof_join, outermost
from traceanalyzer.kernels import kernel_tasks
from traceanalyzer.vocabulary import COMPUTE_TASK_TYPES, NOT_HOST_PROCESSES

WINDOW_SCHEMA = {
    "session": pl.String,
    "step": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "step_source": pl.String,
}
_NO_STEP = pl.lit(None, dtype=pl.Int64)  # a window numbered later, in time order
SOURCES = ("profiler_step", "annotation", "scope", "python_function", "device_activity")


def is_host_span() -> pl.Expr:
    """Whether a slice is one of the framework's host spans (torch ops, python functions, mstx
    ranges, user scopes)."""
    return ~pl.col("process").is_in(NOT_HOST_PROCESSES) & (pl.col("dur_ns") >= 0)


def host_spans(slices: pl.LazyFrame) -> pl.LazyFrame:
    """The framework's host spans (torch ops, python functions, mstx ranges, user scopes)."""
    return slices.filter(is_host_span())


def annotation_match(p: Params) -> pl.Expr:
    name = pl.col("name")
    return (
        name.str.contains(p.annotation_pattern)
        | name.str.contains(p.detailed_annotation_pattern)
        | name.str.contains(p.legacy_annotation_pattern)
    )


def _as_windows(
    frame: pl.DataFrame,
    source: str,
    start: str | pl.Expr = "start_ns",
    end: str | pl.Expr = "end_ns",
    step: pl.Expr = _NO_STEP,
) -> pl.DataFrame:
    """``frame``'s rows as windows of ``source`` (:data:`WINDOW_SCHEMA`'s columns); ``step``:
    their number (none: numbered in time order after)."""
    return frame.select(
        "session", step.alias("step"), start, end, pl.lit(source).alias("step_source")
    )


def _spans(frame: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    keep = frame.filter(where).select("session", "thread", "name", "start_ns", "end_ns")
    return outermost(keep, by=("session", "thread"))


def _cores_and_samples(cores: pl.DataFrame, samples: pl.DataFrame, source: str) -> pl.DataFrame:
    """Iterations from their opening spans (``cores``) and the samples that close them: a sample
    belongs to the latest core that began before it; the window ends with the later of the two."""
    cores = cores.sort("session", "start_ns").with_row_index("_core")
    if not samples.is_empty():
        starts = cores.select("session", "_core", pl.col("start_ns").alias("_core_start"))
        owner = asof_join(samples.sort("start_ns"), starts, "start_ns", "_core_start", "session")
        ends = owner.group_by("_core").agg(pl.col("end_ns").max().alias("_sample_end"))
        cores = cores.join(ends, on="_core", how="left").with_columns(
            pl.max_horizontal("end_ns", "_sample_end").alias("end_ns")
        )
    # a window ends where the next begins, at the latest
    following = pl.col("start_ns").shift(-1).over("session", order_by="start_ns")
    end = pl.min_horizontal("end_ns", following.fill_null(pl.col("end_ns"))).alias("end_ns")
    return _as_windows(cores.sort("session", "start_ns"), source, end=end)


def _profiler_steps(host: pl.DataFrame, p: Params) -> pl.DataFrame:
    spans = _spans(host, pl.col("name").str.contains(p.step_pattern))
    step = pl.col("name").str.extract(p.step_pattern, 1).cast(pl.Int64, strict=False)
    return _as_windows(spans, "profiler_step", step=step)


def _sample_spans(host: pl.DataFrame, p: Params) -> pl.DataFrame:
    is_python = pl.col("cat") == "python_function"
    return _spans(
        host,
        (is_python & pl.col("name").str.contains(p.sample_function))
        | pl.col("name").is_in(list(p.scope_sample)),
    )


def _outside(spans: pl.DataFrame, covers: pl.DataFrame) -> pl.DataFrame:
    """The ``spans`` that no span of ``covers`` contains."""
    if spans.is_empty() or covers.is_empty():
        return spans
    covering = asof_join(
        spans.sort("start_ns"),
        covers.sort("start_ns").select(
            "session", pl.col("start_ns").alias("_s"), pl.col("end_ns").alias("_e")
        ),
        "start_ns",
        "_s",
        "session",
    )
    alone = covering.filter(pl.col("_e").is_null() | (pl.col("_e") < pl.col("end_ns")))
    return alone.drop("_s", "_e")


def _with_standalone(cores: pl.DataFrame, host: pl.DataFrame, p: Params) -> pl.DataFrame:
    """``cores`` and the iterations that run no execute_model (nor its annotation or scopes):
    the engine's start-up calls (graph capture, the memory profile run: one window each, the
    dummy batches they run included) and the data-parallel dummy batches outside them."""
    python = host.filter(pl.col("cat") == "python_function")
    startup = _spans(python, pl.col("name").str.contains(p.warmup_function))
    dummies = _spans(python, pl.col("name").str.contains(p.dummy_function))
    alone = pl.concat([startup, _outside(dummies, startup)])
    return pl.concat([cores, _outside(alone, cores)])


def _of_sessions(host: pl.DataFrame, cores: pl.DataFrame) -> pl.DataFrame:
    """The host spans of the sessions that have ``cores``: a source that needs them frames no
    other session's iterations."""
    return host.filter(pl.col("session").is_in(cores["session"].unique().implode()))


def _annotated(host: pl.DataFrame, p: Params) -> pl.DataFrame:
    cores = _spans(host, annotation_match(p))
    if cores.is_empty():
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    host = _of_sessions(host, cores)
    return _cores_and_samples(
        _with_standalone(cores, host, p), _sample_spans(host, p), "annotation"
    )


def _scoped(host: pl.DataFrame, p: Params) -> pl.DataFrame:
    cores = _spans(host, pl.col("name").is_in(list(p.scope_begin)))
    if cores.is_empty():
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    host = _of_sessions(host, cores)
    inside = _spans(host, pl.col("name").is_in([*p.scope_forward, *p.scope_draft]))
    closing = pl.concat([inside, _sample_spans(host, p)])
    return _cores_and_samples(_with_standalone(cores, host, p), closing, "scope")


def _python_functions(host: pl.DataFrame, p: Params) -> pl.DataFrame:
    python = host.filter(pl.col("cat") == "python_function")
    executes = _spans(python, pl.col("name").str.contains(p.execute_function))
    cores = _with_standalone(executes, host, p)
    if cores.is_empty():
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    return _cores_and_samples(cores, _sample_spans(python, p), "python_function")


def _device_bursts(tasks: pl.DataFrame, p: Params) -> pl.DataFrame:
    """Iterations as bursts of compute: a gap of ``cluster_gap_ms`` or more (or 5 times the
    median gap, when longer) between kernels ends one."""
    if tasks.is_empty():
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    ordered = tasks.sort("session", "start_ns").with_columns(
        pl.col("end_ns").cum_max().over("session").alias("_busy_until")
    )
    gap = pl.col("start_ns") - pl.col("_busy_until").shift(1).over("session")
    ordered = ordered.with_columns(gap.alias("_gap"))
    median = ordered.group_by("session").agg(pl.col("_gap").filter(pl.col("_gap") > 0).median())
    ordered = ordered.join(median.rename({"_gap": "_median"}), on="session", how="left")
    split = pl.max_horizontal(pl.lit(p.cluster_gap_ms * 1e6), pl.col("_median").fill_null(0) * 5)
    ordered = ordered.with_columns(
        (pl.col("_gap").is_null() | (pl.col("_gap") >= split))
        .cum_sum()
        .over("session")
        .alias("_burst")
    )
    bursts = ordered.group_by("session", "_burst").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max()
    )
    return _as_windows(bursts.sort("session", "start_ns"), "device_activity")


def compute_tasks(slices: pl.LazyFrame) -> pl.DataFrame:
    """The device's compute tasks (kernels) of the sessions, in time order
    (:func:`~traceanalyzer.kernels.kernel_tasks`: rank, session, name, stream_id, start_ns,
    end_ns)."""
    return kernel_tasks(slices, COMPUTE_TASK_TYPES)


def session_windows(
    host: pl.DataFrame, tasks: pl.DataFrame, sessions: pl.DataFrame, p: Params
) -> pl.DataFrame:
    """Every session's iteration windows (``step`` numbered, ``step_source`` named) and the idle
    gaps between them. ``host``: the sessions' host spans; ``tasks``: their compute tasks;
    ``sessions``: session, start_ns, end_ns."""
    # Each source frames every session still without windows at once; a session takes the
    # first that frames it (each source reads its sessions apart: by session, over session).
    found, have = [], pl.Series("session", [], pl.String)
    for derive in (_profiler_steps, _annotated, _scoped, _python_functions, _device_bursts):
        rest = tasks if derive is _device_bursts else host
        windows = derive(rest.filter(~pl.col("session").is_in(have.implode())), p)
        if not windows.is_empty():
            found.append(windows)
            have = pl.concat([have, windows["session"].unique()])
    whole = _as_windows(
        sessions.filter(
            ~pl.col("session").is_in(have.implode()) & (pl.col("end_ns") > pl.col("start_ns"))
        ),
        "session",
        pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64),
    )
    windows = pl.concat([pl.DataFrame(schema=WINDOW_SCHEMA), *found, whole], how="vertical_relaxed")
    return _with_idle_gaps(windows.filter(pl.col("end_ns") > pl.col("start_ns")), tasks, p)


def _with_idle_gaps(windows: pl.DataFrame, tasks: pl.DataFrame, p: Params) -> pl.DataFrame:
    """Number every iteration of a session in time order where its source gives no number;
    extend an iteration over the device work it left running past its host markers (the
    forward's last kernels, sampling without a marker); then add an ``idle`` window (no
    number) for each gap of ``idle_gap_ms`` or more that is left between two iterations."""
    ordinal = pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("session")
    ordered = windows.sort("session", "start_ns").with_columns(pl.col("step").fill_null(ordinal))
    # ProfilerStep windows are the profile's own steps, kept as they are
    markers = ~pl.col("step_source").is_in(["session", "profiler_step", "device_activity"])
    following = pl.col("start_ns").shift(-1).over("session")
    ordered = ordered.with_row_index("_i").with_columns(following.alias("_next"))
    if not tasks.is_empty():
        placed = asof_join(
            tasks.sort("start_ns"),
            ordered.select("session", "_i", pl.col("start_ns").alias("_ws"), "end_ns", "_next"),
            "start_ns",
            "_ws",
            "session",
            suffix="_w",
        )
        tail = placed.filter(
            (pl.col("start_ns") >= pl.col("end_ns_w"))
            & (pl.col("_next").is_null() | (pl.col("start_ns") < pl.col("_next")))
        )
        reach = tail.group_by("_i").agg(pl.col("end_ns").max().alias("_tail"))
        ordered = ordered.join(reach, on="_i", how="left").with_columns(
            pl.when(markers & pl.col("_tail").is_not_null())
            .then(pl.min_horizontal(pl.col("_tail"), pl.col("_next").fill_null(pl.col("_tail"))))
            .otherwise(pl.col("end_ns"))
            .alias("end_ns")
        )
    gaps = _as_windows(
        ordered.filter(markers & (pl.col("_next") - pl.col("end_ns") >= p.idle_gap_ms * 1e6)),
        "gap",
        pl.col("end_ns").alias("start_ns"),
        pl.col("_next").alias("end_ns"),
    )
    every = pl.concat([ordered.select(list(WINDOW_SCHEMA)), gaps])
    return every.sort("session", "start_ns")


def window_index(points: pl.DataFrame, windows: pl.DataFrame, at: str = "start_ns") -> pl.DataFrame:
    """``points`` (session, ``at``) with ``_w``, the index (``windows``' ``_w``) of the window
    each lies in; points in no window are dropped."""
    if points.is_empty():
        return points.with_columns(pl.lit(None, dtype=pl.UInt32).alias("_w"))
    spans = windows.select(
        "session", "_w", pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we")
    )
    return (
        points.sort(at)
        .pipe(asof_join, spans.sort("_ws"), at, "_ws", "session")
        .filter(pl.col(at) < pl.col("_we"))
        .drop("_ws", "_we")
    )
