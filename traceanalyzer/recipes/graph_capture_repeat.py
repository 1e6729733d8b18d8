"""Recipe ``graph-capture-repeat`` (the aclgraph capture slowdown report): ACL graph capture slows down per re-capture."""

from __future__ import annotations

import json
import shlex
from typing import Any

from traceanalyzer.recipes.model import (
    Recipe,
    RenderedFile,
    fill,
    offline_analysis,
    sh_env,
    shipped,
    template_text,
)
from traceanalyzer.recipes.params import (
    ANALYSE_PARAM,
    CANN_SET_ENV_PARAM,
    PYTHON_PARAM,
    Param,
    ParamError,
)
from traceanalyzer.recipes.seams import SCOPES_EVIDENCE, HookVariant, Seam

NAME = "graph-capture-repeat"
EXTENSION_CLS = "ta_capture_hooks.CaptureRepeatExtension"
DEFAULT_CAPTURE_SIZES = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 96]
ARMS = ("baseline", "aiv")

_ACL = "vllm_ascend.compilation.acl_graph"
_RUNNER = "vllm_ascend.worker.model_runner_v1"
_COMMON_SEAMS = (
    Seam(
        _ACL, "ACLGraphWrapper.concrete_aclgraph_entries", why="captured graphs, cleared each round"
    ),
    Seam(
        _ACL,
        "ACLGraphWrapper.__call__",
        uses="graph",
        why="torch.npu.graph looked up at call time (per-graph timer)",
    ),
    Seam(_ACL, "_graph_params", why="per-capture attention state reset each round"),
    Seam(_RUNNER, "NPUModelRunner.capture_model", why="stable capture entry point"),
    Seam(
        "vllm_ascend.worker.worker",
        "NPUWorker.model_runner",
        why="the extension reads self.model_runner",
    ),
)

VARIANTS = (
    HookVariant(
        name="weakset",
        summary="AclGraphSleepWakeupManager.reset_all_graph_params() (acl_graph._acl_graph_wrappers)",
        min_version="0.23.0",
        max_version=None,
        seams=_COMMON_SEAMS
        + (
            Seam(_ACL, "_acl_graph_wrappers", why="registry of live wrappers"),
            Seam(
                "vllm_ascend.device_allocator.sleep_mem_optimized",
                "AclGraphSleepWakeupManager.reset_all_graph_params",
                why="vllm-ascend's own re-capture reset",
            ),
        ),
        tested_versions=("0.23.0",),
    ),
    HookVariant(
        name="gc",
        summary="find ACLGraphWrapper objects with gc, clear concrete_aclgraph_entries, reset _graph_params lists",
        min_version="0.13.0",
        max_version="0.23.0",
        seams=_COMMON_SEAMS
        + (Seam(_ACL, "_draft_graph_params", why="draft-model state, reset too"),),
        tested_versions=("0.13.0", "0.18.0"),
    ),
)

VLLM_SEAMS = (
    Seam(
        "vllm.config.parallel",
        "ParallelConfig.worker_extension_cls",
        why="LLM(worker_extension_cls=...)",
    ),
    Seam(
        "vllm.v1.worker.worker_base",
        "WorkerWrapperBase.init_worker",
        uses="worker_extension_cls",
        why="mixes the extension into the worker",
    ),
    Seam("vllm.entrypoints.llm", "LLM.collective_rpc", why="calls ta_recapture on every worker"),
    Seam(
        "vllm.compilation.monitor",
        "set_cudagraph_capturing_enabled",
        why="re-enabled before each round",
    ),
    Seam("vllm.config", "set_current_vllm_config", why="capture runs under the worker's config"),
)

SUPPORTED = {"0.13.0": "gc", "0.18.0": "gc", "0.23.0": "weakset"}


def _check_sizes(sizes: list[int]) -> None:
    if not sizes:
        raise ValueError("needs at least one capture size")


