"""``serving``: a vLLM / vllm-ascend server profiled under traffic: engine iterations of every phase.

Each iteration is what vllm-ascend's worker runs for one scheduler step (``serving_profiles.md``):

- host: the worker's and model runner's ``execute_model`` (Python tracer events, as a default
  vllm-ascend profile has them), the model runner's scopes (``prepare input``, ``forward``,
  ``post process``; ``sample_token``, ``draft_token``) when ``markers`` asks for them, upstream
  vLLM's step annotation (``execute_context_N(T)_generation_M(G)``, or the older
  ``execute_new_N_cached_M``), or msMonitor's ``ProfilerStep#N`` (from one ``execute_model`` to
  the next); then ``sample_tokens``, whose token fetch waits for the device;
- device: per layer the matmuls, padded to the graph size, and the attention: v0.13+
  ``FusedInferAttentionScore`` whose input shapes carry the batch (query ``T,N,D``; the KV cache
  view and the block table ``B,blocks`` INT32, or the current key for a prefill without cache),
  or v0.11's ATB kernels (``PagedAttentionMaskNdKernel`` for decode, ``UnpadFlashAttention`` for
  prefill); decode batches replay a FULL graph (one ``aclmdlRIExecuteAsync``, kernels with a
  model id, shapes of the capture size) in ``full_and_piecewise`` mode, mixed and prefill batches
  run piecewise (graph pieces with the attention eager between them) up to the largest capture
  size and eagerly beyond it;
- a data-parallel rank without requests (``dummy_ranks``) runs ``_dummy_run`` batches padded
  to its peers' size and never samples; ``spec_tokens`` k makes decode steps verify 1+k tokens
  per request after a drafter forward (``_propose`` in ``sample_tokens``); ``idle_every`` leaves
  the scheduler idle between iterations; ``warmup`` captures graphs at the start (the engine's
  ``capture_model``, largest size first: per size an eager warm-up forward, then the capture,
  whose launches are recorded on the host with their Python call sites and run nothing;
  ``capture_drift`` names a size whose capture launches one kernel its replays do not run).

:func:`plan` is the truth the generator follows; tests compare the derived phases with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import cycle, islice

from traceanalyzer.synth import conformance, ops
from traceanalyzer.synth.ops import MS, US, KernelSpec
from traceanalyzer.synth.scenarios import causes
from traceanalyzer.synth.scenarios.timeline import Timeline

KNOBS = {
    "iterations": 24,
    "layers": 2,
    "prefill_every": 4,
    "chunk": 2048,
    "prompts": 1,
    "batch": 16,
    "chunked": True,
    "spec_tokens": 0,
    "dummy_ranks": "",
    "dummy_every": 0,
    "graph": "full_and_piecewise",
    "style": "v0.13",
    "heads": "mha",
    "prefix_hit": False,
    "markers": "python",
    "shapes": True,
    "idle_every": 0,
    "idle_ms": 5.0,
    "warmup": 0,
    "capture_sizes": "1,2,4,8,16,32,64,128,256,512",
    "padding": True,
    "batches": "",
    "slow_layer": -1,
    "slow_layer_factor": 2.0,
    "capture_drift": 0,
}
HELP = (
    "a vLLM server under traffic: prefill, decode, mixed (chunked prefill), speculative, dummy "
    "and idle iterations (knobs: iterations, layers, prefill_every, chunk, prompts, batch, "
    "chunked, spec_tokens, dummy_ranks, dummy_every, graph=full_and_piecewise|piecewise|eager, "
    "style=v0.13|v0.11|mla|sfa, heads=mha|gqa|mqa, prefix_hit: prefills read a cached prefix, "
    "markers=python,scopes,annotation,legacy,profiler_step,none, shapes, idle_every, idle_ms, "
    "warmup: graph captures at the start, one size each (largest first), capture_drift: a size "
    "whose capture launches one kernel more than its replays, capture_sizes: the graph sizes "
    "captured, padding: a batch pads to the next size "
    "(off: one between sizes runs eager), batches: decode batch sizes to cycle through, "
    "slow_layer and slow_layer_factor: one decoder layer's kernels slower)"
)
GRAPHS = ("full_and_piecewise", "piecewise", "eager")
STYLES = tuple(conformance.STYLE_CASES)
MARKERS = ("python", "scopes", "annotation", "legacy", "profiler_step", "none")
HEAD_DIM, BLOCKS, BLOCK_SIZE, MAX_BLOCKS = 128, 1024, 128, 256
RUNNER = "vllm_ascend/worker/model_runner_v1.py"
WORKER = "vllm_ascend/worker/worker.py"


@dataclass(frozen=True)
class Iteration:
    """One scheduler step as the generator runs it: what it serves, its tokens and requests."""

    phase: str  # prefill | decode | mixed | spec_decode | dummy | warmup | idle
    tokens: int = 0  # new tokens in the batch (the attention query's T)
    requests: int = 0  # requests in the batch (the block table's B)
    no_cache: bool = False  # a prefill of new prompts only: the key is the current K


def numbers(text: object) -> list[int]:
    """A knob's comma-separated numbers (``"0, 3"``), in order."""
    return [int(x) for x in str(text).replace(" ", "").split(",") if x]


