"""Recipe ``mooncake-store-transfer`` (the Mooncake KV-pool TTFT report): the TTFT regression."""

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
    offline_analysis,
    options_argv,
    sh_command,
    sh_env,
    shipped,
    template_text,
)
from traceanalyzer.recipes.params import (
    ANALYSE_PARAM,
    CANN_SET_ENV_PARAM,
    PYTHON_PARAM,
    READY_TIMEOUT_PARAM,
    Param,
    ParamError,
    parse_host_port,
    parse_size_gb,
)
from traceanalyzer.recipes.seams import SCOPES_EVIDENCE, HookVariant, Seam

NAME = "mooncake-store-transfer"
ARMS = ("baseline", "sync")
SPAN_NAME = "batch_get_into_multi_buffers"
MODULE_KV_TRANSFER = (
    "vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.backend.mooncake_backend"
)
MODULE_KVPOOL = "vllm_ascend.distributed.kvpool.backend.mooncake_backend"

VARIANTS = (
    HookVariant(
        name="kv_transfer",
        summary=f"wrap {MODULE_KV_TRANSFER}.MooncakeBackend.get",
        min_version="0.18.0",
        max_version=None,
        seams=(
            Seam(
                MODULE_KV_TRANSFER,
                "MooncakeBackend.get",
                uses=SPAN_NAME,
                why="the wrapped transfer",
            ),
            Seam(
                "vllm_ascend.distributed.kv_transfer",
                literal="AscendStoreConnector",
                why="--kv-transfer-config connector name",
            ),
        ),
        tested_versions=("0.18.0", "0.23.0"),
    ),
    HookVariant(
        name="kvpool",
        summary=f"wrap {MODULE_KVPOOL}.MooncakeBackend.get",
        min_version="0.13.0",
        max_version="0.18.0",
        seams=(
            Seam(MODULE_KVPOOL, "MooncakeBackend.get", uses=SPAN_NAME, why="the wrapped transfer"),
            Seam(
                "vllm_ascend.distributed",
                literal="AscendStoreConnector",
                why="--kv-transfer-config connector name",
            ),
        ),
        tested_versions=("0.13.0",),
    ),
)

VLLM_SEAMS = (
    Seam(
        "vllm.plugins",
        "load_general_plugins",
        literal="vllm.general_plugins",
        why="loads ta_store_hooks in every process",
    ),
    Seam(
        "vllm.benchmarks.datasets|vllm.benchmarks.datasets.datasets",
        literal="--prefix-repetition-prefix-len",
        why="bench dataset prefix_repetition",
    ),
    Seam("vllm.benchmarks.serve", literal="--result-filename", why="bench result JSON"),
    Seam(
        "vllm.config.kv_transfer",
        "KVTransferConfig.kv_connector_extra_config",
        why="--kv-transfer-config",
    ),
    Seam("vllm.distributed.parallel_state", "get_world_group", why="rank in the trace dir name"),
    Seam("vllm.distributed.parallel_state", "get_dp_group", why="dp rank in the trace dir name"),
)

SUPPORTED = {"0.13.0": "kvpool", "0.18.0": "kv_transfer", "0.23.0": "kv_transfer"}


