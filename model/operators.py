"""Benchmark operator suites. ``alcop``: the operators of the ALCOP evaluation (Fig. 10/13);
``memops``: the memory-intensive operators of BERT-base and GPT-2 (see _transformer_memops);
``hopper``: the ALCOP suite's GEMMs and BMMs on the Hopper warpgroup-MMA family ("WG_" before
the ALCOP name: the same shapes, so the two families' kernels compare operator by operator).
``llama``: the RMS norms and SwiGLUs of LLaMA-2-style decoders (see _llama_memops); not in
the campaign's default operators (``--operators llama`` sweeps them). ``swiglu``: LLaMA-2
7B's gate and up projections at 1024 tokens, as the fused GEMM + SwiGLU and as the plain
GEMM that the ``llama`` suite's SwiGLU_LLaMA2_7B_t1024 follows (fused against unfused,
each tuned); not in the default operators either. ``bf16``: the ``swiglu`` suite's two GEMMs
with bfloat16 operands (as LLaMA's weights ship), against cuBLAS in bfloat16; not in the
default operators. ``bias_gelu``: GPT-2's FC1 with its bias and GELU in the GEMM's epilogue,
against the alcop suite's MM_BERT_FC1 and the memops suite's BiasGELU_GPT2_b1_s1024 (fused
against unfused, each tuned); not in the default operators.

Shapes follow the ALCOP paper: square GEMMs, BERT-base linear layers at 1024 tokens (N x K
as in the paper), ResNet-50's FC and 1x1 convolutions as GEMM, BERT and GPT-2 attention
BMMs (12 heads), ResNet-50's 3x3 convolutions at batch 64, and 3x3x3 Conv3D layers. The
paper names four Conv3D operators without shapes beyond the first; Conv3D_2..4 here are
the stages of a 3D ResNet (R3D-18) at batch 8, chosen to span the same range.
"""

from __future__ import annotations

