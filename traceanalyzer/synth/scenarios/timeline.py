"""The running state a scenario advances: host clock, device streams, step counter."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from traceanalyzer.synth import ops
from traceanalyzer.synth.rank import RankWriter


@dataclass(frozen=True)
class SessionPlan:
    """One profiler session (one ``*_ascend_pt`` directory) of a rank.

    ``knobs`` are what the scenario's run function sees for this session.
    ``idle_before`` is the unprofiled work between the previous session and this
    one, in units of the previous session's length (e.g. rounds nobody profiled).
    """

    knobs: dict[str, Any]
    idle_before: float = 0.0


@dataclass
class Timeline:
    """Host time ``t`` (ns), the device model and the next ProfilerStep number of one rank."""

    rw: RankWriter
    rng: Random
    t: int
    step: int = 1
    dev: ops.Device = field(default_factory=ops.Device)
    layers: int = 4
    allreduce: bool = False
    knobs: ops.DecodeKnobs = field(default_factory=ops.DecodeKnobs)

    def decode(self, stall: tuple[int, str] | None = None) -> None:
        """One decode step (late by ``stall``, see :func:`~traceanalyzer.synth.ops.decode_step`);
        without a profiler schedule the same work runs without ProfilerStep."""
        if self.rw.cfg.schedule:
            self.t = ops.decode_step(
                self.rw,
                self.rng,
                self.dev,
                self.step,
                self.t,
                layers=self.layers,
                allreduce=self.allreduce,
                knobs=self.knobs,
                stall=stall,
            )
            self.step += 1
            return
        t = self.t
        for _ in range(self.layers):
            t = self.launch(t, ops.DECODE_LAYER, self.knobs.host_us)
        self.t = ops.synchronize(self.rw, t, self.dev.idle_at()) + ops.jitter(self.rng, 60)
        self.rw.flush()

    def launch(self, t: int, kernels: Iterable[ops.KernelSpec], host_us: float = 22) -> int:
        """Launch ``kernels`` eagerly one after the other from ``t``; returns the host time after."""
        for spec in kernels:
            t = ops.launch_kernel(self.rw, self.rng, self.dev, t, spec, host_us=host_us)
        return t

    def pad_to(self, target_bytes: int | None) -> None:
        """Add decode steps until trace_view.json reaches about ``target_bytes`` (``--target-mb``)."""
        if target_bytes is None:
            return
        while self.rw.tv.size < target_bytes:
            self.decode()
