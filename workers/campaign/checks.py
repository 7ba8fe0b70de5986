"""The probe's library checks, written against an array module ``xp`` so that the GPU side
runs them with CuPy (cuBLAS, CuPy's own NVRTC-built elementwise kernels) and the CPU
rehearsal and the tests run the same comparisons with numpy.

- ``matmul_fp32``, ``matmul_fp16``: a small product through ``xp.matmul`` (cuBLAS on the
  GPU) against numpy's float64 product of the same values;
- ``fp16_cast``: float32 -> float16 on the device equals numpy's rounding, bit for bit;
- ``bf16_bits``: the runners' bfloat16 conversions (workers/runners/elements.py, integer
  arithmetic on uint16 bits, as CuPy has no bfloat16) give on the device what they give on
  the host, bit for bit: every bf16 pattern widened, and float32s narrowed (ties, overflow,
  subnormals, NaN). Not required: only the bfloat16 kernels' checks depend on it;
- ``conv_fp16`` (when a convolution is given): a small channels-last fp16 convolution
  against a direct float64 one.

Each answers {"ok": bool, "max_rel_error" or "mismatches", "error"?}; a check that raises
answers ok False with the error, so the probe can say which library failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pipetune.workers.runners import elements

FP32_BOUND = 1e-5  # relative error of a K=48 fp32 product (cuBLAS may use other orders)
FP16_BOUND = 2e-2  # fp16 inputs and output, fp32 or fp16 accumulation: about 2^-8 relative


def _relative_error(got: np.ndarray, exact: np.ndarray) -> float:
    scale = float(np.abs(exact).max()) or 1.0
    return float(np.abs(got.astype(np.float64) - exact).max() / scale)


def _guarded(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return check()
    except Exception as exc:  # the library is missing or broken: that is the finding
        return {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}


def matmul_checks(xp: Any, to_host: Callable[[Any], np.ndarray]) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (64, 48)).astype(np.float32)
    b = rng.uniform(-1, 1, (48, 40)).astype(np.float32)

    def fp32() -> dict[str, Any]:
        got = to_host(xp.matmul(xp.asarray(a), xp.asarray(b)))
        error = _relative_error(got, a.astype(np.float64) @ b.astype(np.float64))
        return {"ok": error <= FP32_BOUND, "max_rel_error": error, "bound": FP32_BOUND}

    def fp16() -> dict[str, Any]:
        a16, b16 = a.astype(np.float16), b.astype(np.float16)
        got = to_host(xp.matmul(xp.asarray(a16), xp.asarray(b16)))
        if got.dtype != np.float16:
            return {"ok": False, "error": f"an fp16 product came back as {got.dtype}"}
        error = _relative_error(got, a16.astype(np.float64) @ b16.astype(np.float64))
        return {"ok": error <= FP16_BOUND, "max_rel_error": error, "bound": FP16_BOUND}

    def cast() -> dict[str, Any]:
        # Beyond the float16 range (70000 -> inf) and below it (1e-8 -> 0) on purpose.
        values = np.concatenate([a.ravel(), np.float32([65504.0, 1e-8, -0.0, 70000.0])])
        with np.errstate(over="ignore"):
            got = to_host(xp.asarray(values).astype(xp.float16))
            expected = values.astype(np.float16)
        differ = int(np.count_nonzero(got.view(np.uint16) != expected.view(np.uint16)))
        return {"ok": differ == 0, "mismatches": differ, "values": int(values.size)}

    def bf16_bits() -> dict[str, Any]:
        patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        wide = to_host(elements.widen(xp, xp.asarray(patterns)))
        expected = elements.widen(np, patterns)
        differ = int(np.count_nonzero(wide.view(np.uint32) != expected.view(np.uint32)))
        # Ties both ways (low half 0x8000), values beside them, and the edges of the range.
        ties = (np.arange(0x3F800000, 0x3F800000 + (256 << 16), 1 << 15, dtype=np.uint32)).view(
            np.float32
        )
        edges = np.float32([3.3895e38, 3.4e38, -3.4e38, 1e-40, -0.0, np.inf, -np.inf, np.nan])
        values = np.concatenate([a.ravel(), ties, edges])
        narrow = to_host(elements.narrow(xp, xp.asarray(values), "bfloat16"))
        differ += int(np.count_nonzero(narrow != elements.narrow(np, values, "bfloat16")))
        return {"ok": differ == 0, "mismatches": differ, "values": int(patterns.size + values.size)}

    return {
        "matmul_fp32": _guarded(fp32),
        "matmul_fp16": _guarded(fp16),
        "fp16_cast": _guarded(cast),
        "bf16_bits": _guarded(bf16_bits),
    }


def direct_conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """NHWC x KRSC -> NPQK in float64, tap by tap (independent of any im2col)."""
    x64 = np.pad(x.astype(np.float64), [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    k, r, s, _ = w.shape
    p = (x64.shape[1] - r) // stride + 1
    q = (x64.shape[2] - s) // stride + 1
    out = np.zeros((x.shape[0], p, q, k))
    for i in range(r):
        for j in range(s):
            window = x64[
                :, i : i + stride * (p - 1) + 1 : stride, j : j + stride * (q - 1) + 1 : stride
            ]
            out += np.tensordot(window, w[:, i, j, :].astype(np.float64), ([-1], [-1]))
    return out


CONV_CASE = {"n": 2, "h": 9, "w": 7, "c": 16, "k": 24, "r": 3, "s": 3, "stride": 2, "pad": 1}


def conv_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    c = CONV_CASE
    x = rng.uniform(-1, 1, (c["n"], c["h"], c["w"], c["c"])).astype(np.float16)
    w = rng.uniform(-1, 1, (c["k"], c["r"], c["s"], c["c"])).astype(np.float16)
    return x, w


def conv_check(run: Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]) -> dict[str, Any]:
    """``run(x NHWC, w KRSC, stride, pad)`` -> NPQK fp16, against the direct convolution."""

    def check() -> dict[str, Any]:
        x, w = conv_inputs()
        got = run(x, w, CONV_CASE["stride"], CONV_CASE["pad"])
        exact = direct_conv2d(x, w, CONV_CASE["stride"], CONV_CASE["pad"])
        if got.shape != exact.shape:
            return {"ok": False, "error": f"shape {got.shape}, expected {exact.shape}"}
        error = _relative_error(got, exact)
        return {"ok": error <= FP16_BOUND, "max_rel_error": error, "bound": FP16_BOUND}

    return _guarded(check)