def markers(knobs: dict) -> set[str]:
    found = {m.strip() for m in str(knobs["markers"]).split(",") if m.strip()}
    unknown = found - set(MARKERS)
    if unknown:
        raise ValueError(f"markers {sorted(unknown)}: choose from {', '.join(MARKERS)}")
    return found


def plan(knobs: dict, rank: int = 0) -> list[Iteration]:
    """The iterations of ``rank``, in order (the generator's truth)."""
    if (
        knobs["graph"] not in GRAPHS
        or knobs["style"] not in STYLES
        or knobs["heads"] not in conformance.HEADS
    ):
        raise ValueError(
            f"graph must be one of {GRAPHS}, style one of {STYLES}, heads one of "
            f"{tuple(conformance.HEADS)}"
        )
    batch, chunk, spec = knobs["batch"], knobs["chunk"], knobs["spec_tokens"]
    batches = numbers(knobs["batches"])
    per_request = 1 + spec
    captured = capture_order(knobs)
    out = [
        Iteration("warmup", size, size // per_request)
        for size in islice(cycle(captured), knobs["warmup"] if captured else 0)
    ]
    dummy_rank = rank in numbers(knobs["dummy_ranks"])
    for i in range(knobs["iterations"]):
        if dummy_rank or (
            knobs["dummy_every"] and i % knobs["dummy_every"] == knobs["dummy_every"] - 1
        ):
            out.append(Iteration("dummy", batch, batch))
        elif knobs["prefill_every"] and i % knobs["prefill_every"] == 0:
            if i and knobs["chunked"] and batch:
                out.append(Iteration("mixed", batch + chunk, batch + 1))
            else:
                prompts = knobs["prompts"]
                out.append(
                    Iteration("prefill", chunk * prompts, prompts, no_cache=not knobs["prefix_hit"])
                )
        elif batch:
            b = batches[i % len(batches)] if batches else batch
            out.append(Iteration("spec_decode" if spec else "decode", b * (1 + spec), b))
        if knobs["idle_every"] and (i + 1) % knobs["idle_every"] == 0:
            out.append(Iteration("idle"))
    return out


def sorted_sizes(text: object) -> list[int]:
    """A knob's comma-separated sizes (``"1, 2, 4"``), sorted."""
    return sorted(set(numbers(text)))


def capture_order(knobs: dict) -> list[int]:
    """The sizes the engine captures, in its order: vLLM's capture_model captures the largest
    first (``reversed(cudagraph_batch_sizes)``)."""
    return sorted_sizes(knobs["capture_sizes"])[::-1]


def padded(tokens: int, knobs: dict) -> int | None:
    """The capture size a batch of ``tokens`` replays (vLLM's dispatcher): the next captured
    size, or with padding off only its own; None above the largest (or between sizes without
    padding): the batch runs eagerly."""
    sizes = sorted_sizes(knobs["capture_sizes"])
    if not knobs["padding"]:
        return tokens if tokens in sizes else None
    return next((s for s in sizes if s >= tokens), None)


def batch_kind(it: Iteration) -> str:
    """What kind of batch an iteration's attention runs (a key of the conformance table's
    styles): a dummy batch runs like a decode."""
    if it.phase == "prefill":
        return "prefill_no_cache" if it.no_cache else "prefill_chunk"
    if it.phase in ("mixed", "spec_decode"):
        return it.phase
    return "decode"


def attention_kernel(
    it: Iteration, style: str, tokens: int, requests: int, shapes: bool, heads: str = "mha"
) -> KernelSpec:
    """The attention kernel of one layer for a batch of ``tokens`` over ``requests``, as the
    conformance table's case for the style and the batch writes it (``synth/conformance.py``:
    every row read from the vllm-ascend, op-plugin and msprof sources)."""
    case = conformance.case_for(style, batch_kind(it))
    n_q, n_kv = conformance.HEADS[heads]
    dims = conformance.Dims(tokens, requests, n_q, n_kv, HEAD_DIM, BLOCKS, BLOCK_SIZE, MAX_BLOCKS)
    written, types = case.inputs(dims)
    dur = {"PagedAttentionMaskNdKernel": 30.0, "UnpadFlashAttentionBF16NdKernel": 80.0}
    spec = KernelSpec(case.api, case.name, case.op_type, case.core, dur.get(case.op_type, 40.0))
    return replace(spec, shapes=written if shapes else "", dtypes=types)


def _layer(it: Iteration, knobs: dict, tokens: int, requests: int) -> list[KernelSpec]:
    """One decoder layer's kernels for a batch: matmuls scale with (and are shaped by) its
    padded tokens; the attention carries the batch. A small decode batch's kernels take a few
    µs, less than their eager launch: an eager decode is bound by the host's launches, which a
    graph replay leaves out."""
    scale = max(0.25, tokens / 64)
    out = []
    for spec in causes.layer(knobs):
        if spec.op_type == "FusedInferAttentionScore":
            attention = attention_kernel(
                it, knobs["style"], tokens, requests, knobs["shapes"], knobs["heads"]
            )
            out.append(replace(attention, dur_us=attention.dur_us * scale**0.8))
            continue
        rest = spec.shapes.split(";", 1)[1:] if ";" in spec.shapes else []
        shape = ";".join([f"{tokens},{spec.shapes.split(';')[0].split(',')[1]}", *rest])
        out.append(
            replace(spec, dur_us=spec.dur_us * scale, shapes=shape if knobs["shapes"] else "")
        )
    return out


def _slowed(kernels: list[KernelSpec], layer: int, knobs: dict) -> list[KernelSpec]:
    """Layer ``layer``'s kernels, ``slow_layer_factor`` times longer if it is ``slow_layer``."""
    if layer != knobs["slow_layer"]:
        return kernels
    return [replace(k, dur_us=k.dur_us * knobs["slow_layer_factor"]) for k in kernels]


def _graph_layers(it: Iteration, knobs: dict, tokens: int, requests: int) -> list[list[KernelSpec]]:
    """The decoder layers' kernels a forward of ``tokens`` over ``requests`` runs, the slow
    layer slowed: what a graph of that size captures and replays."""
    return [_slowed(_layer(it, knobs, tokens, requests), i, knobs) for i in range(knobs["layers"])]


def _forward(tl: Timeline, t: int, it: Iteration, knobs: dict) -> int:
    """The forward's launches: a FULL graph, graph pieces with eager attention, or eager."""
    size = padded(it.tokens, knobs)
    uniform = it.phase in ("decode", "spec_decode", "dummy")
    mode = knobs["graph"]
    tokens = size if size is not None and mode != "eager" else it.tokens
    # a uniform batch's graph is captured for whole requests of 1 + k tokens each
    requests = tokens // (it.tokens // it.requests) if uniform and it.requests else it.requests
    layers = _graph_layers(it, knobs, tokens, requests)
    if mode == "eager" or size is None:
        return tl.launch(t, [k for layer in layers for k in layer])
    if mode == "full_and_piecewise" and uniform:
        return ops.graph_replay(tl.rw, tl.rng, tl.dev, t, [k for layer in layers for k in layer])
    # piecewise: the graph pieces between attentions, each attention eager with real shapes
    real = _graph_layers(it, knobs, tokens, it.requests)
    for captured, eager in zip(layers, real, strict=True):
        cut = next(i for i, k in enumerate(captured) if "ttention" in k.name)
        t = ops.graph_replay(tl.rw, tl.rng, tl.dev, t, captured[:cut])
        attention = replace(
            eager[cut],
            shapes=attention_kernel(
                it, knobs["style"], it.tokens, it.requests, knobs["shapes"], knobs["heads"]
            ).shapes,
        )
        t = tl.launch(t, [attention])
        t = ops.graph_replay(tl.rw, tl.rng, tl.dev, t, captured[cut + 1 :])
    return t


# Where vLLM / vllm-ascend calls each op of a decoder layer from: the nn.Module it runs in and
# the Python frame of the call (the Python tracer's events; lines illustrative). A matmul's
# module is the linear layer it computes, in the layer's order.
MODEL = "vllm/model_executor/models/qwen2.py"
DECODER_LAYER = "Qwen2DecoderLayer"
LINEARS = (
    "QKVParallelLinear",
    "RowParallelLinear",
    "MergedColumnParallelLinear",
    "RowParallelLinear",
)
LINEAR_SITE = "vllm_ascend/ops/linear.py(326): forward"
CALL_SITES = {
    "RmsNorm": ("AscendRMSNorm", "vllm_ascend/ops/layernorm.py(76): forward_oot"),
    "AddRmsNorm": ("AscendRMSNorm", "vllm_ascend/ops/layernorm.py(71): forward_oot"),
    "ApplyRotaryPosEmb": (
        "AscendRotaryEmbedding", "vllm_ascend/ops/rotary_embedding.py(151): forward_oot"
    ),
    "FusedInferAttentionScore": ("Attention", "vllm_ascend/attention/attention_v1.py(1061): forward"),
    "SwiGlu": ("AscendSiluAndMul", "vllm_ascend/ops/activation.py(41): forward_oot"),
}  # fmt: skip
RESIDUAL_SITE = (None, f"{MODEL}(229): forward")  # the residual add: in the layer's own forward
EXTRA_LAUNCH = ops.aclnn_kernel(
    "InplaceCopy", "TensorMoveAiCore", "TensorMove", "AI_VECTOR_CORE", 3.0
)


def call_sites(layer: list[KernelSpec]) -> list[tuple[str | None, str]]:
    """Each kernel's (nn.Module class, Python frame) in one decoder layer (the module null: the
    decoder layer's own forward calls it)."""
    linear = cycle(LINEARS)
    return [
        (next(linear), LINEAR_SITE) if "atmul" in spec.op_type or "MatMul" in spec.op_type
        else CALL_SITES.get(spec.op_type, RESIDUAL_SITE)
        for spec in layer
    ]  # fmt: skip


def _captured_launch(
    tl: Timeline, t: int, spec: KernelSpec, site: tuple[str | None, str], ids: dict, kinds: set[str]
) -> int:
    """One op launched under capture: its nn.Module and Python frame (the Python tracer), the
    torch op, ``AscendCL@aclnn…`` and ``Node@launch`` naming its kernel, all on the capturing
    thread; the capture records the task, the device runs nothing. Returns the host time after."""
    rw, rng = tl.rw, tl.rng
    dur = ops.jitter(rng, 22)
    module, frame = site
    if "python" in kinds:
        if module is not None:
            ids[module] = ids.get(module, -1) + 1
            rw.python_function(f"nn.Module: {module}_{ids[module]}", t, dur)
        rw.python_function(frame, t + 1 * US, dur - 2 * US)
    rw.cpu_op(spec.api, t + 2 * US, dur - 4 * US)
    rw.api("AscendCL@", spec.api, t + 3 * US, dur - 6 * US, mode="ACL_NN")
    rw.api("Node@", "launch", t + 8 * US, ops.jitter(rng, 4), mode="launch", item_id=spec.name)
    return t + dur + ops.jitter(rng, 2)


def _capture(
    tl: Timeline, t: int, layers: list[list[KernelSpec]], extra: bool, ids: dict, kinds: set[str]
) -> int:
    """One capture window (``aclmdlRICaptureBegin`` … ``aclmdlRICaptureEnd``) of the decoder
    ``layers``' launches, each layer in its decoder-layer module (``extra``: one launch more
    first, that the graph's replays do not run). Returns the host time after."""
    rw = tl.rw
    rw.api("AscendCL@", "aclmdlRICaptureBegin", t, 20 * US, mode="ACL_RTS")
    t += 25 * US
    if extra:
        t = _captured_launch(tl, t, EXTRA_LAUNCH, RESIDUAL_SITE, ids, kinds)
    for layer in layers:
        opened = t
        for spec, site in zip(layer, call_sites(layer), strict=True):
            t = _captured_launch(tl, t, spec, site, ids, kinds)
        if "python" in kinds and layer:
            ids[DECODER_LAYER] = ids.get(DECODER_LAYER, -1) + 1
            name = f"nn.Module: {DECODER_LAYER}_{ids[DECODER_LAYER]}"
            rw.python_function(name, opened - 1 * US, t - opened + 1 * US)
        t += 2 * US
    rw.api("AscendCL@", "aclmdlRICaptureEnd", t, 30 * US, mode="ACL_RTS")
    return t + 35 * US


def _warm_up_and_capture(tl: Timeline, t: int, it: Iteration, knobs: dict, kinds: set[str]) -> int:
    """vLLM's capture of one size (``capture_model``): an eager warm-up forward of the size
    (vllm-ascend forces ``cudagraph_num_of_warmups`` to 1, ``platform.py``), the device
    synchronised (``torch.npu.graph``), then the capture (``ACLGraphWrapper``): the whole
    forward as one FULL graph (``full_and_piecewise``: the uniform decode batch's), or each
    piece between the attentions, which run eagerly between them (``piecewise``); an eager
    engine only warms up (``compile_or_warm_up_model``). Returns the host time after."""
    rw, rng = tl.rw, tl.rng
    start = t
    decode = Iteration("spec_decode" if knobs["spec_tokens"] else "decode", it.tokens, it.requests)
    layers = _graph_layers(decode, knobs, it.tokens, it.requests)
    t = tl.launch(t, [k for layer in layers for k in layer])
    t = ops.synchronize(rw, t, tl.dev.idle_at())
    _span(tl, kinds, "", f"{RUNNER}(3139): _dummy_run", start, t)
    mode = knobs["graph"]
    if mode == "eager":
        _span(tl, kinds, "", f"{WORKER}(512): compile_or_warm_up_model", start - 1 * US, t + 5 * US)
        return t + 5 * US
    captured = t + ops.jitter(rng, 30)
    ids: dict[str, int] = {}
    extra = it.tokens == knobs["capture_drift"]
    if mode == "full_and_piecewise":
        t = _capture(tl, captured, layers, extra, ids, kinds)
    else:
        t = captured
        for layer in layers:
            cut = next(i for i, k in enumerate(layer) if "ttention" in k.name)
            t = _capture(tl, t, [layer[:cut]], extra, ids, kinds)
            t = tl.launch(t, [layer[cut]])
            t = _capture(tl, t, [layer[cut + 1 :]], False, ids, kinds)
            extra = False
    _span(tl, kinds, "", f"{RUNNER}(3139): _dummy_run", captured, t)
    _span(tl, kinds, "", f"{RUNNER}(3890): capture_model", start - 1 * US, t + 5 * US)
    return t + 5 * US


VOCAB = 151936
SAMPLER = ops.aclnn_kernel("ArgMax", "ArgMaxV2", "ArgMaxV2", "AI_VECTOR_CORE", 12.0, f"16,{VOCAB}")


# the rejection sampler's Triton kernel (vllm-ascend ops/triton/reject_sample.py; a Triton
# kernel is named by its function)
REJECTION_SAMPLER = KernelSpec(
    "rejection_greedy_sample_triton",
    "rejection_greedy_sample_triton",
    "rejection_greedy_sample_triton",
    "AI_VECTOR_CORE",
    6.0,
    "16,3",
)
PROPOSER = "vllm_ascend/spec_decode/llm_base_proposer.py"


def _draft(tl: Timeline, t: int, it: Iteration, knobs: dict) -> int:
    """The drafter (MTP, one layer) in ``sample_tokens``: a speculative config runs it after
    every forward step, prefill too (``propose_draft_token_ids``); its first pass over the
    step's own tokens, in the step's attention state, then ``spec_tokens`` - 1 passes of one
    token per request (``llm_base_proposer.py`` ``_run_merged_draft``)."""
    one_layer = {**knobs, "layers": 1}
    t = tl.launch(t, _layer(it, one_layer, it.tokens, it.requests))
    step = Iteration("decode", it.requests, it.requests)
    for _ in range(knobs["spec_tokens"] - 1):
        t = tl.launch(t, _layer(step, one_layer, it.requests, it.requests))
    return t


def _span(
    tl: Timeline, kinds: set[str], scope: str, python: str | None, start: int, end: int
) -> None:
    """Record ``start``..``end`` as the scope and the Python function the markers ask for."""
    if "scopes" in kinds and scope:
        tl.rw.cpu_op(scope, start, end - start)
    if "python" in kinds and python:
        tl.rw.python_function(python, start, end - start)


def _iteration(tl: Timeline, it: Iteration, knobs: dict, kinds: set[str]) -> tuple[int, int]:
    """Run one iteration from ``tl.t``; returns its (start, end) on the host."""
    rw, rng = tl.rw, tl.rng
    start = tl.t
    t = start + ops.jitter(rng, 15)
    if it.phase == "warmup":
        return start, _warm_up_and_capture(tl, t, it, knobs, kinds)
    if it.phase == "dummy":
        t = _forward(tl, t + ops.jitter(rng, 60), it, knobs)
        t = ops.synchronize(rw, t, tl.dev.idle_at())
        _span(tl, kinds, "", f"{RUNNER}(3139): _dummy_run", start, t)
        _span(tl, kinds, "", f"{WORKER}(1048): execute_dummy_batch", start - 2 * US, t + 2 * US)
        return start, t + 2 * US
    prepared = t + ops.jitter(rng, 180)
    forward = causes.after_forward(tl, _forward(tl, prepared, it, knobs), knobs)
    posted = forward + ops.jitter(rng, 40)
    _span(tl, kinds, "prepare input", None, t, prepared)
    _span(tl, kinds, "forward", None, prepared, forward)
    _span(tl, kinds, "post process", None, forward, posted)
    executed = posted + 5 * US
    _span(tl, kinds, "", f"{RUNNER}(1838): execute_model", t - 3 * US, executed)
    _span(tl, kinds, "", f"{WORKER}(656): execute_model", t - 6 * US, executed + 3 * US)
    decoded = it.phase in ("decode", "spec_decode")
    if "annotation" in kinds:
        ctx_reqs = 0 if decoded else (1 if it.phase == "mixed" else it.requests)
        gen_reqs = it.requests - ctx_reqs
        ctx_tok = 0 if decoded else it.tokens - gen_reqs
        name = f"execute_context_{ctx_reqs}({ctx_tok})_generation_{gen_reqs}({it.tokens - ctx_tok})"
        rw.cpu_op(name, t - 2 * US, executed - t + 1 * US)
    if "legacy" in kinds:
        new = 0 if decoded or it.phase == "mixed" else it.requests
        rw.cpu_op(
            f"execute_new_{new}_cached_{it.requests - new}", t - 2 * US, executed - t + 1 * US
        )
    # sampling: the sampler kernel (the rejection sampler's too where the batch verifies draft
    # tokens), then the token fetch waits for the device
    s = executed + ops.jitter(rng, 20)
    # the sampler's argmax runs outside the graph on the real batch's logits, [B, vocab]
    sampler = replace(SAMPLER, shapes=f"{it.requests},{VOCAB}")
    sampled = ops.launch_kernel(rw, rng, tl.dev, s + 10 * US, sampler)
    if it.phase == "spec_decode":
        sampled = ops.launch_kernel(rw, rng, tl.dev, sampled, REJECTION_SAMPLER)
    sampled = ops.synchronize(rw, sampled, tl.dev.idle_at())
    copy = ops.jitter(rng, 25)
    rw.api("AscendCL@", "aclrtMemcpy", sampled + 2 * US, copy)
    sampled += copy + 4 * US
    _span(tl, kinds, "sample_token", None, s + 5 * US, sampled)
    end = sampled
    if knobs["spec_tokens"]:
        draft = end + ops.jitter(rng, 10)
        drafted = ops.synchronize(rw, _draft(tl, draft, it, knobs), tl.dev.idle_at())
        _span(tl, kinds, "draft_token", f"{PROPOSER}(718): _propose", draft, drafted)
        end = drafted
    end += 5 * US
    _span(tl, kinds, "", f"{RUNNER}(2240): sample_tokens", s, end)
    _span(tl, kinds, "", f"{WORKER}(693): sample_tokens", s - 3 * US, end + 3 * US)
    return start, end + 3 * US


def run(
    tl: Timeline, knobs: dict, each: Callable[[Iteration, int, int], None] | None = None
) -> None:
    """Run the iterations of :func:`plan`; ``each`` is told every one that ran, with its host
    start and end (what else it did: the ``memory`` scenarios' allocations)."""
    kinds = markers(knobs)
    iterations = plan(knobs, tl.rw.cfg.rank)
    opened: int | None = None
    number = 5001  # msMonitor numbers the process's iterations: profiled ones are far from 1
    for it in iterations:
        if it.phase == "idle":
            tl.t += int(knobs["idle_ms"] * MS)
            continue
        start, end = _iteration(tl, it, knobs, kinds)
        if each is not None:
            each(it, start, end)
        # msMonitor: a step from one execute_model to the next (a dummy batch runs none)
        if "profiler_step" in kinds and it.phase != "dummy":
            if opened is not None:
                tl.rw.step_window(number, opened, start - 1 * US)
                number += 1
            opened = start
        tl.t = end + ops.jitter(tl.rng, 60)
        tl.rw.flush()
    if "profiler_step" in kinds and opened is not None:
        tl.rw.step_window(number, opened, tl.t)
        tl.rw.flush()


def scheduled(knobs: dict) -> bool:
    """Steps (ProfilerStep#N, the Step Id column) exist only with msMonitor's dynamic profiling."""
    return "profiler_step" in markers(knobs)