from pipetune.model.hopper.workloads import HopperWorkload, as_hopper
from pipetune.model.memops.workloads import (
    MemWorkload,
    bias_gelu,
    layernorm,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.workloads import (
    AnyWorkload,
    bmm,
    conv2d,
    conv3d,
    gemm,
    gemm_bias_gelu,
    gemm_swiglu,
)

ALCOP: dict[str, AnyWorkload] = {
    "MM_Square_1k": gemm(1024, 1024, 1024),
    "MM_Square_2k": gemm(2048, 2048, 2048),
    "MM_Square_4k": gemm(4096, 4096, 4096),
    "MM_BERT_Proj": gemm(1024, 768, 768),
    "MM_BERT_QKV": gemm(1024, 2304, 768),
    "MM_BERT_FC1": gemm(1024, 3072, 768),
    "MM_BERT_FC2": gemm(1024, 768, 3072),
    "MM_RN50_FC": gemm(1024, 64, 2048),
    "MM_RN50_Conv1x1_1": gemm(50176, 128, 64),
    "MM_RN50_Conv1x1_2": gemm(12544, 256, 128),
    "MM_RN50_Conv1x1_3": gemm(3136, 512, 256),
    "BMM_BERT_QK": bmm(12, 512, 512, 64),
    "BMM_BERT_SV": bmm(12, 512, 64, 512),
    "BMM_GPT2_QK": bmm(12, 1024, 1024, 64),
    "BMM_GPT2_SV": bmm(12, 1024, 64, 1024),
    "Conv2D_RN50_1": conv2d(64, 56, 56, 64, 64, 3, 3, stride=1, pad=1),
    "Conv2D_RN50_2": conv2d(64, 28, 28, 128, 128, 3, 3, stride=1, pad=1),
    "Conv2D_RN50_3": conv2d(64, 14, 14, 256, 256, 3, 3, stride=1, pad=1),
    "Conv2D_RN50_4": conv2d(64, 7, 7, 512, 512, 3, 3, stride=1, pad=1),
    "Conv3D_1": conv3d(64, 14, 7, 7, 512, 512, 3, 3, 3, stride=1, pad=1),
    "Conv3D_2": conv3d(8, 16, 56, 56, 64, 64, 3, 3, 3, stride=1, pad=1),
    "Conv3D_3": conv3d(8, 8, 28, 28, 128, 128, 3, 3, 3, stride=1, pad=1),
    "Conv3D_4": conv3d(8, 4, 14, 14, 256, 256, 3, 3, 3, stride=1, pad=1),
}


def _transformer_memops() -> dict[str, MemWorkload]:
    """``memops``: the memory-intensive operators of BERT-base and GPT-2 (hidden 768, 12
    heads, FFN 3072) at batch 1, 8, 32 and sequence 128, 1024: the attention softmax
    (rows = batch·12·seq, cols = seq), the layer norm (batch·seq × 768; eps 1e-12 in BERT,
    1e-5 in GPT-2) and the FC1 bias + GELU (batch·seq × 3072; erf GELU in BERT, tanh in
    GPT-2). The two networks' softmax shapes coincide (GPT-2's causal mask does not change
    them); BERT-base's position table stops at 512, so its 1024 rows are the same operators
    at GPT-2's length."""
    nets = {"BERT": (1e-12, "none"), "GPT2": (1e-5, "tanh")}
    out: dict[str, MemWorkload] = {}
    for net, (eps, gelu) in nets.items():
        for batch in (1, 8, 32):
            for seq in (128, 1024):
                tag = f"{net}_b{batch}_s{seq}"
                out[f"Softmax_{tag}"] = softmax(batch * 12 * seq, seq)
                out[f"LayerNorm_{tag}"] = layernorm(batch * seq, 768, eps)
                out[f"BiasGELU_{tag}"] = bias_gelu(batch * seq, 3072, gelu)
    return out


def _llama_memops() -> dict[str, MemWorkload]:
    """``llama``: the memory-intensive operators of LLaMA-2-style decoders besides the
    attention softmax, over 128, 1024 and 8192 tokens: the RMS norm (rows = tokens, cols =
    hidden: 4096 in 7B, 8192 in 70B; eps 1e-5) and the SwiGLU between the MLP's GEMMs (rows
    = tokens, cols = FFN: 11008 in 7B, 28672 in 70B)."""
    out: dict[str, MemWorkload] = {}
    for size, hidden, ffn in (("7B", 4096, 11008), ("70B", 8192, 28672)):
        for tokens in (128, 1024, 8192):
            out[f"RMSNorm_LLaMA2_{size}_t{tokens}"] = rmsnorm(tokens, hidden, 1e-5)
            out[f"SwiGLU_LLaMA2_{size}_t{tokens}"] = silu_mul(tokens, ffn)
    return out


MEMOPS = _transformer_memops()
LLAMA = _llama_memops()
# The gate+up GEMM of LLaMA-2 7B's MLP (hidden 4096, FFN 11008) at 1024 tokens, fused with
# the SwiGLU and not: with LLAMA's SwiGLU_LLaMA2_7B_t1024, what fusing saves once each is tuned.
SWIGLU: dict[str, AnyWorkload] = {
    "GateUpSwiGLU_LLaMA2_7B_t1024": gemm_swiglu(1024, 11008, 4096),
    "GateUp_LLaMA2_7B_t1024": gemm(1024, 22016, 4096),
}
# The swiglu suite's GEMMs in bfloat16: the same kernels but for their type words, so the
# sweeps say what bf16 costs against fp16 on one shape, and how far from cuBLAS's bf16 GEMM.
BF16_PREFIX = "BF16_"
BF16: dict[str, AnyWorkload] = {
    BF16_PREFIX + name: w.model_copy(update={"dtype": "bfloat16"}) for name, w in SWIGLU.items()
}
# GPT-2's FC1 at 1024 tokens with its bias and tanh GELU in the GEMM's epilogue: with the
# alcop suite's MM_BERT_FC1 (the same GEMM) and the memops suite's BiasGELU_GPT2_b1_s1024
# (the same bias + GELU), what fusing saves once each is tuned.
BIAS_GELU: dict[str, AnyWorkload] = {
    "FC1BiasGELU_GPT2_b1_s1024": gemm_bias_gelu(1024, 3072, 768, approximate="tanh"),
}
HOPPER_PREFIX = "WG_"
HOPPER: dict[str, HopperWorkload] = {
    HOPPER_PREFIX + name: as_hopper(w) for name, w in ALCOP.items() if w.op in ("gemm", "bmm")
}

# The fused GEMMs of the swiglu and bias_gelu suites on the Hopper wgmma family (their
# epilogues in its staged one): with those suites' mma.sync sweeps and their PyTorch baselines,
# what each family's fused kernel reaches on one shape.
HOPPER_FUSED: dict[str, HopperWorkload] = {
    HOPPER_PREFIX + name: as_hopper(w)
    for name, w in {**SWIGLU, **BIAS_GELU}.items()
    if w.op in ("gemm_swiglu", "gemm_bias_gelu")
}

# Attention's Q·Kᵀ over the keys as frameworks store them (sequence-major: each B N x K),
# GPT-2's 12 heads at 1024 tokens, on both GEMM families: beside the alcop and hopper suites'
# BMM_GPT2_QK (the same product over a transposed copy of the keys, B K x N), what each
# layout reaches once tuned, against cuBLAS's strided-batched GEMM on the keys as stored.
# Then the softmax between Q·Kᵀ and S·V as GPT-2 computes it: scaled by 1/sqrt(64), causal
# (the masked kernels read only the keys a query sees), beside the memops suite's plain
# Softmax_GPT2_b1_s1024 of the same shape, against eager PyTorch's multiply, torch.where and
# softmax.
_ATTENTION = {"BMM_GPT2_QK_NK": bmm(12, 1024, 1024, 64, b_layout="nk")}
ATTENTION: dict[str, AnyWorkload | MemWorkload | HopperWorkload] = {
    **_ATTENTION,
    **{HOPPER_PREFIX + name: as_hopper(w) for name, w in _ATTENTION.items()},
    "Softmax_GPT2_causal_b1_s1024": softmax(12 * 1024, 1024, 0.125, causal=True),
}

SUITES: dict[str, dict[str, AnyWorkload | MemWorkload | HopperWorkload]] = {
    "alcop": ALCOP,
    "memops": MEMOPS,
    "hopper": HOPPER,
    "llama": LLAMA,
    "swiglu": SWIGLU,
    "bf16": BF16,
    "bias_gelu": BIAS_GELU,
    "hopper_fused": HOPPER_FUSED,
    "attention": ATTENTION,
}


def suite(name: str) -> dict[str, AnyWorkload | MemWorkload | HopperWorkload]:
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"unknown operator suite '{name}'; known: {', '.join(SUITES)}") from None
