"""The rule author's kit: everything a rule file and its fixtures import, from one place.

::

    from traceanalyzer.kit import (
        rule, Param, Requirement, AnyOf, NotEvaluated, RuleContext, Finding, Evidence,
        KeyFigure, Mark, FigureContext, DEVICE_PROCESSES, WAIT_TASK_TYPES, overlap_join, text,
    )

- the rule API (:func:`rule`, :class:`Param`, :class:`Requirement`, ...), the canned
  requirements (:mod:`traceanalyzer.kit.requirements`: ``device_tasks()``, ``host_api(...)``,
  ``kernel_details()``, ``api_statistics()``, ``communication_ops()``, ``counters(name)``) and
  the presentation hooks (:class:`KeyFigure`, :class:`Mark`, :class:`FigureContext`, the SVG
  :class:`Chart` its ``new`` returns and :class:`Swatch`, a legend entry), the units a
  metric is declared in (``NS``, ``SHARE``, ...) and a finding's :class:`Cost`
  (:func:`cost_over`);
- the domain vocabulary (:mod:`traceanalyzer.vocabulary`: process names across generations,
  wait and copy task types, the recipes' metadata markers);
- the shared primitives (:mod:`traceanalyzer.primitives`) and text formatting (``text``);
- fixtures: :func:`fixture`, :class:`StoreBuilder` (canonical rows in memory) and, through real
  files, ``RankBuilder`` and ``ingested`` (loaded on first use: they bring the synthetic
  generator and the parsers); both builders speak one set of verbs, defined once in
  :mod:`traceanalyzer.kit.fixture_verbs` (times as int ns, ``us()`` to write microseconds,
  :class:`Launch` for a task's host launch).

See docs/writing-rules.md.
"""

from __future__ import annotations

from typing import Any

