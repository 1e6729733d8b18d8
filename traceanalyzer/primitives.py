"""Building blocks over the store's tables: interval joins, windows, unions, coverage, trend
tests, the device tasks' host launches; shared by the derivations (steps, overview) and, through
the kit, by the rules.

Every rule that asks "which tasks overlap this span", "how many calls fall in each capture" or
"does this series grow" uses these instead of re-coding them. They work on polars frames with
the canonical column names (``start_ns``/``end_ns`` int64 ns, ``rank``/``session`` keys), and the
interval functions accept eager or lazy frames and return the same kind.

Interval convention: an interval is half-open ``[start_ns, end_ns)``. A zero-length interval is a
point: it *overlaps* a span when it lies inside ``[start, end)``, but it covers no time, so it never
contributes to a union or a covered fraction.

Trend tests use numpy only (no scipy at runtime); p-values come from the normal approximations
that the hydrology/climate literature uses for Mann-Kendall, and Fisher's z for Spearman.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import polars as pl

from traceanalyzer.vocabulary import CANN_PROCESS, GRAPH_REPLAY_APIS, HARDWARE_PROCESS

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)
OverlapMode = Literal["overlap", "contain", "start_within"]

DEFAULT_KEYS: tuple[str, ...] = ("rank", "session")


# --------------------------------------------------------------------------------------------
# Interval joins
# --------------------------------------------------------------------------------------------


def any_of(patterns: Sequence[str]) -> str:
    """One regex that matches where any of ``patterns`` does, each in a group of its own (its
    inline flags stay its own): a column searched once, not once per pattern. None matches
    nothing."""
    return "|".join(f"(?:{p})" for p in patterns) if patterns else r"[^\s\S]"


def overlap_join(
    spans: Frame,
    tasks: Frame,
    *,
    on: Sequence[str] = DEFAULT_KEYS,
    mode: OverlapMode = "overlap",
    suffix: str = "_task",
) -> Frame:
    """Pair every span with the tasks that overlap it (or lie inside it), per ``on`` keys.

    Both frames need ``start_ns`` and ``end_ns``. Task columns that clash with span columns get
    ``suffix`` (so the task bounds become ``start_ns_task``/``end_ns_task``). Added columns:
    ``overlap_start_ns``, ``overlap_end_ns`` and ``overlap_ns`` (the clipped intersection).
    Rows come in the order of the spans, then of the tasks.

    Modes:
      - ``overlap``: the task shares time with the span (``t.start < s.end and t.end > s.start``);
        a zero-length task counts when ``s.start <= t.start < s.end``.
      - ``contain``: the task lies entirely inside the span.
      - ``start_within``: the task starts inside ``[s.start, s.end)`` (for counting calls per
        window regardless of how long they run).

    Each mode is two inequalities between the bounds, which polars joins by sorting (an
    IEJoin): the cost follows the pairs found, so thousands of steps against thousands of calls
    cost what the pairs cost, not their product. polars turns an equality among the predicates
    into a cross join, so each ``on`` key group is joined apart (null keys match nothing, as in
    an equi-join).
    """
    keys = list(on)
    lazy = isinstance(spans, pl.LazyFrame)
    left = spans.collect() if lazy else spans
    right = tasks.collect() if isinstance(tasks, pl.LazyFrame) else tasks
    clashing = [c for c in right.columns if c in left.columns and c not in keys]
    right = right.rename({c: f"{c}{suffix}" for c in clashing})
    s_start, s_end = pl.col("start_ns"), pl.col("end_ns")
    t_start, t_end = pl.col(f"start_ns{suffix}"), pl.col(f"end_ns{suffix}")
    if mode == "overlap":
        # a zero-length task counts from the span's start: its end as one ns later
        right = right.with_columns((t_end + (t_start == t_end).cast(pl.Int64)).alias("_end_by"))
        predicates = [t_start < s_end, pl.col("_end_by") > s_start]
    elif mode == "contain":
        predicates = [t_start >= s_start, t_end <= s_end]
    elif mode == "start_within":
        predicates = [t_start >= s_start, t_start < s_end]
    else:  # pragma: no cover - guarded by the Literal type
        raise ValueError(f"unknown overlap mode {mode!r}")
    # a null bound the predicates read matches nothing (a start_within task needs no end)
    task_bounds = [t_start] if mode == "start_within" else [t_start, t_end]
    keyed = [pl.col(c).is_not_null() for c in keys]
    left = left.with_row_index("_span").filter(*keyed, s_start.is_not_null(), s_end.is_not_null())
    right = right.with_row_index("_task_row").filter(
        *keyed, *(bound.is_not_null() for bound in task_bounds)
    )
    groups = right.partition_by(keys, as_dict=True, include_key=False) if keys else {(): right}
    parts = [
        part.join_where(groups[key], *predicates)
        for key, part in (left.partition_by(keys, as_dict=True) if keys else {(): left}).items()
        if key in groups
    ]
    if not parts:  # the columns of a join that found nothing
        parts = [left.clear().join_where(right.clear().drop(keys), *predicates)]
    ov_start = pl.max_horizontal(s_start, t_start)
    ov_end = pl.min_horizontal(s_end, t_end)
    joined = (
        pl.concat(parts)
        .sort("_span", "_task_row")
        .drop("_span", "_task_row", *(["_end_by"] if mode == "overlap" else []))
        .with_columns(
            ov_start.alias("overlap_start_ns"),
            ov_end.alias("overlap_end_ns"),
            (ov_end - ov_start).clip(lower_bound=0).alias("overlap_ns"),
        )
    )
    return joined.lazy() if lazy else joined  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Unions and coverage
# --------------------------------------------------------------------------------------------


def union_intervals(
    intervals: Frame,
    *,
    by: Sequence[str] = DEFAULT_KEYS,
    start: str = "start_ns",
    end: str = "end_ns",
) -> Frame:
    """Merge overlapping or touching intervals within each ``by`` group.

    Returns one row per merged interval: the ``by`` columns plus ``start``/``end``. Zero-length
    and inverted intervals are dropped (they cover no time). ``[0,5)`` and ``[5,9)`` merge.
    """
    keys = list(by)
    # by the keys, then start and end: the times sorted first and the keys' sort stable (one
    # sort of them all with a text key took three times as long)
    ordered = (
        intervals.select([*keys, start, end]).filter(pl.col(end) > pl.col(start)).sort([start, end])
    )
    prev_end = pl.col(end).cum_max().shift(1)
    if keys:  # each group is one stretch of rows: numbered, not hashed by its keys again
        ordered = ordered.sort(keys, maintain_order=True)
        ordered = ordered.with_columns(pl.struct(keys).rle_id().alias("_interval_group"))
        prev_end = prev_end.over("_interval_group")
    # a run of intervals that overlap or touch, numbered over the whole frame (a group's first
    # interval has no end before it: it starts one)
    run = (prev_end.is_null() | (pl.col(start) > prev_end)).cum_sum()
    return (
        ordered.with_columns(run.alias("_run"))
        .group_by("_run", maintain_order=True)
        .agg(*(pl.col(k).first() for k in keys), pl.col(start).min(), pl.col(end).max())
        .drop("_run")
    )


def total_length(intervals: Frame, *, by: Sequence[str] = DEFAULT_KEYS) -> Frame:
    """Length of the union of intervals per ``by`` group, as ``covered_ns``."""
    merged = union_intervals(intervals, by=by)
    length = (pl.col("end_ns") - pl.col("start_ns")).sum().alias("covered_ns")
    if not by:
        return merged.select(length)
    return merged.group_by(list(by), maintain_order=True).agg(length)


def covered_fraction(
    spans: Frame,
    intervals: Frame,
    *,
    span_id: str,
    on: Sequence[str] = DEFAULT_KEYS,
) -> Frame:
    """For each span, how much of it the union of ``intervals`` covers.

    ``spans`` needs ``span_id``, ``start_ns``, ``end_ns`` (plus the ``on`` keys); ``intervals`` needs
    ``start_ns``/``end_ns`` (plus ``on``). Overlapping intervals are unioned first, so two waits
    over the same time count once. Returns the spans with ``covered_ns`` and ``covered_fraction``
    (``covered_ns / span length``; 0.0 for a zero-length span).
    """
    pairs = overlap_join(spans, intervals.select([*on, "start_ns", "end_ns"]), on=on)
    clipped = pairs.select(
        pl.col(span_id),
        pl.col("overlap_start_ns").alias("start_ns"),
        pl.col("overlap_end_ns").alias("end_ns"),
    )
    covered = total_length(clipped, by=[span_id])
    span_len = pl.col("end_ns") - pl.col("start_ns")
    return (
        spans.join(covered, on=span_id, how="left")
        .with_columns(pl.col("covered_ns").fill_null(0))
        .with_columns(
            pl.when(span_len > 0)
            .then(pl.col("covered_ns") / span_len)
            .otherwise(0.0)
            .alias("covered_fraction")
        )
    )


def uncovered(
    spans: pl.DataFrame,
    intervals: pl.DataFrame,
    *,
    span_id: str,
    on: Sequence[str] = DEFAULT_KEYS,
) -> pl.DataFrame:
    """The pieces of each span that no interval covers: ``span_id``, ``start_ns``, ``end_ns``,
    one row per piece (none for a span covered whole), in the order of the spans.

    ``spans`` needs ``span_id``, ``start_ns``, ``end_ns`` and the ``on`` keys; ``intervals``
    ``start_ns``/``end_ns`` and ``on`` (unioned first)."""
    keys = list(on)
    merged = union_intervals(intervals, by=keys).sort([*keys, "start_ns"])
    lowest, highest = -(2**63), 2**63 - 1
    holes = pl.concat(
        [
            merged.select(
                *keys,
                pl.col("end_ns").shift(1).over(keys).fill_null(lowest).alias("start_ns"),
                pl.col("start_ns").alias("end_ns"),
            ),
            merged.group_by(keys).agg(pl.col("end_ns").max().alias("start_ns"))
            .with_columns(pl.lit(highest, dtype=pl.Int64).alias("end_ns")),
        ]
    ).filter(pl.col("end_ns") > pl.col("start_ns"))  # fmt: skip
    own = spans.select(span_id, *keys, "start_ns", "end_ns").with_row_index("_order")
    pieces = overlap_join(own, holes, on=keys).select(
        "_order", span_id, pl.col("overlap_start_ns").alias("start_ns"),
        pl.col("overlap_end_ns").alias("end_ns"),
    )  # fmt: skip
    alone = own.join(merged.select(keys).unique(), on=keys, how="anti")  # nothing covers them
    return (
        pl.concat([pieces, alone.select(pieces.columns)])
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("_order", "start_ns")
        .drop("_order")
    )


# --------------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------------

WINDOW_COLUMNS = ("window", "start_ns", "end_ns", "dur_ns", "depth", "paired")


def pair_windows(
    events: pl.DataFrame | pl.LazyFrame,
    *,
    is_begin: pl.Expr,
    is_end: pl.Expr,
    by: Sequence[str] = ("rank", "session", "thread"),
    keep_unpaired: bool = False,
) -> pl.DataFrame:
    """Pair begin/end events into windows, per ``by`` group (normally per thread), like brackets.

    A window runs from its begin event's ``start_ns`` to its end event's ``end_ns`` (the end API
    call finishes the window). Pairing is last-in-first-out, so nested windows pair correctly and
    carry ``depth`` (0 = outermost). Events are ordered by ``start_ns`` then ``seq`` (file order)
    when the frame has it, so a begin and an end at the same timestamp pair in file order.

    Unpaired events never raise: an end with no open begin is ignored; a begin still open at the
    end of its group is dropped, or kept with ``end_ns``/``dur_ns`` null and ``paired=False`` when
    ``keep_unpaired``. Returns the ``by`` columns plus ``window`` (0-based index within the group,
    in begin order), ``start_ns``, ``end_ns``, ``dur_ns``, ``depth`` and ``paired``.
    """
    keys = list(by)
    frame = events.lazy() if isinstance(events, pl.DataFrame) else events
    order = ["start_ns", "seq"] if "seq" in frame.collect_schema().names() else ["start_ns"]
    marked = (
        frame.with_columns(
            pl.when(is_begin).then(pl.lit("B")).when(is_end).then(pl.lit("E")).alias("_kind")
        )
        .filter(pl.col("_kind").is_not_null())
        .select([*keys, "_kind", "start_ns", "end_ns", *order[1:]])
        .sort([*keys, *order])
        .collect()
    )
    rows: list[dict] = []
    for group_key, group in marked.group_by(keys, maintain_order=True) if keys else [((), marked)]:
        key_values = dict(zip(keys, group_key, strict=True))
        open_begins: list[int] = []  # start_ns of begins not yet closed (a stack)
        windows: list[dict] = []
        for kind, start_ns, end_ns in group.select("_kind", "start_ns", "end_ns").iter_rows():
            if kind == "B":
                open_begins.append(start_ns)
                continue
            if not open_begins:
                continue  # an end with no begin: profiling started mid-window
            begin_ns = open_begins.pop()
            windows.append(
                {"start_ns": begin_ns, "end_ns": end_ns, "depth": len(open_begins), "paired": True}
            )
        if keep_unpaired:
            windows += [
                {"start_ns": s, "end_ns": None, "depth": d, "paired": False}
                for d, s in enumerate(open_begins)
            ]
        windows.sort(key=lambda w: w["start_ns"])
        for index, window in enumerate(windows):
            end_ns = window["end_ns"]
            dur_ns = None if end_ns is None else end_ns - window["start_ns"]
            rows.append({**key_values, "window": index, **window, "dur_ns": dur_ns})
    schema = {**{k: marked.schema[k] for k in keys}, "window": pl.Int64, "start_ns": pl.Int64,
              "end_ns": pl.Int64, "dur_ns": pl.Int64, "depth": pl.Int64, "paired": pl.Boolean}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).select([*keys, *WINDOW_COLUMNS])


def window_of(
    points: pl.DataFrame,
    windows: pl.DataFrame,
    *,
    at: str = "start_ns",
    by: Sequence[str] = DEFAULT_KEYS,
    keep: Sequence[str] = (),
    bounds: tuple[str, str] | None = None,
) -> pl.DataFrame:
    """``points`` with the ``keep`` columns of the window of ``windows`` (``[start_ns,
    end_ns)``, per ``by`` key, not overlapping) that each point's ``at`` lies in, null where it
    lies in none; with ``bounds``, that window's start and end too, under those two names. The
    points keep their order."""
    added = [*keep, *(bounds or ())]
    if points.is_empty():
        types = {**windows.schema, **dict.fromkeys(bounds or (), pl.Int64)}
        return points.with_columns(pl.lit(None, types[c]).alias(c) for c in added)
    right = (
        windows.select(*by, pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we"), *keep)
        .cast({k: points.schema[k] for k in by})
        .sort("_ws")
    )
    inside = pl.col(at) < pl.col("_we")
    joined = (
        points.with_row_index("_row")
        .sort(at)
        .join_asof(
            right, left_on=at, right_on="_ws", by=list(by), strategy="backward",
            check_sortedness=False,
        )
        .with_columns(pl.when(inside).then(pl.col(c)).alias(c) for c in [*keep, "_ws", "_we"])
        .sort("_row")
    )  # fmt: skip
    if bounds:
        return joined.rename({"_ws": bounds[0], "_we": bounds[1]}).drop("_row")
    return joined.drop("_row", "_ws", "_we")


def count_in_windows(
    windows: pl.DataFrame,
    events: pl.DataFrame | pl.LazyFrame,
    *,
    window_id: str,
    on: Sequence[str] = DEFAULT_KEYS,
    name: str = "count",
) -> pl.DataFrame:
    """Count the events that *start* inside each window (``[start_ns, end_ns)``), per ``on`` keys.

    Every window gets a row, with 0 when nothing falls in it. An event inside nested windows
    counts for each of them. ``window_id`` must identify a window uniquely.
    """
    lazy_events = events.lazy() if isinstance(events, pl.DataFrame) else events
    hits = (
        overlap_join(
            windows.lazy().select([*on, window_id, "start_ns", "end_ns"]),
            lazy_events.select([*on, "start_ns", "end_ns"]),
            on=on,
            mode="start_within",
        )
        .group_by(window_id)
        .agg(pl.len().cast(pl.Int64).alias(name))
        .collect()
    )
    return windows.join(hits, on=window_id, how="left").with_columns(pl.col(name).fill_null(0))


# --------------------------------------------------------------------------------------------
# Trend tests
# --------------------------------------------------------------------------------------------


def _as_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=float)


def theil_sen_slope(y: Sequence[float], x: Sequence[float] | None = None) -> float:
    """Median of the pairwise slopes: a trend estimate that a few outliers cannot move.

    ``x`` defaults to 0..n-1 (e.g. capture index). Returns 0.0 for fewer than two distinct x.
    """
    ys = _as_array(y)
    xs = np.arange(len(ys), dtype=float) if x is None else _as_array(x)
    i, j = np.triu_indices(len(ys), k=1)
    dx = xs[j] - xs[i]
    keep = dx != 0
    if not keep.any():
        return 0.0
    return float(np.median((ys[j] - ys[i])[keep] / dx[keep]))


@dataclass(frozen=True)
class MannKendall:
    """Mann-Kendall monotonic trend test. ``p_increasing`` is the one-sided p for an upward trend."""

    s: int
    z: float
    tau: float
    p_two_sided: float
    p_increasing: float


def mann_kendall(y: Sequence[float]) -> MannKendall:
    """Mann-Kendall test with the tie-corrected variance and a continuity correction.

    Distribution-free: it only asks whether later values tend to be larger than earlier ones, so
    it is not fooled by a single spike. With n < 3 there is no evidence: p = 1.
    """
    ys = _as_array(y)
    n = len(ys)
    if n < 3:
        return MannKendall(0, 0.0, 0.0, 1.0, 1.0)
    i, j = np.triu_indices(n, k=1)
    s = int(np.sign(ys[j] - ys[i]).sum())
    _, tie_counts = np.unique(ys, return_counts=True)
    ties = sum(t * (t - 1) * (2 * t + 5) for t in tie_counts if t > 1)
    var_s = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var_s <= 0:  # every value equal
        return MannKendall(s, 0.0, 0.0, 1.0, 1.0)
    z = (s - math.copysign(1, s)) / math.sqrt(var_s) if s != 0 else 0.0
    tau = s / (n * (n - 1) / 2)
    return MannKendall(
        s=s,
        z=z,
        tau=tau,
        p_two_sided=math.erfc(abs(z) / math.sqrt(2)),
        p_increasing=0.5 * math.erfc(z / math.sqrt(2)),
    )


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), 1-based."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman rank correlation and its two-sided p-value (Fisher z approximation).

    Returns ``(nan, 1.0)`` when either side is constant or n < 3, and p = 1.0 for n = 3.
    """
    xs, ys = _as_array(x), _as_array(y)
    n = len(xs)
    if n < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return float("nan"), 1.0
    rho = float(np.corrcoef(_ranks(xs), _ranks(ys))[0, 1])
    if n <= 3:  # Fisher's z needs n > 3
        return rho, 1.0
    if abs(rho) >= 1.0:
        return rho, 0.0
    z = math.atanh(rho) * math.sqrt((n - 3) / 1.06)
    return rho, math.erfc(abs(z) / math.sqrt(2))


