"""The steps stage: a store's ``steps`` table, before the rules.

Derived in one task per batch of shards with the stages beside it (``stages.run_stages``): after
the launches (the steps read their kernels' launches, and the host calls their graph calls are
taken from), from the slices it reads once for the stages after it too (``derive.STEP_SLICES``).
Its key is part of every rule outcome's key, and of every stage's that reads the steps, so a
rule or a table whose steps changed is derived again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from traceanalyzer.derived.derive import COMPUTE_KERNELS, STEP_SLICES, derive_ranks
from traceanalyzer.derived.launches import TABLE as LAUNCHES
from traceanalyzer.derived.parameters import NAMESPACE, STEP_PARAMS
from traceanalyzer.engine.config import ConfigError, namespace_params
from traceanalyzer.engine.params import Params
from traceanalyzer.executor import SMALL_WORK_BYTES
from traceanalyzer.stages import Stage, declare, rows_of
from traceanalyzer.store import Store

TABLE = "steps"


class StepSettingError(ConfigError):
    """A ``steps.NAME`` setting names no parameter or has a bad value."""


def step_params(values: Mapping[str, Any] | None = None) -> Params:
    """The derivation's parameters: defaults overlaid with ``values`` (``--set steps.X=...``,
    ``[steps]`` of the config file), each coerced to its declared type."""
    return namespace_params(NAMESPACE, STEP_PARAMS, values, StepSettingError)


def derive_steps(
    store: Store,
    ranks: list[int],
    params: Params,
    *,
    step_slices: pl.LazyFrame,
    compute_kernels: pl.DataFrame,
    launches: pl.DataFrame,
) -> pl.DataFrame:
    """The steps of ``ranks``, from the slices and compute kernels the stages after read too."""
    return derive_ranks(store, ranks, params, launches, step_slices, compute_kernels)


STEPS = declare(
    Stage(
        name=NAMESPACE,
        tables=(TABLE,),
        derive=derive_steps,
        inputs=("sessions", "slices", "kernels", LAUNCHES),
        namespace=NAMESPACE,
        params=step_params,
        before_rules=True,
        task_bytes=SMALL_WORK_BYTES,  # the auto executor's bound for work in one process
        reads=(STEP_SLICES, COMPUTE_KERNELS, rows_of(LAUNCHES)),
        order=("rank", "session", "start_ns"),
    )
)
