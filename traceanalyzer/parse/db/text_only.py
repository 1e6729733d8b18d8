"""What a Db export cannot hold that its Text twin would, said from what the database shows the
profile recorded (the real G2 twins compared, tests/test_ingest_db.py): the Db has no table,
column or link for these, so the canonical tables a Text export fills with them stay empty."""

from __future__ import annotations

from collections.abc import Collection

# (what the Text twin holds, the Db's processes any of which shows the profile recorded it)
_WITH_PROCESSES = (
    # msprof samples QoS with the memory hardware (HBM, LLC): trace_view.json's `QoS` process
    ("the QoS counters (`QoS OTHERS`, ...)", ("HBM", "LLC")),
    ("the CANN APIs' `Mode` (slices.api_mode)", ("CANN",)),
)
# What the Text twin holds of the copies (MEMCPY_ASYNC tasks): the Db links a torch op to one
# launch only, and its TASK.taskType says MEMCPY_ASYNC, not the queue the copy ran on.
_WITH_COPIES = (
    "the torch ops' async_npu flows to their copies",
    "each copy's engine (SDMA or PCIe DMA: every MEMCPY_ASYNC is stored as PCIE_DMA_SQE)",
)
# COMPUTE_TASK_INFO's columns some releases leave out → kernel_details.csv's column
KERNEL_COLUMNS = {"opState": "`OP State`", "hf32Eligible": "`HF32 Eligible`"}


def text_only(
    processes: Collection[str], copies: bool, absent_kernel_columns: Collection[str]
) -> list[str]:
    """What this Db export's Text twin would hold and it cannot: of ``processes`` (the Db's),
    its ``copies`` (any copy task), the COMPUTE_TASK_INFO columns of :data:`KERNEL_COLUMNS` it
    lacks while it has kernels."""
    said = [what for what, shown_by in _WITH_PROCESSES if set(shown_by) & set(processes)]
    said += list(_WITH_COPIES) if copies else []
    columns = [KERNEL_COLUMNS[c] for c in KERNEL_COLUMNS if c in absent_kernel_columns]
    if columns:
        lacked = ", ".join(c for c in KERNEL_COLUMNS if c in absent_kernel_columns)
        said.append(f"the kernels' {' and '.join(columns)} (COMPUTE_TASK_INFO has no {lacked})")
    return said
