"""The steps of a store, for those who read them (the kit's helpers, the overview, diff)."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceanalyzer.steps.derive import derive_ranks
from traceanalyzer.steps.evidence import default_params
from traceanalyzer.store import DERIVED_READERS, Store, stored_or_derived


def steps_of(store: Store, ranks: Collection[int] | None = None) -> pl.DataFrame:
    """The steps of ``ranks`` (every rank: None), rank first: the store's ``steps`` table,
    derived here at the default parameters for a rank it has none for (a fixture's store, or
    one written before steps were derived), once per store; read once per store and ranks (a
    snapshot store keeps it: the rules, the exchange paths and the overview ask again)."""
    key = ("steps_of", None if ranks is None else tuple(sorted(ranks)))
    return store.memo(key, lambda: _read(store, ranks))


def _read(store: Store, ranks: Collection[int] | None) -> pl.DataFrame:
    return stored_or_derived(
        store, "steps", ranks, lambda rank: derive_ranks(store, [rank], default_params())
    ).sort("rank", "session", "start_ns")


DERIVED_READERS["steps"] = steps_of
