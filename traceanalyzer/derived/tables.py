"""The steps of a store, for those who read them (the kit's helpers, the overview, diff)."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceanalyzer.derived.stage import TABLE
from traceanalyzer.store import Store


def steps_of(store: Store, ranks: Collection[int] | None = None) -> pl.DataFrame:
    """The steps of ``ranks`` (every rank: None), rank first: the store's ``steps`` table,
    derived here at the default parameters for a rank it has none for (a fixture's store, or
    one written before steps were derived), once per store; read once per store and ranks (a
    snapshot store keeps it: the rules, the exchange paths and the overview ask again)."""
    key = ("steps_of", None if ranks is None else tuple(sorted(ranks)))
    return store.memo(key, lambda: store.derived(TABLE, ranks).collect())
