"""``inference-baseline`` and its sick variants: eager (or graph) decode steps at a chosen size.

The decode knobs (:class:`~traceanalyzer.synth.ops.DecodeKnobs`) add the host-side pathologies
one at a time, each with the numbers the field reports, so each has a sick scenario and a
healthy twin (the baseline itself, or ``graph=1``):

- ``host-launch-bound``: 120 µs of host time per eager op, kernels of 3-55 µs: the compute
  stream idles between kernels because nothing is queued (vllm-ascend #9404). ``graph=1`` is its
  healthy twin: one ``aclmdlRIExecuteAsync`` per step queues all kernels.
- ``sync-in-step``: two ``.item()`` syncs inside every step of a device-bound decode (kernels
  4x longer, so the host runs ahead), each followed by 300 µs of host work before the next
  launch (vllm-ascend #4805, PR #4063), besides the per-step token fetch.
- ``alloc-churn``: ``aclrtMalloc``/``aclrtFree`` pairs of 150 µs in every step;
  ``warmup_only=N`` keeps them to the first N steps (the decoy).
- ``online-compile``: ops recompiled in every step (``aclopCompileAndExecute`` +
  ``opCompile`` of 2 ms); ``warmup_only=N`` keeps them to warm-up.

``tail_at`` makes a few steps late by ``tail_ms`` (``tail_cause``): a single rank's tail
iterations (``tail-iteration`` without waiters).
"""

from __future__ import annotations

from dataclasses import fields

from traceanalyzer.synth.ops import MS, STALL_CAUSES, DecodeKnobs
from traceanalyzer.synth.scenarios.serving import numbers
from traceanalyzer.synth.scenarios.timeline import Timeline

DECODE_KNOBS = {f.name: f.default for f in fields(DecodeKnobs)}
KNOBS = {
    "steps": 8, "layers": 4, "tp_comm": 0, **DECODE_KNOBS,
    "tail_at": "", "tail_ms": 2.0, "tail_cause": "host",
}  # fmt: skip
HELP = (
    "plain decode steps (knobs: steps, layers, tp_comm=1 adds an all-reduce per layer; decode "
    "knobs host_us, kernel_scale, graph, syncs, sync_gap_us, allocs, alloc_us, compiles, compile_us, "
    "warmup_only add host-side pathologies; tail_at: the steps (from 0) late by tail_ms, "
    "tail_cause=host|compile|gc|sync|device)"
)
SICK_KNOBS = {
    "slow-host-decode": ({"host_us": 120.0}, "eager decode whose host takes 120 µs per op"),
    "item-sync-decode": (
        {"syncs": 2, "kernel_scale": 4.0},
        "two .item() syncs inside every decode step of a device-bound decode",
    ),
    "empty-cache-decode": ({"allocs": 2}, "aclrtMalloc/aclrtFree pairs in every decode step"),
    "dynamic-shape-decode": ({"compiles": 2}, "ops compiled online in every decode step"),
}


def run(tl: Timeline, knobs: dict) -> None:
    tl.layers = knobs["layers"]
    tl.allreduce = bool(knobs["tp_comm"])
    tl.knobs = DecodeKnobs(**{k: knobs[k] for k in DECODE_KNOBS})
    if knobs["tail_cause"] not in STALL_CAUSES:
        raise ValueError(f"tail_cause must be one of {', '.join(STALL_CAUSES)}")
    tails = numbers(knobs["tail_at"])
    stall = (int(knobs["tail_ms"] * MS), knobs["tail_cause"])
    for i in range(knobs["steps"]):
        tl.decode(stall if i in tails else None)
