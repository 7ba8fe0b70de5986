"""The cupy runner's parts that need no GPU: inputs, the fp32 reference (im2col for
convolutions) and the fp16 tolerance, run with numpy in place of CuPy; the classification
of trial outcomes; and a clear refusal on a machine without CuPy or a GPU."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import fake_cupy
import numpy as np
import pytest

from pipetune.model.workloads import bmm, conv2d, conv3d, gemm
from pipetune.workers.runners import (
    RunnerUnavailableError,
    cupy_child,
    make_runner,
    reference_cache,
)
from pipetune.workers.runners import reference as ref_module
from pipetune.workers.runners.base import MeasureSettings, RunnerError
from pipetune.workers.runners.cupy_runner import Compiled, compile_failure, trial_result
from pipetune.workers.runners.isolation import CallOutcome
from pipetune.workers.runners.kernel_runner import KernelRunner
from pipetune.workers.runners.reference import check, make_inputs, operand_shapes, reference


def direct_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Channels-last convolution by filter taps (independent of the im2col reference)."""
    spatial = x.ndim - 2
    x = np.pad(x.astype(np.float64), [(0, 0)] + [(pad, pad)] * spatial + [(0, 0)])
    filt = w.shape[1:-1]
    out = [(x.shape[1 + i] - filt[i]) // stride + 1 for i in range(spatial)]
    result = np.zeros((x.shape[0], *out, w.shape[0]))
    for tap in np.ndindex(*filt):
        index = (
            slice(None),
            *(slice(t, t + stride * (o - 1) + 1, stride) for t, o in zip(tap, out, strict=True)),
        )
        result += np.tensordot(x[index], w[(slice(None), *tap)].astype(np.float64), ([-1], [-1]))
    return result


def exact_product(workload, a, b) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if workload.op == "gemm":
        return a64 @ (b64 if workload.b_layout == "kn" else b64.T)
    if workload.op == "bmm":
        return a64 @ (b64 if workload.b_layout == "kn" else b64.transpose(0, 2, 1))
    return direct_conv(a, b, workload.stride, workload.pad)


WORKLOADS = [
    gemm(48, 40, 64),
    gemm(48, 40, 64, b_layout="nk"),
    bmm(3, 20, 16, 24),
    bmm(3, 20, 16, 24, b_layout="nk"),
    conv2d(2, 7, 6, 8, 16, 3, 3, stride=2, pad=1),
    conv3d(2, 4, 5, 5, 8, 8, 3, 3, 3, stride=1, pad=1),
]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.label())
def test_reference_matches_a_direct_computation(workload, monkeypatch):
    monkeypatch.setattr(ref_module, "CHUNK_ELEMENTS", 256)  # exercise the chunked paths
    a, b = make_inputs(workload, seed=7)
    assert (a.shape, b.shape) == operand_shapes(workload)[:2]
    ref, tol = reference(np, workload, a, b)
    assert ref.shape == tol.shape == operand_shapes(workload)[2]
    assert ref.dtype == np.float32
    np.testing.assert_allclose(ref, exact_product(workload, a, b), rtol=1e-5, atol=1e-5)
    assert (tol > 0).all()


def test_inputs_are_seeded_fp16_in_range():
    workload = gemm(64, 32, 16)
    a1, b1 = make_inputs(workload, seed=3)
    a2, _ = make_inputs(workload, seed=3)
    a3, _ = make_inputs(workload, seed=4)
    assert a1.dtype == b1.dtype == np.float16
    assert np.array_equal(a1, a2) and not np.array_equal(a1, a3)
    assert a1.min() >= -1 and a1.max() <= 1 and a1.std() > 0.4


def emulate_kernel(a: np.ndarray, b: np.ndarray, tile: int, skip_tile: int | None = None):
    """What a correct (or a tile-dropping) kernel computes: fp32 partial products per K tile
    in kernel order, accumulated in fp32, stored as fp16."""
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for i, k in enumerate(range(0, a.shape[1], tile)):
        if i != skip_tile:
            acc += a[:, k : k + tile].astype(np.float32) @ b[k : k + tile].astype(np.float32)
    return acc.astype(np.float16)


@pytest.mark.parametrize("k", [16, 256, 4096])
def test_tolerance_passes_correct_kernels_and_catches_a_dropped_tile(k):
    workload = gemm(64, 64, k)
    a, b = make_inputs(workload, seed=0)
    ref, tol = reference(np, workload, a, b)
    passed, max_error, why = check(np, emulate_kernel(a, b, tile=16), ref, tol)
    assert passed and why is None and max_error < 0.05
    passed, max_error, why = check(np, emulate_kernel(a, b, tile=16, skip_tile=0), ref, tol)
    assert not passed and max_error > 0.1
    assert "outside the fp16 tolerance" in why


