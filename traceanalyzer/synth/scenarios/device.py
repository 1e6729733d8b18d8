"""Device-side pathologies on eager decode steps, each with a knob that turns it off.

- ``aicpu-ops``: every layer also runs an op that falls back to the AI CPU (``aicpu_op`` with
  ``aicpu_dtype`` inputs, ``aicpu_us`` long; 0 turns it off).
- ``aicore-throttle``: the AI Core Freq counter drops to ``throttle_mhz`` from step
  ``throttle_from`` on, while kernels run; ``idle_mhz`` lowers it only between steps (the power
  saving decoy).
- ``collective-straggler``: tensor-parallel decode with an all-reduce per layer; rank
  ``late_rank`` arrives ``late_us`` late at each one, because it computes longer
  (``cause=compute``) or its host launches late (``cause=host``); the other ranks wait for it
  inside the collective. ``wait_all_us`` makes every rank wait alike (the balanced decoy).
- ``risky-settings``: plain decode recorded with debugging switches in ``ENV_VARIABLES``.
"""

from __future__ import annotations

from typing import Any

from traceanalyzer.synth import ops
from traceanalyzer.synth.ops import US, KernelSpec
from traceanalyzer.synth.scenarios.timeline import Timeline

AICPU_KNOBS = {
    "steps": 6,
    "layers": 2,
    "aicpu_us": 60.0,
    "aicpu_op": "NonZero",
    "aicpu_dtype": "INT64",
}
AICPU_HELP = (
    "decode steps with an AI CPU op per layer (knobs: steps, layers, aicpu_us=0 for none, "
    "aicpu_op, aicpu_dtype)"
)
THROTTLE_KNOBS = {"steps": 8, "layers": 2, "throttle_mhz": 1300, "throttle_from": 3, "idle_mhz": 0}
THROTTLE_HELP = (
    "decode steps while the AI Core frequency drops (knobs: steps, layers, throttle_mhz=0 for "
    "none, throttle_from, idle_mhz: a lower frequency between steps only)"
)
STRAGGLER_KNOBS = {
    "steps": 6,
    "layers": 2,
    "late_rank": 1,
    "late_us": 200.0,
    "cause": "compute",
    "wait_all_us": 0.0,
}
STRAGGLER_HELP = (
    "tensor-parallel decode where one rank arrives late at every all-reduce (knobs: steps, "
    "layers, late_rank=-1 for none, late_us, cause=compute|host, wait_all_us: all ranks wait)"
)
RISKY_KNOBS = {
    "steps": 4,
    "layers": 2,
    "launch_blocking": "1",
    "log_level": "1",
    "aclnn_cache_limit": "",
}
RISKY_HELP = (
    "decode steps recorded with debugging settings (knobs: steps, layers, launch_blocking, "
    "log_level, aclnn_cache_limit; empty = unset)"
)
EXTRA_COMPUTE = "aclnnGroupedMatmul_GroupedMatmul_GroupedMatmul"  # the late rank's extra experts


def run_aicpu(tl: Timeline, knobs: dict) -> None:
    spec = KernelSpec(
        f"aclnn{knobs['aicpu_op']}",
        knobs["aicpu_op"],
        knobs["aicpu_op"],
        "AI_CPU",
        knobs["aicpu_us"],
        dtypes=knobs["aicpu_dtype"],
    )
    extra = (spec,) if knobs["aicpu_us"] > 0 else ()
    _decode(tl, knobs, extra=extra)


def run_throttle(tl: Timeline, knobs: dict) -> None:
    rw = tl.rw
    tl.layers = knobs["layers"]
    for i in range(knobs["steps"]):
        throttled = knobs["throttle_mhz"] > 0 and i + 1 >= knobs["throttle_from"]
        if knobs["idle_mhz"] or throttled:
            # the counter changes when the step's first kernel is about to run
            rw.ai_core_freq(tl.t + 40 * US, knobs["throttle_mhz"] if throttled else 1800)
        start = tl.t
        tl.decode()
        if knobs["idle_mhz"]:
            rw.ai_core_freq(tl.dev.idle_at() + 20 * US, knobs["idle_mhz"])
            tl.t = max(tl.t, start) + 300 * US  # idle until the next request arrives


def run_straggler(tl: Timeline, knobs: dict) -> None:
    late = tl.rw.cfg.rank == knobs["late_rank"]
    late_ns = int(knobs["late_us"] * 1000)
    extra = KernelSpec(EXTRA_COMPUTE, EXTRA_COMPUTE, "GroupedMatmul", "AI_CORE", knobs["late_us"])
    computes = late and knobs["cause"] == "compute"
    waits = int(knobs["wait_all_us"] * 1000) + (0 if late or knobs["late_rank"] < 0 else late_ns)
    _decode(
        tl,
        knobs,
        allreduce=True,
        extra=(extra,) if computes else (),
        host_late_ns=late_ns if late and not computes else 0,  # its host busy elsewhere
        wait_for_peers_ns=waits,
    )


def run_risky(tl: Timeline, knobs: dict) -> None:
    env = {
        "ASCEND_LAUNCH_BLOCKING": knobs["launch_blocking"],
        "ASCEND_GLOBAL_LOG_LEVEL": knobs["log_level"],
        "ACLNN_CACHE_LIMIT": knobs["aclnn_cache_limit"],
    }
    tl.rw.cfg.env.update(env)  # what the launched process had in its environment
    _decode(tl, knobs)


def _decode(tl: Timeline, knobs: dict, **step: Any) -> None:
    """Eager decode steps of ``layers`` layers (``step``: more of
    :func:`~traceanalyzer.synth.ops.decode_step`'s arguments)."""
    for _ in range(knobs["steps"]):
        tl.t = ops.decode_step(tl.rw, tl.rng, tl.dev, tl.step, tl.t, layers=knobs["layers"], **step)
        tl.step += 1
