"""How a reader writes a large table: in one sorted order, a row group at a time.

The trace derivation (``trace_events.py``) and the Db reader (``db.py``) write their slices and
counters this way, in the same orders, so a Text and a Db export of one session give the same
files. Only the order (a permutation of the rows) and one row group are held besides the table:
a sorted copy of a large table would double its memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pyarrow as pa

# Rows per Parquet row group gathered from the sorted order (16k slices rows with their args
# peaked 30 MB lower than 32k, at the same speed).
ROW_GROUP_ROWS = 16 << 10


def stable_order(
    frame: pl.DataFrame, by: Sequence[pl.Expr | str], descending: Sequence[bool] | None = None
) -> pl.Series:
    """Row numbers of ``frame`` in the order of ``by`` (nulls last, ties in frame order).

    One stable sort per key, the last key first: a sort on all keys at once builds a row
    encoding of every key (70 MB for 412k slices, a text among them). A dictionary-encoded key
    sorts by its texts.
    """
    descending = descending or [False] * len(by)
    order = pl.int_range(frame.height, eager=True, dtype=pl.Int64).alias("row")
    for key, desc in reversed(list(zip(by, descending, strict=True))):
        expr = pl.col(key) if isinstance(key, str) else key
        keys = frame.select(expr.alias("key")).to_series().gather(order).to_frame()
        step = keys.select(
            pl.arg_sort_by("key", descending=desc, nulls_last=True, maintain_order=True)
        )
        order = order.gather(step.to_series())
    return order


def made_ahead(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``parts``, each made on a second thread while the sink writes the one before: polars and
    the Parquet encoder both release the GIL, so the two overlap on two cores."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, parts, None)
        while (part := pending.result()) is not None:
            pending = pool.submit(next, parts, None)
            yield part
