"""The steps stage: a store's ``steps`` and the tables derived with them, before the rules.

One task per batch of shards (``stages.run_stages``) derives, for all their ranks at once, the
``launches`` first (the steps read their kernels' launches), the ``steps``, and from the device
tasks the steps read, the ``exchanges``, ``moe_layers`` and ``moe_dense``, ``kernel_layers``
and ``collectives``: they share their reads, so they are one stage. Its key is part of every
rule outcome's key, so a rule whose steps changed runs again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from traceanalyzer.engine.config import ConfigError, namespace_params
from traceanalyzer.engine.params import Params
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.stages import Stage, declare
from traceanalyzer.steps import collectives, exchanges, launches, layers, moe_layers
from traceanalyzer.steps.derive import derive_ranks, read_slices
from traceanalyzer.steps.evidence import NAMESPACE, STEP_PARAMS
from traceanalyzer.steps.exchanges import device_slices
from traceanalyzer.steps.windows import compute_tasks
from traceanalyzer.store import Store

TABLE = "steps"


class StepSettingError(ConfigError):
    """A ``steps.NAME`` setting names no parameter or has a bad value."""


def step_params(values: Mapping[str, Any] | None = None) -> Params:
    """The derivation's parameters: defaults overlaid with ``values`` (``--set steps.X=...``,
    ``[steps]`` of the config file), each coerced to its declared type."""
    return namespace_params(NAMESPACE, STEP_PARAMS, values, StepSettingError)


def derive_step_tables(
    store: Store, ranks: list[int], params: Params
) -> Iterator[tuple[str, pl.DataFrame]]:
    """The stage's tables of ``ranks``, each as soon as it is derived (the launches first: the
    steps read their kernels' launches from them)."""
    # One after the other: beside each other on a second thread they took as long in all
    # (each query runs on every core). (One read of the slices for the launches and the
    # steps, split at once, took no less time and added a fifth to the task's peak: the
    # allocator held the read's pages while the launches' inputs were copied from it.)
    calls = launches.host_calls(store, ranks)  # the graph calls of the steps are some of them
    found = launches.derive_launches(store, ranks, calls=calls)
    yield launches.TABLE, found
    slices = read_slices(store, ranks, params, calls)
    captured = layers.captures_reader(store, ranks, calls, params)
    del calls
    compute = compute_tasks(slices)  # the steps' and the EP exchanges'
    frame = derive_ranks(store, ranks, params, found, slices, compute)
    yield TABLE, frame
    device = device_slices(slices)
    ops, moe = exchanges.exchange_inputs(device, compute)
    yield exchanges.TABLE, exchanges.derive_exchanges(ops, moe, frame)
    yield from moe_layers.derive_moe(store, device, ops, moe, frame).items()
    yield layers.TABLE, layers.derive_layers(compute, device, frame, found, captured)
    mc2 = ops.filter(pl.col("path") == "mc2")
    yield collectives.TABLE, collectives.derive_collectives(store, device, mc2, frame)


STEPS = declare(
    Stage(
        name=NAMESPACE,
        tables=(
            TABLE,
            launches.TABLE,
            exchanges.TABLE,
            moe_layers.LAYERS,
            moe_layers.DENSE,
            layers.TABLE,
            collectives.TABLE,
        ),
        derive=derive_step_tables,
        inputs=("sessions", "slices", "flows", "kernels", "comm_ops"),
        namespace=NAMESPACE,
        params=step_params,
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the auto executor's bound for work in one process
    )
)