def growth_ratio(y: Sequence[float], edge: int = 1) -> float:
    """Mean of the last ``edge`` values over the mean of the first ``edge`` values.

    ``edge`` > 1 smooths noise at both ends. A zero start gives ``inf`` when the end is positive
    (growth from nothing), 1.0 when both are zero.
    """
    ys = _as_array(y)
    if len(ys) == 0:
        return float("nan")
    k = max(1, min(edge, len(ys) // 2 or 1))
    first, last = float(ys[:k].mean()), float(ys[-k:].mean())
    if first == 0:
        return 1.0 if last == 0 else float("inf")
    return last / first


@dataclass(frozen=True)
class Trend:
    """Everything a growth rule reports about one series (ordered by x)."""

    n: int
    slope: float  # Theil-Sen slope per unit of x
    mk: MannKendall
    ratio: float  # growth_ratio
    first: float
    last: float

    def grows(self, *, min_slope: float, alpha: float, min_ratio: float) -> bool:
        """The three-part verdict: robust slope, significant test, and a material growth."""
        return self.slope > min_slope and self.mk.p_increasing < alpha and self.ratio > min_ratio


def trend(y: Sequence[float], x: Sequence[float] | None = None, *, edge: int = 1) -> Trend:
    """Theil-Sen slope, Mann-Kendall test and growth ratio of one series in one call."""
    ys = _as_array(y)
    return Trend(
        n=len(ys),
        slope=theil_sen_slope(ys, x),
        mk=mann_kendall(ys),
        ratio=growth_ratio(ys, edge),
        first=float(ys[0]) if len(ys) else float("nan"),
        last=float(ys[-1]) if len(ys) else float("nan"),
    )


def outermost(intervals: Frame, *, by: Sequence[str] = DEFAULT_KEYS) -> Frame:
    """Drop intervals that lie inside another interval of the same ``by`` group.

    Used to de-duplicate windows from two sources (a user marker that wraps each capture) and
    spans that match twice (a ``python_function`` inside a ``cpu_op`` of the same name). Partial
    overlaps are kept; of two identical intervals the first (in frame order) is kept.
    """
    keys = list(by)
    # Sorted by time alone: a window over the keys keeps that order within each group, and an
    # integer sort costs a third of one that leads with the text keys.
    ordered = intervals.with_row_index("_order").sort(
        ["start_ns", "end_ns", "_order"], descending=[False, True, False]
    )
    reach = pl.col("end_ns").cum_max().shift(1)
    if keys:
        reach = reach.over(keys)
    return (
        ordered.filter(reach.is_null() | (pl.col("end_ns") > reach)).sort("_order").drop("_order")
    )


# --------------------------------------------------------------------------------------------
# CANN API layers
# --------------------------------------------------------------------------------------------

ApiLayer = Literal["auto", "acl", "runtime", "all"]


def one_api_layer(
    calls: Frame, layer: ApiLayer = "auto", *, by: Sequence[str] = ("rank",)
) -> Frame:
    """Keep the CANN calls (slices with ``api_layer``) of one layer, so no call counts twice.

    Each AscendCL call (``AscendCL@aclrtMemcpy``) also appears as the runtime call it makes
    (``Runtime@MemCopySync``) when the profile has the runtime layer (Level2). ``auto`` keeps, per
    ``by`` group, the runtime calls when the group has any (they also include calls that bypass
    AscendCL, such as HCCL's direct rtMemcpy), else the other layers; ``acl`` and ``runtime`` keep
    that side everywhere; ``all`` keeps every call.
    """
    is_runtime = pl.col("api_layer") == "Runtime"
    if layer == "all":
        return calls
    if layer == "runtime":
        return calls.filter(is_runtime)
    if layer == "acl":
        return calls.filter(~is_runtime)
    group_has_runtime = is_runtime.any().over(list(by)) if by else is_runtime.any()
    return calls.filter(pl.when(group_has_runtime).then(is_runtime).otherwise(~is_runtime))


# --------------------------------------------------------------------------------------------
# Device streams and their host launches
# --------------------------------------------------------------------------------------------

STREAM_KEYS: tuple[str, ...] = ("rank", "session", "stream")


def stream_gaps(tasks: Frame, *, stream: str = "stream_id") -> Frame:
    """The idle gap before each device task, per (rank, session, stream).

    ``tasks`` are device tasks (normally the ``Ascend Hardware`` slices) with ``rank``,
    ``session``, the ``stream`` column (``stream_id`` in the store), ``start_ns``, ``end_ns`` and
    ``name``. A task that starts after everything earlier on its stream has ended follows a gap:
    the returned row carries that next task's columns (its ``start_ns``, ``name``, ids, ...), plus
    ``stream``, ``prev_end_ns`` (when the stream last became free), ``prev_name`` (the task that
    ended then) and ``gap_ns``. The stream's end is a running maximum, so a task nested in or
    overlapping a longer one leaves no gap, and the first task of a stream has none.
    """
    keys = list(STREAM_KEYS)
    ordered = tasks.with_columns(pl.col(stream).alias("stream")).sort([*keys, "start_ns", "end_ns"])
    reach = pl.col("end_ns").cum_max()
    # The name of the task that set the running maximum, carried forward to the tasks after it.
    holder = pl.when(pl.col("end_ns") == reach).then(pl.col("name")).forward_fill()
    return (
        ordered.with_columns(
            reach.shift(1).over(keys).alias("prev_end_ns"),
            holder.over(keys).alias("_holder"),
        )
        .with_columns(
            pl.col("_holder").shift(1).over(keys).alias("prev_name"),
            (pl.col("start_ns") - pl.col("prev_end_ns")).alias("gap_ns"),
        )
        .filter(pl.col("gap_ns") > 0)
        .drop("_holder")
    )


def classify_gaps(
    gaps: pl.DataFrame,
    syncs: pl.DataFrame,
    captures: pl.DataFrame,
    other: pl.DataFrame,
    *,
    min_gap_ns: float,
    max_gap_ns: float,
) -> pl.DataFrame:
    """Flag each stream gap ``host_bound`` (launched after the stream went idle) or
    ``after_sync``: the one definition of "the device waited on the host" that the overview's
    breakdown and host-launch-bound share.

    ``gaps``: :func:`stream_gaps` rows with their next task's launch (:func:`host_launches`:
    ``launch_start_ns``, ``launch_end_ns``, ``link``); ``syncs``, ``captures``, ``other``: host
    intervals (rank, session, start_ns, end_ns) of synchronisations, graph captures, and calls
    whose time is another cause's (compiling, allocating). Gaps under ``min_gap_ns`` are the
    device's dispatch latency and over ``max_gap_ns`` pauses (``pause``): neither counts.

    A gap during which the host waited in a sync is the sync's (``after_sync``); one that
    overlaps a graph capture is start-up, not dispatch. A host-bound gap costs its length less
    the host time spent in ``other`` calls inside it (``other_ns``: compiling, allocating;
    their own rules report that time).
    """
    marked = _gap_overlaps(_gap_overlaps(gaps, syncs, "in_sync"), captures, "in_capture")
    other_ns = _covered_before(marked, other, "start_ns") - _covered_before(
        marked, other, "prev_end_ns"
    )
    late = pl.col("launch_end_ns") > pl.col("prev_end_ns")
    # Which replay queued a graph task is a guess (the last one before it); when the host runs
    # ahead that is a later replay than the task's own. Only a replay that began after the
    # stream ran dry proves nothing was queued.
    replay = pl.col("link") == "graph_replay"
    late = (late & (~replay | (pl.col("launch_start_ns") > pl.col("prev_end_ns")))).fill_null(False)
    pause = pl.col("gap_ns") > max_gap_ns
    counted = late & (pl.col("gap_ns") >= min_gap_ns) & ~pause & ~pl.col("in_capture")
    return (
        marked.with_columns(other_ns.alias("other_ns"))
        .with_columns(
            pause.alias("pause"),
            (counted & ~pl.col("in_sync")).alias("host_bound"),
            (counted & pl.col("in_sync")).alias("after_sync"),
            (pl.col("launch_end_ns") - pl.col("prev_end_ns")).alias("late_ns"),
            (pl.col("gap_ns") - pl.col("other_ns")).alias("cost_ns"),
        )
        .sort("rank", "session", "stream", "start_ns")
    )


def _gap_overlaps(gaps: pl.DataFrame, intervals: pl.DataFrame, flag: str) -> pl.DataFrame:
    """Add ``flag``: the gap ``[prev_end_ns, start_ns)`` overlaps one of the merged ``intervals``."""
    keys = ["rank", "session"]
    merged = union_intervals(intervals).rename({"start_ns": "_s", "end_ns": "_e"}).sort("_s")
    return (
        gaps.sort("start_ns")
        .join_asof(
            merged,
            left_on="start_ns",
            right_on="_s",
            by=keys,
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )  # fmt: skip
        .with_columns((pl.col("_e").fill_null(-1) > pl.col("prev_end_ns")).alias(flag))
        .drop("_s", "_e")
    )


def _covered_before(points: pl.DataFrame, merged: pl.DataFrame, at: str) -> pl.Series:
    """Per row of ``points``: how much of the disjoint ``merged`` intervals lies before ``at``."""
    keys = ["rank", "session"]
    before = merged.sort("start_ns").with_columns(
        (
            (pl.col("end_ns") - pl.col("start_ns")).cum_sum()
            - (pl.col("end_ns") - pl.col("start_ns"))
        )
        .over(keys)
        .alias("_before")
    )
    hit = (
        points.select(*keys, at)
        .with_row_index("_row")
        .sort(at)
        .join_asof(
            before.rename({"start_ns": "_s", "end_ns": "_e"}),
            left_on=at,
            right_on="_s",
            by=keys,
            strategy="backward",
            check_sortedness=False,
        )
        .sort("_row")
    )
    inside = pl.min_horizontal(pl.col(at), pl.col("_e")) - pl.col("_s")
    return hit.select((pl.col("_before") + inside).fill_null(0))["_before"]


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
        return ordered.join_asof(
            ordered_calls,
            left_on=at,
            right_on="call_start_ns",
            by=thread,
            strategy="backward",
            check_sortedness=False,
        )

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
    hit = graph_tasks.join_asof(
        launches.sort("launch_start_ns"),
        left_on="start_ns",
        right_on="launch_start_ns",
        by=["rank", "session"],
        strategy="backward",
        check_sortedness=False,
    )
    return _link(hit.filter(pl.col("launch_name").is_not_null()), "graph_replay")


def _connection_links(tasks: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    keys = ["rank", "session", "connection_id"]
    ranked = calls.filter(pl.col("connection_id").is_not_null()).sort(
        pl.col("api_layer").replace_strict(_LAYER_PREFERENCE, default=9, return_dtype=pl.Int64)
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
