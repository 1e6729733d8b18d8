"""How a reader writes a large table: in one sorted order, a row group at a time.

The trace derivation (``trace_events.py``) and the Db reader (``db.py``) write their slices and
counters this way, in the same orders, so a Text and a Db export of one session give the same
files. Only the order (a permutation of the rows) and one row group are held besides the table:
a sorted copy of a large table would double its memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import polars as pl
import pyarrow as pa

# Rows per Parquet row group gathered from the sorted order: fewer lower the peak, at a cost
# in CPU below this.
ROW_GROUP_ROWS = 8 << 10


def stable_order(
    frame: pl.DataFrame, by: Sequence[pl.Expr | str], descending: Sequence[bool] | None = None
) -> pl.Series:
    """Row numbers of ``frame`` in the order of ``by`` (nulls last, ties in frame order).

    One stable sort of the row numbers on every key (numpy's lexsort), each key an integer
    (a text or float by its dense rank): polars' sort on all keys at once builds a row encoding
    of every key, and one polars sort per key takes more time and memory. A dictionary-encoded
    key sorts by its texts.
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
        # each distinct word ranked once, its codes mapped to the ranks (not every row cast)
        words = values.drop_nulls().unique()
        ranks = words.cast(pl.String).rank("dense")
        return values.to_physical().replace_strict(words.to_physical(), ranks, default=None)
    return values.rank("dense")


def made_ahead(makers: Iterable[Callable[[], pa.Table]], workers: int = 3) -> Iterator[pa.Table]:
    """The parts ``makers`` make, in their order, each made on one of ``workers`` threads while
    the sink writes the ones before: polars and the Parquet encoder release the GIL, so they
    overlap. A row group takes twice as long to make as to write, and a maker waits for the
    GIL, a read or its page faults between polars calls: three makers beat two on two cores,
    for a little more peak each. At most ``workers`` parts are being made or wait, besides the
    one being written."""
    pending: deque[Future[pa.Table]] = deque()
    with ThreadPoolExecutor(max(1, workers)) as pool:
        try:
            for make in makers:
                pending.append(pool.submit(make))
                if len(pending) > workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # an error or a sink that stopped early: what waits is not made
            for future in pending:
                future.cancel()
