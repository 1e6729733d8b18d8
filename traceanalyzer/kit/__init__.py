"""The rule author's kit: everything a rule file imports, from one place.

::

    from traceanalyzer.kit import (
        rule, Param, Requirement, AnyOf, NotEvaluated, RuleContext, Finding, Evidence,
        KeyFigure, Mark, FigureContext, DEVICE_PROCESSES, WAIT_TASK_TYPES, overlap_join, text,
    )

A façade only: what it exports lives in its own layer, so the modules behind it can move
without breaking a rule.

- the rule API (:func:`rule`, :class:`Param`, :class:`Requirement`, ...), the canned
  requirements (:mod:`traceanalyzer.analyses.requirements`: ``device_tasks()``,
  ``host_api(...)``, ``kernel_details()``, ``api_statistics()``, ``communication_ops()``,
  ``counters(name)``) and the presentation hooks (:class:`KeyFigure`, :class:`Mark`,
  :class:`FigureContext`, the SVG :class:`Chart` its ``new`` returns and :class:`Swatch`, a
  legend entry), the units a metric is declared in (``NS``, ``SHARE``, ...) and a finding's
  :class:`Cost` (:func:`cost_over`);
- the domain vocabulary (:mod:`traceanalyzer.vocabulary`: process names across generations,
  wait and copy task types, the recipes' metadata markers);
- the shared analyses (:mod:`traceanalyzer.analyses`: steps and phases, cost windows, device
  memory, the ranks' collectives aligned, tail iterations, MoE expert load), the primitives
  (:mod:`traceanalyzer.intervals`, :mod:`traceanalyzer.host_gaps`,
  :mod:`traceanalyzer.launch_links`, :mod:`traceanalyzer.stats`, ...) and text formatting
  (``text``).

A rule's fixtures import their builders from :mod:`traceanalyzer.kit.testing`.
See docs/writing-rules.md.
"""

from __future__ import annotations

from typing import NoReturn

from traceanalyzer import text
from traceanalyzer.analyses.cost import (
    analysed_window_ns,
    analysed_windows,
    cost_over,
    window_share,
)
from traceanalyzer.analyses.cross_rank import (
    Alignment,
    alignment,
    collective_split,
    iteration_roots,
    rank_waits,
)
from traceanalyzer.analyses.memory import (
    Growth,
    baseline_growth,
    device_memory,
    memory_records,
    step_seconds,
    step_series,
)
from traceanalyzer.analyses.moe import (
    PATH_NAMES,
    EpGroup,
    Imbalance,
    MoeVerdict,
    moe_exchange_paths,
    moe_imbalance,
)
from traceanalyzer.analyses.requirements import (
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
from traceanalyzer.analyses.steps import (
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
from traceanalyzer.analyses.tails import LateWork, Tail, TailVerdict, tail_iterations
from traceanalyzer.api_layers import ApiLayer, one_api_layer
from traceanalyzer.chart import PALETTE, Chart, Swatch
from traceanalyzer.derived.moe_layers import routed_tokens
from traceanalyzer.derived.phases import PHASES, STEADY_PHASES
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
    "Store",
]

# The fixture builders a rule's fixtures imported from here before they moved to kit.testing,
# which stands above the kit: re-exported here they would be an import back up, so the old
# path fails saying where each is now.
MOVED_TO_TESTING = frozenset(
    {"Launch", "RankBuilder", "StoreBuilder", "fixture", "ingested", "scenario_store", "us"}
)


def __getattr__(name: str) -> NoReturn:
    if name in MOVED_TO_TESTING:
        # an ImportError: an AttributeError's message is lost in `from ... import`
        raise ImportError(
            f"{name} is no longer in traceanalyzer.kit: a rule's fixtures import it from "
            f"traceanalyzer.kit.testing (from traceanalyzer.kit.testing import {name})"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
