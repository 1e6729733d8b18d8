"""``capture-growth`` / ``capture-healthy``: vLLM capturing FULL aclgraphs repeatedly (the aclgraph
capture slowdown report).

Each round (one ProfilerStep, like the seed's outer ``for i in range(100)`` loop
with ``prof.step()``) captures every size: an eager warm-up forward, then an
``AscendCL@aclmdlRICaptureBegin`` … ``AscendCL@aclmdlRICaptureEnd`` window on the
Python main thread holding the captured launches (host only: captured tasks are
not executed) and the HCCL ops (``AscendCL@hcom_allReduce_``, Mode HOST_HCCL).
Inside each HCCL op the AICPU resource refresh issues blocking H2D copies
(``AscendCL@aclrtMemcpy``, ``Runtime@MemCopySync`` at Level2). With the leaking
resource list their number grows linearly with the number of earlier captures,
and the capture time with it; with ``HCCL_OP_EXPANSION_MODE=AIV`` it stays flat.

``profiled_rounds=1,45,100`` profiles only those rounds, as the users of that report did:
each is its own profiler session (its own ``*_ascend_pt`` directory of the same
rank and process, later rounds later in time), and the memcpy count of round
``r`` still counts every capture of the unprofiled rounds ``1..r-1``. ``rounds``
is not used then; the decode ``steps`` follow the last profiled round.
"""

from __future__ import annotations

from traceanalyzer.synth import ops
from traceanalyzer.synth.ops import US
from traceanalyzer.synth.scenarios.timeline import SessionPlan, Timeline

SIZES = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 96]
KNOBS = {
    "captures": 11,
    "rounds": 3,
    "growth": 2.0,
    "base_memcpy": 6,
    "noise": 0.1,
    "layers": 2,
    "steps": 0,
    "profiled_rounds": "",
}
HEALTHY_KNOBS = {**KNOBS, "growth": 0.0}
HELP = (
    "aclgraph capture windows whose aclrtMemcpy count grows with earlier captures "
    "(knobs: captures, rounds, growth, base_memcpy, noise, layers, steps, profiled_rounds; "
    "profiled_rounds=1,45,100 writes one *_ascend_pt session per listed round, the counts "
    "still growing with the unprofiled rounds in between)"
)
HEALTHY_HELP = (
    "the same captures with HCCL_OP_EXPANSION_MODE=AIV: memcpy count flat "
    "(same knobs incl. profiled_rounds, growth=0)"
)


def parse_rounds(value: object) -> list[int]:
    """``profiled_rounds`` (``"1,45,100"`` or a sequence of ints) -> round numbers; ``""`` = none.

    Raises ValueError (a usage error on the CLI) unless the rounds are integers >= 1 in strictly
    increasing order.
    """
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")] if value.strip() else []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    rounds = []
    for item in items:
        try:
            if isinstance(item, (bool, float)):
                raise TypeError
            r = int(item)
        except (TypeError, ValueError):
            raise ValueError(
                f"knob profiled_rounds={value!r}: expected comma-separated round numbers "
                "such as 1,45,100"
            ) from None
        if r < 1:
            raise ValueError(f"knob profiled_rounds={value!r}: rounds are numbered from 1, got {r}")
        if rounds and r <= rounds[-1]:
            raise ValueError(
                f"knob profiled_rounds={value!r}: rounds must be strictly increasing "
                f"({r} after {rounds[-1]})"
            )
        rounds.append(r)
    return rounds


def sessions(knobs: dict) -> list[SessionPlan]:
    """One session for the whole run, or one per ``profiled_rounds`` entry."""
    rounds = parse_rounds(knobs["profiled_rounds"])
    if not rounds:
        return [SessionPlan(knobs)]
    plans = []
    previous = 0
    for i, r in enumerate(rounds):
        last = i == len(rounds) - 1
        part = {**knobs, "rounds": 1, "first_round": r, "steps": knobs["steps"] if last else 0}
        plans.append(SessionPlan(part, idle_before=float(r - previous - 1)))
        previous = r
    return plans


def memcpy_count(tl: Timeline, earlier: int, knobs: dict) -> int:
    """Host memcpys in one capture: ``base + growth * earlier`` with multiplicative noise."""
    mean = knobs["base_memcpy"] + knobs["growth"] * earlier
    noise = knobs["noise"]
    return max(int(round(mean * (1 + tl.rng.uniform(-noise, noise)))), 1)


def capture(tl: Timeline, memcpys: int, layers: int) -> None:
    """One capture window with ``layers`` layers of captured launches and one HCCL op per layer."""
    rw, rng = tl.rw, tl.rng
    t = tl.t
    rw.api("AscendCL@", "aclmdlRICaptureBegin", t, ops.jitter(rng, 15))
    t += ops.jitter(rng, 25)
    per_op = [memcpys // layers + (1 if i < memcpys % layers else 0) for i in range(layers)]
    for layer in range(layers):
        for spec in ops.DECODE_LAYER:
            dur = ops.jitter(rng, 20)
            rw.api("AscendCL@", spec.api, t + 3 * US, dur - 6 * US, mode="ACL_NN")
            rw.api(
                "Node@", "launch", t + 8 * US, ops.jitter(rng, 4), mode="launch", item_id=spec.name
            )
            rw.cpu_op(spec.api, t, dur)
            t += dur + ops.jitter(rng, 3)
        start = t
        c = t + ops.jitter(rng, 20)
        for _ in range(per_op[layer]):
            c = ops.memcpy_sync(rw, rng, c) + ops.jitter(rng, 3)
        end = c + ops.jitter(rng, 15)
        rw.api(
            "AscendCL@", "hcom_allReduce_", start + 2 * US, end - start - 4 * US, mode="HOST_HCCL"
        )
        rw.cpu_op("HcclAllreduce", start, end - start)
        t = end + ops.jitter(rng, 3)
    rw.api("AscendCL@", "aclmdlRICaptureEnd", t, ops.jitter(rng, 30))
    tl.t = t + ops.jitter(rng, 40)


def warmup(tl: Timeline, layers: int) -> None:
    """The eager dummy run vLLM does before each capture (kernels and the TP all-reduce really execute)."""
    t = tl.t
    for _ in range(layers):
        t = tl.launch(t, ops.DECODE_LAYER)
        t = ops.allreduce_eager(tl.rw, tl.rng, tl.dev, t, 2, 4)
    tl.t = ops.synchronize(tl.rw, t, tl.dev.idle_at()) + ops.jitter(tl.rng, 30)


def run(tl: Timeline, knobs: dict) -> None:
    sizes = (
        SIZES[: knobs["captures"]]
        if knobs["captures"] <= len(SIZES)
        else SIZES * (knobs["captures"] // len(SIZES) + 1)
    )
    sizes = sizes[: knobs["captures"]]
    layers = knobs["layers"]
    tl.layers = layers
    first_round = knobs.get("first_round", 1)  # > 1 when earlier rounds were not profiled
    earlier = (first_round - 1) * len(sizes)
    tl.step = first_round
    for _ in range(knobs["rounds"]):
        tl.rw.begin_step(tl.step, tl.t)
        for _size in sizes:
            warmup(tl, layers)
            capture(tl, memcpy_count(tl, earlier, knobs), layers)
            tl.rw.flush()
            earlier += 1
        tl.rw.end_step(tl.t)
        tl.t += ops.jitter(tl.rng, 50)
        tl.step += 1
    for _ in range(knobs["steps"]):
        tl.decode()
