"""``pd-kv``: prefill/decode disaggregation, the KV cache moving from prefill to decode instances.

Each rank is one instance's worker (``prefill_ranks`` are prefill instances, the others decode
instances), with the Mooncake connectors of vllm-ascend (``serving_profiles.md`` §4):

- ``mode=push`` (``MooncakeLayerwiseConnector``): the prefill forward records one NPU event per
  layer (``aclrtRecordEvent``, an ``EVENT_RECORD_SQE`` task); the connector's sending thread
  waits on it (``aclrtSynchronizeEvent``) and writes that layer's KV to the decode instance
  (``batch_transfer_sync_write``). ``overlap`` on: layer by layer, while the forward goes on;
  off: the sending thread waits for the last layer, so every send follows the forward;
  ``blocking``: the forward thread itself sends after each layer, and the device idles until
  the send returns.
- ``mode=pull`` (``MooncakeConnector``): the prefill forward sends nothing; the decode
  instance's receiving thread reads the KV (``batch_transfer_sync_read``) per new request.
- decode side, both modes: every ``requests_every`` iterations a new request's KV must arrive
  (``pull_us``). ``overlap`` on: the running batch keeps decoding meanwhile; off: the batch
  has nothing else, so the engine runs ``kv_connector_no_forward`` iterations (an
  ``execute_model`` with no forward) until the KV is there.

Host markers are the Python tracer's (``execute_model``, ``sample_tokens``), as in a default
vllm-ascend profile; the connector threads' calls are python functions of their own threads.
"""

from __future__ import annotations

from dataclasses import replace

from traceanalyzer.synth import ops
from traceanalyzer.synth.ops import US, KernelSpec
from traceanalyzer.synth.scenarios.serving import (
    RUNNER,
    SAMPLER,
    WORKER,
    Iteration,
    attention_kernel,
    numbers,
)
from traceanalyzer.synth.scenarios.timeline import Timeline

KNOBS = {
    "iterations": 10,
    "layers": 8,
    "prefill_ranks": "0",
    "mode": "push",
    "overlap": True,
    "blocking": False,
    "chunk": 4096,
    "send_us": 300.0,
    "batch": 16,
    "requests_every": 3,
    "pull_us": 3000.0,
    "loop_us": 110.0,
    "dp_dummy": False,
    "connector_events": True,
}
HELP = (
    "PD disaggregation: prefill instances push (layerwise) or decode instances pull the KV "
    "cache (knobs: iterations, layers, prefill_ranks, mode=push|pull, overlap, blocking, chunk, "
    "send_us, batch, requests_every, pull_us, loop_us: the engine's pace between iterations "
    "without a forward, dp_dummy: a data-parallel engine runs a dummy batch after each, "
    "connector_events=0 writes no connector calls)"
)
MODES = ("push", "pull")
LAYERWISE = "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_layerwise_connector.py"
P2P = "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py"
WRITE = "<built-in method batch_transfer_sync_write of PyCapsule object at 0x7f3a2c1b4e70>"
READ = "<built-in method batch_transfer_sync_read of PyCapsule object at 0x7f3a2c1b4e70>"
SENDING_TID, RECEIVING_TID = 211, 223  # the connector threads, offsets from the main thread
# the decode layer without the rotary embedding and the residual add; None: the attention
LAYER = tuple(
    None if spec.op_type == "FusedInferAttentionScore" else spec
    for spec in ops.DECODE_LAYER
    if spec.op_type not in ("ApplyRotaryPosEmb", "Add")
)


def _layer(it: Iteration) -> list[KernelSpec]:
    scale = max(1.0, it.tokens / 64)
    attention = attention_kernel(it, "v0.13", it.tokens, it.requests, True)
    return [
        replace(attention, dur_us=attention.dur_us * scale**0.8)
        if spec is None
        else replace(spec, dur_us=spec.dur_us * scale**0.6, shapes=f"{it.tokens},4096")
        for spec in LAYER
    ]


def _sample(tl: Timeline, t: int) -> int:
    """sample_tokens: the sampler kernel, the token fetch; returns its end."""
    rw = tl.rw
    s = t + ops.jitter(tl.rng, 15)
    sampled = ops.launch_kernel(rw, tl.rng, tl.dev, s + 10 * US, SAMPLER)
    sampled = ops.synchronize(rw, sampled, tl.dev.idle_at())
    rw.api("AscendCL@", "aclrtMemcpy", sampled + 2 * US, 20 * US)
    end = sampled + 26 * US
    rw.python_function(f"{RUNNER}(2240): sample_tokens", s, end - s)
    rw.python_function(f"{WORKER}(693): sample_tokens", s - 3 * US, end - s + 6 * US)
    return end + 3 * US


def _dummy(tl: Timeline, t: int, knobs: dict) -> int:
    """A data-parallel engine's dummy batch after a step without work of its own
    (``execute_dummy_batch`` -> ``_dummy_run``): one layer's forward, no sampling."""
    rw = tl.rw
    start = t
    it = Iteration("decode", knobs["batch"], knobs["batch"])
    t = tl.launch(t, _layer(it), host_us=8)
    t = ops.synchronize(rw, t, tl.dev.idle_at())
    rw.python_function(f"{RUNNER}(3139): _dummy_run", start, t - start)
    rw.python_function(f"{WORKER}(1048): execute_dummy_batch", start - 2 * US, t - start + 4 * US)
    return t + 2 * US


