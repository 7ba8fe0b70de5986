"""Kernel variants: which workloads map to which kernel, and the launch arguments of each.

Every variant's kernel takes ``(const __half* A, const __half* B, __half* C, int...)`` (the
bias variants a bias pointer after C); the int32 scalars follow in the order of
:data:`SCALAR_ARGS`:

- ``gemm_kn``: C[M,N] = A[M,K] @ B[K,N], all row-major. Scalars ``(M, N, K)``.
- ``gemm_nk``: C[M,N] = A[M,K] @ B[N,K]^T (B row-major N×K). Scalars ``(M, N, K)``.
- ``gemm_swiglu_kn`` / ``gemm_swiglu_nk``: the GEMM of ``gemm_kn`` / ``gemm_nk`` over B's
  2n interleaved gate and up columns, C[M, N/2] = silu(gate) · up in the epilogue
  (model/workloads.py GemmSwiglu). Scalars ``(M, N, K)`` with N = 2n, the GEMM's.
- ``gemm_bias_gelu_kn`` / ``gemm_bias_gelu_nk``: the GEMM of ``gemm_kn`` / ``gemm_nk`` with
  C = gelu(A @ B + bias) in the epilogue (model/workloads.py GemmBiasGelu). A fourth pointer,
  ``bias`` (N elements), follows C (``pointer_args``); scalars ``(M, N, K, gelu_tanh)``, the
  last 1 for GELU's tanh form and 0 for erf's (an argument, not a constant of the source, so
  one cubin serves both forms).
- ``bmm``: per batch z (grid z), C_z = A_z @ B_z with A, B, C packed contiguously
  (element strides M·K, K·N, M·N between batch entries). Scalars ``(M, N, K)``.
- ``bmm_nk``: ``bmm`` with each B_z stored N×K (C_z = A_z @ B_zᵀ; the same strides).
- ``conv2d``: A = input NHWC, B = filter KRSC, C = output NPQK (row-major
  (N·P·Q)×K). Scalars ``(batch, in_h, in_w, chan, out_k, f_r, f_s, out_p, out_q, stride,
  pad)``: the sizes N, H, W, C, K, R, S, P and Q under the kernel's own parameter names,
  which the launch document repeats (``C`` names the output only); then the division
  constants of Q, P, C, S and R (see below).
- ``conv3d``: A = input NDHWC, B = filter KTRSC, C = output NOPQK. Scalars
  ``(batch, in_d, in_h, in_w, chan, out_k, f_t, f_r, f_s, out_o, out_p, out_q, stride,
  pad)``, then the division constants of Q, P, O, C, S and R.

A convolution kernel divides by the output and filter sizes with a multiplication
(``CONV_DIVISORS``): for each such size d it takes ``d_mul`` and ``d_shift`` (d in lower
case: ``q_mul``, ``q_shift``, ...)
(workers/codegen/layout.py ``fast_divmod_params``; the multiplier, up to 2^32 - 1, is passed
as the int32 with the same 32 bits). ``scalar_args`` computes them from the shape.

The grid is ``(tiles_m · tiles_n, 1, batch)``: the M and N tiles are flattened into x
(the kernel decodes them; x allows 2^31-1 blocks where y and z allow 65535).
"""

from __future__ import annotations

from pipetune.model.workloads import (
    AnyWorkload,
    Bmm,
    Conv2d,
    Conv3d,
    Gemm,
    GemmBiasGelu,
    GemmSwiglu,
)
from pipetune.workers.codegen.layout import fast_divmod_params

VARIANTS: tuple[str, ...] = (
    "gemm_kn", "gemm_nk", "gemm_swiglu_kn", "gemm_swiglu_nk", "gemm_bias_gelu_kn",
    "gemm_bias_gelu_nk", "bmm", "bmm_nk", "conv2d", "conv3d"
)  # fmt: skip
# The batched variants: B's layouts of one loop whose grid z walks the batch.
BMM_VARIANTS: tuple[str, ...] = ("bmm", "bmm_nk")
# The variants whose epilogue gates interleaved gate and up columns (C is N/2 wide).
SWIGLU_VARIANTS: tuple[str, ...] = ("gemm_swiglu_kn", "gemm_swiglu_nk")
# The variants whose epilogue adds a bias of N elements and applies GELU.
BIAS_GELU_VARIANTS: tuple[str, ...] = ("gemm_bias_gelu_kn", "gemm_bias_gelu_nk")
# Every variant of a plain (unbatched, unconvolved) GEMM's loop, whatever its epilogue.
GEMM_LOOP_VARIANTS: tuple[str, ...] = ("gemm_kn", "gemm_nk", *SWIGLU_VARIANTS, *BIAS_GELU_VARIANTS)


def pointer_args(variant: str) -> tuple[str, ...]:
    """A variant's pointer parameters, in order, before its int32 scalars."""
    return ("A", "B", "C", "bias") if variant in BIAS_GELU_VARIANTS else ("A", "B", "C")