def _check_devices(text: str) -> None:
    items = [d.strip() for d in text.split(",")]
    if not all(d.isdigit() for d in items):
        raise ValueError(f"expected comma-separated device ids like 0,1,2,3; got {text!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"duplicate device ids in {text!r}")


PARAMS = (
    Param(
        "model",
        "str",
        "Qwen/Qwen3-8B",
        "HF id or local dir with config.json + tokenizer; weights are not loaded (load_format=dummy)",
    ),
    Param(
        "tensor_parallel_size",
        "int",
        8,
        "tensor parallel size (number of worker processes / NPUs)",
        minimum=1,
    ),
    Param(
        "devices",
        "str",
        "0,1,2,3,4,5,6,7",
        "ASCEND_RT_VISIBLE_DEVICES; at least tensor_parallel_size ids",
        check=_check_devices,
    ),
    Param(
        "capture_sizes",
        "int_list",
        DEFAULT_CAPTURE_SIZES,
        "cudagraph_capture_sizes, sorted ascending",
        minimum=1,
        sorted_unique=True,
        check=_check_sizes,
    ),
    Param(
        "cudagraph_mode",
        "choice",
        "FULL",
        "compilation_config.cudagraph_mode (the report uses FULL)",
        choices=("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "PIECEWISE"),
    ),
    Param("max_num_seqs", "int", 24, "LLM(max_num_seqs=...)", minimum=1),
    Param("dtype", "choice", "bfloat16", "model dtype", choices=("bfloat16", "float16")),
    Param("seed", "int", 10, "LLM(seed=...)"),
    Param(
        "rounds",
        "int",
        100,
        "how many times every rank clears and re-captures all graphs",
        minimum=1,
    ),
    Param(
        "profile_rounds",
        "int_list",
        [1, 45, 100],
        "rounds captured under torch_npu.profiler (one *_ascend_pt per rank per round)",
        minimum=1,
        sorted_unique=True,
    ),
    Param(
        "profiler_level",
        "choice",
        "Level2",
        "Level2 records Runtime APIs (rtMemcpy) besides aclmdlRICapture*; Level1 only AscendCL",
        choices=("Level1", "Level2"),
    ),
    ANALYSE_PARAM,
    Param(
        "arms",
        "str_list",
        list(ARMS),
        "arms run by run.sh: baseline (HCCL_OP_EXPANSION_MODE unset) and/or aiv (=AIV)",
        choices=ARMS,
        sorted_unique=False,
    ),
    Param(
        "per_graph_timing",
        "bool",
        True,
        "time every torch.npu.graph capture (subclass of torch_npu.npu.graph)",
    ),
    Param(
        "generate",
        "bool",
        True,
        "after re-capture, generate 10 tokens to check that replay still works",
    ),
    Param(
        "hook_variant",
        "choice",
        "auto",
        "how capture state is cleared: auto (doctor/run time), weakset (vllm-ascend>=0.23), gc (0.13-0.22)",
        choices=("auto", "weakset", "gc"),
    ),
    Param(
        "arm_timeout_s",
        "int",
        7200,
        "per-arm timeout; a timed-out arm is recorded as outcome=hang",
        minimum=60,
    ),
    PYTHON_PARAM,
    CANN_SET_ENV_PARAM,
)


def cross_check(values: dict[str, Any]) -> None:
    devices = [d for d in values["devices"].split(",") if d.strip()]
    tp = values["tensor_parallel_size"]
    if len(devices) < tp:
        raise ParamError(f"devices lists {len(devices)} NPUs but tensor_parallel_size is {tp}")
    late = [r for r in values["profile_rounds"] if r > values["rounds"]]
    if late:
        raise ParamError(f"profile_rounds {late} exceed rounds={values['rounds']}")
    if len(set(values["arms"])) != len(values["arms"]):
        raise ParamError(f"arms has duplicates: {values['arms']}")
    if not values["arms"]:
        raise ParamError("arms must name at least one of baseline, aiv")


def llm_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """The ``LLM(**kwargs)`` of the launcher (the seed's, plus the worker extension)."""
    return {
        "model": values["model"],
        "tensor_parallel_size": values["tensor_parallel_size"],
        "dtype": values["dtype"],
        "max_num_seqs": values["max_num_seqs"],
        "distributed_executor_backend": "mp",
        "compilation_config": {
            "cudagraph_capture_sizes": list(values["capture_sizes"]),
            "cudagraph_mode": values["cudagraph_mode"],
        },
        "load_format": "dummy",
        "seed": values["seed"],
        "worker_extension_cls": EXTENSION_CLS,
    }


def environment(values: dict[str, Any]) -> dict[str, str]:
    """Exported by run.sh for both arms (HCCL_OP_EXPANSION_MODE is set per arm)."""
    return {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_ASCEND_ENABLE_NZ": "0",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:False",
        "ASCEND_RT_VISIBLE_DEVICES": values["devices"],
        # iteration evidence in the profiled windows (docs/serving.md)
        "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1",
    }


def build(values: dict[str, Any]) -> dict[str, RenderedFile]:
    config = {
        "recipe": NAME,
        "llm": llm_kwargs(values),
        "plan": {
            "rounds": values["rounds"],
            "profile_rounds": list(values["profile_rounds"]),
            "profiler_level": values["profiler_level"],
            "analyse": values["analyse"] == "inline",
            "per_graph_timing": values["per_graph_timing"],
            "hook_variant": values["hook_variant"],
        },
        "generate": values["generate"],
    }
    run_sh = fill(
        template_text(NAME, "run.sh.tmpl"),
        {
            "PYTHON": values["python"],
            "CANN_SET_ENV": shlex.quote(values["cann_set_env"]),
            "ARM_TIMEOUT_S": str(values["arm_timeout_s"]),
            "ARMS": " ".join(values["arms"]),
            "HOOK_VARIANT": shlex.quote(values["hook_variant"]),
            "ENV": sh_env(environment(values)),
            "ANALYSE": offline_analysis(values),
        },
    )
    return {
        "run.sh": RenderedFile(run_sh, executable=True),
        "config.json": RenderedFile(json.dumps(config, indent=2) + "\n"),
        **shipped(NAME, "launch.py", "hooks/ta_capture_hooks.py"),
        **shipped("common", "analyse_profiles.py"),
    }


def cann_note(cann: str | None) -> str | None:
    from traceanalyzer.recipes.versions import version_tuple

    if cann is None:
        return None
    if version_tuple(cann) >= (9, 1, 0):
        return f"CANN {cann} has the fix (9.1.0): expect flat capture times in the baseline arm too"
    return f"CANN {cann} < 9.1.0: expect the baseline arm's capture time to grow per round"


RECIPE = Recipe(
    name=NAME,
    summary="Re-capture ACL graphs N rounds (FULL mode) and profile chosen rounds; baseline vs HCCL AIV",
    reproduces=(
        "The aclgraph capture slowdown report: with FULL ACL graph mode and TP>1, every re-capture of the same set of "
        "graph shapes takes longer than the previous one. HCCL gives every communication op in a "
        "captured graph its own tag; the AI CPU resource refresh does an h2d memcpy per "
        "resource, and resources of earlier graphs are not released, so rtMemcpy calls grow "
        "with each capture. Workaround HCCL_OP_EXPANSION_MODE=AIV; fixed in CANN 9.1.0."
    ),
    expect=(
        "profiling_data/<arm>/capture_timings.json holds per-rank, per-round capture seconds "
        "(and per-graph seconds). On CANN < 9.1.0 the baseline arm grows roughly linearly "
        "with the round, and the profiled rounds show more rtMemcpy / aclrtMemcpy API calls "
        "inside aclmdlRICaptureBegin..End as rounds increase; the aiv arm stays flat. "
        "Caveat (vllm-ascend #13688): AIV plus graph task groups and HCCL inside "
        "torch.npu.graph can fail capture (507009) or hang replay with MC2 MoE; a timed-out "
        "arm is recorded as outcome=hang, not as a slow capture."
    ),
    params=PARAMS,
    variants=VARIANTS,
    vllm_seams=VLLM_SEAMS,
    supported=SUPPORTED,
    build=build,
    cross_check=cross_check,
    cann_note=cann_note,
    evidence=(SCOPES_EVIDENCE,),
)
