"""The domain vocabulary: names torch_npu / CANN exports use, and the markers our recipes add.

Rules, reports and fixtures name processes, task types and metadata keys through these
constants, so a name that differs between export generations is spelt out once, here.
Processes are identified by their ``process_name`` metadata (the ``process`` column), never by
pid value (pids are version dependent; see docs/schema.md).
"""

from __future__ import annotations

import json
from typing import Any

# --------------------------------------------------------------------------------------------
# Processes (the `process` column of `slices`)
# --------------------------------------------------------------------------------------------

PYTHON_PROCESS = "Python"  # torch_npu's framework events (cpu_op, python_function, mstx ranges)
PYTHON_GC_PROCESS = "Python GC"
CANN_PROCESS = "CANN"  # host API layer (AscendCL@, Runtime@, Node@, Hccl@/Communication@), Level1+
# Processes that run on the host CPU: the framework and the CANN API layer.
HOST_PROCESSES = (PYTHON_PROCESS, PYTHON_GC_PROCESS, CANN_PROCESS)
HARDWARE_PROCESS = "Ascend Hardware"  # device stream tasks; threads are `Stream <id>`
# The communication plane: `HCCL` in G1/G2 exports, `Communication` in current ones.
COMMUNICATION_PROCESSES = ("HCCL", "Communication")
DEVICE_PROCESSES = (HARDWARE_PROCESS, *COMMUNICATION_PROCESSES)
OVERLAP_PROCESS = "Overlap Analysis"  # Computing / Communication / Free per step
AI_CORE_FREQ_PROCESS = "AI Core Freq"  # counter, MHz, sampled when it changes
# Every process that is not the framework's host threads: a host span (cpu_op, python_function,
# an mstx range, a user process) is a slice of any other process.
NOT_HOST_PROCESSES = (CANN_PROCESS, *DEVICE_PROCESSES, OVERLAP_PROCESS)

# --------------------------------------------------------------------------------------------
# Device tasks (`task_type` and `name` of Ascend Hardware / communication slices)
# --------------------------------------------------------------------------------------------

# Cross-stream waits: task types on Ascend Hardware, and the names they (and HCCL plane tasks)
# carry across generations.
WAIT_TASK_TYPES = ("EVENT_WAIT_SQE", "NOTIFY_WAIT_SQE")
WAIT_TASK_NAMES = ("EVENT_WAIT", "NOTIFY_WAIT", "Notify Wait", "Notify_Wait")
# Of those, the waits inside a collective for a peer rank (a notify from another device).
NOTIFY_WAIT_NAMES = ("Notify Wait", "Notify_Wait", "NOTIFY_WAIT", "NOTIFY_WAIT_SQE")
# Copies: host<->device memcpy tasks and the DMA engines that carry them.
COPY_TASK_NAMES = ("MEMCPY_ASYNC",)
COPY_TASK_TYPES = ("PCIE_DMA_SQE", "SDMA_SQE")
# Kernels: compute on the AI Core / AI Vector / AI CPU, as GE names them in trace_view.json
# `Task Type` (G1 exports label AI Core kernels `Other`), and as the runtime names them
# (task_time.csv, newer chips).
AI_CORE_TASK_TYPES = (
    "AI_CORE",
    "Other",
    "AI_VECTOR_CORE",
    "MIX_AIC",
    "MIX_AIV",
    "AIV_SQE",
    "FFTS_PLUS",
    "KERNEL_AICORE",
    "KERNEL_AIVEC",
    "KERNEL_MIX_AIC",
    "KERNEL_MIX_AIV",
)
AI_CPU_TASK_TYPES = ("AI_CPU", "KERNEL_AICPU", "AICPU_H", "AICPU_D")
# A kernel's `Task Type` in trace_view.json is its hardware queue's, which is its
# `Accelerator Core` except for AI Vector Core kernels, queued as AI Core tasks (real G2 export).
CORE_TASK_TYPE = {"AI_VECTOR_CORE": "AI_CORE"}
COMPUTE_TASK_TYPES = (*AI_CORE_TASK_TYPES, *AI_CPU_TASK_TYPES)
# kernel_details.csv lists each collective too, under these `Accelerator Core` names (G1/G2,
# then G3+); op_statistic.csv leaves them out.
COMMUNICATION_CORES = ("HCCL", "COMMUNICATION")

# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------

SITE_CATEGORIES = ("cpu_op", "dequeue")  # torch ops, and the task queue running them
DEQUEUE_PREFIX = "Dequeue@"  # the task queue's event of the op it runs: `Dequeue@<op>`
MODULE_EVENT_PREFIX = "nn.Module: "  # the Python tracer's module calls: `nn.Module: <Class>_<id>`
HCCL_API_PREFIX = "hcom"  # the AscendCL calls of HCCL collectives: `hcom_allReduce_`, ...
STEP_SPAN_PREFIX = "ProfilerStep#"  # `ProfilerStep#N` spans, one per prof.step()
# Flow categories linking a host call to the device task it launched.
LAUNCH_FLOW_CATEGORIES = ("HostToDevice", "async_npu")

