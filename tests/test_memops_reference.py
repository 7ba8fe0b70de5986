"""The reference check the cupy runner will use for the memory-intensive kernels, run with
numpy: exact results pass, a kernel that gets one vector of a row wrong fails."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf

from pipetune.model.memops.workloads import (
    bias_gelu,
    layernorm,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.workers.runners.elements import narrow, widen
from pipetune.workers.runners.memops_reference import (
    check,
    input_shapes,
    make_inputs,
    output_shape,
    reference,
    tolerance_text,
)


def _values(array):
    """A 16-bit input's values in float64 (bfloat16 as its bits: workers/runners/elements.py)."""
    return widen(np, array).astype(np.float64)


def _exact(workload, inputs):
    """The op in float64, rounded once to the workload's dtype: what a perfect kernel writes
    (float16, or bfloat16's bits as uint16)."""
    x = _values(inputs["x"])
    if workload.op == "reduce":
        y = x.sum(axis=1) if workload.reduction == "sum" else x.max(axis=1)
    elif workload.op == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True)
    elif workload.op == "layernorm":
        mean = x.mean(axis=1, keepdims=True)
        var = x.var(axis=1, keepdims=True)
        g, b = _values(inputs["gamma"]), _values(inputs["beta"])
        y = (x - mean) / np.sqrt(var + workload.eps) * g + b
    elif workload.op == "rmsnorm":
        mean_sq = (x * x).mean(axis=1, keepdims=True)
        y = x / np.sqrt(mean_sq + workload.eps) * _values(inputs["gamma"])
    elif workload.op == "silu_mul":
        gate, up = x[:, : workload.cols], x[:, workload.cols :]
        y = gate / (1 + np.exp(-gate)) * up
    else:
        z = x + _values(inputs["bias"])
        if workload.approximate == "tanh":
            y = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
        else:
            y = 0.5 * z * (1 + erf(z / np.sqrt(2)))
    # float16 straight from float64, as before bfloat16; bfloat16 through float32 (narrow),
    # which a tie of float64's bits could round twice: within the check's twice-unit margin.
    return y.astype(np.float16) if workload.dtype == "float16" else narrow(np, y, workload.dtype)


