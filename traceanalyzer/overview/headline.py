"""The components of a step as the reports name them, and the headline that weighs them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from traceanalyzer import text
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


# a second part is named when it takes at least this share of the step
SECOND_PART = 0.05
# the phases of served iterations: a profile with two or more of them leads with each one,
# since one mean over 12 ms prefills and 0.4 ms decodes describes neither
SERVED_PHASES = ("prefill", "decode", "mixed", "spec_decode")


def _largest(mean: Mapping[str, float]) -> list[tuple[float, str]]:
    """The two largest parts of the mean step (share, name), the second only when it counts."""
    parts = sorted(
        (
            (sum(mean.get(k, 0.0) for k in keys) / mean["step_ns"], name)
            for name, keys in HEADLINE_PARTS
        ),
        reverse=True,
    )
    return [parts[0], *([parts[1]] if parts[1][0] >= SECOND_PART else [])]


def headline(mean: Mapping[str, float] | None) -> str | None:
    """ "Most of the step is exposed communication (64%), then ... (17%)": the two largest parts."""
    if not mean or not mean.get("step_ns"):
        return None
    (first, first_name), *second = _largest(mean)
    lead = "Most of the step is" if first >= 0.5 else "The largest part of the step is"
    text = f"{lead} {first_name} ({first:.0%})"
    return text + (f", then {second[0][1]} ({second[0][0]:.0%})." if second else ".")


def phase_headline(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """With two or more served phases, each one's largest parts and median iteration, the
    phases by their share of the time: "Per phase: mixed (5 iterations, p50 12.2 ms): compute
    98%; decode (18, p50 419 µs): the device drained by host synchronisations 66%, then compute
    29%." None with fewer (the whole profile's headline says it)."""
    served = [
        r for r in rows if r["phase"] in SERVED_PHASES and (r.get("mean") or {}).get("step_ns")
    ]
    if len(served) < 2:
        return None
    said = []
    for i, row in enumerate(sorted(served, key=lambda r: -(r.get("total_ns") or 0))):
        count = (
            f"{row['steps']} iteration{'s' if row['steps'] != 1 else ''}" if not i else row["steps"]
        )
        parts = ", then ".join(f"{name} {share:.0%}" for share, name in _largest(row["mean"]))
        said.append(f"{row['phase']} ({count}, p50 {text.duration(row['p50_ns'])}): {parts}")
    return "Per phase: " + "; ".join(said) + "."


def mean_components(frame: pl.DataFrame) -> dict[str, float]:
    return {k: float(frame[k].mean() or 0.0) for k in ("step_ns", *COMPONENT_NAMES)}
