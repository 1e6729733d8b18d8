"""Generation profiles: what changes on disk between torch_npu/CANN releases.

The parsers must accept every generation seen in the field, so the generator
must be able to produce each of them. Everything that differs between
generations lives here as data; the writers never branch on a version string.
See ``/shared/reference/torch_npu_export_format.md`` (table at the top, §2, §3).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from traceanalyzer.parse.trace_shared import CURRENT_SORT_INDEX, G2_SORT_INDEX

# Columns of kernel_details.csv after the fixed leading block, at Level1/2
# (aic_metrics = PipeUtilization, as in the real G2/G3 exports).
PIPE_UTILIZATION_COLUMNS: tuple[str, ...] = (
    "aicore_time(us)",
    "aic_total_cycles",
    "aic_mac_time(us)",
    "aic_mac_ratio",
    "aic_scalar_time(us)",
    "aic_scalar_ratio",
    "aic_mte1_time(us)",
    "aic_mte1_ratio",
    "aic_mte2_time(us)",
    "aic_mte2_ratio",
    "aic_fixpipe_time(us)",
    "aic_fixpipe_ratio",
    "aic_icache_miss_rate",
    "aiv_time(us)",
    "aiv_total_cycles",
    "aiv_vec_time(us)",
    "aiv_vec_ratio",
    "aiv_scalar_time(us)",
    "aiv_scalar_ratio",
    "aiv_mte2_time(us)",
    "aiv_mte2_ratio",
    "aiv_mte3_time(us)",
    "aiv_mte3_ratio",
    "aiv_icache_miss_rate",
    "cube_utilization(%)",
)

SHAPE_COLUMNS: tuple[str, ...] = (
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
    "Output Formats",
)

# G1 (ArithmeticUtilization sample) had fewer leading columns and no OP State/HF32.
G1_METRIC_COLUMNS: tuple[str, ...] = (
    "aicore_time(us)",
    "aic_total_cycles",
    "aic_mac_fp16_ratio",
    "aic_mac_int8_ratio",
    "aic_cube_fops",
    "aic_vector_fops",
    "aiv_time(us)",
    "aiv_total_cycles",
    "aiv_vec_fp32_ratio",
    "aiv_vec_fp16_ratio",
    "aiv_vec_int32_ratio",
    "aiv_vec_misc_ratio",
    "aiv_cube_fops",
    "aiv_vector_fops",
)


@dataclass(frozen=True)
class Generation:
    """On-disk differences of one torch_npu/CANN generation.

    Attributes are named after what they change, so a reader of a writer never
    needs to know which release introduced which quirk.
    """

    name: str
    device_id_column: bool  # CSVs start with Device_id (G3+)
    block_word: str  # "Dim" (G1-G3) or "Num" (current) in Block Dim/Mix Block Dim
    hw_stream_arg: str  # "Stream Id" (G1) or "Physic Stream Id"
    comm_process: str  # "HCCL" or "Communication"
    comm_prefix: str  # CANN event prefix for HCCL host APIs: "Hccl@" / "Communication@"
    comm_level: str  # api level: "hccl" / "communication"
    comm_core: str  # kernel_details Accelerator Core of collective rows
    export_type_list: bool  # profiler_info _export_type: ["text"] (G3+) or "text"
    rank_id_str: bool  # profiler_info rank_id "0" (env RANK) or 0 (get_rank)
    versions: dict[str, str] = field(default_factory=dict)  # torch_npu/cann version keys
    npu_label_with_device: bool = False  # process_labels "NPU 0" instead of "NPU"
    flow_id_with_context: bool = True  # HostToDevice id (conn<<32)+ctx, else conn<<32
    has_op_state: bool = True  # kernel_details "OP State" and "HF32 Eligible" columns
    step_preparing_column: bool = True  # step_trace_time "Preparing" column
    # process_sort_index per process name (pid = (ospid<<10)|(sort<<5)|dev)
    sort_index: dict[str, int] = field(default_factory=dict)
    host_device_id: int | None = None  # device bits for host layers (31 in current C++)
    db_export: bool = True  # export_type=Db written (G2+; the G1 sample is Text only)
    db_op_state: bool = True  # COMPUTE_TASK_INFO opState/hf32Eligible (G3+; the G2 Db has none)

    @property
    def block_dim(self) -> str:
        return f"Block {self.block_word}"

    @property
    def mix_block_dim(self) -> str:
        return f"Mix Block {self.block_word}"

    def npu_label(self, device: int) -> str:
        return f"NPU {device}" if self.npu_label_with_device else "NPU"


# Each generation as what changed since the one before it.
_G1 = Generation(
    name="g1",
    device_id_column=False,
    block_word="Dim",
    hw_stream_arg="Stream Id",
    comm_process="HCCL",
    comm_prefix="Hccl@",
    comm_level="hccl",
    comm_core="HCCL",
    export_type_list=False,
    rank_id_str=False,
    has_op_state=False,
    step_preparing_column=False,
    sort_index=G2_SORT_INDEX,
    db_export=False,
    db_op_state=False,
)
_G2 = replace(
    _G1,
    name="g2",
    hw_stream_arg="Physic Stream Id",
    has_op_state=True,
    step_preparing_column=True,
    db_export=True,
)
_G3 = replace(
    _G2,
    name="g3",
    device_id_column=True,
    comm_process="Communication",
    comm_prefix="Communication@",
    comm_level="communication",
    comm_core="COMMUNICATION",
    export_type_list=True,
    rank_id_str=True,
    versions={"torch_npu_version": "2.7.1", "cann_version": "8.3.RC1"},
    npu_label_with_device=True,
    db_op_state=True,
)
_CURRENT = replace(
    _G3,
    name="current",
    block_word="Num",
    versions={"torch_npu_version": "2.8.0", "cann_version": "9.0.0"},
    flow_id_with_context=False,
    sort_index=CURRENT_SORT_INDEX,
    host_device_id=31,
)
GENERATIONS: dict[str, Generation] = {g.name: g for g in (_G1, _G2, _G3, _CURRENT)}


def get_generation(name: str) -> Generation:
    """Look a generation up by name, with an error that lists the valid ones."""
    try:
        return GENERATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown generation {name!r}; choose from {sorted(GENERATIONS)}"
        ) from None