# The shape scalars of each variant, in order.
SHAPE_ARGS: dict[str, tuple[str, ...]] = {
    "gemm_kn": ("M", "N", "K"),
    "gemm_nk": ("M", "N", "K"),
    "gemm_swiglu_kn": ("M", "N", "K"),
    "gemm_swiglu_nk": ("M", "N", "K"),
    "gemm_bias_gelu_kn": ("M", "N", "K"),
    "gemm_bias_gelu_nk": ("M", "N", "K"),
    "bmm": ("M", "N", "K"),
    "bmm_nk": ("M", "N", "K"),
    # The kernel's own parameter names (workers/codegen/cuda_text.py's ConvShape): the launch
    # document names each argument so, and the output buffer is C, not the channel count.
    "conv2d": ("batch", "in_h", "in_w", "chan", "out_k", "f_r", "f_s", "out_p", "out_q",
               "stride", "pad"),
    "conv3d": ("batch", "in_d", "in_h", "in_w", "chan", "out_k", "f_t", "f_r", "f_s", "out_o",
               "out_p", "out_q", "stride", "pad"),
}  # fmt: skip
# The sizes a convolution kernel divides by (a GEMM row into output coordinates, a column
# into filter tap and channel), each by its letter in the division constants' names and its
# SHAPE_ARGS name; a 2-D convolution has one depth slice, O = 1.
CONV_DIVISORS: dict[str, dict[str, str]] = {
    "conv2d": {"q": "out_q", "p": "out_p", "c": "chan", "s": "f_s", "r": "f_r"},
    "conv3d": {"q": "out_q", "p": "out_p", "o": "out_o", "c": "chan", "s": "f_s", "r": "f_r"},
}


def divisor_args(variant: str) -> tuple[str, ...]:
    """The names of a variant's division constants, in order: ``d_mul`` and ``d_shift`` for
    each size d of CONV_DIVISORS (none for a GEMM)."""
    return tuple(f"{d}_{part}" for d in CONV_DIVISORS.get(variant, {}) for part in ("mul", "shift"))


# Scalars after the shape's that choose what an epilogue computes: GELU's form (1 tanh, 0 erf).
EPILOGUE_ARGS: dict[str, tuple[str, ...]] = {v: ("gelu_tanh",) for v in BIAS_GELU_VARIANTS}

SCALAR_ARGS: dict[str, tuple[str, ...]] = {
    variant: names + divisor_args(variant) + EPILOGUE_ARGS.get(variant, ())
    for variant, names in SHAPE_ARGS.items()
}


def variant_of(workload: AnyWorkload) -> str:
    """The kernel variant that computes a workload."""
    if isinstance(workload, Gemm):
        return "gemm_kn" if workload.b_layout == "kn" else "gemm_nk"
    if isinstance(workload, GemmSwiglu):
        return "gemm_swiglu_kn" if workload.b_layout == "kn" else "gemm_swiglu_nk"
    if isinstance(workload, GemmBiasGelu):
        return "gemm_bias_gelu_kn" if workload.b_layout == "kn" else "gemm_bias_gelu_nk"
    if isinstance(workload, Bmm):
        # "bmm" for K x N: the name every kn BMM's kernel, cubin and export had before nk.
        return "bmm" if workload.b_layout == "kn" else "bmm_nk"
    if isinstance(workload, Conv2d):
        return "conv2d"
    if isinstance(workload, Conv3d):
        return "conv3d"
    raise TypeError(f"no kernel variant for {type(workload).__name__}")


def b_is_kn(variant: str) -> bool:
    """Whether the variant's B operand is stored K×N (else N×K, as a conv filter is)."""
    return variant in ("gemm_kn", "gemm_swiglu_kn", "gemm_bias_gelu_kn", "bmm")


def b_layout_of(variant: str) -> str:
    """How the variant's B operand is stored, as the workloads' ``b_layout`` says it."""
    return "kn" if b_is_kn(variant) else "nk"


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; known: {', '.join(VARIANTS)}")
    return variant


def scalar_args(workload: AnyWorkload) -> tuple[int, ...]:
    """The int32 kernel arguments after the pointers, in SCALAR_ARGS order."""
    if isinstance(workload, Gemm | Bmm):
        return (workload.m, workload.n, workload.k)
    if isinstance(workload, GemmSwiglu):
        return (workload.m, 2 * workload.n, workload.k)  # the GEMM's N: both projections
    if isinstance(workload, GemmBiasGelu):
        return (workload.m, workload.n, workload.k, int(workload.approximate == "tanh"))
    w = workload
    if isinstance(w, Conv2d):
        p, q = w.out_hw
        shape = (w.n, w.h, w.w, w.c, w.k, w.r, w.s, p, q, w.stride, w.pad)
    elif isinstance(w, Conv3d):
        o, p, q = w.out_dhw
        shape = (w.n, w.d, w.h, w.w, w.c, w.k, w.t, w.r, w.s, o, p, q, w.stride, w.pad)
    else:
        raise TypeError(f"no kernel variant for {type(workload).__name__}")
    variant = variant_of(w)
    sizes = dict(zip(SHAPE_ARGS[variant], shape, strict=True))
    return shape + tuple(
        _int32_bits(value)
        for size in CONV_DIVISORS[variant].values()
        for value in fast_divmod_params(sizes[size])
    )


def _int32_bits(value: int) -> int:
    """The int32 whose 32 bits are those of an unsigned value below 2^32."""
    if not 0 <= value < 1 << 32:
        raise ValueError(f"{value} does not fit 32 bits")
    return value - (1 << 32) if value >= 1 << 31 else value
