"""The components of a step as the reports name them, and the headline that weighs them."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from traceanalyzer.schema import COMPONENT_NAMES

# key, label, group: the order is the stacked bar's, bottom to top
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("compute_ai_core_ns", "compute: AI Core", "compute"),
    ("compute_ai_vector_ns", "compute: AI Vector", "compute"),
    ("compute_mix_ns", "compute: MIX", "compute"),
    ("compute_ai_cpu_ns", "compute: AI CPU", "compute"),
    ("compute_other_ns", "compute: other", "compute"),
    ("overlapped_ns", "compute + communication (overlapped)", "communication"),
    ("comm_exposed_ns", "communication, not overlapped", "communication"),
    ("device_other_ns", "memory copies, runtime tasks", "device"),
    ("idle_host_ns", "idle: waiting on the host (launch-bound)", "idle"),
    ("idle_sync_ns", "idle: after a host synchronisation", "idle"),
    ("idle_stream_ns", "idle: waiting on another stream", "idle"),
    ("idle_other_ns", "idle: other", "idle"),
)
# what the headline weighs: the components a performance engineer acts on, grouped
HEADLINE_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compute", tuple(k for k, _, g in COMPONENTS if g == "compute") + ("overlapped_ns",)),
    ("exposed communication", ("comm_exposed_ns",)),
    ("memory copies and runtime tasks", ("device_other_ns",)),
    ("the device waiting on the host", ("idle_host_ns",)),
    ("the device drained by host synchronisations", ("idle_sync_ns",)),
    ("streams waiting on other streams", ("idle_stream_ns",)),
    ("other device idle time", ("idle_other_ns",)),
)


def headline(mean: Mapping[str, float] | None) -> str | None:
    """ "Most of the step is exposed communication (64%), then ... (17%)": the two largest parts."""
    if not mean or not mean.get("step_ns"):
        return None
    parts = sorted(
        (
            (sum(mean.get(k, 0.0) for k in keys) / mean["step_ns"], name)
            for name, keys in HEADLINE_PARTS
        ),
        reverse=True,
    )
    (first, first_name), (second, second_name) = parts[0], parts[1]
    lead = "Most of the step is" if first >= 0.5 else "The largest part of the step is"
    text = f"{lead} {first_name} ({first:.0%})"
    return text + (f", then {second_name} ({second:.0%})." if second >= 0.05 else ".")


def mean_components(frame: pl.DataFrame) -> dict[str, float]:
    return {k: float(frame[k].mean() or 0.0) for k in ("step_ns", *COMPONENT_NAMES)}
