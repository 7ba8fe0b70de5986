"""Inputs, reference results and the fp16 (bf16) tolerance for the memory-intensive kernels.

Written against an array module ``xp`` (CuPy on the GPU, numpy in the tests and the CPU
emulation), as workers/runners/reference.py is for the GEMM family; ``check`` is that
module's (the same verdicts and messages).

Inputs (of the workload's dtype, from numpy's PCG64 with the seed, on the host; bfloat16 as
the uint16 of its bits, workers/runners/elements.py: the same float32 draws as float16's,
rounded to bfloat16 instead): x uniform in [-4, 4) for reduce, softmax, bias_gelu and
silu_mul (logit-sized values; silu_mul's x holds gate and up side by side, rows x 2·cols);
for layernorm and rmsnorm x uniform in [-1.5, 2.5) (a mean away from zero), gamma in
[0.5, 1.5), beta and bias in [-0.5, 0.5). The norms' rows 1, 5, 9, ...
(``LOW_VARIANCE_ROWS``) are instead uniform in ±sqrt(3·eps), a variance (and mean square)
of about eps: on rows of variance ~1.3 eps changes rstd by ~4e-6 relative, far below fp16's
rounding, so a kernel that dropped eps (or added it in the wrong place) passed; on these
rows it is off by a factor of ~sqrt(2).

The reference computes the same maths in float32 from the same 16-bit inputs, widened
exactly (numpy or CuPy reductions, whose summation order differs from the kernels').
Tolerances per output element (u16 = 2^-11, u32 = 2^-24 the unit roundoffs, C = cols,
A = 8·sqrt(C) + 16: fp32 sums over C terms in two different orders err by about sqrt(C)·u32
each (Higham & Mary, 2019), 8 is the margin, 16 covers a few-ulp expf/erff/tanhf on either
side):

- reduce sum: 2·u16·|ref| + A·u32·‖x‖₂ + 2^-14 (the output rounds to fp16 once, twice
  that leaves room for the reference's own rounding; the inputs have random signs, so the
  partial sums, and the rounding errors they carry, grow as ‖x‖₂ rather than Σ|x|: the
  Σ|x| form would let a dropped vector of a 30000-element row pass);
- reduce max: exact (the max of fp16 values is an fp16 value): 2^-25, less than the
  smallest difference between two fp16 values (and between two bf16 values of magnitude
  2^-17 or more, as the largest of a row of these inputs is);
- softmax: 2·u16·|ref| + A·u32·|ref| + 2^-24 (the sum's relative error scales every output;
  2^-24 is fp16's subnormal step, for outputs that round to almost nothing); with a scale,
  z = scale·x rounds in float32, which moves each exp by up to |z|·u32 relative and the max's
  as much: 2·u32·max|z| more relative. A causal softmax's hidden keys are 0 in the reference;
- layernorm: 2·u16·|ref| + A·u32·(|x − mean|·rstd·|γ|·(1 + κ) + |mean|·rstd·|γ| + |β|) +
  2^-14, with κ = sqrt(mean(x²) / var) the variance's condition number (Chan, Golub and
  LeVeque): the kernel's Welford updates and Chan's pairwise combine lose about u32·κ of the
  variance (the one-pass Σx² − n·mean² would lose u32·κ², which the tolerance once allowed
  and which let any output pass on a nearly constant row). The variance is floored at
  2^-48·mean(x²), so κ stays finite (at most 2^24) on a constant row, whose output is β;
- rmsnorm: (2·u16 + A·u32)·|ref| + 2^-14: the sum of squares has positive terms, so its
  relative error (about sqrt(C)·u32 for two summation orders) carries over to rstd halved
  and to every output of the row, as softmax's sum does;
- bias_gelu: 2·u16·|ref| + A·u32·(|z| + 1) + 2^-14, z = x + bias (exact in fp32): 1 + erf
  or 1 + tanh cancels for negative z, leaving an absolute error of order |z|·u32.
- silu_mul: 2·u16·|ref| + 16·u32·(|g| + 1)·|u| + 2^-14, g the gate and u the up value: the
  SiLU g / (1 + e^-g) errs by a few ulp of its size (at most |g|), the product by one more;
  no sum, so no sqrt(C) term.

For a bfloat16 workload every u16 above is bf16's unit roundoff 2^-8, and softmax's 2^-24
bf16's subnormal step 2^-133: they bound the rounding of the output, the only value the
kernels round to 16 bits (every intermediate is float32; the inputs are exact in the
reference too), and a bf16 output keeps 8 significant bits down to 2^-126. The floor 2^-14
stays: an absolute allowance for outputs near zero, not a rounding of either type.

A kernel that drops or repeats one vector of a row errs far outside these (a softmax row's
sum off by one element, a layernorm's mean shifted; tests/test_memops_reference.py checks
that a single wrong vector fails while the exact values pass).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipetune.model.memops.workloads import MemWorkload, NormWorkload, op_key
from pipetune.workers.runners.elements import UNIT_ROUNDOFF, narrow, widen
from pipetune.workers.runners.reference import check, gelu, silu

U32 = 2.0**-24
FLOOR = 2.0**-14
# The spacing of each output type's subnormals: the absolute part of an output's rounding (a
# softmax's smallest outputs; a bf16 output that small rounds relative to its value).
SUBNORMAL_STEP: dict[str, float] = {"float16": 2.0**-24, "bfloat16": 2.0**-133}
EXACT = 2.0**-25  # below any difference of two fp16 values (and non-zero: check divides by it)
ROW_CHUNK_ELEMENTS = 1 << 26  # rows·cols of one reference chunk (bounds the fp32 copies)
# The norms' rows whose variance (mean square) is about eps (the module doc): start, step.
LOW_VARIANCE_ROWS = slice(1, None, 4)

__all__ = [
    "check",
    "compute_reference",
    "input_buffers",
    "input_shapes",
    "make_inputs",
    "output_shape",
    "reference",
    "reference_method",
    "tolerance_text",
]


def input_shapes(workload: MemWorkload) -> dict[str, tuple[int, ...]]:
    """Every input buffer the kernels read, by name (as the launch plan names them)."""
    shapes: dict[str, tuple[int, ...]] = {"x": (workload.rows, workload.row_inputs * workload.cols)}
    if workload.op == "layernorm":
        shapes["gamma"] = (workload.cols,)
        shapes["beta"] = (workload.cols,)
    elif workload.op == "rmsnorm":
        shapes["gamma"] = (workload.cols,)
    elif workload.op == "bias_gelu":
        shapes["bias"] = (workload.cols,)
    return shapes


def output_shape(workload: MemWorkload) -> tuple[int, ...]:
    return (workload.rows,) if workload.op == "reduce" else (workload.rows, workload.cols)


def make_inputs(workload: MemWorkload, seed: int) -> dict[str, np.ndarray]:
    """The inputs as host arrays of the workload's dtype (the same whatever the GPU or CuPy
    version): float16, or bfloat16's bits as uint16, the same draws rounded to bfloat16."""
    rng = np.random.default_rng(seed)

    def uniform(shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
        values = low + (high - low) * rng.random(shape, dtype=np.float32)
        return narrow(np, values, workload.dtype)  # type: ignore[no-any-return]

    shapes = input_shapes(workload)
    if isinstance(workload, NormWorkload):
        inputs = {"x": uniform(shapes["x"], -1.5, 2.5), "gamma": uniform(shapes["gamma"], 0.5, 1.5)}
        if "beta" in shapes:
            inputs["beta"] = uniform(shapes["beta"], -0.5, 0.5)
        # Rows where eps matters (the module doc): uniform in [-h, h) has variance h²/3.
        low = inputs["x"][LOW_VARIANCE_ROWS]
        half_width = math.sqrt(3.0 * workload.eps)
        low[...] = uniform(low.shape, -half_width, half_width)
        return inputs
    inputs = {"x": uniform(shapes["x"], -4.0, 4.0)}
    if workload.op == "bias_gelu":
        inputs["bias"] = uniform(shapes["bias"], -0.5, 0.5)
    return inputs


def _chunk_rows(workload: MemWorkload) -> int:
    return max(1, ROW_CHUNK_ELEMENTS // workload.cols)


def reference(xp: Any, workload: MemWorkload, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """(ref, tol): the float32 reference and the per-element tolerance, shaped as the output.
    ``inputs`` as make_inputs stores them (bfloat16 as its bits), or already float32."""
    key = op_key(workload)
    f32 = xp.float32
    unit = UNIT_ROUNDOFF[workload.dtype]  # the output's rounding (the module doc)
    subnormal = SUBNORMAL_STEP[workload.dtype]
    accumulation = (8.0 * math.sqrt(workload.cols) + 16.0) * U32
    ref = xp.empty(output_shape(workload), dtype=f32)
    tol = xp.empty(output_shape(workload), dtype=f32)
    step = _chunk_rows(workload)
    for start in range(0, workload.rows, step):
        rows = slice(start, min(workload.rows, start + step))
        x = widen(xp, inputs["x"][rows])
        if key == "reduce-sum":
            r = x.sum(axis=1)
            ref[rows] = r
            norm = xp.sqrt((x * x).sum(axis=1))
            tol[rows] = 2 * unit * xp.abs(r) + accumulation * norm + FLOOR
        elif key == "reduce-max":
            ref[rows] = x.max(axis=1)
            tol[rows] = EXACT
        elif key == "softmax":
            z = x * f32(workload.scale)  # as the kernels: the float32 product, rounded once
            hidden = _masked(xp, workload, rows)
            if hidden is not None:
                z = xp.where(hidden, f32(-xp.inf), z)
            e = xp.exp(z - z.max(axis=1, keepdims=True))
            r = e / e.sum(axis=1, keepdims=True)
            ref[rows] = r
            relative = 2 * unit + accumulation
            if workload.scale != 1.0:
                # The product's rounding moves z by up to |z|·u32, and an output by twice
                # that relative: e^(z - max) with both z and the max so moved.
                visible = xp.where(xp.isinf(z), f32(0), z)
                relative = relative + 2 * U32 * xp.abs(visible).max(axis=1, keepdims=True)
            tol[rows] = relative * xp.abs(r) + subnormal
        elif key == "layernorm":
            gamma = widen(xp, inputs["gamma"])
            beta = widen(xp, inputs["beta"])
            mean = x.mean(axis=1, keepdims=True)
            centred = x - mean
            var = (centred * centred).mean(axis=1, keepdims=True)
            rstd = 1.0 / xp.sqrt(var + f32(workload.eps))
            r = centred * rstd * gamma + beta
            mean_sq = (x * x).mean(axis=1, keepdims=True)
            floor = mean_sq * f32(2.0**-48) + f32(1e-30)  # an all-zero row: kappa 0
            kappa = xp.sqrt(mean_sq / xp.maximum(var, floor))
            scale = (
                xp.abs(centred) * rstd * xp.abs(gamma) * (1 + kappa)
                + xp.abs(mean) * rstd * xp.abs(gamma)
                + xp.abs(beta)
            )
            ref[rows] = r
            tol[rows] = 2 * unit * xp.abs(r) + accumulation * scale + FLOOR
        elif key == "rmsnorm":
            mean_sq = (x * x).mean(axis=1, keepdims=True)
            r = x * (1.0 / xp.sqrt(mean_sq + f32(workload.eps))) * widen(xp, inputs["gamma"])
            ref[rows] = r
            tol[rows] = (2 * unit + accumulation) * xp.abs(r) + FLOOR
        elif key == "silu_mul":
            gate, up = x[:, : workload.cols], x[:, workload.cols :]
            r = silu(xp, gate) * up
            ref[rows] = r
            tol[rows] = 2 * unit * xp.abs(r) + 16 * U32 * (xp.abs(gate) + 1) * xp.abs(up) + FLOOR
        else:  # bias_gelu
            z = x + widen(xp, inputs["bias"])
            r = gelu(xp, z, workload.approximate)
            ref[rows] = r
            tol[rows] = 2 * unit * xp.abs(r) + accumulation * (xp.abs(z) + 1) + FLOOR
    return ref, tol


def _masked(xp: Any, workload: Any, rows: slice) -> Any:
    """Which elements of ``rows`` a causal softmax hides (True), or None without a mask: row
    r is query r mod L, which sees columns up to r mod L + cols - L (model/memops/workloads.py)."""
    queries = workload.mask_queries
    if not queries:
        return None
    query = xp.arange(rows.start, rows.stop)[:, None] % queries
    return xp.arange(workload.cols)[None, :] > query + (workload.cols - queries)


def tolerance_text(workload: MemWorkload) -> str:
    """The tolerance of this workload's check, in one line (for logs and reports)."""
    key = op_key(workload)
    a = "(8*sqrt(C)+16)*2^-24"
    # The output type's unit roundoff and subnormal step, as reference() takes them: 2^-11
    # and 2^-24 for fp16 (every text as it was before bfloat16), 2^-8 and 2^-133 for bf16.
    u = _power_of_two(UNIT_ROUNDOFF[workload.dtype])
    step = _power_of_two(SUBNORMAL_STEP[workload.dtype])
    if key == "softmax":
        return _softmax_text(workload, u, a, step)
    return {
        "reduce-sum": f"|y-ref| <= 2*{u}*|ref| + {a}*||x||_2 + 2^-14",
        "reduce-max": "exact",
        # (The inputs are named too: the reference cache's key holds this text, and a
        # reference of the inputs before rows of variance eps must not be reused.)
        "layernorm": f"|y-ref| <= 2*{u}*|ref| + {a}*(|x-mean|*rstd*|g|*(1+sqrt(mean(x^2)/var))"
        " + |mean|*rstd*|g| + |b|) + 2^-14; rows 1::4 of x have variance eps",
        "rmsnorm": f"|y-ref| <= (2*{u} + {a})*|ref| + 2^-14; rows 1::4 of x have mean square eps",
        "bias_gelu": f"|y-ref| <= 2*{u}*|ref| + {a}*(|x+bias|+1) + 2^-14",
        "silu_mul": f"|y-ref| <= 2*{u}*|ref| + 16*2^-24*(|gate|+1)*|up| + 2^-14",
    }[key]


def _softmax_text(workload: Any, u: str, a: str, step: str) -> str:
    """A plain softmax's text is the one it had before scale and the mask existed."""
    if workload.scale == 1.0:
        text = f"|y-ref| <= (2*{u} + {a})*|ref| + {step}"
    else:
        text = f"|y-ref| <= (2*{u} + {a} + 2*2^-24*max|z|)*|ref| + {step}, z = {workload.scale!r}*x"
    if workload.mask_queries:
        text += f"; causal, {workload.mask_queries} queries"
    return text


def _power_of_two(value: float) -> str:
    """A power of two as the tolerance texts write it: 2^-11."""
    exponent = math.log2(value)
    assert exponent == int(exponent), value
    return f"2^{int(exponent)}"


# The runners' interface to a family's reference check (workers/runners/reference.py says
# what it is): the inputs are already by buffer name, and the reference is computed by the
# array module itself (CuPy's reductions on the GPU; there is no vendor library to prefer).
def input_buffers(workload: MemWorkload, seed: int) -> dict[str, np.ndarray]:
    return make_inputs(workload, seed)


def reference_method(workload: MemWorkload, preferred: str = "cublas") -> str:
    return "xp-float32"


def compute_reference(
    xp: Any, workload: MemWorkload, inputs: dict[str, Any], preferred: str = "cublas"
) -> tuple[Any, Any, str, str | None]:
    ref, tol = reference(xp, workload, inputs)
    return ref, tol, reference_method(workload, preferred), None