# Export generations, oldest first (``sessions.generation``; docs/schema.md): G1 2024, G2 Jan 2025,
# G3 Nov 2025, current.
GENERATIONS = ("g1", "g2", "g3", "current")


def generation_label(generation: str | None) -> str:
    """``g2`` -> ``G2`` (``current`` stays as is), as the docs name them."""
    return (generation or "?").upper() if (generation or "").startswith("g") else generation or "?"


# --------------------------------------------------------------------------------------------
# Markers our recipes add to profiler_metadata.json (prof.add_metadata)
# --------------------------------------------------------------------------------------------

# What the profiled window wraps (WINDOW_KEY): one store transfer (and which call it was,
# TRANSFER_KEY), or a graph-capture round. Read them from `sessions.metadata` with
# `session_metadata`. The recipes' hook templates run on hosts without traceanalyzer and spell
# these out themselves (tests/test_architecture.py checks they agree).
WINDOW_KEY = "traceanalyzer.window"
STORE_TRANSFER_WINDOW = "store_transfer"
CAPTURE_WINDOW = "graph_capture"
TRANSFER_KEY = "traceanalyzer.transfer"


# The expert-parallel exchange paths an MoE step takes (derived.exchanges tells them apart):
# id -> (how findings and reports name it, its short name in the overview's tables)
EP_PATHS: dict[str, tuple[str, str]] = {
    "mc2": ("MC2 dispatch/combine", "MC2"),
    "alltoall": ("all-to-all", "all-to-all"),
    "allgather": ("all-gather", "all-gather"),
}


def session_metadata(raw: str | None) -> dict[str, Any]:
    """The `sessions.metadata` JSON string as a dict ({} when absent or not an object)."""
    try:
        value = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


# --------------------------------------------------------------------------------------------
# Host <-> device synchronisation, profiler markers, graph replay
# --------------------------------------------------------------------------------------------

# AscendCL calls that block the host until the device (a stream, an event, the whole device)
# has finished, and the synchronous copy (`aclrtMemcpy`: `.item()`, `.tolist()`, `.cpu()`).
SYNC_APIS = (
    "aclrtSynchronizeStream",
    "aclrtSynchronizeStreamWithTimeout",
    "aclrtSynchronizeDevice",
    "aclrtSynchronizeDeviceWithTimeout",
    "aclrtSynchronizeEvent",
    "aclrtSynchronizeEventWithTimeout",
    "aclrtMemcpy",
)
# Tasks the profiler itself puts on a stream when it starts and stops: not the workload's.
PROFILER_MARKER_TASKS = ("PROFILING_ENABLE", "PROFILING_DISABLE")
# Graph replay: one call queues a whole captured graph (aclgraph / NPUGraph.replay()).
GRAPH_REPLAY_APIS = ("aclmdlRIExecuteAsync",)
# Graph capture (regexes on api_name): NPUGraph.capture_begin / capture_end.
CAPTURE_BEGIN_API = r"^aclmdl(RI)?CaptureBegin$"
CAPTURE_END_API = r"^aclmdl(RI)?CaptureEnd$"
# Device memory: the driver calls a caching allocator's miss makes (aclMallocMemInner is the
# name msprof-analyze's memory checker reads on some CANN versions).
ALLOC_APIS = (
    "aclrtMalloc", "aclrtMallocAlign32", "aclrtMallocCached", "aclrtMallocPhysical",
    "aclMallocMemInner",
)  # fmt: skip
FREE_APIS = ("aclrtFree", "aclrtFreePhysical")
# Online operator compilation (regex on api_name): an aclopCompileAndExecute shows its
# opCompile inside.
COMPILE_API = r"^(?:aclopCompile\w*|opCompile\w*)$"
# ... and the compile itself, whose time is the compile's cost (not the execute around it)
COMPILE_CALLS = ("opCompile", "aclopCompile")

# Idle gaps on a stream (the overview's breakdown and host-launch-bound classify them alike):
# shorter ones are the device's own dispatch latency between queued tasks, longer ones pauses
# (nothing queued: between requests, data loading), not slow dispatch.
DISPATCH_LATENCY_US = 5.0
PAUSE_MS = 10.0

# The allocating stream torch's memory records name in the real G2 export: what synth and the
# fixture builders write (no rule reads a stream's pointer value).
MEMORY_STREAM_PTR = 897357296
