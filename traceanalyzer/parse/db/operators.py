"""operator_details.csv of a Db export: one row per torch op with its host and device times.

The Db keeps no such table; torch_npu derives the CSV from the ops, their nesting and the device
tasks each op launched, and so does this module:

- host total: the op's span; host self: that less the spans of the ops directly inside it (on
  its thread);
- device self: the device tasks the op launched itself (its ``async_npu`` links: kernels,
  copies, collectives); device total: those of the op and of every op inside it;
- "with AICore": the same, counting only tasks queued as `AI_CORE`.

Every op but the ``ProfilerStep#N`` spans has a row, as in the CSV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceanalyzer.parse.csv_tables import canonical_text
from traceanalyzer.parse.db.database import I64, STR, Db, conform, schema_of
from traceanalyzer.vocabulary import STEP_SPAN_PREFIX


@dataclass(frozen=True)
class OperatorTexts:
    """The texts an op's row shows, by the ids its slice keeps: call stacks (a JSON string
    literal of ``;\\r\\n``-joined frames, as the trace's `Call stack`) and input dims."""

    stacks: pl.DataFrame  # callchain, stack
    dims: pl.DataFrame  # dims_id, dims


def operator_texts(db: Db, stacks: pl.DataFrame, python: pl.DataFrame) -> OperatorTexts:
    """The texts of the ops among ``python`` (its slices, with their ``dims_id``)."""
    ids = python.filter(pl.col("cat") == "cpu_op")["dims_id"].drop_nulls().unique()
    dims = pl.DataFrame({"dims_id": ids}).with_columns(db.text(pl.col("dims_id")).alias("dims"))
    return OperatorTexts(stacks, dims)


def operator_ops(slices: pl.DataFrame) -> pl.DataFrame:
    """The ops among ``slices`` with what :func:`operator_table` reads of them: taken before the
    slices are written and let go, so that the table is derived without them in memory."""
    return slices.filter(
        (pl.col("process") == "Python")
        & (pl.col("cat") == "cpu_op")
        & ~pl.col("name").cast(STR).str.starts_with(STEP_SPAN_PREFIX)
    ).select("api_row", "tid", "start_ns", "end_ns", "dur_ns", "name", "callchain", "dims_id")


def operator_table(ops: pl.DataFrame, launched: pl.DataFrame, texts: OperatorTexts) -> pl.DataFrame:
    """The operators table from :func:`operator_ops`, the device tasks they launched
    (:meth:`~traceanalyzer.parse.db.flows.Links.launched`) and the ops' texts, but for their call stacks
    (:func:`with_operator_stacks`)."""
    ops = ops.sort("tid", "start_ns", pl.col("dur_ns"), descending=[False, False, True])
    ops = ops.with_columns(pl.Series("depth", _depths(ops), dtype=I64))
    ops = ops.with_columns(pl.int_range(pl.len(), dtype=I64).alias("pos"))
    parents = ops.select(
        "tid", pl.col("depth").alias("parent_depth"), pl.col("pos").alias("parent_pos"), "api_row"
    )
    ops = (
        ops.with_columns((pl.col("depth") - 1).alias("parent_depth"))
        .join_asof(
            parents.rename({"api_row": "parent"}),
            left_on="pos",
            right_on="parent_pos",
            by=["tid", "parent_depth"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,  # positions rise within every group
        )
        .drop("parent_depth", "parent_pos")
    )
    launched = launched.select(
        "api_row",
        pl.col("dur_ns").alias("task_ns"),
        pl.when(pl.col("task_type") == "AI_CORE")
        .then(pl.col("dur_ns"))
        .otherwise(0)
        .alias("aicore_ns"),
    )
    own = launched.group_by("api_row").agg(pl.col("task_ns", "aicore_ns").sum())
    ops = ops.join(own, on="api_row", how="left").with_columns(
        pl.col("task_ns", "aicore_ns").fill_null(0)
    )
    children = ops.group_by("parent").agg(pl.col("dur_ns").sum().alias("children_ns"))
    ops = ops.join(children, left_on="api_row", right_on="parent", how="left")
    totals = _subtree_sums(ops, ("task_ns", "aicore_ns"))
    ops = ops.join(totals, on="api_row", how="left")
    ops = ops.join(texts.dims, on="dims_id", how="left")
    table = ops.sort("start_ns", "dur_ns", "tid", descending=[False, True, False]).select(
        pl.col("name").cast(STR),
        canonical_text(pl.col("dims").str.replace_all("\r\n", "\n"), "text").alias("input_shapes"),
        "callchain",  # its call stack is added as the rows are written (with_operator_stacks)
        (pl.col("dur_ns") - pl.col("children_ns").fill_null(0)).alias("host_self_ns"),
        pl.col("dur_ns").alias("host_total_ns"),
        pl.col("task_ns").alias("device_self_ns"),
        pl.col("task_ns_total").alias("device_total_ns"),
        pl.col("aicore_ns").alias("device_self_aicore_ns"),
        pl.col("aicore_ns_total").alias("device_total_aicore_ns"),
    )
    return conform(table, schema_of("operators", callchain=I64))


def with_operator_stacks(part: pl.DataFrame, stacks: pl.DataFrame) -> pl.DataFrame:
    """``part`` (rows of :func:`operator_table`) with each op's call stack (``stacks``:
    callchain → the trace's `Call stack` JSON literal) as operator_details.csv shows it: added
    a row group at a time, so that the ops' stacks (the table's largest column) are not made
    for all of them beside the ones held for the slices."""
    stacks = part.select("callchain").join(
        stacks, on="callchain", how="left", maintain_order="left"
    )
    stack = stacks["stack"].str.json_decode(STR).str.replace_all(r";?\r?\n", "\n")
    return part.with_columns(stack.alias("call_stack"))


def _depths(ops: pl.DataFrame) -> np.ndarray:
    """How many ops of its thread are open around each op (``ops`` sorted by thread, start, and
    the longer first): those started before it less those ended by its start."""
    depths = np.zeros(ops.height, dtype=np.int64)
    if not ops.height:
        return depths
    tids = ops["tid"].to_numpy()
    starts, ends = ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    bounds = np.flatnonzero(np.diff(tids)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, ops.height], strict=True):
        ended = np.searchsorted(np.sort(ends[lo:hi]), starts[lo:hi], side="right")
        depths[lo:hi] = np.arange(hi - lo) - ended
    return depths


def _subtree_sums(ops: pl.DataFrame, columns: tuple[str, ...]) -> pl.DataFrame:
    """api_row → each of ``columns`` summed over the op and every op inside it (as
    ``<column>_total``): added up one nesting level at a time, deepest first."""
    sums = ops.select("api_row", "parent", "depth", *columns)
    totals = {c: f"{c}_total" for c in columns}
    sums = sums.with_columns(pl.col(c).alias(t) for c, t in totals.items())
    for depth in range(int(sums["depth"].max() or 0), 0, -1):
        level = sums.filter(pl.col("depth") == depth)
        up = level.group_by("parent").agg(pl.col(list(totals.values())).sum())
        sums = (
            sums.join(
                up.rename({"parent": "api_row", **{t: f"{t}_up" for t in totals.values()}}),
                on="api_row",
                how="left",
            )
            .with_columns(
                (pl.col(t) + pl.col(f"{t}_up").fill_null(0)).alias(t) for t in totals.values()
            )
            .drop(f"{t}_up" for t in totals.values())
        )
    return sums.select("api_row", *totals.values())
