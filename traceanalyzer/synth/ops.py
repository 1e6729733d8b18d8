"""Composite host/device actions built from :class:`RankWriter` primitives.

Each function models one thing a torch_npu program does and emits every event
that action leaves in a real export, with physically consistent timing: a host
call ends after what it waits for, a device task starts no earlier than its
launch and than the previous task on its stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random

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


DECODE_LAYER: tuple[KernelSpec, ...] = (
    KernelSpec("aclnnRmsNorm", "aclnnRmsNorm_RmsNorm_RmsNorm", "RmsNorm", "AI_VECTOR_CORE", 6.0),
    KernelSpec(
        "aclnnMm", "aclnnMm_MatMulCommon_MatMulV2", "MatMulV2", "AI_CORE", 38.0, "8,4096;4096,6144"
    ),
    KernelSpec(
        "aclnnApplyRotaryPosEmb",
        "aclnnApplyRotaryPosEmb_ApplyRotaryPosEmb",
        "ApplyRotaryPosEmb",
        "AI_VECTOR_CORE",
        5.0,
    ),
    KernelSpec(
        "aclnnFusedInferAttentionScore",
        "aclnnFusedInferAttentionScore_FusedInferAttentionScore",
        "FusedInferAttentionScore",
        "MIX_AIC",
        42.0,
    ),
    KernelSpec(
        "aclnnMm", "aclnnMm_MatMulCommon_MatMulV2", "MatMulV2", "AI_CORE", 22.0, "8,4096;4096,4096"
    ),
    KernelSpec("aclnnAdd", "aclnnAdd_AddAiCore_Add", "Add", "AI_VECTOR_CORE", 3.0),
    KernelSpec(
        "aclnnMm", "aclnnMm_MatMulCommon_MatMulV2", "MatMulV2", "AI_CORE", 55.0, "8,4096;4096,24576"
    ),
    KernelSpec("aclnnSwiGlu", "aclnnSwiGlu_SwiGlu_SwiGlu", "SwiGlu", "AI_VECTOR_CORE", 8.0),
    KernelSpec(
        "aclnnMm",
        "aclnnMm_MatMulCommon_MatMulV2",
        "MatMulV2",
        "AI_CORE",
        30.0,
        "8,12288;12288,4096",
    ),
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


def launch_kernel(
    rw: RankWriter, rng: Random, dev: Device, t: int, spec: KernelSpec, stream: int = 2
) -> int:
    """Eager aclnn launch through the torch_npu task queue; returns the host time after the op.

    Python main thread: ``cpu_op`` + Enqueue; consumer thread: Dequeue@op with ``AscendCL@aclnn*`` →
    ``Node@launch`` (→ ``Runtime@KernelLaunch`` at Level2); device: the kernel, linked by HostToDevice
    and torch_to_npu flows.
    """
    op_dur = jitter(rng, 22)
    enq = t + op_dur - 6 * US
    deq = enq + jitter(rng, 4)
    deq_dur = jitter(rng, 24)
    rw.enqueue(spec.api, enq, 3 * US, deq, deq_dur)
    acl = deq + 2 * US
    acl_dur = deq_dur - 4 * US
    rw.api("AscendCL@", spec.api, acl, acl_dur, tid=rw.dequeue_tid, mode="ACL_NN")
    node = acl + 6 * US
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
    kdur = jitter(rng, spec.dur_us, 0.1) + rng.randrange(0, 1000)
    kstart = dev.place(stream, node + node_dur + 8 * US, kdur)
    rw.kernel(
        stream,
        spec.name,
        spec.op_type,
        spec.core,
        kstart,
        kdur,
        conn=conn,
        in_shapes=spec.shapes,
        in_types=spec.dtypes,
    )
    rw.h2d(conn, True, rw.dequeue_tid, node, rw.hw_pid, stream, kstart)
    rw.cpu_op(spec.api, t, op_dur, device_ns=kdur, aicore_ns=kdur)
    rw.torch_to_npu(t, stream, kstart)
    return t + op_dur + jitter(rng, 4)


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


def decode_step(
    rw: RankWriter,
    rng: Random,
    dev: Device,
    number: int,
    t: int,
    *,
    layers: int,
    allreduce: bool,
    comm_stream: int = 4,
    stream: int = 2,
    extra: tuple[KernelSpec, ...] = (),
) -> int:
    """One ProfilerStep of eager decoding: layers of kernels (+ ``extra`` kernels, + an all-reduce
    per layer with TP), then a sync."""
    rw.begin_step(number, t)
    t += jitter(rng, 30)
    for _ in range(layers):
        for spec in (*DECODE_LAYER, *extra):
            t = launch_kernel(rw, rng, dev, t, spec, stream)
        if allreduce:
            t = allreduce_eager(rw, rng, dev, t, stream, comm_stream)
    end = synchronize(rw, t, dev.idle_at())
    rw.end_step(end + jitter(rng, 20))
    return end + jitter(rng, 60)


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
    rw.api(
        "AscendCL@",
        "hcom_allReduce_",
        t + 5 * US,
        op_dur - 10 * US,
        tid=rw.main_tid,
        mode="HOST_HCCL",
    )
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
