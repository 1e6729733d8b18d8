"""What each vllm-ascend attention case writes in a torch_npu export: the conformance table.

One :class:`Case` per attention backend, attention state and graph mode, read from the
vllm-ascend, op-plugin, CANN and msprof sources (each row cites where), never from what the
product's classifier expects: the ``serving`` scenario writes its attention kernels from these
rows (:func:`attention_kernel`), ``docs/serving.md``'s conformance table is generated from them
(:func:`markdown`), and ``tests/test_conformance.py`` runs every row through the product and
checks the phase it derives. ``derived/phases.py`` is written from the rules these rows follow,
so the test holds two readings of the sources to agree, not one reading to itself.

How kernel_details.csv writes an attention kernel's inputs (msprof
``cann_trace_db_dumper.cpp`` ``AddTensorShapeInfo``): every input slot of the CANN op
definition in its order, ``;``-separated; an absent optional input has no dims (an empty field),
its type ``DT_UNDEFINED`` and its format ``NULL``. FusedInferAttentionScore has 31 slots
(ops-transformer ``fused_infer_attention_score_def.cpp``): 0 query, 1 key, 2 value, 4 the
attention mask, 5 ``actual_seq_lengths`` and 6 ``actual_seq_lengths_kv`` (INT64 ``[B]``, in
every state), 14 the block table (INT32 ``B,max_blocks``; none without a cache), 24 and 25 the
MLA rope inputs. A real vllm-ascend 0.15 sample (msmodeling's ``FusedInferAttentionScore.csv``
fixture) reads ``24624,4,128;24624,1,128;24624,1,128;;2048,2048;7;7;;...`` for a prefill of 7
prompts without cache on a GQA model (4 query heads, 1 key head per rank).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

FIA_SLOTS = 31
BF16, INT8, INT32, INT64, NONE = "DT_BF16", "INT8", "INT32", "INT64", "DT_UNDEFINED"
VA = "vllm-ascend"  # vllm-project/vllm-ascend; HEAD = 182b75ea (2026-08-22)


@dataclass(frozen=True)
class Dims:
    """The sizes a case's shapes are written in: numbers for the synth, symbols for the docs."""

    T: int | str  # the query's tokens
    B: int | str  # requests
    Nq: int | str = "Nq"  # query heads per rank
    Nkv: int | str = "Nkv"  # key/value heads per rank
    D: int | str = "D"  # head dim
    blocks: int | str = "blocks"  # KV cache blocks
    block_size: int | str = "bs"
    max_blocks: int | str = "max_blocks"  # block table width: cdiv(max_model_len, block_size)

    @property
    def kv_width(self) -> int | str:
        if isinstance(self.Nkv, int) and isinstance(self.D, int):
            return self.Nkv * self.D
        return f"{self.Nkv}·{self.D}"


SYMBOLS = Dims("T", "B")
MASK = "2048,2048"  # vllm-ascend's causal mask (AttentionMaskBuilder), INT8


def fia_inputs(slots: dict[int, tuple[str, str]]) -> tuple[str, str]:
    """A FusedInferAttentionScore row's Input Shapes and Input Data Types: the 31 slots, the
    given ones filled (slot -> (shape, dtype)), the rest empty and DT_UNDEFINED."""
    shapes, types = zip(*(slots.get(i, ("", NONE)) for i in range(FIA_SLOTS)), strict=True)
    return ";".join(shapes), ";".join(types)


def _lengths(d: Dims, mask: bool = True) -> dict[int, tuple[str, str]]:
    """The causal mask (4) and ``actual_seq_lengths`` (5), absent without ``mask``, and
    ``actual_seq_lengths_kv`` (6)."""
    slots = {4: (MASK, INT8), 5: (f"{d.B}", INT64)} if mask else {}
    return {**slots, 6: (f"{d.B}", INT64)}


def _fia_no_cache(d: Dims) -> tuple[str, str]:
    current = f"{d.T},{d.Nkv},{d.D}"
    return fia_inputs(
        {0: (f"{d.T},{d.Nq},{d.D}", BF16), 1: (current, BF16), 2: (current, BF16), **_lengths(d)}
    )


