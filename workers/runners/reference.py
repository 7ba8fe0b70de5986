"""Inputs, reference results and the fp16 (bf16) tolerance for verifying a tensor-core GEMM
family kernel's output (the family's reference check, model/gemm_family.py).

A bfloat16 workload's inputs and outputs are held as the uint16 of their bits (numpy and
CuPy have no bfloat16: workers/runners/elements.py); everything below holds for it with
bf16's unit roundoff 2^-8 in place of u16 (its outputs are rounded to 8 significant bits).

Written against an array module ``xp`` (CuPy on the GPU, numpy in the tests) so that the
same code that checks kernels on the GPU is tested here on the CPU.

What every family's reference module gives the runners (workers/runners/memops_reference.py
is the other): ``input_buffers(workload, seed)`` (host fp16 arrays by the launch plan's
buffer names), ``reference_method``, ``compute_reference(xp, workload, inputs, preferred)``
(the reference and the per-element tolerance, shaped as the plan's output), ``check`` and
``tolerance_text``.

Reference: the kernel computes C = A·B from fp16 inputs with fp32 accumulation and stores
C in fp16. The reference computes the same product in fp32 from the same fp16 inputs
(``xp.matmul``, cuBLAS on the GPU); a convolution is first lowered to its implicit GEMM by
an explicit im2col of the NHWC (NDHWC) input against the KRSC (KTRSC) filter, or, when
asked (``preferred="cudnn"``, the campaign's correctness phase), computed by cuDNN through
PyTorch: an implementation of convolution that shares nothing with pipetune's.

Tolerance, per output element (u16 = 2^-11, u32 = 2^-24 the unit roundoffs)::

    |C - ref| <= 2·u16·|ref|  +  8·sqrt(K)·u32·(|A|·|B|)  +  2^-14

- 2·u16·|ref|: C is rounded to fp16 once (u16·|ref|); twice that leaves room for the
  reference's own rounding and tensor cores' truncating adds;
- 8·sqrt(K)·u32·(|A|·|B|): fp32 accumulation in a different order than cuBLAS. sqrt(K)
  is the probabilistic bound on rounding errors over K terms (Higham & Mary, 2019), 8 the
  margin; the worst-case bound K·u32 would let real indexing bugs through at large K;
- 2^-14 (fp16's smallest normal) for outputs near zero.

With inputs uniform in [-1, 1) the typical tolerance is ~0.002 at K = 64 and ~0.2 at
K = 13824 (the largest ALCOP operator), while a kernel that drops or repeats one K tile errs
by ~sqrt(BK)/3 (1 to 4) on every output; a correct kernel stays under half the tolerance
(tests/test_runners_cupy.py emulates both).

Deep reductions (EXACT_DEPTH <= K <= 2^24): on uniform inputs |A|·|B| ≈ K/4, so the
tolerance above grows as K^1.5 while a dropped K tile's error does not grow: at K = 2^18 a
kernel that drops its last 64-deep K tile passed it, and at K = 2^24 one that computes a
quarter of K. There the inputs are integers in {-1, 0, 1} instead: every product and every
partial sum is an integer of magnitude at most K <= 2^24, exact in fp32 whatever the order
(split-K, stream-K, tensor cores' truncating adds and the reference's alike), so the
tolerance drops its accumulation term::

    |C - ref| <= 2·u16·|ref|  +  2^-14          (K from 2^16 to 2^24)

and only C's own rounding to fp16 is allowed: a dropped tile (an integer off by ~sqrt(BK))
fails. A fused SwiGLU multiplies two such sums, which passed fp16's range: its integers are
scaled by a power of two (integer_input_scale), exact still. Below 2^16 the inputs stay
uniform, as every measurement the project holds was timed with (its operators have K <=
13824); beyond 2^24 (only a convolution's C·R·S gets there) the uniform inputs and the
first bound apply.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipetune.model.workloads import (
    SWIGLU_INTERLEAVE,
    AnyWorkload,
    Bmm,
    Conv2d,
    Conv3d,
    Gemm,
    GemmBiasGelu,
    GemmSwiglu,
)
from pipetune.workers.runners.elements import UNIT_ROUNDOFF, narrow, widen

U16 = 2.0**-11
U32 = 2.0**-24
ACCUMULATION_MARGIN = 8.0
FLOOR = 2.0**-14
CHUNK_ELEMENTS = 1 << 26  # rows·K of one reference chunk: bounds the im2col copy (256 MB)
TOLERANCE_TEXT = "|C-ref| <= 2*2^-11*|ref| + 8*sqrt(K)*2^-24*(|A|@|B|) + 2^-14 (fp32 reference)"
# Reduction depths whose inputs are integers in {-1, 0, 1}, so that fp32 accumulation is exact
# (the module doc): from where the bound above stops catching a dropped K tile, up to where a
# partial sum could pass 2^24.
EXACT_DEPTH = 1 << 16
EXACT_DEPTH_LIMIT = 1 << 24
EXACT_TOLERANCE_TEXT = (
    "|C-ref| <= 2*2^-11*|ref| + 2^-14 (inputs in {-1, 0, 1}: fp32 accumulation is exact; "
    "fp32 reference)"
)


def exact_depth(k: int) -> bool:
    """Whether a reduction of depth ``k`` is verified on integer inputs (exact sums)."""
    return EXACT_DEPTH <= k <= EXACT_DEPTH_LIMIT


# The most a SwiGLU's gate and up projections spread on integer inputs (exact_depth) once
# scaled by integer_input_scale (8 to 32): silu(gate)·up of a few spreads stays far inside fp16.
SWIGLU_MAX_SPREAD = 32.0


def integer_input_scale(workload: AnyWorkload) -> float:
    """What a deep reduction's integer inputs are multiplied by: 1, or for a fused SwiGLU a
    power of two 2^-s. Unscaled, its gate and up each spread as sqrt(4K/9) (a term is
    non-zero with odds 4/9), so silu(gate)·up reached ~4K/9 >= 29,127 at K = 2^16, past
    fp16's 65,504 on a share of the outputs: a correct kernel stored inf and failed the
    check. A power of two keeps every product and partial sum exact in fp32 (an integer
    below 2^24 times 2^-2s) and both halves of float16 and bfloat16 inputs exact, and it
    scales a dropped K tile's error as it scales the sums: the check catches what it did."""
    k = workload.gemm_view().k
    if not isinstance(workload, GemmSwiglu) or not exact_depth(k):
        return 1.0
    spread = math.sqrt(4 * k / 9)
    s = max(0, math.ceil(math.log2(spread / SWIGLU_MAX_SPREAD) / 2))
    return 2.0**-s