@pytest.mark.parametrize("k", [1 << 16, 1 << 18])
def test_a_deep_reduction_is_checked_exactly_and_still_catches_a_dropped_tile(k):
    # With uniform inputs the tolerance grows as K^1.5: at K = 2^18 a kernel that dropped its
    # last 64-deep tile passed. A deep reduction's inputs are integers: exact sums.
    workload = gemm(16, 16, k)
    a, b = make_inputs(workload, seed=3)
    assert set(np.unique(a)) <= {-1.0, 0.0, 1.0} and set(np.unique(b)) <= {-1.0, 0.0, 1.0}
    ref, tol = reference(np, workload, a, b)
    np.testing.assert_array_equal(ref, exact_product(workload, a, b))  # exact in fp32
    assert ref_module.tolerance_text(workload) == ref_module.EXACT_TOLERANCE_TEXT
    tiles = k // 64
    correct = emulate_kernel(a, b, tile=64)
    assert check(np, correct, ref, tol)[0]
    # The same sums in another order (split-K's halves added last) are still exact.
    halves = (
        a[:, : k // 2].astype(np.float32) @ b[: k // 2].astype(np.float32)
        + a[:, k // 2 :].astype(np.float32) @ b[k // 2 :].astype(np.float32)
    ).astype(np.float16)
    assert check(np, halves, ref, tol)[0]
    for dropped in (tiles - 1, 0):
        assert not check(np, emulate_kernel(a, b, tile=64, skip_tile=dropped), ref, tol)[0]


def test_below_the_exact_depth_the_inputs_are_the_measured_ones():
    # Every committed measurement was timed on uniform inputs: a shallower reduction keeps them.
    workload = gemm(16, 16, (1 << 16) - 8)
    a, _ = make_inputs(workload, seed=3)
    assert len(np.unique(a)) > 3
    assert ref_module.tolerance_text(workload) == ref_module.TOLERANCE_TEXT


def test_unwritten_outputs_fail_as_nan():
    workload = gemm(16, 16, 16)
    a, b = make_inputs(workload, seed=0)
    ref, tol = reference(np, workload, a, b)
    c = emulate_kernel(a, b, tile=16)
    c[3, 5] = np.nan
    passed, max_error, why = check(np, c, ref, tol)
    assert not passed and max_error is None and "1 of 256 outputs are NaN" in why


COMPILED = Compiled(
    kernel=SimpleNamespace(name="k", threads=128, smem_bytes=32768),
    cubin_path="/tmp/k.cubin",
    registers=128,
    spill_bytes=0,
    smem_static_bytes=16,
    compile_ms=700.0,
)


def test_a_timed_trial_becomes_a_measurement():
    samples_ms = [0.010, 0.011, 0.012, 0.010, 0.013]
    outcome = CallOutcome(
        "ok", value={"status": "ok", "samples_ms": samples_ms, "max_abs_error": 0.01}
    )
    result = trial_result(outcome, COMPILED)
    assert result.status == "ok" and result.runner == "cupy"
    assert result.latency_us == pytest.approx(11.0)
    assert result.samples_us == pytest.approx([10.0, 11.0, 12.0, 10.0, 13.0])
    p10, p90 = np.percentile(result.samples_us, [10, 90])
    assert result.spread == pytest.approx((p90 - p10) / 11.0)
    assert (result.registers, result.smem_bytes, result.compile_ms) == (128, 32784, 700.0)


@pytest.mark.parametrize(
    ("outcome", "status", "text"),
    [
        (CallOutcome("timeout", error="no answer within 60 s"), "timeout", "60 s"),
        (
            CallOutcome("crashed", error="died (killed by signal SIGSEGV)"),
            "runtime_error",
            "SIGSEGV",
        ),
        (CallOutcome("error", error="RuntimeError: boom"), "runtime_error", "boom"),
        (
            CallOutcome("ok", value={"status": "launch_error", "error": "launch: INVALID_VALUE"}),
            "launch_error",
            "INVALID_VALUE",
        ),
        (
            CallOutcome("ok", value={"status": "runtime_error", "error": "illegal address"}),
            "runtime_error",
            "illegal address",
        ),
        (
            CallOutcome(
                "ok", value={"status": "wrong_result", "error": "3 off", "max_abs_error": 2.0}
            ),
            "wrong_result",
            "3 off",
        ),
    ],
)
def test_failed_trials_are_classified(outcome, status, text):
    result = trial_result(outcome, COMPILED)
    assert result.status == status and text in result.error
    assert result.latency_us is None and result.registers == 128


def test_a_compile_failure():
    result = compile_failure(Compiled(error="x" * 5000, compile_ms=12.0))
    assert result.status == "compile_error" and len(result.error) == 2000
    assert result.compile_ms == 12.0


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_without_cupy_the_runner_says_why():
    with pytest.raises(RunnerUnavailableError, match="CuPy is not installed"):
        make_runner("cupy", gpu="h100")


class _InProcessPool:
    """The isolated worker's interface, calling the child's functions in this process."""

    generation = 0

    def start(self) -> dict:
        return {}

    def call(self, fn, *args, timeout_s=None) -> CallOutcome:
        try:
            return CallOutcome("ok", value=fn(*args))
        except Exception as exc:
            return CallOutcome("error", error=f"{type(exc).__name__}: {exc}")


def test_a_failed_prepare_does_not_leave_the_previous_workload_counted_as_set_up(monkeypatch):
    # The child drops its workload before setting up the next; when that failed (out of
    # memory, say), the runner still counted the old one as set up, and every later trial
    # of it failed as "run_trial before prepare_workload".
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy.make())
    monkeypatch.setattr(cupy_child, "MIN_FLUSH_BYTES", 1 << 16)
    cupy_child.init_device(0)
    first, second = gemm(64, 32, 48), gemm(64, 32, 80)
    real = reference_cache.cached_reference

    def out_of_memory_for_second(xp, workload_hash, *args, **kwargs):
        if workload_hash == second.workload_hash:
            raise MemoryError("out of memory")
        return real(xp, workload_hash, *args, **kwargs)

    monkeypatch.setattr(reference_cache, "cached_reference", out_of_memory_for_second)
    runner = object.__new__(KernelRunner)  # the parent's bookkeeping alone (no GPU child)
    runner._side, runner._pool, runner._settings = cupy_child, _InProcessPool(), MeasureSettings()
    runner.reference_cache, runner.conv_reference, runner.prepare_timeout_s = None, "cublas", 60
    runner._prepared = runner.last_prepare = None
    runner._ensure_prepared(first)
    with pytest.raises(RunnerError, match="out of memory"):
        runner._ensure_prepared(second)
    runner._ensure_prepared(first)
    assert cupy_child._STATE["workload"].workload_hash == first.workload_hash
