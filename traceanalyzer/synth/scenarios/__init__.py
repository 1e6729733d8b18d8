"""Scenario registry: name -> (run function, knobs with defaults, help).

A knob's type is the type of its default; values from the CLI (``--set k=v``)
are converted to it, and unknown names are rejected with the list of valid ones.
A scenario may split a rank into several profiler sessions (``sessions``), e.g.
``capture-growth`` with ``profiled_rounds``: one ``*_ascend_pt`` directory each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traceanalyzer.hints import did_you_mean, expected
from traceanalyzer.synth.scenarios import (
    baseline,
    capture,
    causes,
    device,
    memory,
    moe,
    pd,
    serving,
    store,
)
from traceanalyzer.synth.scenarios.timeline import SessionPlan, Timeline


def one_session(knobs: dict) -> list[SessionPlan]:
    """The default: the whole run is one profiler session per rank."""
    return [SessionPlan(knobs)]


def unless_session(knobs: dict) -> bool:
    """The default: the profile has a schedule unless profiled session-style (one
    ``with profile()`` around one call)."""
    return knobs.get("profile_style", "events") != "session"


def never(knobs: dict) -> bool:
    """A default vllm-ascend profile has no ProfilerStep (no schedule)."""
    return False


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Timeline, dict], None]
    knobs: dict[str, Any]
    help: str
    metadata: Callable[[dict], dict] = field(default=lambda knobs: {})
    env: dict[str, str] = field(default_factory=dict)
    sessions: Callable[[dict], list[SessionPlan]] = one_session
    # Whether the profile has a schedule (ProfilerStep#N, the Step Id column)
    scheduled: Callable[[dict], bool] = unless_session

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with ``given``, converted to each default's type."""
        unknown = sorted(set(given) - set(self.knobs))
        if unknown:
            hint = did_you_mean(unknown[0], self.knobs) if len(unknown) == 1 else ""
            raise KeyError(
                f"unknown knob(s) {unknown} for scenario {self.name!r}"
                + (hint or f"; valid: {sorted(self.knobs)}")
            )
        out = dict(self.knobs)
        for key, value in given.items():
            out[key] = convert(value, self.knobs[key], key)
        if "profile_style" in out and out["profile_style"] not in ("events", "session"):
            raise ValueError(
                f"profile_style must be 'events' or 'session', not {out['profile_style']!r}"
            )
        return out


def convert(value: Any, default: Any, key: str) -> Any:
    """Convert a knob value (often a CLI string) to the type of its default."""
    if isinstance(value, str) and not isinstance(default, str):
        try:
            if isinstance(default, bool):
                return value.lower() in ("1", "true", "yes", "on")
            return type(default)(value)
        except ValueError:
            raise ValueError(f"knob {key}={value!r}: expected {expected(default)}") from None
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    return value


def _variants(module: Any, twin: str, **options: Any) -> list[Scenario]:
    """The sick variants of ``module``'s scenario (its ``SICK_KNOBS``): its knobs, the sick ones
    changed; ``twin`` says whose knobs they take and which is healthy."""
    return [
        Scenario(name, module.run, {**module.KNOBS, **sick}, f"{help_} ({twin})", **options)
        for name, (sick, help_) in module.SICK_KNOBS.items()
    ]


_ALL = (
    Scenario("capture-growth", capture.run, capture.KNOBS, capture.HELP, sessions=capture.sessions),
    Scenario(
        "capture-healthy",
        capture.run,
        capture.HEALTHY_KNOBS,
        capture.HEALTHY_HELP,
        sessions=capture.sessions,
    ),
    Scenario("store-stall", store.run, store.KNOBS, store.HELP, store.metadata),
    Scenario("store-healthy", store.run, store.HEALTHY_KNOBS, store.HEALTHY_HELP, store.metadata),
    Scenario("inference-baseline", baseline.run, baseline.KNOBS, baseline.HELP),
    Scenario("aicpu-fallback", device.run_aicpu, device.AICPU_KNOBS, device.AICPU_HELP),
    Scenario("aicore-throttle", device.run_throttle, device.THROTTLE_KNOBS, device.THROTTLE_HELP),
    Scenario(
        "late-rank-decode", device.run_straggler, device.STRAGGLER_KNOBS, device.STRAGGLER_HELP
    ),
    Scenario("debug-settings", device.run_risky, device.RISKY_KNOBS, device.RISKY_HELP),
    Scenario(
        "serving",
        causes.with_causes(serving.run),
        {**serving.KNOBS, **causes.KNOBS},
        serving.HELP + causes.HELP,
        scheduled=serving.scheduled,
    ),
    Scenario("moe-ep", moe.run, moe.KNOBS, moe.HELP, scheduled=never),
    Scenario("pd-kv", pd.run, pd.KNOBS, pd.HELP, scheduled=never),
    Scenario("memory", memory.run, memory.KNOBS, memory.HELP, scheduled=serving.scheduled),
    *_variants(memory, "memory knobs; `memory` is the healthy twin", scheduled=serving.scheduled),
    *_variants(baseline, "inference-baseline knobs; the baseline is the healthy twin"),
)
SCENARIOS: dict[str, Scenario] = {sc.name: sc for sc in _ALL}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; choose from {sorted(SCENARIOS)}") from None
