"""How a reader writes a large table: in one sorted order, a row group at a time.

The trace derivation (``trace_events.py``) and the Db reader (``db.py``) write their slices and
counters this way, in the same orders, so a Text and a Db export of one session give the same
files. Only the order (a permutation of the rows) and one row group are held besides the table:
a sorted copy of a large table would double its memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
import pyarrow as pa

# Rows per Parquet row group gathered from the sorted order: on the 200 MB benchmark 8k slices
# rows with their args peaked 20 MB lower than 16k (and 50 lower than 32k) at the same speed;
# 4k was 12 MB lower still but took 0.3 s more CPU.
ROW_GROUP_ROWS = 8 << 10


def stable_order(
    frame: pl.DataFrame, by: Sequence[pl.Expr | str], descending: Sequence[bool] | None = None
) -> pl.Series:
    """Row numbers of ``frame`` in the order of ``by`` (nulls last, ties in frame order).

    One stable sort of the row numbers on every key (numpy's lexsort), each key an integer
    (a text or float by its dense rank): polars' sort on all keys at once builds a row encoding
    of every key (70 MB for 412k slices, a text among them), and one polars sort per key took
    more time (0.12 s instead of 0.08 on those slices) and memory. A dictionary-encoded key sorts by
    its texts.
    """
    descending = descending or [False] * len(by)
    keys: list[np.ndarray] = []  # the least significant first, as lexsort takes them
    for key, desc in reversed(list(zip(by, descending, strict=True))):
        expr = pl.col(key) if isinstance(key, str) else key
        values = _as_integers(frame.select(expr.alias("key")).to_series())
        nulls = values.null_count()
        filled = (values.fill_null(0) if nulls else values).to_numpy()
        # ~x reverses the order of integers without the overflow of -x at the type's minimum.
        keys.append(~filled if desc else filled)
        if nulls:
            keys.append(values.is_null().to_numpy())  # nulls last, in either direction
    if not keys:
        return pl.int_range(frame.height, eager=True, dtype=pl.Int64).alias("row")
    return pl.Series("row", np.lexsort(keys).astype(np.int64, copy=False))


def _as_integers(values: pl.Series) -> pl.Series:
    """``values`` as integers that sort as they do (equal values equal, nulls kept)."""
    if values.dtype.is_integer():
        return values
    if values.dtype == pl.Boolean:
        return values.cast(pl.UInt8)
    if values.dtype in (pl.Categorical, pl.Enum):
        values = values.cast(pl.String)
    return values.rank("dense")


def made_ahead(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``parts``, each made on a second thread while the sink writes the one before: polars and
    the Parquet encoder both release the GIL, so the two overlap on two cores."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, parts, None)
        while (part := pending.result()) is not None:
            pending = pool.submit(next, parts, None)
            yield part