def operand_shapes(workload: AnyWorkload) -> tuple[tuple[int, ...], ...]:
    """Shapes of A, B and C as the kernels take them (row-major)."""
    w = workload
    if isinstance(w, Gemm | GemmBiasGelu):  # the bias: N elements (bias_shape)
        b = (w.k, w.n) if w.b_layout == "kn" else (w.n, w.k)
        return (w.m, w.k), b, (w.m, w.n)
    if isinstance(w, GemmSwiglu):  # B holds both projections, interleaved
        b = (w.k, 2 * w.n) if w.b_layout == "kn" else (2 * w.n, w.k)
        return (w.m, w.k), b, (w.m, w.n)
    if isinstance(w, Bmm):
        b = (w.b, w.k, w.n) if w.b_layout == "kn" else (w.b, w.n, w.k)
        return (w.b, w.m, w.k), b, (w.b, w.m, w.n)
    if isinstance(w, Conv2d):
        p, q = w.out_hw
        return (w.n, w.h, w.w, w.c), (w.k, w.r, w.s, w.c), (w.n, p, q, w.k)
    if isinstance(w, Conv3d):
        o, p, q = w.out_dhw
        return (w.n, w.d, w.h, w.w, w.c), (w.k, w.t, w.r, w.s, w.c), (w.n, o, p, q, w.k)
    raise TypeError(f"unsupported workload {type(w).__name__}")


