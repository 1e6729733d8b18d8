"""``store-stall`` / ``store-healthy``: Mooncake ``batch_get_into_multi_buffers`` (seed 002).

Stall: the transfer's ``aclrtMemcpyAsync`` calls run inside a Python span
(``record_function``) while extra streams (39, 40, 43, 46) hold long
``Notify Wait`` / ``EVENT_WAIT`` tasks; the transfer stream first waits on them
(EVENT_WAIT) so its MEMCPY_ASYNC tasks only run at the end and the host's
stream sync inside the span takes seconds. Healthy (the fix): a
``torch.npu.synchronize()`` before the span, short spans without cross-stream
waits inside, and an unrelated long wait elsewhere.

``profile_style=session`` is how seed 002 was profiled: the profiler window
wraps one call, so there is no span event and no ProfilerStep; the whole window
is the transfer. ``mark_transfer=1`` adds the ``traceanalyzer.window`` metadata
key our recipes write.
"""

from __future__ import annotations

from traceanalyzer.synth import ops
from traceanalyzer.synth.ops import MS, US
from traceanalyzer.synth.scenarios.timeline import Timeline

SPAN = "batch_get_into_multi_buffers"
KNOBS = {
    "spans": 2,
    "stall_s": 2.5,
    "memcpys": 16,
    "size_mb": 32.0,
    "steps_before": 3,
    "steps_after": 3,
    "layers": 2,
    "wait_streams": "39,40,43,46",
    "transfer_stream": 9,
    "sick": "all",
    "profile_style": "events",
    "mark_transfer": 0,
    "tp_comm": 1,
}
HEALTHY_KNOBS = {**KNOBS, "stall_s": 0.0}
HELP = (
    "Mooncake transfer spans stalled by cross-stream waits (knobs: spans, stall_s, memcpys, size_mb, "
    "steps_before, steps_after, layers, wait_streams, transfer_stream, sick, profile_style, mark_transfer, tp_comm)"
)
HEALTHY_HELP = (
    "the same transfers after torch.npu.synchronize(): short spans, unrelated waits elsewhere"
)


def metadata(knobs: dict) -> dict:
    return {"traceanalyzer.window": "store_transfer"} if knobs["mark_transfer"] else {}


def is_sick(knobs: dict, rank: int) -> bool:
    if knobs["stall_s"] <= 0:
        return False
    sick = str(knobs["sick"]).strip()
    return sick == "all" or str(rank) in {s.strip() for s in sick.split(",")}


def transfer(tl: Timeline, knobs: dict, stall_ns: int, in_span: bool) -> None:
    """One ``batch_get_into_multi_buffers`` call starting at ``tl.t``."""
    rw, rng, dev = tl.rw, tl.rng, tl.dev
    streams = [int(s) for s in str(knobs["wait_streams"]).split(",") if s.strip()]
    xfer = knobs["transfer_stream"]
    start = tl.t
    t = start + ops.jitter(rng, 40)
    size = int(knobs["size_mb"] * 1_000_000)
    blocked_until = 0
    # Other streams were running work launched before this call (no host events in the window).
    for s in streams:
        for spec in (ops.DECODE_LAYER[1], ops.DECODE_LAYER[5]):
            kdur = ops.jitter(rng, spec.dur_us, 0.1)
            rw.kernel(
                s,
                spec.name,
                spec.op_type,
                spec.core,
                dev.place(s, start - 400 * US, kdur),
                kdur,
                in_shapes=spec.shapes,
            )
    if stall_ns > 0:
        # Work queued earlier on the extra streams: long cross-stream waits covering the span.
        for i, s in enumerate(streams):
            w0 = dev.place(s, start - ops.jitter(rng, 300) - i * 37 * US, 0)
            wdur = stall_ns - ops.jitter(rng, 400) + i * 11 * US
            if i % 2 == 0:
                rw.task(s, "Notify Wait", "NOTIFY_WAIT_SQE", w0, wdur)
            else:
                rw.task(s, "EVENT_WAIT", "EVENT_WAIT_SQE", w0, wdur)
            dev.free[s] = w0 + wdur
            blocked_until = max(blocked_until, w0 + wdur)
        # The transfer stream waits for an event recorded behind those waits.
        wstart = dev.place(xfer, t, blocked_until - t)
        rw.task(xfer, "EVENT_WAIT", "EVENT_WAIT_SQE", wstart, blocked_until - wstart)
    last_end = t
    dev_total = 0
    for _ in range(knobs["memcpys"]):
        t, _s, e = ops.memcpy_async(rw, rng, dev, t, xfer, size, ready=blocked_until)
        dev_total += e - _s
        last_end = max(last_end, e)
        t += ops.jitter(rng, 3)
    end = ops.synchronize(rw, t, last_end)
    end += ops.jitter(rng, 30)
    if in_span:
        rw.cpu_op(SPAN, start, end - start, device_ns=dev_total, self_ns=end - start)
    rw._count("transfer")
    tl.t = end + ops.jitter(rng, 80)
    rw.flush()


def unrelated_wait(tl: Timeline, knobs: dict) -> None:
    """A long wait on an extra stream that overlaps no transfer (healthy runs have these too)."""
    streams = [int(s) for s in str(knobs["wait_streams"]).split(",") if s.strip()]
    if not streams:
        return
    s = streams[0]
    w0 = tl.dev.place(s, tl.t + 50 * US, 0)
    tl.rw.task(s, "Notify Wait", "NOTIFY_WAIT_SQE", w0, 40 * MS)
    tl.dev.free[s] = w0 + 40 * MS


def run(tl: Timeline, knobs: dict) -> None:
    rank = tl.rw.cfg.rank
    sick = is_sick(knobs, rank)
    stall_ns = int(knobs["stall_s"] * 1e9) if sick else 0
    tl.layers = knobs["layers"]
    tl.allreduce = bool(knobs["tp_comm"])
    if knobs["profile_style"] == "session":
        transfer(tl, knobs, stall_ns, in_span=False)
        return
    for _ in range(knobs["steps_before"]):
        tl.decode()
    if not sick:
        unrelated_wait(tl, knobs)
        tl.decode()
    for _ in range(knobs["spans"]):
        rw = tl.rw
        rw.begin_step(tl.step, tl.t)
        tl.t += ops.jitter(tl.rng, 30)
        if not sick:
            tl.t = ops.synchronize(rw, tl.t, tl.dev.idle_at(), "aclrtSynchronizeDevice")
        transfer(tl, knobs, stall_ns, in_span=True)
        t = tl.t
        for spec in ops.DECODE_LAYER:
            t = ops.launch_kernel(rw, tl.rng, tl.dev, t, spec)
        end = ops.synchronize(rw, t, tl.dev.idle_at([2]))
        rw.end_step(end + ops.jitter(tl.rng, 20))
        tl.t = end + ops.jitter(tl.rng, 60)
        tl.step += 1
    for _ in range(knobs["steps_after"]):
        tl.decode()