def _paged(
    d: Dims,
    query: str,
    cache: str,
    mask: bool = True,
    more: dict[int, tuple[str, str]] | None = None,
) -> tuple[str, str]:
    """FIA on a paged cache: the query (0), the cache view as key and value (1, 2), the lengths,
    the block table (14) and ``more`` slots."""
    slots = {0: (query, BF16), 1: (cache, BF16), 2: (cache, BF16), **_lengths(d, mask=mask)}
    return fia_inputs({**slots, 14: (f"{d.B},{d.max_blocks}", INT32), **(more or {})})


def _fia_paged(d: Dims) -> tuple[str, str]:
    return _paged(d, f"{d.T},{d.Nq},{d.D}", f"{d.blocks},{d.block_size},{d.kv_width}")


def _mla(d: Dims, query: str, spec: bool) -> tuple[str, str]:
    """MLA on the latent cache ``blocks,1,bs,512``, the rope parts in 24/25: decode (layout
    BNSD_NBSD: the query ``B,N,1,512``, dim 0 is B, S = 1; ``actual_seq_lengths`` absent) or,
    with a speculative config, ``spec`` (layout TND_NTD: the query ``T,N,512``)."""
    rope = {24: (f"{query},64", BF16), 25: (f"{d.blocks},1,{d.block_size},64", BF16)}
    return _paged(d, f"{query},512", f"{d.blocks},1,{d.block_size},512", spec, rope)


def _mla_decode(d: Dims) -> tuple[str, str]:
    return _mla(d, f"{d.B},{d.Nq},1", spec=False)


def _mla_spec(d: Dims) -> tuple[str, str]:
    return _mla(d, f"{d.T},{d.Nq}", spec=True)


def _mla_prefill(d: Dims) -> tuple[str, str]:
    """MLA prefill at HEAD: FIA in TND on the current (up-projected) K, 192 = 128 nope + 64
    rope; no block table; ``softmax_lse`` requested (its output is not empty)."""
    current = f"{d.T},{d.Nq},192"
    return fia_inputs(
        {0: (current, BF16), 1: (current, BF16), 2: (f"{d.T},{d.Nq},128", BF16), **_lengths(d)}
    )


def _paged_attention(d: Dims) -> tuple[str, str]:
    """v0.11's ATB paged attention: query ``B,N,D`` (B padded), the cache ``blocks,bs,Nkv,D``,
    the block table and the context lengths (the ATB in-tensor order was not traced: these are
    the inputs the call passes, in its order)."""
    shapes = (
        f"{d.B},{d.Nq},{d.D};{d.blocks},{d.block_size},{d.Nkv},{d.D};"
        f"{d.blocks},{d.block_size},{d.Nkv},{d.D};{d.B},{d.max_blocks};{d.B}"
    )
    return shapes, ";".join([BF16, BF16, BF16, INT32, INT32])


def _flash_attention(d: Dims) -> tuple[str, str]:
    """v0.11's ATB flash attention without cache: the (padded) query first."""
    return f"{d.T},{d.Nq},{d.D};{d.T},{d.Nkv},{d.D};{d.T},{d.Nkv},{d.D}", ";".join([BF16] * 3)


def _sparse_attention(d: Dims) -> tuple[str, str]:
    """SFA (DeepSeek-V3.2, GLM-5): ``npu_sparse_flash_attention`` on the latent cache with the
    indexer's top-k indices, in every state; ``actual_seq_lengths_query/kv`` ``[B]``."""
    cache = f"{d.blocks},{d.block_size},1,512"
    shapes = (
        f"{d.T},{d.Nq},512;{cache};{cache};{d.T},1,2048;{d.B},{d.max_blocks};{d.B};{d.B};"
        f"{d.T},{d.Nq},64;{d.blocks},{d.block_size},1,64"
    )
    return shapes, ";".join([BF16, BF16, BF16, INT32, INT32, INT64, INT64, BF16, BF16])


