"""The GPU-side functions (the cupy runner's child, the campaign's library child) run on
the CPU against a numpy stand-in for CuPy (tests/fake_cupy.py): their control flow, not
CuPy's behaviour. And each GPU side's simulated twin keeps the same functions and
arguments, so that a simulated rehearsal calls exactly what a GPU run calls."""

from __future__ import annotations

import inspect
import sys

import fake_cupy
import numpy as np
import pytest

from pipetune.model.workloads import conv2d, gemm
from pipetune.workers.campaign import cuda_side, sim_side
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan
from pipetune.workers.runners import cupy_child, sim_child
from pipetune.workers.runners.cupy_child import TrialSpec
from pipetune.workers.runners.timing import RepeatPolicy

WORKLOAD = gemm(64, 32, 48)
POLICY = RepeatPolicy(warmup=1, min_repeats=5, max_repeats=10, settle=0.03)


@pytest.fixture
def cupy(monkeypatch):
    fake = fake_cupy.make()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cupy_child, "MIN_FLUSH_BYTES", 1 << 16)  # a small flush buffer
    cupy_child.init_device(0)
    return fake


def cubin(tmp_path, behaviour: str) -> str:
    path = tmp_path / f"{behaviour}.cubin"
    path.write_bytes(behaviour.encode() + b"\n")
    return str(path)


def spec(path: str, *, policy: RepeatPolicy = POLICY, workload=WORKLOAD) -> TrialSpec:
    m, n, k = workload.m, workload.n, workload.k
    launch = KernelLaunch(
        "k", (4, 1, 1), (32, 1, 1), 1024, ("A", "B", "C", "M", "N", "K"), {"M": m, "N": n, "K": k}
    )
    buffers = (
        Buffer("A", (m, k), "float16", "input"),
        Buffer("B", (k, n), "float16", "input"),
        Buffer("C", (m, n), "float16", "output"),
    )
    return TrialSpec(
        workload_hash=workload.workload_hash,
        schedule_id="1-1-1-1-1-1-1",
        cubin_path=path,
        plan=LaunchPlan(buffers, (launch,), output="C"),
        policy=policy,
    )


def test_init_describes_the_device(cupy):
    info = cupy_child.init_device(0)
    assert info["name"] == "NVIDIA H100 80GB HBM3" and info["arch"] == "sm_90"
    assert info["flush_bytes"] == 1 << 21  # twice the (fake) 1 MiB L2


def test_a_correct_kernel_is_verified_then_timed_with_adaptive_repeats(cupy, tmp_path):
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(cubin(tmp_path, "ok")))
    assert answer["status"] == "ok" and answer["verified"]
    assert answer["samples_ms"] == [0.01] * 5  # the samples agree: 5 repeats, not 10
    assert answer["max_abs_error"] < 0.05
    assert cupy.state.launches == 1 + 1 + 5  # verification, warm-up, repeats


def test_verify_only_launches_once(cupy, tmp_path):
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(cubin(tmp_path, "ok"), policy=RepeatPolicy.verify_only()))
    assert answer["status"] == "ok" and answer["samples_ms"] == []
    assert cupy.state.launches == 1


def test_a_wrong_kernel_is_a_wrong_result_and_is_not_timed(cupy, tmp_path):
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(cubin(tmp_path, "wrong")))
    assert answer["status"] == "wrong_result" and "outside the fp16 tolerance" in answer["error"]
    assert not answer.get("poisoned") and cupy.state.launches == 1


def test_a_batch_stops_at_the_first_poisoned_trial(cupy, tmp_path):
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    batch = [spec(cubin(tmp_path, b)) for b in ("ok", "fault", "ok", "launch-error")]
    answers = cupy_child.run_trials(batch)
    assert [a["status"] for a in answers] == ["ok", "runtime_error"]
    assert answers[-1]["poisoned"] and "illegal memory access" in answers[-1]["error"]
    answers = cupy_child.run_trials(batch[2:])
    assert [a["status"] for a in answers] == ["ok", "launch_error"] and answers[-1]["poisoned"]


def test_a_trial_needs_its_workload_prepared(cupy, tmp_path):
    with pytest.raises(RuntimeError, match="before prepare_workload"):
        cupy_child.run_trial(spec(cubin(tmp_path, "ok")))


def test_the_reference_comes_back_from_disk_in_a_new_child(cupy, tmp_path):
    cache = str(tmp_path / "refs")
    first = cupy_child.prepare_workload(WORKLOAD.canonical(), 3, cache)
    assert first["reference"] == "cublas" and not first["reference_from_disk"]
    ref = cupy_child._STATE["workload"].ref.copy()
    cupy_child.init_device(0)  # what a restarted child starts from
    second = cupy_child.prepare_workload(WORKLOAD.canonical(), 3, cache)
    assert second["reference_from_disk"]
    np.testing.assert_array_equal(cupy_child._STATE["workload"].ref, ref)
    other_seed = cupy_child.prepare_workload(WORKLOAD.canonical(), 4, cache)
    assert not other_seed["reference_from_disk"]


def test_a_cudnn_reference_falls_back_to_im2col_where_pytorch_is_missing(
    cupy, monkeypatch, tmp_path
):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    workload = conv2d(1, 6, 6, 8, 8, 3, 3, stride=1, pad=1)
    cache = str(tmp_path / "refs")
    answer = cupy_child.prepare_workload(workload.canonical(), 0, cache, "cudnn")
    assert answer["reference"] == "cublas-im2col"
    assert "cuDNN reference unavailable" in answer["reference_note"]
    # The fallback is cached as what it is: a sweep (im2col) finds it, cuDNN asked again not.
    assert cupy_child.prepare_workload(workload.canonical(), 0, cache)["reference_from_disk"]
    again = cupy_child.prepare_workload(workload.canonical(), 0, cache, "cudnn")
    assert not again["reference_from_disk"]


def test_the_timing_floor_is_timed_like_a_trial(cupy, tmp_path):
    samples = cupy_child.timing_floor(cubin(tmp_path, "empty"), "e", POLICY)
    assert samples == [0.01] * 5


def test_library_child_checks_and_baseline(cupy, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    cuda_side.init(0)
    checks = cuda_side.library_checks()
    for name in ("matmul_fp32", "matmul_fp16", "fp16_cast"):
        assert checks[name]["ok"], checks[name]
    assert not checks["conv_fp16_cudnn"]["ok"] and "torch" in checks["conv_fp16_cudnn"]["error"]
    described = cuda_side.describe()
    assert described["name"] == "NVIDIA H100 80GB HBM3" and described["torch"] is None
    assert described["clock_mhz"] == 1980 and described["memory_bus_bits"] == 5120
    answer = cuda_side.vendor_time(WORKLOAD.canonical(), 0, POLICY)
    assert answer["library"].startswith("cuBLAS") and answer["samples_ms"] == [0.01] * 5


def _public_functions(module) -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("gpu", "twin", "names"),
    [
        (cupy_child, sim_child, ("prepare_workload", "run_trial", "run_trials", "timing_floor")),
        (cuda_side, sim_side, ("init", "describe", "library_checks", "vendor_time")),
    ],
)
def test_each_simulated_twin_has_the_gpu_side_s_functions(gpu, twin, names):
    gpu_functions, twin_functions = _public_functions(gpu), _public_functions(twin)
    for name in names:
        assert gpu_functions[name] == twin_functions[name], name
    # The initializers agree on their first arguments (the twin takes its test knobs after).
    init = "init_device" if gpu is cupy_child else "init"
    assert twin_functions[init][: len(gpu_functions[init])] == gpu_functions[init]
