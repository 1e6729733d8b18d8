"""Canned requirements: the data most rules need, each declared once.

A rule declares what it reads so that, without it, the runner says *not evaluated: missing X
(collect with Y)* instead of a silent "clean". These factories hold the table, the columns and
the row filter of the usual cases, and the words of that message; the arguments name what the
rule looks for, so the message stays specific::

    requires=[host_api("aclrtSynchronize*", "aclrtMemcpy"), device_tasks()]
    # not evaluated: missing CANN API events (`aclrtSynchronize*`, `aclrtMemcpy`)
    #                (collect with profiler_level=Level1)

Combine alternatives with ``AnyOf`` (``AnyOf(kernel_details(), device_tasks(...))``); write a
:class:`Requirement` by hand for anything else.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceanalyzer.engine.rule import Requirement
from traceanalyzer.vocabulary import CANN_PROCESS, HARDWARE_PROCESS

LEVEL1 = "profiler_level=Level1"  # the CANN layer, kernel_details.csv and communication.json
NPU_ACTIVITY = "ProfilerActivity.NPU"  # the device side of trace_view.json


def _naming(what: str, names: Sequence[str]) -> str:
    return f"{what} ({', '.join(f'`{n}`' for n in names)})" if names else what


def device_tasks(
    what: str = f"device tasks (process `{HARDWARE_PROCESS}`)",
    *,
    columns: Sequence[str] = ("stream_id",),
) -> Requirement:
    """Tasks on the device streams (trace_view.json ``Ascend Hardware``) with values in
    ``columns`` (``("task_type",)`` for a rule that tells kernels from waits and copies)."""
    return Requirement(
        "slices",
        tuple(columns),
        what=what,
        collect_with=NPU_ACTIVITY,
        where=pl.col("process") == HARDWARE_PROCESS,
    )


def host_api(*apis: str, what: str = "CANN API events", collect_with: str = LEVEL1) -> Requirement:
    """Host CANN API calls (process ``CANN``; torch_npu prunes that layer at Level0). ``apis``
    name the calls the rule looks at, for the message: ``host_api("aclrtMalloc", "aclrtFree")``."""
    return Requirement(
        "slices",
        ("api_name",),
        what=_naming(what, apis),
        collect_with=collect_with,
        where=pl.col("process") == CANN_PROCESS,
    )


def api_statistics(collect_with: str = LEVEL1) -> Requirement:
    """Call counts per CANN API (api_statistic.csv): the fallback when the trace is not there."""
    return Requirement(
        "api_stats",
        ("api_name", "count"),
        what="CANN API statistics (api_statistic.csv)",
        collect_with=collect_with,
    )


def kernel_details(
    what: str = "device kernels with their core type (kernel_details.csv)",
    *,
    columns: Sequence[str] = ("accelerator_core", "dur_ns"),
    collect_with: str = LEVEL1,
) -> Requirement:
    """The kernels table (kernel_details.csv: op type, accelerator core, shapes, dtypes)."""
    return Requirement("kernels", tuple(columns), what=what, collect_with=collect_with)


def communication_ops(
    *,
    columns: Sequence[str] = ("wait_ns",),
    collect_with: str = f"{LEVEL1} in a multi-rank job",
) -> Requirement:
    """Collective and point-to-point ops of communication.json (transit, wait, sync times)."""
    return Requirement(
        "comm_ops",
        tuple(columns),
        what="communication ops (communication.json)",
        collect_with=collect_with,
    )


def counters(*names: str, collect_with: str = NPU_ACTIVITY) -> Requirement:
    """Samples of the counters ``names`` (``counters(AI_CORE_FREQ_PROCESS)``), matched on the
    counter's process or its name, as exports name them either way."""
    if not names:
        raise ValueError("counters() needs the name of at least one counter")
    return Requirement(
        "counters",
        ("value",),
        what=f"the {' or '.join(names)} counter",
        collect_with=collect_with,
        where=pl.col("process").is_in(names) | pl.col("name").is_in(names),
    )


# The step windows the host marked (the steps table's sources that say where an iteration
# begins and ends on the host): device bursts and whole sessions are no such thing.
HOST_MARKED_STEPS = ("profiler_step", "annotation", "scope", "python_function")
STEP_COLLECT = (
    "a profiler schedule and prof.step() every iteration; for a vLLM server, with_stack or "
    "with_modules (execute_model python functions) or VLLM_CUSTOM_SCOPES_FOR_PROFILING=1"
)


def step_spans(what: str = "step windows marked on the host") -> Requirement:
    """Iterations whose bounds the host recorded (``ProfilerStep#N``, vLLM's step annotation or
    scopes, the Python tracer's ``execute_model``): what a rule that places host calls in their
    step needs."""
    return Requirement(
        "steps",
        ("step",),
        what=f"{what} (ProfilerStep#N, vLLM step annotations or scopes, execute_model)",
        collect_with=STEP_COLLECT,
        where=pl.col("step_source").is_in(list(HOST_MARKED_STEPS)),
    )


def phases(*names: str) -> Requirement:
    """Steps of the phases ``names`` (``phases("decode", "spec_decode")``): a rule that judges
    only them says "not evaluated: no decode steps" on a profile that has none."""
    return Requirement(
        "steps",
        ("phase",),
        what=f"{' or '.join(names)} steps",
        collect_with="a profile of the server while it serves that phase",
        where=pl.col("phase").is_in(list(names)),
    )
