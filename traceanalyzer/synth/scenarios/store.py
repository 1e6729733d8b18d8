"""``store-stall`` / ``store-healthy``: Mooncake ``batch_get_into_multi_buffers`` (the Mooncake
KV-pool TTFT report).

Stall: the transfer's ``aclrtMemcpyAsync`` calls run inside a Python span
(``record_function``) while extra streams (39, 40, 43, 46) hold long
``Notify Wait`` / ``EVENT_WAIT`` tasks; the transfer stream first waits on them
(EVENT_WAIT) so its MEMCPY_ASYNC tasks only run at the end and the host's
stream sync inside the span takes seconds. Healthy (the fix): a
``torch.npu.synchronize()`` before the span, short spans without cross-stream
waits inside, and an unrelated long wait elsewhere.

``profile_style=session`` is how that report was profiled: the profiler window
wraps one call, so there is no span event and no ProfilerStep; the whole window
is the transfer. The waits are then queued inside the window by the model
thread (the torch_npu acl thread): ``aclrtStreamWaitEvent`` for EVENT_WAIT and
``hcom_allGather_`` for Notify Wait, each with a HostToDevice flow onto its wait
task, and the store call's thread queues its own stream's wait the same way.
``mark_transfer=1`` adds the ``traceanalyzer.window`` metadata key our recipes
write.
"""

from __future__ import annotations

from traceanalyzer.synth import ops
from traceanalyzer.synth.ops import MS, US
from traceanalyzer.synth.scenarios.timeline import Timeline
from traceanalyzer.vocabulary import STORE_TRANSFER_WINDOW, WINDOW_KEY

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
# In a session profile the model thread's wait launches come first, inside the window (and
# the extra streams' earlier kernels too): the store call starts this long after the window.
LAUNCH_LEAD = 600 * US
HEALTHY_KNOBS = {**KNOBS, "stall_s": 0.0}
HELP = (
    "Mooncake transfer spans stalled by cross-stream waits (knobs: spans, stall_s, memcpys, size_mb, "
    "steps_before, steps_after, layers, wait_streams, transfer_stream, sick, profile_style, mark_transfer, tp_comm)"
)
HEALTHY_HELP = (
    "the same transfers after torch.npu.synchronize(): short spans, unrelated waits elsewhere"
)


def metadata(knobs: dict) -> dict:
    return {WINDOW_KEY: STORE_TRANSFER_WINDOW} if knobs["mark_transfer"] else {}


def is_sick(knobs: dict, rank: int) -> bool:
    if knobs["stall_s"] <= 0:
        return False
    sick = str(knobs["sick"]).strip()
    return sick == "all" or str(rank) in {s.strip() for s in sick.split(",")}


def queue_waits(tl: Timeline, streams: list[int], stall_ns: int, start: int, launch: bool) -> int:
    """Long cross-stream waits on ``streams`` covering a call at ``start``; returns when the last ends.

    Without ``launch`` they were queued before the window (no host events). With it, the model
    thread (the torch_npu acl thread) queues them just before the call, as a real export of seed
    002 shows: ``aclrtStreamWaitEvent`` for EVENT_WAIT, an ``hcom_allGather_`` for Notify Wait,
    each with its HostToDevice flow onto the wait task.
    """
    rw, rng, dev = tl.rw, tl.rng, tl.dev
    blocked_until = 0
    for i, s in enumerate(streams):
        notify = i % 2 == 0
        ready = start - ops.jitter(rng, 300) - i * 37 * US
        call = ready - 30 * US
        conn = None
        if launch:
            api, mode = (
                ("hcom_allGather_", "HOST_HCCL") if notify else ("aclrtStreamWaitEvent", "ACL_RTS")
            )
            conn = rw.api("AscendCL@", api, call, ops.jitter(rng, 8), tid=rw.dequeue_tid, mode=mode)
        w0 = dev.place(s, ready, 0)
        wdur = stall_ns - ops.jitter(rng, 400) + i * 11 * US
        name, kind = (
            ("Notify Wait", "NOTIFY_WAIT_SQE") if notify else ("EVENT_WAIT", "EVENT_WAIT_SQE")
        )
        conn = rw.task(s, name, kind, w0, wdur, conn=conn)
        if launch:
            rw.h2d(conn, notify, rw.dequeue_tid, call, rw.hw_pid, s, w0)
        dev.free[s] = w0 + wdur
        blocked_until = max(blocked_until, w0 + wdur)
    return blocked_until


def transfer(tl: Timeline, knobs: dict, stall_ns: int, in_span: bool, launch_waits: bool) -> None:
    """One ``batch_get_into_multi_buffers`` call starting at ``tl.t`` (after the waits it meets,
    when ``launch_waits`` queues them in the window)."""
    rw, rng, dev = tl.rw, tl.rng, tl.dev
    streams = [int(s) for s in str(knobs["wait_streams"]).split(",") if s.strip()]
    xfer = knobs["transfer_stream"]
    start = tl.t + (LAUNCH_LEAD if launch_waits else 0)
    t = start + ops.jitter(rng, 40)
    size = int(knobs["size_mb"] * 1_000_000)
    blocked_until = 0
    # Other streams were running work launched before this call (no host events in the window).
    for s in streams:
        for spec in (ops.DECODE_LAYER[1], ops.DECODE_LAYER[5]):
            kdur = ops.jitter(rng, spec.dur_us, 0.1)
            ops.run_kernel(rw, s, spec, dev.place(s, start - 400 * US, kdur), kdur)
    if stall_ns > 0:
        blocked_until = queue_waits(tl, streams, stall_ns, start, launch_waits)
        # The transfer stream waits for an event recorded behind those waits.
        wstart = dev.place(xfer, t, blocked_until - t)
        conn = None
        if launch_waits:  # queued by the store call itself: its thread, its stream
            conn = rw.api("AscendCL@", "aclrtStreamWaitEvent", t, ops.jitter(rng, 8))
        conn = rw.task(
            xfer, "EVENT_WAIT", "EVENT_WAIT_SQE", wstart, blocked_until - wstart, conn=conn
        )
        if launch_waits:
            rw.h2d(conn, False, rw.main_tid, t, rw.hw_pid, xfer, wstart)
            t += 12 * US
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
        transfer(tl, knobs, stall_ns, in_span=False, launch_waits=True)
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
        transfer(tl, knobs, stall_ns, in_span=True, launch_waits=False)
        t = tl.launch(tl.t, ops.DECODE_LAYER)
        end = ops.synchronize(rw, t, tl.dev.idle_at([2]))
        rw.end_step(end + ops.jitter(tl.rng, 20))
        tl.t = end + ops.jitter(tl.rng, 60)
        tl.step += 1
    for _ in range(knobs["steps_after"]):
        tl.decode()
