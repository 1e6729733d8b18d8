"""``inference-baseline``: plain eager decode steps at a chosen size, for benchmarks."""

from __future__ import annotations

from traceanalyzer.synth.scenarios.timeline import Timeline

KNOBS = {"steps": 8, "layers": 4, "tp_comm": 0}
HELP = "plain decode steps (knobs: steps, layers, tp_comm=1 adds an all-reduce per layer)"


def run(tl: Timeline, knobs: dict) -> None:
    tl.layers = knobs["layers"]
    tl.allreduce = bool(knobs["tp_comm"])
    for _ in range(knobs["steps"]):
        tl.decode()