from traceanalyzer import text
from traceanalyzer.api_layers import ApiLayer, one_api_layer
from traceanalyzer.authoring.ruletest import fixture
from traceanalyzer.chart import PALETTE, Chart, Swatch
from traceanalyzer.engine.findings import Cost, Evidence, Finding, compress_ranks
from traceanalyzer.engine.params import Param, Params
from traceanalyzer.engine.presentation import (
    FigureContext,
    KeyFigure,
    Mark,
    evidence_marks,
    series_by_rank,
)
from traceanalyzer.engine.rule import (
    AnyOf,
    NotEvaluated,
    Requirement,
    Rule,
    RuleContext,
    rule,
    sql_rule,
)
from traceanalyzer.engine.units import COUNT, NS, P_VALUE, RATIO, SHARE, TRACE_NS
from traceanalyzer.host_gaps import (
    GapSettings,
    StreamGaps,
    classify_gaps,
    compute_stream_gaps,
    stream_gaps,
    stream_gaps_of,
)
from traceanalyzer.intervals import (
    count_in_windows,
    covered_fraction,
    outermost,
    overlap_join,
    pair_windows,
    total_length,
    uncovered,
    union_intervals,
    window_of,
)
from traceanalyzer.kernels import NOT_KERNEL_PATTERN, kernel_tasks
from traceanalyzer.kit.cost import analysed_window_ns, analysed_windows, cost_over, window_share
from traceanalyzer.kit.cross_rank import (
    Alignment,
    alignment,
    collective_split,
    iteration_roots,
    rank_waits,
)
from traceanalyzer.kit.fixture_verbs import Launch, us
from traceanalyzer.kit.memory import (
    Growth,
    baseline_growth,
    device_memory,
    memory_records,
    step_seconds,
    step_series,
)
from traceanalyzer.kit.moe import (
    PATH_NAMES,
    EpGroup,
    Imbalance,
    MoeVerdict,
    exchange_paths,
    moe_exchange_paths,
    moe_imbalance,
)
from traceanalyzer.kit.requirements import (
    HOST_MARKED_STEPS,
    api_statistics,
    communication_ops,
    counters,
    device_tasks,
    host_api,
    kernel_details,
    phases,
    step_spans,
)
from traceanalyzer.kit.steps import (
    DEQUEUE_PREFIX,
    NO_STEPS,
    SteadyUse,
    call_sites,
    cann_calls,
    capture_windows,
    host_calls,
    in_steps,
    launched_tasks,
    per_step_figure,
    phase_at,
    phase_windows,
    phases_in,
    recurring_calls,
    serving_steps,
    steady_key_figures,
    step_windows,
)
from traceanalyzer.kit.store_builder import StoreBuilder
from traceanalyzer.kit.tails import LateWork, Tail, TailVerdict, tail_iterations
from traceanalyzer.launch_links import containing_call, host_launches
from traceanalyzer.memory import (
    APP,
    GE,
    MB_BYTES,
    NO_CAPACITY,
    PTA,
    SERIES,
    RankMemory,
    capacity_mb,
    steady_steps,
)
from traceanalyzer.patterns import any_of, first_match
from traceanalyzer.stats import OUTLIER_EXCESS, OUTLIER_Z, Trend, robust_z, spearman, trend
from traceanalyzer.steps.moe_layers import routed_tokens
from traceanalyzer.steps.phases import PHASES, STEADY_PHASES
from traceanalyzer.store import Store
from traceanalyzer.vocabulary import (
    AI_CORE_FREQ_PROCESS,
    AI_CORE_TASK_TYPES,
    AI_CPU_TASK_TYPES,
    ALLOC_APIS,
    CANN_PROCESS,
    CAPTURE_WINDOW,
    COMMUNICATION_PROCESSES,
    COMPILE_API,
    COMPILE_CALLS,
    COMPUTE_TASK_TYPES,
    COPY_TASK_NAMES,
    COPY_TASK_TYPES,
    DEVICE_PROCESSES,
    DISPATCH_LATENCY_US,
    FREE_APIS,
    GRAPH_REPLAY_APIS,
    HARDWARE_PROCESS,
    HOST_PROCESSES,
    LAUNCH_FLOW_CATEGORIES,
    NOT_HOST_PROCESSES,
    NOTIFY_WAIT_NAMES,
    OVERLAP_PROCESS,
    PAUSE_MS,
    PROFILER_MARKER_TASKS,
    PYTHON_GC_PROCESS,
    PYTHON_PROCESS,
    STEP_SPAN_PREFIX,
    STORE_TRANSFER_WINDOW,
    SYNC_APIS,
    TRANSFER_KEY,
    WAIT_TASK_NAMES,
    WAIT_TASK_TYPES,
    WINDOW_KEY,
    session_metadata,
)

# Fixture helpers that go through real files: resolved on first use, so loading a rule does not
# import the synthetic generator.
_THROUGH_FILES = {
    "RankBuilder": "traceanalyzer.synth.fixtures",
    "ingested": "traceanalyzer.synth.fixtures",
    "scenario_store": "traceanalyzer.synth.fixtures",
}