PARAMS = (
    Param(
        "model",
        "str",
        "Qwen/Qwen3-30B-A3B",
        "model path or HF id (the report: Qwen3-235B-A22B-W8A8 with quantization=ascend)",
    ),
    Param("served_model_name", "str", "qwen3", "--served-model-name (bench --model)"),
    Param("quantization", "str", "", "--quantization (e.g. ascend); empty: omit"),
    Param("port", "int", 8000, "API server port", minimum=1),
    Param("devices", "str", "0,1,2,3,4,5,6,7", "ASCEND_RT_VISIBLE_DEVICES"),
    Param("tensor_parallel_size", "int", 8, "--tensor-parallel-size", minimum=1),
    Param(
        "data_parallel_size",
        "int",
        1,
        "--data-parallel-size (the report: 2, over two nodes)",
        minimum=1,
    ),
    Param(
        "data_parallel_size_local",
        "int",
        0,
        "--data-parallel-size-local; 0: same as data_parallel_size (one node)",
        minimum=0,
    ),
    Param(
        "data_parallel_address",
        "str",
        "",
        "--data-parallel-address; empty: this host's first IP ($LOCAL_IP)",
    ),
    Param("data_parallel_rpc_port", "int", 13389, "--data-parallel-rpc-port", minimum=1),
    Param("api_server_count", "int", 0, "--api-server-count; 0: vLLM's default", minimum=0),
    Param("enable_expert_parallel", "bool", True, "--enable-expert-parallel"),
    Param("max_num_seqs", "int", 16, "--max-num-seqs", minimum=1),
    Param("max_model_len", "int", 40960, "--max-model-len", minimum=1),
    Param("max_num_batched_tokens", "int", 4096, "--max-num-batched-tokens", minimum=1),
    Param("gpu_memory_utilization", "str", "0.9", "--gpu-memory-utilization"),
    Param("async_scheduling", "bool", True, "--async-scheduling"),
    Param("seed", "int", 1024, "--seed"),
    Param("extra_serve_args", "str", "", "appended to vllm serve (shell words)"),
    Param("nic_name", "str", "", "if set: GLOO/TP/HCCL_SOCKET_IFNAME and HCCL_IF_IP=$LOCAL_IP"),
    Param(
        "kv_connector",
        "choice",
        "AscendStoreConnector",
        "kv connector (MooncakeConnectorStoreV1 is the legacy alias)",
        choices=("AscendStoreConnector", "MooncakeConnectorStoreV1"),
    ),
    Param(
        "lookup_rpc_port",
        "str",
        "0",
        "kv_connector_extra_config.lookup_rpc_port; unique per instance on a host",
    ),
    Param(
        "load_async",
        "bool",
        False,
        "kv_connector_extra_config.load_async (transfer on a receive thread)",
    ),
    Param(
        "master_server_address",
        "host_port",
        "127.0.0.1:50088",
        "mooncake.json master_server_address (host:port of mooncake_master)",
    ),
    Param("metadata_server", "str", "P2PHANDSHAKE", "mooncake.json metadata_server"),
    Param("global_segment_size", "size_gb", "10 GB", "mooncake.json global_segment_size, whole GB"),
    Param(
        "local_hostname",
        "str",
        "",
        "mooncake.json local_hostname (ignored by vllm-ascend >= 0.18; kept for older consumers)",
    ),
    Param("device_name", "str", "", "mooncake.json device_name"),
    Param(
        "start_master",
        "bool",
        True,
        "run.sh starts `mooncake_master --port <port>` (master must be on this host)",
    ),
    Param(
        "master_args",
        "str",
        "--eviction_high_watermark_ratio 0.95 --eviction_ratio 0.05",
        "extra mooncake_master args",
    ),
    Param("num_prompts", "int", 50, "bench --num-prompts", minimum=1),
    Param("max_concurrency", "int", 16, "bench --max-concurrency", minimum=1),
    Param("request_rate", "str", "inf", "bench --request-rate"),
    Param("prefix_len", "int", 22610, "bench --prefix-repetition-prefix-len", minimum=1),
    Param("suffix_len", "int", 10158, "bench --prefix-repetition-suffix-len", minimum=0),
    Param("num_prefixes", "int", 8, "bench --prefix-repetition-num-prefixes", minimum=1),
    Param("output_len", "int", 1, "bench --prefix-repetition-output-len", minimum=1),
    Param(
        "percentile_metrics",
        "str_list",
        ["ttft", "tpot", "itl", "e2el"],
        "bench --percentile-metrics",
        choices=("ttft", "tpot", "itl", "e2el"),
    ),
    Param(
        "metric_percentiles",
        "int_list",
        [25, 50, 75, 99],
        "bench --metric-percentiles",
        minimum=1,
        sorted_unique=True,
    ),
    Param(
        "profile_calls",
        "int",
        1,
        "K: profile transfers S+1..S+K of every worker, one *_ascend_pt each",
        minimum=0,
    ),
    Param(
        "skip_calls",
        "int",
        0,
        "S: transfers to let pass before profiling (e.g. to skip a cold first hit)",
        minimum=0,
    ),
    Param(
        "profiler_level",
        "choice",
        "Level1",
        "torch_npu profiler level of the transfer windows",
        choices=("Level0", "Level1", "Level2"),
    ),
    ANALYSE_PARAM,
    Param(
        "arms",
        "str_list",
        list(ARMS),
        "arms run by run.sh: baseline and/or sync (torch.npu.synchronize() before every transfer)",
        choices=ARMS,
    ),
    Param(
        "hook_variant",
        "choice",
        "auto",
        "backend module to wrap: auto, kv_transfer (vllm-ascend>=0.18), kvpool (0.13)",
        choices=("auto", "kv_transfer", "kvpool"),
    ),
    READY_TIMEOUT_PARAM,
    PYTHON_PARAM,
    CANN_SET_ENV_PARAM,
)


