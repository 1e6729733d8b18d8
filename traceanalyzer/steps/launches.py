"""The ``launches`` derived table: each device task with the host call that launched it.

Linking a task to its launch (:func:`~traceanalyzer.primitives.host_launches`) reads every
device task, host call and flow of a rank: host-launch-bound and the overview's host-bound idle
both need it, and each derived it on its own. It is derived once per shard before the rules,
beside the steps (``steps/stage.py``), at the default graph-replay calls; a rule whose
parameters differ derives its own.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import polars as pl

from traceanalyzer import primitives
from traceanalyzer.primitives import host_launches
from traceanalyzer.store import DERIVED_READERS, Store, stored_or_derived
from traceanalyzer.vocabulary import GRAPH_REPLAY_APIS

TABLE = "launches"
# host_launches' own order, kept by the stored files (a stable sort on read restores it)
ORDER = ["rank", "session", "stream", "start_ns"]


def derive_launches(
    store: Store,
    ranks: Collection[int],
    replay_apis: Sequence[str] = GRAPH_REPLAY_APIS,
    calls: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """The launches of ``ranks``' device tasks (every column of the ``launches`` table), a graph's
    tasks by the last of ``replay_apis`` before them; ``calls``: the ranks' :func:`host_calls`,
    when the caller read them."""
    in_ranks = pl.col("rank").is_in(sorted(ranks))
    return host_launches(
        store.table("slices").filter(in_ranks),
        store.table("flows").filter(in_ranks),
        replay_apis=replay_apis,
        calls=calls,
    )


def host_calls(store: Store, ranks: Collection[int]) -> pl.DataFrame:
    """The CANN calls of ``ranks`` that the launches link tasks to
    (:func:`~traceanalyzer.primitives.host_calls`)."""
    return primitives.host_calls(store.table("slices").filter(pl.col("rank").is_in(sorted(ranks))))


def launches_of(store: Store, ranks: Collection[int]) -> pl.DataFrame:
    """The launches of ``ranks``: the store's ``launches`` table, derived here for a rank it has
    none for (a fixture's store, or one written before launches were derived), once per store."""
    return stored_or_derived(store, TABLE, ranks, lambda rank: derive_launches(store, [rank])).sort(
        ORDER, maintain_order=True
    )


DERIVED_READERS[TABLE] = launches_of
