"""Composite host/device actions built from :class:`RankWriter` primitives.

Each function models one thing a torch_npu program does and emits every event
that action leaves in a real export, with physically consistent timing: a host
call ends after what it waits for, a device task starts no earlier than its
launch and than the previous task on its stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from random import Random
from typing import Any

from traceanalyzer.synth.rank import RankWriter

US = 1000
MS = 1_000_000


@dataclass(frozen=True)
class KernelSpec:
    """A kernel as launched by one aclnn API."""

    api: str  # aclnn API, also the torch_npu cpu_op name
    name: str  # device kernel name
    op_type: str
    core: str
    dur_us: float  # typical device duration
    shapes: str = "8,4096"
    dtypes: str = "DT_BF16"  # kernel_details Input Data Types


def aclnn_kernel(
    api: str, kernel: str, op_type: str, core: str, dur_us: float, shapes: str = "8,4096"
) -> KernelSpec:
    """The kernel of ``aclnn<api>``, named ``aclnn<api>_<kernel>_<op_type>`` as eager aclnn
    kernels are (``aclnn<api>_<op_type>`` without a ``kernel`` part)."""
    name = "_".join(part for part in (f"aclnn{api}", kernel, op_type) if part)
    return KernelSpec(f"aclnn{api}", name, op_type, core, dur_us, shapes)


DECODE_LAYER: tuple[KernelSpec, ...] = (
    aclnn_kernel("RmsNorm", "RmsNorm", "RmsNorm", "AI_VECTOR_CORE", 6.0),
    aclnn_kernel("Mm", "MatMulCommon", "MatMulV2", "AI_CORE", 38.0, "8,4096;4096,6144"),
    aclnn_kernel("ApplyRotaryPosEmb", "", "ApplyRotaryPosEmb", "AI_VECTOR_CORE", 5.0),
    aclnn_kernel("FusedInferAttentionScore", "", "FusedInferAttentionScore", "MIX_AIC", 42.0),
    aclnn_kernel("Mm", "MatMulCommon", "MatMulV2", "AI_CORE", 22.0, "8,4096;4096,4096"),
    aclnn_kernel("Add", "AddAiCore", "Add", "AI_VECTOR_CORE", 3.0),
    aclnn_kernel("Mm", "MatMulCommon", "MatMulV2", "AI_CORE", 55.0, "8,4096;4096,24576"),
    aclnn_kernel("SwiGlu", "SwiGlu", "SwiGlu", "AI_VECTOR_CORE", 8.0),
    aclnn_kernel("Mm", "MatMulCommon", "MatMulV2", "AI_CORE", 30.0, "8,12288;12288,4096"),
)


class Device:
    """When each stream becomes free; the device side of the timing model."""

    def __init__(self) -> None:
        self.free: dict[int, int] = {}

    def place(self, stream: int, ready: int, dur: int) -> int:
        """Start time of a task that becomes ready at ``ready`` on ``stream``."""
        start = max(ready, self.free.get(stream, 0))
        self.free[stream] = start + dur
        return start

    def idle_at(self, streams: list[int] | None = None) -> int:
        vals = self.free.values() if streams is None else [self.free.get(s, 0) for s in streams]
        return max(vals, default=0)


def jitter(rng: Random, base_us: float, spread: float = 0.15) -> int:
    """A duration around ``base_us`` in ns, a multiple of 10 ns (host clocks tick at 10 ns)."""
    v = base_us * (1 + rng.uniform(-spread, spread))
    return max(int(v * 100), 1) * 10


def run_kernel(
    rw: RankWriter, stream: int, spec: KernelSpec, start: int, dur: int, **options: Any
) -> int:
    """``spec`` runs on ``stream`` (:meth:`RankWriter.kernel`, with its shapes and types)."""
    return rw.kernel(
        stream,
        spec.name,
        spec.op_type,
        spec.core,
        start,
        dur,
        in_shapes=spec.shapes,
        in_types=spec.dtypes,
        **options,
    )


def launch_kernel(
    rw: RankWriter,
    rng: Random,
    dev: Device,
    t: int,
    spec: KernelSpec,
    stream: int = 2,
    *,
    host_us: float = 22,
    compile_ns: int = 0,
    kernel_scale: float = 1.0,
) -> int:
    """Eager aclnn launch through the torch_npu task queue; returns the host time after the op.

    Python main thread: ``cpu_op`` (about ``host_us``) + Enqueue; consumer thread: Dequeue@op with
    ``AscendCL@aclnn*`` → ``Node@launch`` (→ ``Runtime@KernelLaunch`` at Level2); device: the
    kernel, linked by HostToDevice and torch_to_npu flows. ``compile_ns`` > 0 puts the op on the
    online-compile path (``jit_compile=True`` and a shape not seen before): the consumer runs
    ``AscendCL@aclopCompileAndExecute`` with ``AscendCL@opCompile`` inside before the launch, and
    the caller, whose queue is full behind it, resumes when the launch is done.
    """
    op_dur = jitter(rng, host_us)
    enq = t + op_dur - 6 * US
    deq = enq + jitter(rng, 4)
    deq_dur = jitter(rng, 24) + compile_ns
    rw.enqueue(spec.api, enq, 3 * US, deq, deq_dur)
    acl = deq + 2 * US
    acl_dur = deq_dur - 4 * US
    acl_api, acl_mode = ("aclopCompileAndExecute", "ACL_OP") if compile_ns else (spec.api, "ACL_NN")
    rw.api("AscendCL@", acl_api, acl, acl_dur, tid=rw.dequeue_tid, mode=acl_mode)
    if compile_ns:
        rw.api(
            "AscendCL@", "opCompile", acl + 3 * US, compile_ns, tid=rw.dequeue_tid, mode="ACL_OP"
        )
    node = acl + 6 * US + compile_ns
    node_dur = jitter(rng, 5)
    conn = rw.api(
        "Node@", "launch", node, node_dur, tid=rw.dequeue_tid, mode="launch", item_id=spec.name
    )
    rw.api(
        "Runtime@",
        "KernelLaunch",
        node + 1 * US,
        node_dur - 2 * US,
        tid=rw.dequeue_tid,
        mode="KernelLaunch",
    )
    kdur = jitter(rng, spec.dur_us * kernel_scale, 0.1) + rng.randrange(0, 1000)
    kstart = dev.place(stream, node + node_dur + 8 * US, kdur)
    run_kernel(rw, stream, spec, kstart, kdur, conn=conn)
    rw.h2d(conn, True, rw.dequeue_tid, node, rw.hw_pid, stream, kstart)
    rw.cpu_op(spec.api, t, op_dur, device_ns=kdur, aicore_ns=kdur)
    rw.torch_to_npu(t, stream, kstart)
    resume = t + op_dur + jitter(rng, 4)
    return max(resume, deq + deq_dur) if compile_ns else resume


def memcpy_sync(rw: RankWriter, rng: Random, t: int, *, tid: int | None = None) -> int:
    """``aclrtMemcpy`` (blocking H2D on the host; ``Runtime@MemCopySync`` nested at Level2). Returns its end."""
    dur = jitter(rng, 45, 0.3)
    rw.api("AscendCL@", "aclrtMemcpy", t, dur, tid=tid)
    rw.api("Runtime@", "MemCopySync", t + 3 * US, dur - 6 * US, tid=tid, mode="MemCopySync")
    return t + dur


DIRECTION_TASK = {
    "host to device": "PCIE_DMA_SQE",
    "device to host": "PCIE_DMA_SQE",
    "device to device": "SDMA_SQE",
}


def memcpy_async(
    rw: RankWriter,
    rng: Random,
    dev: Device,
    t: int,
    stream: int,
    size: int,
    *,
    direction: str = "host to device",
    ready: int | None = None,
    gbps: float = 20.0,
    tid: int | None = None,
) -> tuple[int, int, int]:
    """``aclrtMemcpyAsync`` and its MEMCPY_ASYNC task. Returns (host end, task start, task end)."""
    dur = jitter(rng, 12)
    tid = rw.main_tid if tid is None else tid
    conn = rw.api("AscendCL@", "aclrtMemcpyAsync", t, dur, tid=tid)
    rw.api("Runtime@", "MemcpyAsync", t + 2 * US, dur - 4 * US, tid=tid, mode="MemcpyAsync")
    tdur = max(int(size / gbps), 2 * US)  # bytes / (GB/s) = ns
    tstart = dev.place(stream, max(t + dur, ready or 0), tdur)
    extra = {"data size(Byte)": size, "memcpy direction": direction}
    rw.task(stream, "MEMCPY_ASYNC", DIRECTION_TASK[direction], tstart, tdur, conn=conn, extra=extra)
    rw.h2d(conn, False, tid, t, rw.hw_pid, stream, tstart)
    return t + dur, tstart, tstart + tdur


def synchronize(
    rw: RankWriter,
    t: int,
    until: int,
    api: str = "aclrtSynchronizeStream",
    *,
    tid: int | None = None,
) -> int:
    """A blocking sync on the host that returns when the device reaches ``until``."""
    end = max(until, t + 5 * US) + 4 * US
    rw.api("AscendCL@", api, t, end - t, tid=tid)
    return end


# what a host does while its device waits for it, by cause: Python frames (outermost first)
STALL_FRAMES = {
    "host": (
        "vllm_ascend/worker/model_runner_v1.py(1502): _prepare_inputs",
        "vllm_ascend/worker/model_runner_v1.py(1187): _update_states",
    ),
    "compile": ("triton/runtime/jit.py(612): run", "triton/compiler/compiler.py(295): compile"),
}
STALL_CAUSES = ("host", "compile", "gc", "sync", "device")  # device: a kernel runs longer


def host_stall(rw: RankWriter, at: int, dur: int, cause: str) -> None:
    """The host busy for ``dur`` from ``at`` while its device waits (a tail iteration's late
    work): Python frames (``host``), a Triton compile (``compile``), a garbage collection
    (``gc``), or ``.item()`` blocked in a stream synchronisation behind a long copy on another
    stream (``sync``)."""
    if cause in STALL_FRAMES:
        for depth, frame in enumerate(STALL_FRAMES[cause]):
            rw.python_function(frame, at + depth * US, dur - 2 * depth * US)
    elif cause == "gc":
        rw.gc(at, dur)
    elif cause == "sync":
        conn = rw.api("AscendCL@", "aclrtMemcpyAsync", at, 8 * US)
        rw.task(3, "MEMCPY_ASYNC", "PCIE_DMA_SQE", at + 10 * US, dur - 20 * US, conn=conn,
                extra={"data size(Byte)": 64 << 20, "memcpy direction": "device to host"})  # fmt: skip
        rw.cpu_op("aten::_local_scalar_dense", at + 12 * US, dur - 14 * US)
        rw.cpu_op("aten::item", at + 10 * US, dur - 10 * US)
        rw.api("AscendCL@", "aclrtSynchronizeStream", at + 14 * US, dur - 18 * US)


@dataclass(frozen=True)
class DecodeKnobs:
    """How decode steps run and the host-side pathologies they carry (defaults: healthy eager).

    - ``host_us``: host time per eager op; raise it and the device starves between launches.
    - ``kernel_scale``: device time per kernel, times the typical decode kernel (a larger batch).
    - ``graph``: each step replays one captured graph (``AscendCL@aclmdlRIExecuteAsync``; the
      kernels carry its model id) instead of launching every op.
    - ``syncs``: extra ``.item()`` calls inside each step (``aclrtSynchronizeStream`` then a
      device-to-host ``aclrtMemcpy``), each followed by ``sync_gap_us`` of host work.
    - ``allocs``: ``aclrtMalloc``/``aclrtFree`` pairs per step (caching-allocator misses,
      ``empty_cache()`` in the loop), ``alloc_us`` each call.
    - ``compiles``: ops per step on the online-compile path, ``compile_us`` each.
    - ``warmup_only``: > 0 keeps the allocs and compiles to the first that many steps (warm-up).
    """

    host_us: float = 22.0
    kernel_scale: float = 1.0
    graph: bool = False
    syncs: int = 0
    sync_gap_us: float = 300.0
    allocs: int = 0
    alloc_us: float = 150.0
    compiles: int = 0
    compile_us: float = 2000.0
    warmup_only: int = 0


def decode_step(
    rw: RankWriter,
    rng: Random,
    dev: Device,
    number: int,
    t: int,
    *,
    layers: int,
    allreduce: bool = False,
    comm_stream: int = 4,
    stream: int = 2,
    knobs: DecodeKnobs = DecodeKnobs(),
    extra: tuple[KernelSpec, ...] = (),
    stall: tuple[int, str] | None = None,
    host_late_ns: int = 0,
    wait_for_peers_ns: int = 0,
) -> int:
    """One ProfilerStep of decoding: layers of kernels (+ ``extra`` kernels per layer, + an
    all-reduce per layer with TP), then a sync. ``stall`` (ns, cause): the step is late by
    that much, its host busy before its first launch (:func:`host_stall`) or, ``device``, its
    first matmul that much longer. ``host_late_ns``: the host busy elsewhere that long after
    each layer's launches; ``wait_for_peers_ns``: see :func:`allreduce_eager`.

    The closing ``aclrtSynchronizeStream`` is the per-step token fetch every decoder has.
    """
    rw.begin_step(number, t)
    t += jitter(rng, 30)
    slow_ns = 0
    if stall is not None and stall[1] == "device":
        slow_ns = stall[0]
    elif stall is not None:
        host_stall(rw, t, stall[0], stall[1])
        t += stall[0]
    churn = knobs.warmup_only <= 0 or number <= knobs.warmup_only
    if knobs.graph:
        scaled = [replace(s, dur_us=s.dur_us * knobs.kernel_scale) for s in DECODE_LAYER]
        t = graph_replay(rw, rng, dev, t, scaled * layers, stream)
    for layer in range(0 if knobs.graph else layers):
        if churn and layer < knobs.allocs:
            t = alloc_free(rw, rng, t, knobs.alloc_us)
        for i, spec in enumerate((*DECODE_LAYER, *extra)):
            compile_ns = (
                int(knobs.compile_us * US) if churn and i == 0 and layer < knobs.compiles else 0
            )
            scale = knobs.kernel_scale
            if slow_ns and spec.op_type.startswith("MatMul"):  # the late kernel, once
                scale *= 1 + slow_ns / (spec.dur_us * US * scale)
                slow_ns = 0
            t = launch_kernel(
                rw, rng, dev, t, spec, stream, host_us=knobs.host_us, compile_ns=compile_ns,
                kernel_scale=scale,
            )  # fmt: skip
        if host_late_ns:  # the device runs dry before the all-reduce
            rw.cpu_op("vllm/v1/worker/gpu_model_runner.py: _prepare_inputs", t, host_late_ns)
            t += host_late_ns
        if allreduce:
            t = allreduce_eager(rw, rng, dev, t, stream, comm_stream, wait_for_peers_ns)
        if layer < knobs.syncs:
            t = item_sync(rw, rng, dev, t, knobs.sync_gap_us)
    end = synchronize(rw, t, dev.idle_at())
    rw.end_step(end + jitter(rng, 20))
    return end + jitter(rng, 60)


GRAPH_MODEL_ID = 7


def graph_replay(
    rw: RankWriter, rng: Random, dev: Device, t: int, kernels: list[KernelSpec], stream: int = 2
) -> int:
    """One ``NPUGraph.replay()``: a single ``aclmdlRIExecuteAsync`` queues the captured ``kernels``.

    They run back to back, carrying the graph's model id; no per-op launch exists.
    """
    dur = jitter(rng, 40)
    rw.api("AscendCL@", "aclmdlRIExecuteAsync", t + 5 * US, dur - 10 * US, mode="ACL_RTS")
    rw.cpu_op("acl_graph_replay", t, dur)
    ready = t + dur + 10 * US
    for spec in kernels:
        kdur = jitter(rng, spec.dur_us, 0.1)
        kstart = dev.place(stream, ready, kdur + 1 * US)
        run_kernel(rw, stream, spec, kstart, kdur, model_id=GRAPH_MODEL_ID)
    return t + dur + jitter(rng, 4)


def item_sync(rw: RankWriter, rng: Random, dev: Device, t: int, gap_us: float) -> int:
    """``tensor.item()`` mid-step: the host waits for the device, copies 4 bytes back, then goes on.

    ``aten::item`` → ``aten::_local_scalar_dense`` → ``AscendCL@aclrtSynchronizeStream`` (returns
    when the queue is drained) and a device-to-host ``AscendCL@aclrtMemcpy``; the next launch comes
    only after ``gap_us`` of host work, so the device idles.
    """
    sync_end = synchronize(rw, t + 4 * US, dev.idle_at())
    copy = jitter(rng, 35)
    rw.api("AscendCL@", "aclrtMemcpy", sync_end + 2 * US, copy)
    end = sync_end + 2 * US + copy + 2 * US
    rw.cpu_op("aten::_local_scalar_dense", t + 2 * US, end - t - 2 * US)
    rw.cpu_op("aten::item", t, end - t + 1 * US)
    return end + jitter(rng, gap_us)


def alloc_free(rw: RankWriter, rng: Random, t: int, alloc_us: float) -> int:
    """A caching-allocator miss: ``aclrtMalloc`` inside ``aten::empty_strided``, then the block's
    ``aclrtFree`` (``torch.npu.empty_cache()`` in the loop); returns the host time after both."""
    malloc = jitter(rng, alloc_us)
    rw.api("AscendCL@", "aclrtMalloc", t + 3 * US, malloc)
    rw.cpu_op("aten::empty_strided", t, malloc + 6 * US)
    t += malloc + 8 * US
    free = jitter(rng, alloc_us * 0.6)
    rw.api("AscendCL@", "aclrtFree", t + 3 * US, free)
    rw.cpu_op("empty_cache", t, free + 6 * US)
    return t + free + 8 * US


def allreduce_eager(
    rw: RankWriter,
    rng: Random,
    dev: Device,
    t: int,
    stream: int,
    comm_stream: int,
    wait_for_peers_ns: int = 0,
) -> int:
    """``hcom_allReduce_`` from torch.distributed: host API (HOST_HCCL) and the collective on its stream.

    ``wait_for_peers_ns``: how much longer this rank waits inside the collective for a peer that
    arrives late (its first Notify Wait and the op grow by it)."""
    op_dur = jitter(rng, 60)
    rw.api("AscendCL@", "hcom_allReduce_", t + 5 * US, op_dur - 10 * US, mode="HOST_HCCL")
    dur = jitter(rng, 90, 0.3) + wait_for_peers_ns
    wait = jitter(rng, 8) + wait_for_peers_ns  # drawn after dur: seeded outputs stay the same
    start = dev.place(comm_stream, max(t + op_dur, dev.free.get(stream, 0)), dur)
    rw.collective(
        "allReduce",
        start,
        dur,
        host_tid=rw.main_tid,
        host_start=t + 10 * US,
        stream=comm_stream,
        wait_ns=wait,
        count=8 * 4096,
        host_dur=op_dur - 25 * US,
    )
    rw.cpu_op("HcclAllreduce", t, op_dur, device_ns=dur)
    rw.torch_to_npu(t, comm_stream, start, collective=True)
    dev.free[stream] = max(dev.free.get(stream, 0), start + dur)
    return t + op_dur + jitter(rng, 4)
