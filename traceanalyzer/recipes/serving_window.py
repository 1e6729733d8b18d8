"""Recipe ``serving-window``: profile a short window of a running vLLM server under mixed traffic.

No hook: the server's own profiler switch (``--profiler-config`` from vllm-ascend 0.14 on, the
``VLLM_TORCH_PROFILER_DIR`` environment before) and its ``/start_profile`` / ``/stop_profile``
endpoints. Steady decode traffic runs from the start; the profile window opens once it is
steady and a prefill-heavy burst lands inside it, so the trace holds prefill, decode and mixed
iterations, the evidence that tells them apart turned on (the model runner's scopes, the Python
tracer's functions; Level1 keeps the kernels' input shapes) and ``traceanalyzer run`` splits
every figure by phase (docs/serving.md).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from traceanalyzer.recipes.model import (
    SOURCE_CANN,
    SOURCE_ENV_SH,
    Recipe,
    RenderedFile,
    bash_script,
    fill,
    sh_command,
    sh_env,
    template_text,
)
from traceanalyzer.recipes.params import (
    CANN_SET_ENV_PARAM,
    PYTHON_PARAM,
    READY_TIMEOUT_PARAM,
    Param,
    ParamError,
)
from traceanalyzer.recipes.seams import SCOPES_EVIDENCE, HookVariant, Seam

NAME = "serving-window"
_WORKER = "vllm_ascend.worker.worker"

VARIANTS = (
    HookVariant(
        name="profiler_config",
        summary="vllm serve --profiler-config; the worker builds its torch_npu profiler from it",
        min_version="0.14.0",
        max_version=None,
        seams=(
            Seam(
                _WORKER,
                "NPUWorker.profile",
                uses="profiler_config",
                why="/start_profile and /stop_profile reach the worker's profiler",
            ),
        ),
        tested_versions=("0.18.0", "0.23.0"),
    ),
    HookVariant(
        name="env",
        summary="VLLM_TORCH_PROFILER_DIR (and _WITH_STACK) in the environment",
        min_version="0.11.0",
        max_version="0.14.0",
        seams=(
            Seam(_WORKER, "NPUWorker.profile", why="/start_profile and /stop_profile"),
            Seam(
                _WORKER,
                "NPUWorker._init_profiler",
                uses="VLLM_TORCH_PROFILER_DIR",
                why="the profiler is configured from the environment",
            ),
        ),
        tested_versions=("0.13.0",),
    ),
)

VLLM_SEAMS = (Seam("vllm.benchmarks.serve", literal="--result-filename", why="bench result JSON"),)

SUPPORTED = {"0.13.0": "env", "0.18.0": "profiler_config", "0.23.0": "profiler_config"}

PARAMS = (
    Param("model", "str", "Qwen/Qwen3-8B", "model path or HF id"),
    Param("served_model_name", "str", "served", "--served-model-name (bench --model)"),
    Param("port", "int", 8000, "API server port", minimum=1),
    Param("devices", "str", "0", "ASCEND_RT_VISIBLE_DEVICES"),
    Param("tensor_parallel_size", "int", 1, "--tensor-parallel-size", minimum=1),
    Param("max_num_seqs", "int", 64, "--max-num-seqs", minimum=1),
    Param("max_num_batched_tokens", "int", 4096, "--max-num-batched-tokens (the chunk)", minimum=1),
    Param("max_model_len", "int", 16384, "--max-model-len", minimum=1),
    Param("extra_serve_args", "str", "", "appended to vllm serve (shell words)"),
    Param("decode_prompts", "int", 400, "steady traffic: requests", minimum=1),
    Param("decode_concurrency", "int", 32, "steady traffic: concurrent requests", minimum=1),
    Param("decode_input_len", "int", 256, "steady traffic: prompt tokens", minimum=1),
    Param("decode_output_len", "int", 512, "steady traffic: output tokens", minimum=1),
    Param("burst_prompts", "int", 16, "the burst: long prompts sent at once", minimum=0),
    Param("burst_input_len", "int", 8192, "the burst: prompt tokens", minimum=1),
    Param("burst_output_len", "int", 16, "the burst: output tokens", minimum=1),
    Param(
        "warmup_s",
        "int",
        20,
        "seconds of steady traffic before the window opens (past start-up and the first prefills)",
        minimum=0,
    ),
    Param("window_s", "int", 10, "seconds the profiler records", minimum=1),
    Param(
        "burst_at_s",
        "int",
        3,
        "seconds into the window the burst starts (so the window holds decode before and "
        "mixed and prefill iterations after)",
        minimum=0,
    ),
    Param(
        "scopes",
        "bool",
        True,
        "VLLM_CUSTOM_SCOPES_FOR_PROFILING=1: the model runner's scopes mark each iteration's "
        "forward and sampling",
    ),
    Param(
        "with_stack",
        "bool",
        True,
        "the Python tracer (torch_profiler_with_stack): execute_model / sample_tokens / "
        "_dummy_run mark iterations; off, device bursts do",
    ),
    Param(
        "hook_variant",
        "choice",
        "auto",
        "profiler switch: auto (recipe doctor), profiler_config (vllm-ascend>=0.14), env (0.13)",
        choices=("auto", "profiler_config", "env"),
    ),
    READY_TIMEOUT_PARAM,
    PYTHON_PARAM,
    CANN_SET_ENV_PARAM,
)


def cross_check(values: dict[str, Any]) -> None:
    if values["burst_at_s"] >= values["window_s"]:
        raise ParamError(
            f"burst_at_s={values['burst_at_s']} must fall inside the window "
            f"(window_s={values['window_s']})"
        )
    long = values["burst_input_len"] + values["burst_output_len"]
    if long > values["max_model_len"]:
        raise ParamError(f"burst prompts of {long} tokens exceed max_model_len")
    try:
        shlex.split(values["extra_serve_args"])
    except ValueError as exc:
        raise ParamError(f"extra_serve_args: {exc}") from None


def serve_argv(values: dict[str, Any]) -> list[str]:
    """``vllm serve`` argv; the profiler switch is added by serve.sh (it knows the variant)."""
    return [
        "serve", values["model"], "--host", "0.0.0.0", "--port", str(values["port"]),
        "--served-model-name", values["served_model_name"],
        "--tensor-parallel-size", str(values["tensor_parallel_size"]),
        "--max-num-seqs", str(values["max_num_seqs"]),
        "--max-num-batched-tokens", str(values["max_num_batched_tokens"]),
        "--max-model-len", str(values["max_model_len"]), "--trust-remote-code",
        *shlex.split(values["extra_serve_args"]),
    ]  # fmt: skip


def bench_argv(values: dict[str, Any], kind: str) -> list[str]:
    """``vllm bench serve`` of the steady decode traffic or of the prefill burst."""
    prompts, concurrency, input_len, output_len = (
        (values["decode_prompts"], values["decode_concurrency"],
         values["decode_input_len"], values["decode_output_len"])
        if kind == "decode"
        else (values["burst_prompts"], values["burst_prompts"],
              values["burst_input_len"], values["burst_output_len"])
    )  # fmt: skip
    return [
        "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
        "--host", "127.0.0.1", "--port", str(values["port"]),
        "--model", values["served_model_name"], "--tokenizer", values["model"],
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--ignore-eos", "--save-result",
        "--result-filename", f"bench_{kind}.json",
    ]  # fmt: skip


def environment(values: dict[str, Any]) -> dict[str, str]:
    env = {"ASCEND_RT_VISIBLE_DEVICES": values["devices"], "TASK_QUEUE_ENABLE": "1"}
    if values["scopes"]:
        env["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"
    return env


_ENV_HEAD = (
    "# Environment of serving-window (rendered; sourced by run.sh and serve.sh).\n"
    + SOURCE_CANN
    + "@@ENV@@\n"
)


def build(values: dict[str, Any]) -> dict[str, RenderedFile]:
    profiler = {
        "profiler": "torch",
        "torch_profiler_dir": "@@DIR@@",
        "torch_profiler_with_stack": values["with_stack"],
    }
    config = json.dumps(profiler, separators=(",", ":")).replace(
        '"@@DIR@@"', '"\'"$PROFILE_DIR"\'"'
    )
    serve = sh_command(['"$VLLM"', *serve_argv(values)], raw=[0])
    serve_sh = bash_script(
        "# vllm serve with its profiler on; run.sh opens and closes the window.\n"
        "#   PROFILE_DIR=DIR TA_PROFILER_SWITCH=profiler_config|env ./serve.sh",
        SOURCE_ENV_SH + ': "${PROFILE_DIR:?set PROFILE_DIR}"\n'
        'if [[ "${TA_PROFILER_SWITCH:-profiler_config}" == env ]]; then\n'
        '  export VLLM_TORCH_PROFILER_DIR="$PROFILE_DIR"\n'
        f"  export VLLM_TORCH_PROFILER_WITH_STACK={int(values['with_stack'])}\n"
        "  PROFILER_ARGS=()\n"
        "else\n"
        f"  PROFILER_ARGS=(--profiler-config '{config}')\n"
        "fi\n"
        f'exec {serve} \\\n  "${{PROFILER_ARGS[@]}}"',
    )
    benches = {
        kind: bash_script(
            f"# vllm bench serve: the {'steady decode traffic' if kind == 'decode' else 'prefill burst'}"
            f"; saves RESULT_DIR/bench_{kind}.json.",
            f'RESULT_DIR="${{1:?usage: bench_{kind}.sh RESULT_DIR}}"\nVLLM="${{VLLM:-vllm}}"\n'
            "exec "
            + sh_command(
                ['"$VLLM"', *bench_argv(values, kind), "--result-dir", '"$RESULT_DIR"'],
                raw=[0, len(bench_argv(values, kind)) + 2],
            ),
        )
        for kind in ("decode", "burst")
    }
    run_sh = fill(
        template_text(NAME, "run.sh.tmpl"),
        {
            "PYTHON": values["python"],
            "PORT": str(values["port"]),
            "READY_TIMEOUT_S": str(values["ready_timeout_s"]),
            "HOOK_VARIANT": shlex.quote(values["hook_variant"]),
            "WARMUP_S": str(values["warmup_s"]),
            "WINDOW_S": str(values["window_s"]),
            "BURST_AT_S": str(values["burst_at_s"]),
            "BURST": "1" if values["burst_prompts"] else "0",
        },
    )
    env_sh = fill(
        _ENV_HEAD,
        {"CANN_SET_ENV": shlex.quote(values["cann_set_env"]), "ENV": sh_env(environment(values))},
    )
    return {
        "run.sh": RenderedFile(run_sh, executable=True),
        "env.sh": RenderedFile(env_sh),
        "serve.sh": RenderedFile(serve_sh, executable=True),
        "bench_decode.sh": RenderedFile(benches["decode"], executable=True),
        "bench_burst.sh": RenderedFile(benches["burst"], executable=True),
    }


RECIPE = Recipe(
    name=NAME,
    summary="vllm serve under steady decode traffic; profile a short window with a prefill burst inside",
    reproduces=(
        "Not a bug report: a serving profile as the field takes one, from a running server "
        "through /start_profile and /stop_profile, with the evidence of engine iterations and "
        "their phases turned on (the model runner's scopes, the Python tracer), so that "
        "`traceanalyzer run` gives every figure per phase: prefill time per 1k tokens, decode "
        "iteration time, graph replay vs eager, host-bound decode, dummy and idle shares."
    ),
    expect=(
        "profiling_data/bench_decode.json and bench_burst.json (TTFT/TPOT percentiles), one "
        "*_ascend_pt per worker rank holding the window, and analysis/ with the overview's "
        "'by phase' table: decode iterations before the burst, prefill and mixed ones after."
    ),
    params=PARAMS,
    variants=VARIANTS,
    vllm_seams=VLLM_SEAMS,
    supported=SUPPORTED,
    build=build,
    cross_check=cross_check,
    evidence=(SCOPES_EVIDENCE,),
)