@dataclass(frozen=True)
class Case:
    """One row of the conformance table: what one attention case writes, and its phase."""

    key: str  # the row's id (tests, docs)
    backend: str  # vllm-ascend's attention backend and versions
    state: str  # AscendAttentionState (attention_v1.py), or what the batch is
    graphs: tuple[str, ...]  # graph modes the row holds for: eager, piecewise, full
    call: str  # the torch_npu / ATB call -> aclnn API
    api: str  # the host call that launches it (its cpu_op / AscendCL@ name)
    op_type: str  # kernel_details Type
    name: str  # kernel_details Name (eager aclnn: aclnn<Api>_<kernel>_<OpType>)
    core: str
    inputs: Callable[[Dims], tuple[str, str]]  # Input Shapes, Input Data Types
    counts: str  # what T and B are: real, or padded
    phase: str  # the phase the product must derive
    source: str  # where in the sources


FIA_NAME = "aclnnFusedInferAttentionScoreV3_FusedInferAttentionScore_FusedInferAttentionScore"
FIA_V2_NAME = FIA_NAME.replace("V3", "V4")  # npu_fused_infer_attention_score_v2
FIA_CALL = "torch_npu.npu_fused_infer_attention_score (TND) -> aclnnFusedInferAttentionScoreV3"
STATE_SRC = f"{VA} HEAD worker/model_runner_v1.py:1287-1314 (_build_attn_state)"
FIA_SRC = f"{VA} HEAD attention/attention_v1.py:1301-1338, 1366-1373 (forward_impl); v0.13.0 :504-520, 590-610"

