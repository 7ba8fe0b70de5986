"""The tuned operators of whole networks, for end-to-end views (ALCOP Table 3).

Two kernel families are listed (model/family.py; each layer's family is
``family_of(layer.workload)``), three with ``Network.on_hopper`` (the GEMMs and BMMs on the
Hopper wgmma family):

- tensor-core GEMM: GEMMs, batched GEMMs and Conv2Ds, the operators pipelining applies to
  (ALCOP: "pipelining can be applied to MatMuls, BMMs and Conv2Ds");
- memory-intensive (AStitch): the transformers' attention softmax, layer norms and the FC1
  bias + GELU, with the shapes of the ``memops`` benchmark suite (model/operators.py).

The attention softmax is attention's: its input scaled by 1/sqrt(head dimension) and, in
the decoders (gpt2, the LLaMA-2 networks), causally masked (a query sees the keys up to its
own position), as fused attention computes it; a decode step's one query sees every key, and
its softmax has no mask. BERT's padding mask is left out (it depends on the batch's lengths).

Left out everywhere: embeddings (BERT's embedding layer norm with them), the output head
(BERT's pooler, GPT-2's final layer norm ln_f and LM head), residual adds, dropout (off at
inference) and ResNet's pooling, batch-norm and activations. An end-to-end figure built
from these layers covers the listed operators only.

- bert-base: 12 post-LN encoder layers, hidden 768, 12 heads of 64, FFN 3072, at most 512
  tokens (its position embeddings; GPT-2: 1024). Per layer,
  with T = batch·seq tokens: fused QKV projection (T×2304×768), attention scores Q·Kᵀ as a
  BMM (b = batch·12, seq×seq×64), the attention softmax (rows = batch·12·seq, cols = seq),
  attention-weighted values (b = batch·12, seq×64×seq), output projection (T×768×768), a
  layer norm (T×768, eps 1e-12), FC1 (T×3072×768) with its bias + erf GELU (T×3072), FC2
  (T×768×3072) and the second layer norm (T×768, eps 1e-12).
- gpt2: GPT-2 small, 12 pre-LN decoder layers of the same shapes (ln_1, c_attn, attention,
  c_proj, ln_2, c_fc + tanh GELU, mlp c_proj); its layer norms use eps 1e-5, and its
  softmax is causal.
- llama2-7b: LLaMA-2 7B (HF LlamaConfig of Llama-2-7b-hf), 32 pre-norm decoder blocks,
  hidden 4096, 32 heads of 128, FFN 11008, RMS norms with eps 1e-5, at most 4096 tokens.
  Per block: an RMS norm (T×4096), the fused QKV projection (T×12288×4096, no biases),
  Q·Kᵀ and S·V as BMMs (b = batch·32, head dimension 128) around the softmax, the output
  projection (T×4096×4096), the second RMS norm, the gate and up projections as one GEMM
  (T×22016×4096), the SwiGLU between them (SiLU(gate)·up, T×11008) and the down projection
  (T×4096×11008). Not listed besides the above: the rotary position embedding and the final
  norm.
- llama2-70b: LLaMA-2 70B, the same blocks (80 of them) with hidden 8192, 64 query heads of
  128 sharing 8 key/value heads (grouped-query attention), FFN 28672: the QKV projection is
  T×10240×8192, and each key/value head's 8 query heads are one BMM's rows (b = batch·8,
  M = 8·seq), as GQA kernels fold them.
- A decode step (``decode=True``; gpt2 and the LLaMA-2 networks, which generate): each of the
  batch's sequences adds one token, which attends to ``seq`` positions of its key/value cache
  (the context, its own included). The same layers with T = batch tokens, and attention
  with one query row per head: Q·Kᵀ b = batch·heads, 1×seq×head_dim, the softmax's rows
  batch·heads of seq, S·V 1×head_dim×seq (with GQA, a key/value head's query heads are its
  BMM's rows: M = group). Appending the new keys and values to the cache is not listed.
  BERT encodes; it has no decode step.
- resnet50: ResNet-50 v1.5 at 224×224, NHWC, tensor-core layers only. Stride-1 1×1
  convolutions are GEMMs (M = batch·H·W, N = out channels, K = in channels); the stride-2
  1×1 downsampling convolutions and every 3×3 are Conv2D (implicit GEMM); the classifier is
  a GEMM (batch×1000×2048). The 7×7/2 stem has C = 3 input channels, which the 16-byte
  loads cannot take: its input is zero-padded to C = 8 (listed in `notes`).
- Element types (``dtype``): every operator float16, or every one bfloat16 (as LLaMA-2's
  weights ship); both the tensor-core and the memory-intensive families take either.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field

from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hopper.workloads import TENSOR_OP, HopperWorkload, as_hopper
from pipetune.model.memops.workloads import (
    MemWorkload,
    Softmax,
    bias_gelu,
    layernorm,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.workloads import (
    DTYPES,
    AnyWorkload,
    WorkloadError,
    bmm,
    conv2d,
    gemm,
    gemm_bias_gelu,
    gemm_swiglu,
)

NETWORKS = ("bert-base", "gpt2", "llama2-7b", "llama2-70b", "resnet50")
TRANSFORMERS = ("bert-base", "gpt2", "llama2-7b", "llama2-70b")  # networks of sequences (--seq)
DECODERS = ("gpt2", "llama2-7b", "llama2-70b")  # networks that generate: a decode step (--decode)
SWIGLU_NETWORKS = ("llama2-7b", "llama2-70b")  # MLPs gated by a SwiGLU (--fuse-swiglu)
BIAS_GELU_NETWORKS = ("bert-base", "gpt2")  # FC1 + bias + GELU (--fuse-bias-gelu)
# Defaults that match ALCOP's operator shapes (BMM_BERT_QK is 12×512×512×64 at batch 1,
# BMM_GPT2_QK 12×1024×1024×64; Conv2D_RN50 is batch 64); LLaMA-2's, half its context.
DEFAULT_SEQ = {"bert-base": 512, "gpt2": 1024, "llama2-7b": 2048, "llama2-70b": 2048}
# The longest sequence each network takes: its context length (HF BertConfig's and
# LlamaConfig's max_position_embeddings, GPT2Config's n_positions). Longer is another network.
MAX_SEQ = {"bert-base": 512, "gpt2": 1024, "llama2-7b": 4096, "llama2-70b": 4096}
DEFAULT_BATCH = {"bert-base": 1, "gpt2": 1, "llama2-7b": 1, "llama2-70b": 1, "resnet50": 64}
# Per network: the layer norms' eps and the GELU form (the memops workloads' `approximate`),
# as the reference implementations (HF BertConfig.layer_norm_eps, GPT2Config's
# layer_norm_epsilon and "gelu_new"), and as model/operators.py's memops suite has them.
LAYERNORM_EPS = {"bert-base": 1e-12, "gpt2": 1e-5}
GELU = {"bert-base": "none", "gpt2": "tanh"}


@dataclass(frozen=True)
class Layer:
    name: str
    workload: AnyWorkload | MemWorkload | HopperWorkload


@dataclass(frozen=True)
class DistinctShape:
    workload: AnyWorkload | MemWorkload | HopperWorkload
    count: int  # how many times the network runs this exact operator
    layers: tuple[str, ...]  # the layer names that share it


@dataclass
class Network:
    name: str
    batch: int
    seq: int | None  # a decode step's context: the key/value positions its token attends to
    layers: list[Layer]
    notes: list[str] = field(default_factory=list)
    decode: bool = False  # one generated token per sequence (else the whole sequence at once)
    fuse_swiglu: bool = False  # gate+up and the SwiGLU as one GEMM (gemm_swiglu)
    fuse_bias_gelu: bool = False  # FC1 with its bias and GELU as one GEMM (gemm_bias_gelu)
    dtype: str = "float16"  # every operator's element type

    def of_family(self, family: str) -> list[Layer]:
        """The layers of one kernel family ("tensor_gemm", "memops"), in network order."""
        return [layer for layer in self.layers if family_of(layer.workload).name == family]

    def on_hopper(self) -> Network:
        """The same network with its GEMMs and BMMs (and the fused GEMMs with bias + GELU or
        SwiGLU) computed by the Hopper warpgroup-MMA family (model/hopper/: H100, H200) instead
        of the mma.sync one; convolutions and the memory-intensive operators as they were."""
        layers = [
            Layer(layer.name, as_hopper(layer.workload))
            if getattr(layer.workload, "op", None) in TENSOR_OP.values()
            else layer
            for layer in self.layers
        ]
        note = "GEMMs and BMMs on the Hopper wgmma family (hopper_gemm, hopper_bmm)"
        if self.fuse_swiglu:
            note += "; the gate+up GEMM with its SwiGLU too (hopper_gemm_swiglu)"
        if self.fuse_bias_gelu:
            note += "; FC1 with its bias and GELU too (hopper_gemm_bias_gelu)"
        return dataclasses.replace(self, layers=layers, notes=[*self.notes, note])

    def in_dtype(self, dtype: str) -> Network:
        """The same network with every operator's element type ``dtype`` (float16 or
        bfloat16): each layer's workload again, validated, of that type."""
        if dtype not in DTYPES:
            raise WorkloadError("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if dtype == self.dtype:
            return self
        layers = [
            Layer(layer.name, parse_any_workload({**layer.workload.canonical(), "dtype": dtype}))
            for layer in self.layers
        ]
        return dataclasses.replace(self, layers=layers, dtype=dtype)

    def distinct(self, family: str | None = None) -> list[DistinctShape]:
        """Each distinct workload once, with how often it occurs, in first-use order; only
        one family's when `family` is given."""
        counts: Counter[str] = Counter()
        first: dict[str, AnyWorkload | MemWorkload] = {}
        names: dict[str, list[str]] = {}
        for layer in self.layers if family is None else self.of_family(family):
            key = layer.workload.workload_hash
            counts[key] += 1
            first.setdefault(key, layer.workload)
            group = names.setdefault(key, [])
            if layer.name not in group:
                group.append(layer.name)
        return [DistinctShape(first[k], counts[k], tuple(names[k])) for k in first]


def _transformer(
    name: str,
    batch: int,
    seq: int,
    decode: bool,
    hidden: int,
    heads: int,
    ffn: int,
    blocks: int,
    eps: float,
    gelu: str,
    pre_ln: bool,
    causal: bool,
    fuse_bias_gelu: bool = False,
) -> Network:
    _check_seq(seq)
    queries = _queries(seq, decode)
    tokens = batch * queries
    head_dim = hidden // heads
    qkv = [
        Layer("qkv", gemm(tokens, 3 * hidden, hidden)),
        # Q·Kᵀ over the keys as frameworks hold them (and a KV cache does): sequence-major,
        # each head's B N x K (b_layout nk), not a transposed copy. V is K x N as it is.
        Layer("attn_qk", bmm(batch * heads, queries, seq, head_dim, b_layout="nk")),
        # One softmax row per (sequence, head, query) over the seq keys.
        Layer("attn_softmax", _attention_softmax(batch * heads, queries, seq, head_dim, causal)),
        Layer("attn_sv", bmm(batch * heads, queries, head_dim, seq)),
        Layer("attn_proj", gemm(tokens, hidden, hidden)),
    ]
    # FC1's bias is added with the GELU, by the stitched bias_gelu operator after the plain
    # GEMM, or with fuse_bias_gelu in the GEMM's epilogue (gemm_bias_gelu). The other linear
    # layers' biases are not listed.
    fc1 = (
        [Layer("fc1_bias_gelu", gemm_bias_gelu(tokens, ffn, hidden, approximate=gelu))]
        if fuse_bias_gelu
        else [
            Layer("fc1", gemm(tokens, ffn, hidden)),
            Layer("fc1_bias_gelu", bias_gelu(tokens, ffn, gelu)),
        ]
    )
    mlp = [*fc1, Layer("fc2", gemm(tokens, hidden, ffn))]
    if pre_ln:  # GPT-2: a layer norm before the attention and before the MLP
        ln_1 = Layer("ln_1", layernorm(tokens, hidden, eps))
        ln_2 = Layer("ln_2", layernorm(tokens, hidden, eps))
        per_block = [ln_1, *qkv, ln_2, *mlp]
    else:  # BERT: after each residual add
        ln_attn = Layer("ln_attn", layernorm(tokens, hidden, eps))
        ln_ffn = Layer("ln_ffn", layernorm(tokens, hidden, eps))
        per_block = [*qkv, ln_attn, *mlp, ln_ffn]
    layers = [layer for _ in range(blocks) for layer in per_block]
    form = "erf" if gelu == "none" else gelu
    fc1_text = (
        f"FC1 with its bias and GELU ({form}) in its epilogue (one GEMM, gemm_bias_gelu)"
        if fuse_bias_gelu
        else f"FC1, bias+GELU ({form})"
    )
    notes = [
        f"{blocks} blocks x (QKV, Q·Kᵀ, softmax, S·V, projection, 2 layer norms (eps {eps:g}), "
        f"{fc1_text}, FC2); embeddings, residual adds and the output head are not listed"
    ]
    return Network(
        name, batch, seq, layers, [*notes, *_decode_notes(decode, seq)], decode,
        fuse_bias_gelu=fuse_bias_gelu,
    )  # fmt: skip


def _attention_softmax(
    matrices: int, queries: int, seq: int, head_dim: int, causal: bool
) -> Softmax:
    """The softmax of `matrices` attention matrices of queries x seq scores, scaled by
    1/sqrt(head_dim) as the models do (in the softmax's input, as fused attention does), and
    in a decoder causal: a query sees the keys up to its own position. A decode step's one
    query sees every cached key, so its mask hides nothing and is left out."""
    mask = causal and queries > 1
    return softmax(matrices * queries, seq, 1.0 / math.sqrt(head_dim), causal=mask)


def _queries(seq: int, decode: bool) -> int:
    """The query tokens per sequence: the whole sequence, or a decode step's one new token."""
    return 1 if decode else seq


def _decode_notes(decode: bool, seq: int) -> list[str]:
    if not decode:
        return []
    return [
        f"one decode step: each sequence's new token attends to {seq} cached positions (its "
        "own included); appending its keys and values to the cache is not listed"
    ]


def _check_seq(seq: int) -> None:
    if seq % 8:
        raise WorkloadError(
            "seq",
            f"must be a multiple of 8 (it is the N of Q·Kᵀ and the K of the attention-values "
            f"BMM, leading dimensions the 16-byte loads need aligned), got {seq}",
        )


def _llama(
    name: str,
    batch: int,
    seq: int,
    decode: bool,
    fuse_swiglu: bool,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    blocks: int,
    eps: float,
) -> Network:
    _check_seq(seq)
    queries = _queries(seq, decode)
    tokens = batch * queries
    head_dim = hidden // heads
    # Grouped-query attention: each key/value head serves `group` query heads, whose queries
    # are one BMM's rows against that head's keys (group 1: one BMM per head, as MHA).
    group = heads // kv_heads
    per_block = [
        Layer("input_norm", rmsnorm(tokens, hidden, eps)),
        Layer("qkv", gemm(tokens, hidden + 2 * kv_heads * head_dim, hidden)),
        Layer("attn_qk", bmm(batch * kv_heads, group * queries, seq, head_dim, b_layout="nk")),
        Layer("attn_softmax", _attention_softmax(batch * heads, queries, seq, head_dim, True)),
        Layer("attn_sv", bmm(batch * kv_heads, group * queries, head_dim, seq)),
        Layer("attn_proj", gemm(tokens, hidden, hidden)),
        Layer("post_attention_norm", rmsnorm(tokens, hidden, eps)),
        # gate_proj and up_proj read the same input: one GEMM of both weights, and with
        # fuse_swiglu the SwiGLU in its epilogue (the weights interleaved).
        *(
            [Layer("gate_up_swiglu", gemm_swiglu(tokens, ffn, hidden))]
            if fuse_swiglu
            else [
                Layer("gate_up", gemm(tokens, 2 * ffn, hidden)),
                Layer("swiglu", silu_mul(tokens, ffn)),
            ]
        ),
        Layer("down", gemm(tokens, hidden, ffn)),
    ]
    layers = [layer for _ in range(blocks) for layer in per_block]
    mlp = (
        "gate+up with the SwiGLU in its epilogue (one GEMM, gemm_swiglu: the weights "
        "interleaved in groups of 8)"
        if fuse_swiglu
        else "gate+up (one GEMM), SwiGLU (SiLU(gate)·up)"
    )
    notes = [
        f"{blocks} blocks x (RMS norm (eps {eps:g}), QKV, Q·Kᵀ, softmax, S·V, projection, RMS "
        f"norm, {mlp}, down); the rotary embedding, embeddings, residual adds, the final norm "
        "and the LM head are not listed"
    ]
    if group > 1:
        notes.append(
            f"grouped-query attention: {heads} query heads over {kv_heads} key/value heads; each "
            f"key/value head's {group} query heads are one BMM's rows (M = {group} x "
            + ("1 new token)" if decode else "seq)")
        )
    return Network(
        name, batch, seq, layers, [*notes, *_decode_notes(decode, seq)], decode, fuse_swiglu
    )


def _bottleneck(layers: list[Layer], stage: str, n: int, hw: int, cin: int, mid: int, stride: int):
    """One ResNet-50 v1.5 bottleneck block (the stride sits on the 3×3), with its shortcut
    projection when it changes shape. `hw` is the block's input size."""
    out = 4 * mid
    layers.append(Layer(f"{stage}.conv1x1_reduce", gemm(n * hw * hw, mid, cin)))
    layers.append(Layer(f"{stage}.conv3x3", conv2d(n, hw, hw, mid, mid, 3, 3, stride, 1)))
    hw_out = (hw + 2 - 3) // stride + 1
    layers.append(Layer(f"{stage}.conv1x1_expand", gemm(n * hw_out * hw_out, out, mid)))
    if stride != 1 or cin != out:
        if stride == 1:
            shortcut = gemm(n * hw * hw, out, cin)
        else:  # a strided 1×1 reads every other pixel: an implicit GEMM, not a plain one
            shortcut = conv2d(n, hw, hw, cin, out, 1, 1, stride, 0)
        layers.append(Layer(f"{stage}.downsample", shortcut))
    return out, hw_out


def _resnet50(batch: int) -> Network:
    n = batch
    layers = [Layer("stem.conv7x7", conv2d(n, 224, 224, 8, 64, 7, 7, 2, 3))]
    notes = [
        "stem 7x7/2 conv: input channels padded from 3 to 8 (16-byte cp.async loads need C "
        "to be a multiple of 8); its FLOPs are 8/3 of the real layer's",
        "stride-1 1x1 convolutions as GEMM, strided 1x1 and 3x3 as Conv2D; pooling, "
        "batch-norm and activations are not tensor-core layers here",
    ]
    cin, hw = 64, 56  # after the stem (112) and the 3×3/2 max-pool (56)
    for stage, (mid, blocks, stride) in enumerate(
        [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=2
    ):
        for block in range(blocks):
            cin, hw = _bottleneck(
                layers, f"conv{stage}_x", n, hw, cin, mid, stride if block == 0 else 1
            )
    layers.append(Layer("fc", gemm(n, 1000, 2048)))
    return Network("resnet50", batch, None, layers, notes)


def network(
    name: str,
    batch: int | None = None,
    seq: int | None = None,
    decode: bool = False,
    fuse_swiglu: bool = False,
    dtype: str = "float16",
    fuse_bias_gelu: bool = False,
) -> Network:
    """The tuned operators of `name` at this batch (and sequence length): tensor-core
    layers, and for the transformers their memory-intensive operators too. With `decode`,
    one generation step of a decoder network, `seq` being its context; with `fuse_swiglu`,
    a LLaMA's gate+up GEMM and SwiGLU as one fused GEMM; with `fuse_bias_gelu`, BERT's or
    GPT-2's FC1 with its bias and GELU as one; every operator of `dtype`."""
    if dtype not in DTYPES:
        raise WorkloadError("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if name not in NETWORKS:
        raise WorkloadError("network", f"unknown network {name!r}; known: {', '.join(NETWORKS)}")
    if fuse_swiglu and name not in SWIGLU_NETWORKS:
        raise WorkloadError(
            "fuse_swiglu",
            f"{name} has no SwiGLU to fuse (networks with one: {', '.join(SWIGLU_NETWORKS)})",
        )
    if fuse_bias_gelu and name not in BIAS_GELU_NETWORKS:
        raise WorkloadError(
            "fuse_bias_gelu",
            f"{name} has no bias + GELU after a GEMM to fuse (networks with one: "
            f"{', '.join(BIAS_GELU_NETWORKS)})",
        )
    if decode and name not in DECODERS:
        what = "an encoder" if name in TRANSFORMERS else "not a network of sequences"
        raise WorkloadError(
            "decode",
            f"{name} is {what}: it has no decode step (decoders: {', '.join(DECODERS)})",
        )
    batch = DEFAULT_BATCH[name] if batch is None else batch
    if batch < 1:
        raise WorkloadError("batch", f"must be at least 1, got {batch}")
    if name in TRANSFORMERS:
        seq = DEFAULT_SEQ[name] if seq is None else seq
        if seq < 1:
            raise WorkloadError("seq", f"must be at least 1, got {seq}")
        if seq > MAX_SEQ[name]:
            raise WorkloadError(
                "seq",
                f"{name} takes at most {MAX_SEQ[name]} tokens (its context length), got {seq}",
            )
    try:
        return _layers(name, batch, seq, decode, fuse_swiglu, fuse_bias_gelu).in_dtype(dtype)
    except WorkloadError as exc:
        if exc.field in ("batch", "seq"):
            raise
        # A layer's own check speaks of its operator's fields (m, rows, ...), which the
        # user never gave: say which of theirs made it too large.
        sizes = f"batch {batch}" + (f" x seq {seq}" if name in TRANSFORMERS else "")
        raise WorkloadError(
            "batch/seq" if name in TRANSFORMERS else "batch",
            f"{sizes} is too large for {name}: a layer's {exc.field}: {exc.reason}",
        ) from None


def _layers(
    name: str, batch: int, seq: int | None, decode: bool, fuse_swiglu: bool, fuse_bias_gelu: bool
) -> Network:
    if name == "resnet50":
        return _resnet50(batch)
    assert seq is not None
    # HF LlamaConfig of meta-llama/Llama-2-7b-hf and Llama-2-70b-hf.
    if name == "llama2-7b":
        return _llama(
            name, batch, seq, decode, fuse_swiglu, 4096, heads=32, kv_heads=32, ffn=11008,
            blocks=32, eps=1e-5,
        )  # fmt: skip
    if name == "llama2-70b":
        return _llama(
            name, batch, seq, decode, fuse_swiglu, 8192, heads=64, kv_heads=8, ffn=28672,
            blocks=80, eps=1e-5,
        )  # fmt: skip
    return _transformer(
        name,
        batch,
        seq,
        decode,
        hidden=768,
        heads=12,
        ffn=3072,
        blocks=12,
        eps=LAYERNORM_EPS[name],
        gelu=GELU[name],
        pre_ln=name == "gpt2",
        causal=name in DECODERS,  # GPT-2 attends to earlier tokens only; BERT to all
        fuse_bias_gelu=fuse_bias_gelu,
    )