__all__ = [
    # rule API
    "AnyOf",
    "Evidence",
    "Finding",
    "NotEvaluated",
    "Param",
    "Params",
    "Requirement",
    "Rule",
    "RuleContext",
    "rule",
    "sql_rule",
    # canned requirements
    "api_statistics",
    "communication_ops",
    "counters",
    "device_tasks",
    "host_api",
    "kernel_details",
    "phases",
    "step_spans",
    "HOST_MARKED_STEPS",
    # steps and phases (the steps table), host calls in them
    "DEQUEUE_PREFIX",
    "NO_STEPS",
    "SteadyUse",
    "call_sites",
    "cann_calls",
    "launched_tasks",
    "capture_windows",
    "host_calls",
    "in_steps",
    "per_step_figure",
    "PHASES",
    "STEADY_PHASES",
    "phase_at",
    "phase_windows",
    "serving_steps",
    "phases_in",
    "recurring_calls",
    "steady_key_figures",
    "step_windows",
    # device memory (profile_memory=True)
    "APP",
    "GE",
    "MB_BYTES",
    "NO_CAPACITY",
    "PTA",
    "SERIES",
    "Growth",
    "RankMemory",
    "baseline_growth",
    "capacity_mb",
    "device_memory",
    "memory_records",
    "steady_steps",
    "step_seconds",
    "step_series",
    # mixture of experts: EP exchanges, expert load
    "PATH_NAMES",
    "EpGroup",
    "Imbalance",
    "MoeVerdict",
    "exchange_paths",
    "moe_exchange_paths",
    "moe_imbalance",
    "routed_tokens",
    # ranks that meet in collectives: iterations aligned, roots, tails
    "Alignment",
    "LateWork",
    "Tail",
    "TailVerdict",
    "alignment",
    "collective_split",
    "iteration_roots",
    "rank_waits",
    "tail_iterations",
    # gaps on compute streams, the host-bound ones
    "GapSettings",
    "StreamGaps",
    "compute_stream_gaps",
    "stream_gaps_of",
    # cost, kernels, statistics
    "Cost",
    "analysed_window_ns",
    "analysed_windows",
    "cost_over",
    "window_share",
    "NOT_KERNEL_PATTERN",
    "kernel_tasks",
    "OUTLIER_EXCESS",
    "OUTLIER_Z",
    "robust_z",
    # presentation
    "COUNT",
    "NS",
    "P_VALUE",
    "RATIO",
    "SHARE",
    "TRACE_NS",
    "PALETTE",
    "Chart",
    "Swatch",
    "FigureContext",
    "KeyFigure",
    "Mark",
    "evidence_marks",
    "series_by_rank",
    # vocabulary
    "AI_CORE_FREQ_PROCESS",
    "ALLOC_APIS",
    "COMPILE_API",
    "COMPILE_CALLS",
    "DISPATCH_LATENCY_US",
    "FREE_APIS",
    "PAUSE_MS",
    "AI_CORE_TASK_TYPES",
    "AI_CPU_TASK_TYPES",
    "CANN_PROCESS",
    "CAPTURE_WINDOW",
    "COMMUNICATION_PROCESSES",
    "COMPUTE_TASK_TYPES",
    "COPY_TASK_NAMES",
    "COPY_TASK_TYPES",
    "DEVICE_PROCESSES",
    "GRAPH_REPLAY_APIS",
    "HARDWARE_PROCESS",
    "HOST_PROCESSES",
    "LAUNCH_FLOW_CATEGORIES",
    "NOTIFY_WAIT_NAMES",
    "NOT_HOST_PROCESSES",
    "OVERLAP_PROCESS",
    "PYTHON_GC_PROCESS",
    "PROFILER_MARKER_TASKS",
    "PYTHON_PROCESS",
    "STEP_SPAN_PREFIX",
    "STORE_TRANSFER_WINDOW",
    "SYNC_APIS",
    "TRANSFER_KEY",
    "WAIT_TASK_NAMES",
    "WAIT_TASK_TYPES",
    "WINDOW_KEY",
    "session_metadata",
    # primitives
    "ApiLayer",
    "Trend",
    "any_of",
    "classify_gaps",
    "containing_call",
    "count_in_windows",
    "covered_fraction",
    "host_launches",
    "one_api_layer",
    "outermost",
    "overlap_join",
    "pair_windows",
    "spearman",
    "stream_gaps",
    "total_length",
    "trend",
    "uncovered",
    "union_intervals",
    "window_of",
    "first_match",  # a pattern parameter on one text, in linear time
    "text",
    "compress_ranks",
    # fixtures
    "Launch",
    "RankBuilder",  # noqa: F822 - resolved lazily by __getattr__
    "Store",
    "StoreBuilder",
    "fixture",
    "ingested",  # noqa: F822 - resolved lazily by __getattr__
    "scenario_store",  # noqa: F822 - resolved lazily by __getattr__
    "us",
]


def __getattr__(name: str) -> Any:
    if name in _THROUGH_FILES:
        import importlib

        return getattr(importlib.import_module(_THROUGH_FILES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