CASES: tuple[Case, ...] = (
    Case(
        "v0.11-prefill-no-cache", "v0.11 (ATB)", "PrefillNoCache", ("eager", "piecewise"),
        "torch_npu._npu_flash_attention -> ATB SelfAttentionOperation (PA_ENCODER)",
        "atb::_npu_flash_attention", "UnpadFlashAttentionBF16NdKernel", "UnpadFlashAttentionBF16NdKernel", "MIX_AIC",
        _flash_attention,
        "T padded to the capture size (v0.11 pads every batch up to the largest size, and "
        "flash attention reads the unsliced query)",
        "prefill",
        f"{VA} v0.11.0 attention/attention_v1.py:333-368; worker/model_runner_v1.py:1252-1267 "
        "(pad_for_cudagraph); ATB unpad_flash_attention_operation.cpp:30-45",
    ),
    Case(
        "v0.11-decode", "v0.11 (ATB)", "DecodeOnly", ("eager", "piecewise", "full"),
        "torch_npu._npu_paged_attention -> ATB PagedAttentionOperation",
        "atb::_npu_paged_attention", "PagedAttentionMaskNdKernel", "PagedAttentionMaskNdKernel", "MIX_AIC",
        _paged_attention,
        "B padded to the batch's padded size (seq_lens and block table padded to "
        "num_input_tokens)",
        "decode",
        f"{VA} v0.11.0 attention/attention_v1.py:228-243, 397-490 (_forward_decode_only); "
        "op-plugin ops/atb/PagedAttentionAtb.cpp:19-58",
    ),
    Case(
        "v0.11-chunked-mixed", "v0.11 (FIA)", "ChunkedPrefill (prefill chunk beside decodes)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged, "T, B real (the query is sliced to query_start_loc[-1])", "mixed",
        f"{VA} v0.11.0 attention/attention_v1.py:501-560, 672-676 (_forward_v1_style)",
    ),
    Case(
        "fia-prefill-no-cache", "v0.13+ (FIA)", "PrefillNoCache (every request new)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_no_cache,
        "T real (query, key and value sliced to the real tokens); B real (actual_seq_lengths); "
        "key T,Nkv,D: fewer heads than the query on GQA/MQA; no block table",
        "prefill",
        f"{FIA_SRC}; {STATE_SRC}; msmodeling fia_raw_test/FusedInferAttentionScore.csv (real row)",
    ),
    Case(
        "fia-prefill-chunk", "v0.13+ (FIA)",
        "ChunkedPrefill / PrefillCacheHit, one request (a prompt chunk over its cached part)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged, "T real, B = 1; a paged cache view and a block table", "prefill",
        f"{FIA_SRC}; {STATE_SRC}",
    ),
    Case(
        "fia-mixed", "v0.13+ (FIA)", "ChunkedPrefill (a prefill chunk beside decodes)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged,
        "T real, B real; the kernel holds only the totals (no per-request lengths): told from "
        "a prefill of several prompts by the decodes running on from the step before",
        "mixed", f"{FIA_SRC}; {STATE_SRC}",
    ),
    Case(
        "fia-decode", "v0.13+ (FIA)", "DecodeOnly (every request one token)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged, "T = B, real", "decode",
        f"{FIA_SRC}; {VA} HEAD attention/attention_v1.py:1318-1327, 1654-1675",
    ),
    Case(
        "fia-decode-full", "v0.13+ (FIA)", "DecodeOnly in a FULL graph replay", ("full",),
        "the captured npu_fused_infer_attention_score.out (full_graph_fia), replayed by "
        "aclmdlRIExecuteAsync", "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC", _fia_paged,
        "T = the capture size S and B = S/(1+k): padded (Model ID set); the real batch is in "
        "no replayed shape", "decode",
        f"{VA} HEAD attention/attention_v1.py:853-911, 918-1087; worker/model_runner_v1.py:"
        "824-835 (_pad_query_start_loc_for_fia); compilation/acl_graph.py:133-267",
    ),
    Case(
        "fia-spec", "v0.13+ (FIA)", "SpecDecoding (MTP: 1 + k tokens per request)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged,
        "T = B·(1+k), real; the drafter runs on every step (prefill too), so the verifying "
        "rejection sampler and the session's 1 + k tell it, not the drafter alone",
        "spec_decode",
        f"{STATE_SRC}; {VA} HEAD sample/rejection_sampler.py:566-571, worker/model_runner_v1.py:"
        "2316-2330, 2434-2465; spec_decode/llm_base_proposer.py:1044-1338",
    ),
    Case(
        "fia-spec-one-request", "v0.13+ (FIA)", "SpecDecoding, one request (T = 1 + k, B = 1)",
        ("eager", "piecewise"), FIA_CALL, "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged,
        "T = 1 + k, B = 1, a block table: shaped like a one-request prompt chunk of 1 + k "
        "tokens; the rejection sampler (or the session's 1 + k with a drafter) tells it",
        "spec_decode", f"{STATE_SRC}; {VA} HEAD worker/model_runner_v1.py:2434-2465",
    ),
    Case(
        "fia-spec-full", "v0.13+ (FIA)", "SpecDecoding in a FULL graph replay", ("full",),
        "the captured FIA, replayed", "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore", FIA_NAME, "MIX_AIC",
        _fia_paged, "T = S, B = S/(1+k): padded, the ratio 1 + k kept", "spec_decode",
        f"{VA} HEAD worker/model_runner_v1.py:824-835; vLLM cudagraph_dispatcher.py "
        "(uniform decode keys)",
    ),
    Case(
        "mla-prefill", "MLA (HEAD)", "PrefillNoCache (the prefill part)", ("eager", "piecewise"),
        "torch_npu.npu_fused_infer_attention_score TND with softmax_lse", "aclnnFusedInferAttentionScoreV3", "FusedInferAttentionScore",
        FIA_NAME, "MIX_AIC", _mla_prefill, "T real; no block table", "prefill",
        f"{VA} HEAD attention/mla_v1.py:1115-1221",
    ),
    Case(
        "mla-decode", "MLA (v0.11+)", "DecodeOnly (the decode part)",
        ("eager", "piecewise", "full"),
        "torch_npu.npu_fused_infer_attention_score(_v2), layout BNSD_NBSD",
        "aclnnFusedInferAttentionScoreV4", "FusedInferAttentionScore", FIA_V2_NAME, "MIX_AIC", _mla_decode,
        "query dim 0 is B (S = 1 at dim 2): T = B; actual_seq_lengths absent, "
        "actual_seq_lengths_kv [B]", "decode",
        f"{VA} HEAD attention/mla_v1.py:1373-1580 (1463-1482: the layout); v0.13.0 :1152-1293",
    ),
    Case(
        "mla-spec", "MLA (v0.11+)", "SpecDecoding (layout TND_NTD)", ("eager", "piecewise"),
        "torch_npu.npu_fused_infer_attention_score_v2, layout TND_NTD",
        "aclnnFusedInferAttentionScoreV4", "FusedInferAttentionScore", FIA_V2_NAME, "MIX_AIC", _mla_spec, "T = B·(1+k), real",
        "spec_decode", f"{VA} HEAD attention/mla_v1.py:1412-1440; v0.13.0 :1183-1198",
    ),
    Case(
        "sfa-decode", "SFA (v0.13+)", "DecodeOnly", ("eager", "piecewise"),
        "_C_ascend.npu_lightning_indexer then _C_ascend.npu_sparse_flash_attention",
        "_C_ascend::npu_sparse_flash_attention", "SparseFlashAttention", "SparseFlashAttention", "MIX_AIC", _sparse_attention,
        "T = B, real: one kernel type for every state, T against B tells", "decode",
        f"{VA} v0.13.0 attention/sfa_v1.py:878-893, 1010-1021",
    ),
    Case(
        "sfa-prefill-chunk", "SFA (v0.13+)", "ChunkedPrefill, one request",
        ("eager", "piecewise"),
        "_C_ascend.npu_lightning_indexer then _C_ascend.npu_sparse_flash_attention",
        "_C_ascend::npu_sparse_flash_attention", "SparseFlashAttention", "SparseFlashAttention", "MIX_AIC", _sparse_attention,
        "T real, B = 1", "prefill", f"{VA} v0.13.0 attention/sfa_v1.py:878-893, 1010-1021",
    ),
)  # fmt: skip
BY_KEY = {case.key: case for case in CASES}

