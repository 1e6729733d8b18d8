"""Interval algebra over the store's frames: joins, unions, coverage, nesting, and points or
events placed in windows; shared by the derivations (steps, overview) and, through the kit, by
the rules ("which tasks overlap this span", "how many calls fall in each capture").

They work on polars frames with the canonical column names (``start_ns``/``end_ns`` int64 ns,
``rank``/``session`` keys), and the interval functions accept eager or lazy frames and return the
same kind.

An interval is half-open ``[start_ns, end_ns)``. A zero-length interval is a point: it
*overlaps* a span when it lies inside ``[start, end)``, but it covers no time, so it never
contributes to a union or a covered fraction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import polars as pl

Frame = TypeVar("Frame", pl.DataFrame, pl.LazyFrame)
OverlapMode = Literal["overlap", "contain", "start_within"]

DEFAULT_KEYS: tuple[str, ...] = ("rank", "session")


# --------------------------------------------------------------------------------------------
# Interval joins
# --------------------------------------------------------------------------------------------


def asof_join(
    points: Frame, rows: Frame, at: str, start: str, by: str | Sequence[str], **options: Any
) -> Frame:
    """``points`` with the columns of the row of ``rows`` of their ``by`` key whose ``start`` is
    the latest at or before each point's ``at`` (``strategy="forward"``: the earliest at or
    after; the other ``options`` are polars' ``join_asof``'s). Both come sorted on their key:
    polars cannot check that within ``by`` groups."""
    options = {"strategy": "backward", **options}
    return points.join_asof(
        rows, left_on=at, right_on=start, by=by, check_sortedness=False, **options
    )


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
        .pipe(asof_join, right, at, "_ws", list(by))
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
