"""What marks an engine iteration and its phase in a torch_npu export, as parameters.

Every name pattern the step and phase derivation looks for is here, with its default and what
it means, overridable per run like a rule's (``--set steps.NAME=VALUE``, or ``[steps]`` in
``traceanalyzer.toml``), so a user can teach the product a new kernel or function name without
a release. Where each default comes from: ``docs/serving.md`` (and the vllm-ascend and vLLM
sources it cites).
"""

from __future__ import annotations

from traceanalyzer.engine.params import Param
from traceanalyzer.vocabulary import CAPTURE_BEGIN_API, CAPTURE_END_API, GRAPH_REPLAY_APIS

# The parameter namespace of the derivation (`--set steps.idle_gap_ms=2`).
NAMESPACE = "steps"

STEP_PARAMS: dict[str, Param] = {
    # ---- step windows, most reliable first ---------------------------------------------------
    "step_pattern": Param(
        r"^ProfilerStep#(\d+)$",
        "Regex on host span names that mark steps (a profiler schedule, msMonitor); group 1, "
        "when present, is the step number.",
    ),
    "annotation_pattern": Param(
        r"^execute_(?:\d+_)?context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$",
        "Regex on host spans: upstream vLLM's step annotation (PR #31193); groups: context "
        "requests, context tokens, generation requests, generation tokens.",
    ),
    "detailed_annotation_pattern": Param(
        r"^execute_(?:\d+_)?context_(\d+)\([^)]*\)_generation_(\d+)\([^)]*\)$",
        "Regex on host spans: the detailed form of the annotation (PR #37524); groups: context "
        "and generation requests (token counts are not in it).",
    ),
    "legacy_annotation_pattern": Param(
        r"^execute_new_(\d+)_cached_(\d+)$",
        "Regex on host spans: vLLM's older step annotation (PR #22496); groups: new and cached "
        "requests.",
    ),
    "scope_begin": Param(
        ("prepare input", "gpu_model_runner: preprocess"),
        "Model-runner scopes that open an iteration (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1).",
    ),
    "scope_forward": Param(
        ("forward", "gpu_model_runner: forward"), "Model-runner scopes of the forward."
    ),
    "scope_sample": Param(
        ("sample_token", "async_state_update", "gpu_model_runner: sample"),
        "Model-runner scopes of sampling: they end the iteration they follow.",
    ),
    "scope_draft": Param(
        ("draft_token", "gpu_model_runner: draft"),
        "Model-runner scopes of a speculative drafter's forward.",
    ),
    "execute_function": Param(
        r"\.py\(\d+\): execute_model$",
        "Regex on python_function names: the worker's and model runner's execute_model (the "
        "outermost one per thread opens an iteration).",
    ),
    "sample_function": Param(
        r"\.py\(\d+\): sample_tokens$",
        "Regex on python_function names: sampling, called after execute_model; it ends the "
        "iteration.",
    ),
    "dummy_function": Param(
        r"\.py\(\d+\): (?:_dummy_run|execute_dummy_batch)$",
        "Regex on python_function names: a data-parallel dummy batch (an engine with no work "
        "of its own while its peers run; it does not sample).",
    ),
    "draft_function": Param(
        r"\.py\(\d+\): (?:_propose|propose|propose_draft_token_ids)$",
        "Regex on python_function names: a speculative drafter's proposal.",
    ),
    "no_forward_function": Param(
        r"kv_connector_no_forward",
        "Regex on host span names: an execute_model that runs no forward because its requests "
        "wait for their KV cache (a KV connector is in use).",
    ),
    "warmup_function": Param(
        r"\.py\(\d+\): (?:capture_model|profile_run|_capture_model|compile_or_warm_up_model|"
        r"_warmup\w*|warming_up_model)$",
        "Regex on python_function names: engine start-up (graph capture, the memory profile "
        "run, warm-up).",
    ),
    "warmup_steps": Param(
        1, "ProfilerStep windows numbered up to this are warm-up (ProfilerStep#1 ...)."
    ),
    "capture_begin": Param(
        CAPTURE_BEGIN_API, "Regex on the CANN api_name that opens a graph capture (warm-up)."
    ),
    "capture_end": Param(
        CAPTURE_END_API, "Regex on the CANN api_name that closes a graph capture."
    ),
    "idle_gap_ms": Param(
        1.0,
        "A gap between two iterations at least this long is an `idle` step of its own (the "
        "scheduler had nothing to run), not time of either iteration (ms).",
    ),
    "cluster_gap_ms": Param(
        0.25,
        "Without host markers, device work splits into iterations at gaps of at least this "
        "long, or 5 times the median gap between kernels if that is longer (ms).",
    ),
    # ---- phases ----------------------------------------------------------------------------
    "attention_types": Param(
        (
            "FusedInferAttentionScore",
            "FusedInferAttentionScoreV2",
            "IncreFlashAttention",
            "SparseFlashAttention",
        ),
        "kernel_details `Type` of the attention kernels whose input shapes tell the phase "
        "(the query's first dim is T; the block table, the first two-dim INT32 input, or "
        "actual_seq_lengths, the first one-dim INT64 input, gives the requests B).",
    ),
    "decode_kernels": Param(
        r"PagedAttention|MlaProlog",
        "Regex on kernel names that run in decode (vllm-ascend v0.11 ATB paged attention; "
        "MLA decode); a splitfuse kernel, which matches too, makes the step mixed.",
    ),
    "prefill_kernels": Param(
        r"UnpadFlashAttention|RINGMLAPrefill|RingMLA|FlashAttentionScore",
        "Regex on kernel names that run only in prefill (v0.11 ATB flash attention; MLA ring "
        "prefill; npu_fusion_attention).",
    ),
    "mixed_kernels": Param(
        r"[Ss]plit[Ff]use",
        "Regex on kernel names of chunked prefill with decodes in one batch (paged attention "
        "splitfuse).",
    ),
    "sampler_kernels": Param(
        r"ArgMax|(?:^|_|aclnn)TopK|ApplyTopKTopP|Sort|Multinomial|Exponential|RejectionSampl"
        r"|Sampl|(?i:rejection_\w*sample)",
        "Regex on kernel names of sampling (vllm-ascend's sampler: ArgMaxV2, npu_top_k_top_p, "
        "the exponential draw; MoE routing's MoeGatingTopK is no sampler): a decode-like step "
        "without any, among steps that have them, is a dummy batch (it does not sample); the "
        "attention after the first is a drafter's.",
    ),
    "verify_kernels": Param(
        r"(?i)rejection_\w*sample|RejectionSampl",
        "Regex on kernel names of the rejection sampler, which verifies draft tokens (vllm-ascend "
        "runs it instead of the plain sampler whenever the batch holds drafts: "
        "AscendRejectionSampler, its Triton kernels rejection_*sample*).",
    ),
    "token_kernels": Param(
        (
            "MatMulV2",
            "MatMulV3",
            "MatMul",
            "QuantBatchMatmulV3",
            "QuantBatchMatmulV4",
            "WeightQuantBatchMatmulV2",
            "RmsNorm",
            "AddRmsNorm",
            "AddRmsNormBias",
            "FusedInferAttentionScore",
            "SparseFlashAttention",
        ),
        "kernel_details `Type` of the kernels whose first input's first dim is the batch's "
        "token count (the hidden states, `T,H`; the attention query): in a graph replay, the "
        "capture size the graph ran at (graph_size).",
    ),
    "batch_kernels": Param(
        r"ArgMax",
        "Regex on kernel names whose first input's first dim is the batch's real requests: the "
        "sampler's argmax over the `B,V` logits, which runs outside the graph on the real "
        "batch (model_runner_v1.py: logits of hidden_states[logits_indices]; the sampler "
        "slices logits[:num_reqs]).",
    ),
    "replay_apis": Param(
        GRAPH_REPLAY_APIS, "Host calls that replay a captured graph (aclgraph / NPUGraph)."
    ),
}
