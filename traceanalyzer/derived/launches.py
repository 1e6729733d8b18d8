"""The ``launches`` derived table: each device task with the host call that launched it.

Linking a task to its launch (:func:`~traceanalyzer.launch_links.host_launches`) reads every
device task, host call and flow of a rank: host-launch-bound and the overview's host-bound idle
both need it, and each derived it on its own. It is a stage derived once per shard before the
rules, first in the task of the steps (which read it, and the host calls it is linked from),
at the default graph-replay calls; a rule whose parameters differ derives its own.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import polars as pl

from traceanalyzer import launch_links
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.launch_links import host_launches
from traceanalyzer.stages import Read, Stage, declare
from traceanalyzer.store import Store
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
    (:func:`~traceanalyzer.launch_links.host_calls`)."""
    return launch_links.host_calls(
        store.table("slices").filter(pl.col("rank").is_in(sorted(ranks)))
    )


def _read_calls(store: Store, ranks: list[int], params: None) -> pl.DataFrame:
    return host_calls(store, ranks)


# the host calls, read once for the launches, the steps' graph calls and the capture windows
CALLS = Read("calls", _read_calls)


def launches_of(store: Store, ranks: Collection[int]) -> pl.DataFrame:
    """The launches of ``ranks``: the store's ``launches`` table, derived here for a rank it has
    none for (a fixture's store, or one written before launches were derived), once per store."""
    return store.derived(TABLE, ranks).collect()


def derive_stage(
    store: Store, ranks: list[int], params: None, *, calls: pl.DataFrame
) -> pl.DataFrame:
    """The ``launches`` rows of ``ranks``, from their host calls."""
    return derive_launches(store, ranks, calls=calls)


LAUNCHES = declare(
    Stage(
        name=TABLE,
        tables=(TABLE,),
        derive=derive_stage,
        inputs=("slices", "flows"),
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the auto executor's bound for work in one process
        reads=(CALLS,),
        order=tuple(ORDER),
    )
)
