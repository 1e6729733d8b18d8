"""``memory`` and its sick variants: a vLLM server under traffic, profiled with
``profile_memory=True``.

The ``serving`` scenario's iterations (an idle gap after each by default, so that msprof's
20 ms APP samples see every iteration), with the device memory they use
(:class:`~traceanalyzer.synth.memory.CachingAllocator`): the weights held before the profile
began (``weights_gb``), the KV-cache pool allocated at its start (``kv_cache_gb``, never freed),
GE's workspace, HCCL's buffers and the runtime's (``hccl_mb``: outside torch), and in every
iteration the activations of its batch (``activation_mb`` per 1k tokens, freed at its end).
Each variant adds one behaviour to the healthy ``memory``:

- ``memory-leak``: every iteration allocates ``leak_mb`` (``leak_op``) and never frees it
  (PTA grows; vllm-ascend #6478, 62 -> 64 GB over two days, then OOM);
- ``memory-app-leak``: the process's memory outside torch grows ``app_leak_mb`` per iteration
  (HCCL buffers: APP grows, PTA does not);
- ``memory-plateau``: the first ``plateau_iterations`` iterations each keep ``plateau_mb``,
  then none (buffers grown once per batch size: growth that stops; the decoy);
- ``memory-sawtooth``: every iteration keeps ``sawtooth_mb``, all of it freed every
  ``sawtooth_every`` iterations (a cache that is flushed: back to its baseline; the decoy);
- ``memory-fragmented``: ``fragment_gb`` of cached blocks no request fits, and every
  iteration's activations miss the cache: a new segment from the driver, handed back at the
  iteration's end (reserved minus allocated stays large; vLLM #37428).
"""

from __future__ import annotations

from traceanalyzer.synth.memory import MB, CachingAllocator, Totals
from traceanalyzer.synth.ops import US
from traceanalyzer.synth.scenarios import serving
from traceanalyzer.synth.scenarios.timeline import Timeline
from traceanalyzer.synth.tables import MODULE_RESERVED_MB

GB = 1 << 30
KNOBS = {
    **serving.KNOBS,
    "iterations": 40,
    "layers": 1,
    "prefill_every": 8,
    "idle_every": 1,
    "idle_ms": 20.0,
    "weights_gb": 12.0,
    "kv_cache_gb": 6.0,
    "activation_mb": 256.0,
    "hccl_mb": 404.0625,
    "ge_mb": 73.0625,
    "leak_mb": 0.0,
    "leak_op": "aten::empty_strided",
    "app_leak_mb": 0.0,
    "plateau_mb": 0.0,
    "plateau_iterations": 8,
    "sawtooth_mb": 0.0,
    "sawtooth_every": 6,
    "fragment_gb": 0.0,
}
HELP = (
    "a vLLM server under traffic profiled with profile_memory=True (serving knobs, and "
    "weights_gb, kv_cache_gb, activation_mb per 1k tokens, hccl_mb, ge_mb; leak_mb, leak_op, "
    "app_leak_mb, plateau_mb, plateau_iterations, sawtooth_mb, sawtooth_every, fragment_gb "
    "add the memory behaviours)"
)
SICK_KNOBS = {
    "memory-leak": ({"leak_mb": 4.0}, "every iteration leaks leak_mb in torch (PTA)"),
    "memory-app-leak": (
        {"app_leak_mb": 4.0},
        "the process's memory outside torch (APP, HCCL buffers) grows every iteration",
    ),
    "memory-plateau": (
        {"plateau_mb": 64.0},
        "the first iterations each keep plateau_mb, then none: growth that stops (decoy)",
    ),
    "memory-sawtooth": (
        {"sawtooth_mb": 64.0},
        "every iteration keeps sawtooth_mb, freed every sawtooth_every iterations (decoy)",
    ),
    "memory-fragmented": (
        {"fragment_gb": 8.0},
        "fragmented cached blocks, and every iteration's activations miss the cache",
    ),
}
GE_SLACK = 1_802_240  # GE reserves a little above what it allocates (the real export's 1.72 MB)
KV_CACHE_OP = "aten::zeros"  # vLLM's KV-cache pool: torch.zeros at start-up
ACTIVATION_OP = "aten::empty_strided"


def run(tl: Timeline, knobs: dict) -> None:
    rw = tl.rw
    outside = int((knobs["hccl_mb"] + MODULE_RESERVED_MB["RUNTIME"]) * MB)
    ge = int(knobs["ge_mb"] * MB)
    memory = CachingAllocator(
        rw,
        allocated=int(knobs["weights_gb"] * GB),
        outside=outside,
        ge=Totals(ge, ge + GE_SLACK, None),
    )
    t = tl.t
    memory.ge_record(t)
    if knobs["kv_cache_gb"] > 0:
        memory.alloc(t + 10 * US, KV_CACHE_OP, int(knobs["kv_cache_gb"] * GB))
    fragmented = knobs["fragment_gb"] > 0
    if fragmented:  # blocks freed into the cache that no later request fits
        cached = memory.alloc(t + 20 * US, ACTIVATION_OP, int(knobs["fragment_gb"] * GB))
        memory.free(t + 30 * US, cached)
    tl.t = t + 40 * US
    kept: list[int] = []  # the sawtooth's blocks, freed together
    served = 0

    def each(it: serving.Iteration, start: int, end: int) -> None:
        nonlocal served
        if it.phase == "warmup":
            return
        span = max(end - start, 20 * US)
        at = [start + span * k // 10 for k in range(10)]
        tokens = it.tokens or knobs["batch"]
        size = max(int(knobs["activation_mb"] * MB * tokens / 1000) // 512 * 512, MB)
        activation = memory.alloc(at[1], ACTIVATION_OP, size, new_segment=fragmented)
        if knobs["leak_mb"] > 0:
            memory.alloc(at[5], knobs["leak_op"], int(knobs["leak_mb"] * MB))
        if knobs["plateau_mb"] > 0 and served < knobs["plateau_iterations"]:
            memory.alloc(at[5] + 1 * US, "aten::empty", int(knobs["plateau_mb"] * MB))
        if knobs["sawtooth_mb"] > 0:
            kept.append(memory.alloc(at[5] + 2 * US, "aten::cat", int(knobs["sawtooth_mb"] * MB)))
        if knobs["app_leak_mb"] > 0:
            memory.grow_outside(at[5] + 3 * US, int(knobs["app_leak_mb"] * MB))
        if len(kept) >= knobs["sawtooth_every"]:
            for handle in kept:
                memory.free(at[8], handle)
            kept.clear()
        memory.free(at[9], activation, release_segment=fragmented)
        served += 1

    serving.run(tl, knobs, each)