def make_inputs(workload: AnyWorkload, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A and B in the workload's dtype, uniform in [-1, 1) (integers in {-1, 0, 1} for a
    deep reduction: exact_depth, times integer_input_scale), from numpy's PCG64 with this
    seed (host arrays, so the inputs are the same whatever the GPU or CuPy version).
    float16 as numpy's float16; bfloat16 as the uint16 of its bits
    (workers/runners/elements.py), the same draws rounded to bfloat16."""
    rng = np.random.default_rng(seed)
    shape_a, shape_b, _ = operand_shapes(workload)
    k = workload.gemm_view().k
    if exact_depth(k):
        scale = np.float32(integer_input_scale(workload))
        a32 = rng.integers(-1, 2, shape_a, dtype=np.int8).astype(np.float32) * scale
        b32 = rng.integers(-1, 2, shape_b, dtype=np.int8).astype(np.float32) * scale
    else:
        a32 = rng.random(shape_a, dtype=np.float32) * 2 - 1
        b32 = rng.random(shape_b, dtype=np.float32) * 2 - 1
    return narrow(np, a32, workload.dtype), narrow(np, b32, workload.dtype)


def _windows(xp: Any, x: Any, filt: tuple[int, ...], out: tuple[int, ...], stride: int, pad: int):
    """im2col of a channels-last batch x (n, *spatial, C): rows (n·prod(out)), columns
    (prod(filt)·C) in filter order then channel, as the KRSC filter is laid out."""
    spatial = len(filt)
    x = xp.pad(x, [(0, 0)] + [(pad, pad)] * spatial + [(0, 0)])
    columns = []
    for offset in np.ndindex(*filt):
        index = (slice(None),)
        for o, size in zip(offset, out, strict=True):
            index += (slice(o, o + stride * (size - 1) + 1, stride),)
        columns.append(x[index])
    n, c = x.shape[0], x.shape[-1]
    cols = xp.stack(columns, axis=1 + spatial)  # (n, *out, prod(filt), C)
    return cols.reshape(n * math.prod(out), math.prod(filt) * c)


def _gemm_chunks(xp: Any, workload: AnyWorkload, a: Any, b: Any):
    """(row slice of C viewed as (rows, N), A chunk (rows, K) fp32, B (K, N) fp32, a view of
    an N x K B transposed), each
    widened from the inputs as stored (float16, or bfloat16's bits) one chunk at a time."""
    w = workload
    if isinstance(w, Gemm | GemmSwiglu | GemmBiasGelu):
        b2 = widen(xp, b) if w.b_layout == "kn" else widen(xp, b).T
        rows = max(1, CHUNK_ELEMENTS // w.k)
        for start in range(0, w.m, rows):
            yield slice(start, min(w.m, start + rows)), widen(xp, a[start : start + rows]), b2
    elif isinstance(w, Bmm):
        for i in range(w.b):
            rows = slice(i * w.m, (i + 1) * w.m)
            b2 = widen(xp, b[i]) if w.b_layout == "kn" else widen(xp, b[i]).T
            yield rows, widen(xp, a[i]), b2
    elif isinstance(w, Conv2d | Conv3d):
        filt = (w.r, w.s) if isinstance(w, Conv2d) else (w.t, w.r, w.s)
        out = w.out_hw if isinstance(w, Conv2d) else w.out_dhw
        b2 = widen(xp, b.reshape(w.k, -1)).T
        per_image = math.prod(out)
        images = max(1, CHUNK_ELEMENTS // (per_image * b2.shape[0]))
        for start in range(0, w.n, images):
            stop = min(w.n, start + images)
            cols = _windows(xp, widen(xp, a[start:stop]), filt, out, w.stride, w.pad)
            yield slice(start * per_image, stop * per_image), cols, b2
    else:
        raise TypeError(f"unsupported workload {type(w).__name__}")


def tolerance(xp: Any, product: Any, magnitude: Any | None, k: int, unit: float = U16) -> Any:
    """The per-element tolerance (see the module doc) of a product computed in fp32 over a
    reduction of depth ``k``, given ``magnitude`` = |A|·|B| over the same terms, for an
    output rounded to a type of unit roundoff ``unit`` (2^-11 fp16, 2^-8 bf16). A deep
    reduction's inputs are integers (make_inputs): its sums are exact, only C's rounding
    is allowed."""
    if exact_depth(k):
        return 2 * unit * xp.abs(product) + FLOOR
    accumulation = ACCUMULATION_MARGIN * math.sqrt(k) * U32
    return 2 * unit * xp.abs(product) + accumulation * magnitude + FLOOR


def reference(
    xp: Any, workload: AnyWorkload, a: Any, b: Any, bias: Any | None = None
) -> tuple[Any, Any]:
    """(ref, tol): the fp32 reference and the per-element tolerance, both shaped like C.
    ``a`` and ``b`` (and a GemmBiasGelu's ``bias``) as make_inputs and make_bias store them
    (bfloat16 as its bits), or already float32."""
    if isinstance(workload, GemmBiasGelu) and bias is None:
        raise ValueError(f"{workload.label()} needs its bias")
    view = workload.gemm_view()
    unit = UNIT_ROUNDOFF[workload.dtype]
    rows_total = view.batch * view.m
    shape_c = operand_shapes(workload)[2]
    ref = xp.empty((rows_total, shape_c[-1]), dtype=xp.float32)
    tol = xp.empty((rows_total, shape_c[-1]), dtype=xp.float32)
    for rows, a2, b2 in _gemm_chunks(xp, workload, a, b):
        product = xp.matmul(a2, b2)
        # A deep reduction's exact sums need no magnitude term (tolerance): not computed.
        magnitude = None if exact_depth(view.k) else xp.matmul(xp.abs(a2), xp.abs(b2))
        if isinstance(workload, GemmSwiglu):
            ref[rows], tol[rows] = swiglu_reference(xp, product, magnitude, view.k, unit)
            continue
        if isinstance(workload, GemmBiasGelu):
            ref[rows], tol[rows] = bias_gelu_reference(
                xp, product, magnitude, widen(xp, bias), workload.approximate, view.k, unit
            )
            continue
        ref[rows] = product
        tol[rows] = tolerance(xp, product, magnitude, view.k, unit)
    return ref.reshape(shape_c), tol.reshape(shape_c)


def split_gate_up(xp: Any, columns: Any) -> tuple[Any, Any]:
    """The gate's and the up projection's halves of a (rows, 2n) array whose columns
    interleave them in groups of SWIGLU_INTERLEAVE (model/workloads.py GemmSwiglu)."""
    rows, width = columns.shape
    groups = columns.reshape(rows, width // (2 * SWIGLU_INTERLEAVE), 2, SWIGLU_INTERLEAVE)
    return groups[:, :, 0, :].reshape(rows, -1), groups[:, :, 1, :].reshape(rows, -1)


def silu(xp: Any, x: Any) -> Any:
    """x·sigmoid(x) in x's precision, without overflow: exp of -|x| only."""
    e = xp.exp(-xp.abs(x))
    return x * xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def swiglu_reference(
    xp: Any, product: Any, magnitude: Any | None, k: int, unit: float = U16
) -> tuple[Any, Any]:
    """(ref, tol) of the fused GEMM + SwiGLU from the fp32 product of both projections.

    y = silu(g)·u. The kernel gates its own f32 accumulators, so g and u carry the GEMM's
    accumulation error e_g, e_u (the tolerance's second term, per column) and y is rounded
    once. |d silu / dg| = |s(1 + g(1 - s))| <= 1.1 (s the sigmoid), so

        |y - ref| <= 2·u16·|ref| + 1.1·|u|·e_g + |silu(g)|·e_u + 2^-14

    (e = 0 on a deep reduction's integer inputs, whose sums are exact; ``unit`` in place of
    u16 for bfloat16)."""
    g, u = split_gate_up(xp, product)
    gated = silu(xp, g)
    ref = gated * u
    tol = 2 * unit * xp.abs(ref) + FLOOR
    if magnitude is not None and not exact_depth(k):
        e_g, e_u = split_gate_up(xp, ACCUMULATION_MARGIN * math.sqrt(k) * U32 * magnitude)
        tol = tol + 1.1 * xp.abs(u) * e_g + xp.abs(gated) * e_u
    return ref, tol


# GELU's largest slope, max |d gelu / dz| over z (erf form 1.1289 at z = 1.4142, tanh form
# 1.1297 at z = 1.4335): how much of the GEMM's accumulation error reaches its output.
GELU_SLOPE = 1.13
# What f32 GELU's own evaluation may err by, as a share of |z| (erff's and tanhf's few ulps,
# scaled by 0.5·|z|, and the tanh form's cube): a small multiple of f32's unit roundoff.
GELU_F32_ERROR = 2.0**-20


def gelu(xp: Any, z: Any, approximate: str) -> Any:
    """GELU of a float32 array in float32, as torch.nn.functional.gelu(z, approximate=...)
    defines it: erf's form ("none") or tanh's. Every family's reference uses this one."""
    f32 = xp.float32
    if approximate == "tanh":
        inner = f32(0.7978845608028654) * (z + f32(0.044715) * z * z * z)
        return 0.5 * z * (1 + xp.tanh(inner))
    return 0.5 * z * (1 + _erf(xp, z * f32(0.7071067811865476)))


def _erf(xp: Any, z: Any) -> Any:
    if xp is np:
        from scipy.special import erf

        return erf(z).astype(np.float32)
    from cupyx.scipy.special import erf  # CuPy's, on the device

    return erf(z)


def bias_gelu_reference(
    xp: Any,
    product: Any,
    magnitude: Any | None,
    bias: Any,
    approximate: str,
    k: int,
    unit: float = U16,
) -> tuple[Any, Any]:
    """(ref, tol) of C = gelu(A·B + bias) from the fp32 product and the bias in f32.

    The kernel adds the bias to its own f32 accumulators (error e, the tolerance's second
    term; 0 on a deep reduction's integer inputs) and rounds GELU's f32 value once, so

        |y - ref| <= 2·u16·|ref| + 1.13·e + 2^-20·|z| + 2^-14

    with z = A·B + bias (1.13: GELU_SLOPE; 2^-20·|z|: GELU_F32_ERROR; ``unit`` in place of
    u16 for bfloat16)."""
    z = product + bias[None, :]
    ref = gelu(xp, z, approximate)
    tol = 2 * unit * xp.abs(ref) + GELU_F32_ERROR * xp.abs(z) + FLOOR
    if magnitude is not None and not exact_depth(k):
        tol = tol + GELU_SLOPE * ACCUMULATION_MARGIN * math.sqrt(k) * U32 * magnitude
    return ref, tol


def check(xp: Any, c: Any, ref: Any, tol: Any) -> tuple[bool, float | None, str | None]:
    """(passed, max |C - ref| or None if C has non-finite values, why it failed). ``c`` as
    the kernel stored it: float16, or bfloat16's bits as uint16."""
    values = widen(xp, c)
    kind = "bf16" if c.dtype == xp.uint16 else "fp16"
    finite = xp.isfinite(values)
    bad_values = int(values.size - int(xp.count_nonzero(finite)))
    if bad_values:
        return (
            False,
            None,
            f"{bad_values} of {values.size} outputs are NaN or infinite "
            "(NaN: outputs the kernel never wrote)",
        )
    bad_tolerances = int(tol.size - int(xp.count_nonzero(xp.isfinite(tol))))
    if bad_tolerances:
        # A NaN tolerance compares false with every difference: it would pass any output.
        return (
            False,
            None,
            f"{bad_tolerances} of {tol.size} tolerances are NaN or infinite: the reference "
            "cannot judge this output",
        )
    diff = xp.abs(values - ref)
    max_error = float(diff.max())
    over = int(xp.count_nonzero(diff > tol))
    if over:
        worst = int(xp.argmax(diff / tol))  # the element furthest outside its tolerance
        where = tuple(int(i) for i in np.unravel_index(worst, values.shape))
        return (
            False,
            max_error,
            f"{over} of {values.size} outputs outside the {kind} tolerance; worst at {where}: "
            f"|C - ref| = {float(diff.ravel()[worst]):.4g} (ref {float(ref.ravel()[worst]):.4g}, "
            f"tolerance {float(tol.ravel()[worst]):.4g})",
        )
    return True, max_error, None


# How a convolution's reference may be computed: the im2col product through cuBLAS, or cuDNN.
CONV_REFERENCES = ("cublas", "cudnn")


def make_bias(workload: GemmBiasGelu, seed: int) -> np.ndarray:
    """A GemmBiasGelu's bias in its dtype, from a stream of its own (A's and B's draws stay
    those of the plain GEMM with this seed): uniform in [-1, 1), or integers in {-1, 0, 1}
    where A and B are (exact_depth)."""
    rng = np.random.default_rng([seed, 1])
    if exact_depth(workload.k):
        bias32 = rng.integers(-1, 2, workload.n, dtype=np.int8).astype(np.float32)
    else:
        bias32 = rng.random(workload.n, dtype=np.float32) * 2 - 1
    return narrow(np, bias32, workload.dtype)


def input_buffers(workload: AnyWorkload, seed: int) -> dict[str, np.ndarray]:
    """The inputs by the launch plan's buffer names (A, B; and a GemmBiasGelu's bias):
    make_inputs's arrays, and make_bias's."""
    a, b = make_inputs(workload, seed)
    if isinstance(workload, GemmBiasGelu):
        return {"A": a, "B": b, "bias": make_bias(workload, seed)}
    return {"A": a, "B": b}


SWIGLU_TOLERANCE_TEXT = (
    "|C-ref| <= 2*2^-11*|ref| + 1.1*|up|*e(gate) + |silu(gate)|*e(up) + 2^-14, e = "
    "8*sqrt(K)*2^-24*(|A|@|B|) of that column (0 on integer inputs); fp32 reference"
)
# (Said of a deep reduction: its inputs are scaled (integer_input_scale), and the text is
# part of the cached reference's key, so no reference of the unscaled inputs is read back.)
SWIGLU_SCALED_TEXT = " (integer inputs times 2^-s: gate and up spread at most 32)"


BIAS_GELU_TOLERANCE_TEXT = (
    "|C-ref| <= 2*2^-11*|ref| + 1.13*8*sqrt(K)*2^-24*(|A|@|B|) + 2^-20*|A@B+bias| + 2^-14 "
    "(the accumulation term 0 on integer inputs); fp32 reference"
)


def tolerance_text(workload: AnyWorkload) -> str:
    if isinstance(workload, GemmSwiglu):
        text = SWIGLU_TOLERANCE_TEXT
        if exact_depth(workload.gemm_view().k):
            text += SWIGLU_SCALED_TEXT
    elif isinstance(workload, GemmBiasGelu):
        text = BIAS_GELU_TOLERANCE_TEXT
    else:
        text = EXACT_TOLERANCE_TEXT if exact_depth(workload.gemm_view().k) else TOLERANCE_TEXT
    # The rounding term's unit roundoff is the output type's (every text writes fp16's).
    return text if workload.dtype == "float16" else text.replace("2*2^-11*", "2*2^-8*", 1)


def reference_method(workload: AnyWorkload, preferred: str = "cublas") -> str:
    """How the reference of a workload is computed: "cublas" (GEMM, BMM), "cublas-im2col" or
    "cudnn" (convolutions, as ``preferred`` asks)."""
    if preferred not in CONV_REFERENCES:
        raise ValueError(f"conv_reference must be one of {CONV_REFERENCES}")
    if workload.op not in ("conv2d", "conv3d"):
        return "cublas"
    return "cudnn" if preferred == "cudnn" else "cublas-im2col"


def cudnn_reference(cupy: Any, workload: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """(ref, tol) of a convolution through cuDNN (PyTorch): channels-last tensors, fp32 math
    on the fp16 inputs with TF32 off, and |x|*|w| through the same convolution for the
    tolerance's magnitude term. CuPy arrays in and out (on a GPU only)."""
    import torch
    import torch.nn.functional as functional

    torch.backends.cudnn.allow_tf32 = False
    spatial = a.ndim - 2
    cupy.cuda.Device().synchronize()
    x, w = torch.from_dlpack(a), torch.from_dlpack(b)
    # NHWC (NDHWC) storage seen as NCHW (NCDHW): the channels-last layout cuDNN takes as is.
    channels_first = (0, spatial + 1, *range(1, spatial + 1))
    x32, w32 = x.permute(*channels_first).float(), w.permute(*channels_first).float()
    conv = functional.conv2d if spatial == 2 else functional.conv3d
    with torch.no_grad():
        product = conv(x32, w32, stride=workload.stride, padding=workload.pad)
        magnitude = conv(x32.abs(), w32.abs(), stride=workload.stride, padding=workload.pad)
    channels_last = (0, *range(2, spatial + 2), 1)
    product = product.permute(*channels_last).contiguous()
    magnitude = magnitude.permute(*channels_last).contiguous()
    torch.cuda.synchronize()
    ref = cupy.array(cupy.from_dlpack(product), copy=True)
    unit = UNIT_ROUNDOFF[workload.dtype]
    tol = tolerance(cupy, ref, cupy.from_dlpack(magnitude), workload.gemm_view().k, unit)
    cupy.cuda.Device().synchronize()
    del x, w, x32, w32, product, magnitude
    torch.cuda.empty_cache()
    return ref.astype(cupy.float32, copy=False), tol.astype(cupy.float32, copy=False)


def compute_reference(
    xp: Any, workload: AnyWorkload, inputs: dict[str, Any], preferred: str = "cublas"
) -> tuple[Any, Any, str, str | None]:
    """(ref, tol, method used, why the preferred method was not used): cuDNN where asked and
    it can run, else the fp32 product through ``xp.matmul``."""
    method = reference_method(workload, preferred)
    a, b = inputs["A"], inputs["B"]
    why = None
    if method == "cudnn":
        try:
            # bfloat16's bits widened for PyTorch; float16 as it is (converted there).
            x, w = (a, b) if workload.dtype == "float16" else (widen(xp, a), widen(xp, b))
            ref, tol = cudnn_reference(xp, workload, x, w)
            return ref, tol, method, None
        except Exception as exc:  # no PyTorch or no cuDNN here: the cuBLAS reference stands in
            why = f"cuDNN reference unavailable ({type(exc).__name__}: {exc})"
    ref, tol = reference(xp, workload, a, b, inputs.get("bias"))
    return ref, tol, reference_method(workload, "cublas"), why
