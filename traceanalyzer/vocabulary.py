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
# Copies: host<->device memcpy tasks and the DMA engines that carry them.
COPY_TASK_NAMES = ("MEMCPY_ASYNC",)
COPY_TASK_TYPES = ("PCIE_DMA_SQE", "SDMA_SQE")

# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------

STEP_SPAN_PREFIX = "ProfilerStep#"  # `ProfilerStep#N` spans, one per prof.step()
# Flow categories linking a host call to the device task it launched.
LAUNCH_FLOW_CATEGORIES = ("HostToDevice", "async_npu")

# --------------------------------------------------------------------------------------------
# Markers our recipes add to profiler_metadata.json (prof.add_metadata)
# --------------------------------------------------------------------------------------------

# The profiled window wraps one store transfer (WINDOW_KEY: STORE_TRANSFER_WINDOW), and which
# call it was (TRANSFER_KEY). Read them from `sessions.metadata` with `session_metadata`.
WINDOW_KEY = "traceanalyzer.window"
STORE_TRANSFER_WINDOW = "store_transfer"
TRANSFER_KEY = "traceanalyzer.transfer"


def session_metadata(raw: str | None) -> dict[str, Any]:
    """The `sessions.metadata` JSON string as a dict ({} when absent or not an object)."""
    try:
        value = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