def cross_check(values: dict[str, Any]) -> None:
    dp = values["data_parallel_size"]
    dpl = values["data_parallel_size_local"] or dp
    if dpl > dp:
        raise ParamError(f"data_parallel_size_local={dpl} exceeds data_parallel_size={dp}")
    if dpl < dp and not values["data_parallel_address"]:
        raise ParamError(
            "multi-node data parallel (data_parallel_size_local < data_parallel_size) needs data_parallel_address"
        )
    if dpl < dp:
        host, _ = parse_host_port(values["master_server_address"])
        if host in ("127.0.0.1", "localhost", "::1"):
            raise ParamError(
                "multi-node data parallel needs a master_server_address reachable from every node, "
                f"not {values['master_server_address']}"
            )
    if not values["lookup_rpc_port"].isdigit():
        raise ParamError(
            f"lookup_rpc_port must be a port number as a string, got {values['lookup_rpc_port']!r}"
        )
    if len(set(values["arms"])) != len(values["arms"]) or not values["arms"]:
        raise ParamError(f"arms must list baseline and/or sync once each, got {values['arms']}")
    try:
        shlex.split(values["extra_serve_args"])
        shlex.split(values["master_args"])
    except ValueError as exc:
        raise ParamError(f"extra_serve_args/master_args: {exc}") from None