# the serving scenario's attention styles: which case each iteration's batch runs
STYLE_CASES: dict[str, dict[str, str]] = {
    "v0.11": {
        "prefill_no_cache": "v0.11-prefill-no-cache",
        "prefill_chunk": "v0.11-chunked-mixed",
        "mixed": "v0.11-chunked-mixed",
        "decode": "v0.11-decode",
        "spec_decode": "v0.11-chunked-mixed",
    },
    "v0.13": {
        "prefill_no_cache": "fia-prefill-no-cache",
        "prefill_chunk": "fia-prefill-chunk",
        "mixed": "fia-mixed",
        "decode": "fia-decode",
        "spec_decode": "fia-spec",
    },
    "mla": {
        "prefill_no_cache": "mla-prefill",
        "prefill_chunk": "mla-spec",
        "mixed": "mla-spec",
        "decode": "mla-decode",
        "spec_decode": "mla-spec",
    },
    "sfa": {
        "prefill_no_cache": "sfa-prefill-chunk",
        "prefill_chunk": "sfa-prefill-chunk",
        "mixed": "sfa-prefill-chunk",
        "decode": "sfa-decode",
        "spec_decode": "sfa-decode",
    },
}
# query / key-value heads per rank of each head layout
HEADS = {"mha": (8, 8), "gqa": (8, 2), "mqa": (8, 1)}


def case_for(style: str, batch: str) -> Case:
    """The case ``style`` runs a batch of kind ``batch`` with (a key of :data:`STYLE_CASES`)."""
    return BY_KEY[STYLE_CASES[style][batch]]


def markdown() -> list[str]:
    """The conformance table as Markdown rows (``docs/serving.md``)."""
    out = [
        "| case | backend | state | graph | call | kernel Type | Input Shapes (slot order; "
        "empty: absent) | T and B | phase | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        shapes, types = case.inputs(SYMBOLS)
        cells = [
            f"`{case.key}`",
            case.backend,
            case.state,
            ", ".join(case.graphs),
            case.call,
            f"`{case.op_type}`",
            f"`{_trimmed(shapes)}`",
            case.counts,
            f"**{case.phase}**",
            case.source,
        ]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def _trimmed(shapes: str) -> str:
    """Input Shapes without its trailing empty slots (``;;;...`` to the 31st)."""
    return shapes.rstrip(";") + (";…" if shapes.endswith(";") else "")


BEGIN = "<!-- conformance: generated by `python -m traceanalyzer.synth.conformance` -->"
END = "<!-- /conformance -->"


def with_table(page: str) -> str:
    """``docs/serving.md`` with its conformance table made current."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return "\n".join([head + BEGIN, *markdown(), END + tail])


if __name__ == "__main__":
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
    doc.write_text(with_table(doc.read_text("utf-8")), "utf-8")