def _executed(tl: Timeline, start: int, end: int) -> None:
    tl.rw.python_function(f"{RUNNER}(1838): execute_model", start, end - start)
    tl.rw.python_function(f"{WORKER}(656): execute_model", start - 3 * US, end - start + 6 * US)


def _finish(tl: Timeline, start: int, forward_end: int, gap_us: float) -> None:
    """An iteration's execute_model around its forward, then sample_tokens; the next one
    starts about ``gap_us`` later."""
    _executed(tl, start - 2 * US, forward_end + 5 * US)
    end = _sample(tl, forward_end + 8 * US)
    tl.rw.flush()
    tl.t = end + ops.jitter(tl.rng, gap_us)


def _send(tl: Timeline, tid: int, ready: int, at: int, knobs: dict) -> int:
    """One layer's KV write on ``tid``: wait on the layer's event from ``at`` until ``ready``,
    then ``batch_transfer_sync_write``; returns when it is done."""
    rw = tl.rw
    waited = max(at + 5 * US, ready + 3 * US)
    rw.api("AscendCL@", "aclrtSynchronizeEvent", at, waited - at, tid=tid)
    dur = ops.jitter(tl.rng, knobs["send_us"], 0.05)
    if knobs["connector_events"]:
        rw.python_function(f"{LAYERWISE}(550): _transfer_kv_cache", waited, dur + 4 * US, tid=tid)
        rw.python_function(WRITE, waited + 2 * US, dur, tid=tid)
    return waited + dur + 6 * US


def _prefill(tl: Timeline, knobs: dict) -> None:
    rw, rng, dev = tl.rw, tl.rng, tl.dev
    sender = rw.main_tid + SENDING_TID
    free = tl.t  # when the sending thread is free again
    for _ in range(knobs["iterations"]):
        it = Iteration("prefill", knobs["chunk"], 1, no_cache=True)
        start = tl.t
        t = start + ops.jitter(rng, 120)
        ready = []
        for _layer_index in range(knobs["layers"]):
            t = tl.launch(t, _layer(it))
            if knobs["mode"] == "pull":
                continue
            # the layer's event: recorded on the stream after its last kernel
            rw.api("AscendCL@", "aclrtRecordEvent", t, 4 * US)
            done = dev.place(2, t + 8 * US, 1 * US)
            rw.task(2, "EVENT_RECORD_SQE", "EVENT_RECORD_SQE", done, 1 * US)
            t += 6 * US
            ready.append(done + 1 * US)
            if knobs["blocking"]:  # the forward thread sends, and launches nothing meanwhile
                t = _send(tl, rw.main_tid, done + 1 * US, t, knobs)
        forward_end = t
        if knobs["mode"] == "push" and not knobs["blocking"]:
            if not knobs["overlap"]:  # the sending thread waits for the whole forward
                ready = [ready[-1]] * len(ready)
            for layer_ready in ready:
                free = _send(tl, sender, layer_ready, max(free, start), knobs)
        _finish(tl, start, forward_end, 200)


def _decode(tl: Timeline, knobs: dict) -> None:
    rw, rng = tl.rw, tl.rng
    receiver = rw.main_tid + RECEIVING_TID
    for i in range(knobs["iterations"]):
        if knobs["requests_every"] and i % knobs["requests_every"] == 0:
            # a new request's KV: pulled by the receiving thread, or pushed by the prefill
            pull = ops.jitter(rng, knobs["pull_us"], 0.05)
            if knobs["mode"] == "pull" and knobs["connector_events"]:
                rw.python_function(f"{P2P}(1010): _transfer_kv_cache", tl.t, pull + 4 * US,
                                   tid=receiver)  # fmt: skip
                rw.python_function(READ, tl.t + 2 * US, pull, tid=receiver)
            if not knobs["overlap"]:  # nothing else to run: iterations without a forward
                until = tl.t + pull + 6 * US
                while tl.t < until:
                    s = tl.t
                    dur = ops.jitter(rng, 40)
                    if knobs["connector_events"]:
                        rw.python_function(f"{RUNNER}(1874): kv_connector_no_forward", s + 4 * US,
                                           dur - 8 * US)  # fmt: skip
                    _executed(tl, s, s + dur)
                    t = s + dur
                    if knobs["dp_dummy"]:  # DPEngineCoreProc: execute_dummy_batch
                        t = _dummy(tl, t + ops.jitter(rng, 30), knobs)
                    tl.t = t + ops.jitter(rng, knobs["loop_us"])
                rw.flush()
        it = Iteration("decode", knobs["batch"], knobs["batch"])
        start = tl.t
        t = start + ops.jitter(rng, 60)
        for _layer_index in range(knobs["layers"]):
            t = tl.launch(t, _layer(it), host_us=8)
        _finish(tl, start, t, 80)


def run(tl: Timeline, knobs: dict) -> None:
    if knobs["mode"] not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {knobs['mode']!r}")
    if tl.rw.cfg.rank in numbers(knobs["prefill_ranks"]):
        _prefill(tl, knobs)
    else:
        _decode(tl, knobs)