def kv_transfer_config(values: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {"lookup_rpc_port": values["lookup_rpc_port"], "backend": "mooncake"}
    if values["load_async"]:
        extra["load_async"] = True
    return {
        "kv_connector": values["kv_connector"],
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def mooncake_json(values: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    if values["local_hostname"]:
        cfg["local_hostname"] = values["local_hostname"]
    cfg.update(
        metadata_server=values["metadata_server"],
        protocol="ascend",
        device_name=values["device_name"],
        master_server_address=values["master_server_address"],
        global_segment_size=f"{parse_size_gb(values['global_segment_size'])} GB",
    )
    return cfg


def serve_argv(values: dict[str, Any], secondary: bool = False) -> tuple[list[str], set[int]]:
    """``vllm serve`` argv; the indices in the returned set are shell expressions (unquoted)."""
    argv = ['"$VLLM"', "serve", values["model"]]
    raw = {0}
    dp = values["data_parallel_size"]
    dpl = values["data_parallel_size_local"] or dp
    if not secondary:
        argv += ["--host", "0.0.0.0", "--port", str(values["port"])]
    if dp > 1:
        argv += ["--data-parallel-size", str(dp)]
        if secondary:
            argv += ["--headless", "--data-parallel-start-rank", '"$START_RANK"']
            raw.add(len(argv) - 1)
        elif values["api_server_count"]:
            argv += ["--api-server-count", str(values["api_server_count"])]
        argv += ["--data-parallel-size-local", str(dpl), "--data-parallel-address"]
        if values["data_parallel_address"]:
            argv.append(values["data_parallel_address"])
        else:
            argv.append('"$LOCAL_IP"')
            raw.add(len(argv) - 1)
        argv += ["--data-parallel-rpc-port", str(values["data_parallel_rpc_port"])]
    argv += ["--seed", str(values["seed"]), "--served-model-name", values["served_model_name"]]
    if values["quantization"]:
        argv += ["--quantization", values["quantization"]]
    argv += ["--tensor-parallel-size", str(values["tensor_parallel_size"])]
    if values["enable_expert_parallel"]:
        argv.append("--enable-expert-parallel")
    argv += options_argv(
        {
            "--max-num-seqs": str(values["max_num_seqs"]),
            "--max-model-len": str(values["max_model_len"]),
            "--max-num-batched-tokens": str(values["max_num_batched_tokens"]),
            "--trust-remote-code": None,
        }
    )
    if values["async_scheduling"]:
        argv.append("--async-scheduling")
    argv += ["--gpu-memory-utilization", values["gpu_memory_utilization"]]
    argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(values), separators=(",", ":"))]
    argv += shlex.split(values["extra_serve_args"])
    return argv, raw


def bench_argv(values: dict[str, Any]) -> tuple[list[str], set[int]]:
    options = {
        "--backend": "openai-chat",
        "--endpoint": "/v1/chat/completions",
        "--host": "127.0.0.1",
        "--port": str(values["port"]),
        "--model": values["served_model_name"],
        "--tokenizer": values["model"],
        "--dataset-name": "prefix_repetition",
        "--prefix-repetition-prefix-len": str(values["prefix_len"]),
        "--prefix-repetition-suffix-len": str(values["suffix_len"]),
        "--prefix-repetition-num-prefixes": str(values["num_prefixes"]),
        "--prefix-repetition-output-len": str(values["output_len"]),
        "--num-prompts": str(values["num_prompts"]),
        "--max-concurrency": str(values["max_concurrency"]),
        "--request-rate": values["request_rate"],
        "--ignore-eos": None,
        "--percentile-metrics": ",".join(values["percentile_metrics"]),
        "--metric-percentiles": ",".join(str(p) for p in values["metric_percentiles"]),
        "--save-result": None,
        "--result-dir": '"$RESULT_DIR"',
        "--result-filename": "bench.json",
    }
    argv = ['"$VLLM"', "bench", "serve", *options_argv(options)]
    return argv, {0, len(argv) - 3}


def environment(values: dict[str, Any]) -> dict[str, str]:
    """The Mooncake KV-pool TTFT report's exports (MOONCAKE_CONFIG_PATH, LD_LIBRARY_PATH and NIC vars are added by env.sh)."""
    return {
        "OMP_PROC_BIND": "false",
        "OMP_NUM_THREADS": "1",
        "HCCL_BUFFSIZE": "1024",
        "TASK_QUEUE_ENABLE": "1",
        "ASCEND_RT_VISIBLE_DEVICES": values["devices"],
        "PYTHONHASHSEED": "0",
        "ACL_OP_INIT_MODE": "1",
        "VLLM_ENGINE_READY_TIMEOUT_S": "1800",
        "HCCL_RDMA_TIMEOUT": "17",
        "ASCEND_CONNECT_TIMEOUT": "10000",
        "ASCEND_TRANSFER_TIMEOUT": "10000",
        "ASCEND_BUFFER_POOL": "4:8",
        # iteration evidence in the profiled windows (docs/serving.md)
        "VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1",
    }


_ENV_HEAD = (
    """\
# Environment of mooncake-store-transfer (rendered; sourced by run.sh and serve_secondary.sh).
# Never sets VLLM_PLUGINS: it filters all plugins, vllm-ascend's included.
_TA_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"""
    + SOURCE_CANN
    + """\
LOCAL_IP="${LOCAL_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
export LOCAL_IP
@@NIC@@
@@ENV@@
export LD_LIBRARY_PATH="/usr/local/Ascend/ascend-toolkit/latest/python/site-packages${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MOONCAKE_CONFIG_PATH="$_TA_HERE/mooncake.json"
"""
)


def build(values: dict[str, Any]) -> dict[str, RenderedFile]:
    nic = values["nic_name"]
    nic_lines = (
        "\n".join(
            f"export {k}={shlex.quote(nic)}"
            for k in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")
        )
        + '\nexport HCCL_IF_IP="$LOCAL_IP"'
        if nic
        else "# nic_name not set: GLOO/TP/HCCL_SOCKET_IFNAME and HCCL_IF_IP left as they are"
    )
    env_sh = fill(
        _ENV_HEAD,
        {
            "CANN_SET_ENV": shlex.quote(values["cann_set_env"]),
            "NIC": nic_lines,
            "ENV": sh_env(environment(values)),
        },
    )
    serve, serve_raw = serve_argv(values)
    serve_sh = bash_script(
        "# vllm serve with AscendStoreConnector (backend mooncake); run.sh starts it once per arm.",
        SOURCE_ENV_SH + "exec " + sh_command(serve, raw=sorted(serve_raw)) + ' "$@"',
    )
    bench, bench_raw = bench_argv(values)
    bench_sh = bash_script(
        "# vllm bench serve, prefix_repetition dataset; saves RESULT_DIR/bench.json.",
        'RESULT_DIR="${1:?usage: bench.sh RESULT_DIR}"\nVLLM="${VLLM:-vllm}"\n'
        "exec " + sh_command(bench, raw=sorted(bench_raw)),
    )
    if values["start_master"]:
        _, master_port = parse_host_port(values["master_server_address"])
        master_cmd = [
            "mooncake_master",
            "--port",
            str(master_port),
            *shlex.split(values["master_args"]),
        ]
        start_master = (
            f'{sh_command(master_cmd)} > "$PROFILING_DIR/mooncake_master.log" 2>&1 &\n'
            "MASTER_PID=$!\nsleep 3"
        )
        stop_master = 'kill -TERM "$MASTER_PID" 2>/dev/null || true\nMASTER_PID=""'
    else:
        start_master = f"# start_master=false: mooncake_master must already run at {values['master_server_address']}"
        stop_master = ""
    run_sh = fill(
        template_text(NAME, "run.sh.tmpl"),
        {
            "PYTHON": values["python"],
            "PORT": str(values["port"]),
            "READY_TIMEOUT_S": str(values["ready_timeout_s"]),
            "ARMS": " ".join(values["arms"]),
            "HOOK_VARIANT": shlex.quote(values["hook_variant"]),
            "PROFILE_CALLS": str(values["profile_calls"]),
            "SKIP_CALLS": str(values["skip_calls"]),
            "PROFILER_LEVEL": values["profiler_level"],
            "ANALYSE_INLINE": "1" if values["analyse"] == "inline" else "0",
            "START_MASTER": start_master,
            "STOP_MASTER": stop_master,
            "ANALYSE": offline_analysis(values),
        },
    )
    files = {
        "run.sh": RenderedFile(run_sh, executable=True),
        "env.sh": RenderedFile(env_sh),
        "serve.sh": RenderedFile(serve_sh, executable=True),
        "bench.sh": RenderedFile(bench_sh, executable=True),
        "mooncake.json": RenderedFile(json.dumps(mooncake_json(values), indent=2) + "\n"),
        **shipped(
            NAME, "ta_store_hooks/pyproject.toml", "ta_store_hooks/ta_store_hooks/__init__.py"
        ),
        **shipped("common", "analyse_profiles.py"),
    }
    dp = values["data_parallel_size"]
    if (values["data_parallel_size_local"] or dp) < dp:
        secondary, sec_raw = serve_argv(values, secondary=True)
        files["serve_secondary.sh"] = RenderedFile(
            bash_script(
                "# Run on every other node, once per arm, while run.sh waits for /health:\n"
                "#   ./serve_secondary.sh START_RANK ARM     (ARM: baseline | sync)",
                'START_RANK="${1:?usage: serve_secondary.sh START_RANK ARM}"\nARM="${2:-baseline}"\n'
                + SOURCE_ENV_SH
                + 'export TA_STORE_SYNC_BEFORE_TRANSFER="$([[ $ARM == sync ]] && echo 1 || echo 0)"\n'
                f"export TA_STORE_PROFILE_CALLS={values['profile_calls']} TA_STORE_PROFILE_SKIP={values['skip_calls']}\n"
                f"export TA_STORE_PROFILER_LEVEL={values['profiler_level']} "
                f"TA_STORE_ANALYSE={'1' if values['analyse'] == 'inline' else '0'}\n"
                'export TA_STORE_PROFILE_DIR="$_TA_HERE/profiling_data/$ARM"\n'
                '"${PYTHON:-python3}" -m pip install --quiet --no-deps --no-build-isolation -e "$_TA_HERE/ta_store_hooks"\n'
                'mkdir -p "$TA_STORE_PROFILE_DIR"\n'
                "exec " + sh_command(secondary, raw=sorted(sec_raw)),
            ),
            executable=True,
        )
    return files


RECIPE = Recipe(
    name=NAME,
    summary="vllm serve + Mooncake KV pool, bench prefix_repetition, profile the first K store transfers; baseline vs sync",
    reproduces=(
        "The Mooncake KV-pool TTFT report: vllm-ascend 0.18 with AscendStoreConnector (backend mooncake) has a "
        "much worse TTFT than without the pool (38.5 s -> 60.9 s); on a pool hit one "
        "batch_get_into_multi_buffers takes seconds. Profiling the transfer shows other streams "
        "of the framework in long NOTIFY_WAIT / EVENT_WAIT_SQE waits; a torch.npu.synchronize() "
        "before the transfer (outside the profiler window) makes it fast."
    ),
    expect=(
        "profiling_data/<arm>/bench.json (TTFT/TPOT/ITL/E2EL percentiles) and one *_ascend_pt per "
        "worker rank per profiled transfer, whose window is tagged traceanalyzer.window="
        "store_transfer and holds a batch_get_into_multi_buffers span. In the baseline arm the "
        "span lasts long and other streams show NOTIFY_WAIT / EVENT_WAIT_SQE; in the sync arm "
        "the span is short and TTFT drops."
    ),
    params=PARAMS,
    variants=VARIANTS,
    vllm_seams=VLLM_SEAMS,
    supported=SUPPORTED,
    build=build,
    cross_check=cross_check,
    evidence=(SCOPES_EVIDENCE,),
)