WORKLOADS = [
    reduce(64, 30000),
    reduce(64, 4096, "max"),
    softmax(256, 1024),
    softmax(16, 65536),
    layernorm(128, 768, 1e-12),
    layernorm(8, 65536),
    rmsnorm(128, 4096, 1e-6),
    rmsnorm(8, 65536),
    silu_mul(64, 11008),
    silu_mul(4096, 16),
    bias_gelu(64, 3072),
    bias_gelu(64, 3072, "tanh"),
]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.label())
def test_exact_results_pass_and_one_wrong_vector_fails(workload):
    inputs = make_inputs(workload, seed=3)
    assert {k: v.shape for k, v in inputs.items()} == input_shapes(workload)
    assert all(v.dtype == np.float16 for v in inputs.values())
    ref, tol = reference(np, workload, inputs)
    assert ref.shape == tol.shape == output_shape(workload)
    exact = _exact(workload, inputs)
    passed, max_error, why = check(np, exact, ref, tol)
    assert passed, why
    # A correct kernel stays well inside the tolerance (room for its own fp32 order).
    assert max_error is not None
    # The kernel dropped one vector of 8 from row 1 (as a missed tail or a lost segment):
    # for a max, the vector that holds the row's maximum.
    broken_inputs = {**inputs, "x": inputs["x"].copy()}
    start = 8 * (int(np.argmax(inputs["x"][1])) // 8) if workload.op == "reduce" else 8
    broken_inputs["x"][1, start : start + 8] = 0
    broken = _exact(workload, broken_inputs)
    assert not check(np, broken, ref, tol)[0], tolerance_text(workload)


@pytest.mark.parametrize("norm", [layernorm, rmsnorm])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_a_norm_that_leaves_out_eps_fails(norm, eps):
    # On rows of variance ~1.3, eps = 1e-5 moves rstd by ~4e-6 relative: no fp16 output
    # changes, and a kernel that dropped eps passed. The rows of variance (mean square) ~eps
    # catch it.
    w = norm(16, 4096, eps)
    inputs = make_inputs(w, 0)
    ref, tol = reference(np, w, inputs)
    assert check(np, _exact(w, inputs), ref, tol)[0]
    no_eps = _exact(norm(16, 4096, 2e-38), inputs)  # about the smallest eps there is
    assert not check(np, no_eps, ref, tol)[0]


def test_an_rmsnorm_that_subtracts_the_mean_fails():
    """rmsnorm is not a layer norm without beta: the inputs' mean is away from zero (x in
    [-1.5, 2.5)), so a kernel that centred the row fails."""
    w = rmsnorm(16, 4096)
    inputs = make_inputs(w, 0)
    ref, tol = reference(np, w, inputs)
    x = inputs["x"].astype(np.float64)
    centred = x - x.mean(axis=1, keepdims=True)
    rms = np.sqrt((centred * centred).mean(axis=1, keepdims=True) + w.eps)
    wrong = (centred / rms * inputs["gamma"].astype(np.float64)).astype(np.float16)
    assert not check(np, wrong, ref, tol)[0]


def test_unwritten_outputs_fail():
    w = softmax(4, 64)
    inputs = make_inputs(w, 0)
    ref, tol = reference(np, w, inputs)
    out = _exact(w, inputs)
    out[2, 5] = np.float16("nan")
    passed, _, why = check(np, out, ref, tol)
    assert not passed and "NaN" in why


def test_inputs_are_reproducible_and_in_their_ranges():
    w = layernorm(64, 256)
    a, b = make_inputs(w, 5), make_inputs(w, 5)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert a["x"].min() >= -1.5 and a["x"].max() <= 2.5  # fp16 rounding may reach the end
    assert a["gamma"].min() >= 0.5 and a["gamma"].max() <= 1.5
    x = make_inputs(softmax(64, 256), 5)["x"]
    assert x.min() >= -4 and x.max() <= 4


def test_tolerance_is_tight_where_it_matters():
    w = softmax(64, 1024)
    ref, tol = reference(np, w, make_inputs(w, 1))
    # about fp16's rounding of each output (2^-10 relative), not a blanket allowance
    assert np.median(tol / np.abs(ref)) < 2e-3
    w = reduce(64, 1024, "max")
    assert (reference(np, w, make_inputs(w, 1))[1] == 2.0**-25).all()  # max is exact


@pytest.mark.parametrize(
    "row",
    [
        np.full(4096, 65504.0),  # constant: var 0 made the tolerance NaN, which passes anything
        np.r_[np.full(4095, 1000.0), 1000.5],  # nearly constant: the tolerance was ~1e4-3e7
    ],
    ids=["constant", "nearly-constant"],
)
def test_a_layernorm_of_a_nearly_constant_row_still_judges_its_output(row):
    w = layernorm(1, 4096)
    inputs = {
        "x": row.astype(np.float16)[None, :],
        "gamma": np.ones(4096, np.float16),
        "beta": np.zeros(4096, np.float16),
    }
    ref, tol = reference(np, w, inputs)
    assert np.isfinite(tol).all()
    exact = _exact(w, inputs)
    assert check(np, exact, ref, tol)[0]
    # A kernel that wrote its input back fails. (Such a row is ill-conditioned: an ulp of
    # the mean moves every output by rstd ulps, so the bound stays wide, but finite.)
    assert not check(np, inputs["x"].copy(), ref, tol)[0]
    assert tol.max() < 1000


def test_a_tolerance_that_is_not_finite_fails_the_check():
    w = softmax(2, 64)
    inputs = make_inputs(w, 0)
    ref, tol = reference(np, w, inputs)
    tol[1, 3] = np.nan
    passed, _, why = check(np, _exact(w, inputs), ref, tol)
    assert not passed and "tolerances are NaN or infinite" in why
