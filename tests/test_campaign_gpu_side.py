"""The GPU-side functions (the cupy runner's child, the campaign's library child) run on
the CPU against a numpy stand-in for CuPy (tests/fake_cupy.py), and for PyTorch (FakeTorch
below, for the memory-intensive baselines): their control flow and the calls they make, not
the libraries' behaviour. And each GPU side's simulated twin keeps the same functions and
arguments, so that a simulated rehearsal calls exactly what a GPU run calls."""

from __future__ import annotations

import inspect
import sys
import types
from contextlib import nullcontext

import fake_cupy
import ml_dtypes
import numpy as np
import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.memops.workloads import (
    bias_gelu,
    layernorm,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.operators import LLAMA, MEMOPS
from pipetune.model.workloads import bmm, conv2d, gemm, gemm_bias_gelu, gemm_swiglu
from pipetune.workers.campaign import cuda_side, sim_side
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan
from pipetune.workers.runners import cupy_child, elements, memops_reference, sim_child
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


def _bf16_gemm(grid, block, args, shared_mem=0):
    """A correct bfloat16 kernel: its operands and output are bf16 bits (uint16)."""
    a, b, c = args[:3]
    product = elements.widen(np, a) @ elements.widen(np, b)
    c[...] = elements.narrow(np, product, "bfloat16")


def _bf16_as_fp16(grid, block, args, shared_mem=0):
    """A bfloat16 kernel that stores fp16 bits: its output read as bf16 is wrong."""
    a, b, c = args[:3]
    c[...] = (elements.widen(np, a) @ elements.widen(np, b)).astype(np.float16).view(np.uint16)


def test_a_bfloat16_trial_runs_on_bf16_bits_and_is_checked_with_bf16_s_tolerance(
    cupy, tmp_path, monkeypatch
):
    workload = gemm(64, 32, 48, dtype="bfloat16")
    monkeypatch.setitem(fake_cupy.KERNELS, b"bf16", _bf16_gemm)
    monkeypatch.setitem(fake_cupy.KERNELS, b"bf16-as-fp16", _bf16_as_fp16)
    prepared = cupy_child.prepare_workload(workload.canonical(), 0, None)
    assert "2*2^-8*|ref|" in prepared["tolerance"]
    plan = spec(cubin(tmp_path, "bf16"), workload=workload).plan
    bf16_plan = LaunchPlan(
        tuple(Buffer(b.name, b.shape, "bfloat16", b.role) for b in plan.buffers),
        plan.launches,
        output="C",
    )

    def bf16_spec(behaviour: str) -> TrialSpec:
        base = spec(cubin(tmp_path, behaviour), workload=workload)
        return TrialSpec(base.workload_hash, base.schedule_id, base.cubin_path, bf16_plan, POLICY)

    answer = cupy_child.run_trial(bf16_spec("bf16"))
    assert answer["status"] == "ok" and answer["verified"], answer
    wrong = cupy_child.run_trial(bf16_spec("bf16-as-fp16"))
    assert wrong["status"] == "wrong_result" and "outside the bf16 tolerance" in wrong["error"]


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


def _right_once(grid, block, args, shared_mem=0):
    """A kernel right on its first run and wrong on the next (a workspace left dirty)."""
    a, b, c = args[:3]
    off = 0.0 if fake_cupy._State.launches == 1 else 1.0
    c[...] = (a.astype(np.float32) @ b.astype(np.float32) + off).astype(np.float16)


def _scribbler(grid, block, args, shared_mem=0):
    """A right product, then a stray store into the input A."""
    fake_cupy._gemm_kernel(grid, block, args, shared_mem)
    args[0][0, :] = 0


def test_a_kernel_wrong_after_its_first_run_is_not_timed_as_ok(cupy, tmp_path, monkeypatch):
    # It passed the check of its first run and its timed runs, of something else, were ok.
    monkeypatch.setitem(fake_cupy.KERNELS, b"right-once", _right_once)
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(cubin(tmp_path, "right-once")))
    assert answer["status"] == "wrong_result"
    assert "wrong after the timed runs" in answer["error"] and "samples_ms" not in answer


@pytest.mark.parametrize("policy", [POLICY, RepeatPolicy.verify_only()], ids=["timed", "verify"])
def test_a_kernel_that_writes_into_its_inputs_fails_and_not_the_next_one(
    cupy, tmp_path, monkeypatch, policy
):
    # It was ok, and every later trial of the workload (on the corrupted A) a wrong result.
    monkeypatch.setitem(fake_cupy.KERNELS, b"scribble", _scribbler)
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    batch = [spec(cubin(tmp_path, b), policy=policy) for b in ("scribble", "ok")]
    answers = cupy_child.run_trials(batch)
    assert [a["status"] for a in answers] == ["wrong_result"]  # the rest: to a new child
    assert answers[0]["poisoned"] and "wrote into its input(s) A" in answers[0]["error"]
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)  # what a new child does
    assert cupy_child.run_trial(batch[1])["status"] == "ok"


def test_a_batch_stops_at_the_first_poisoned_trial(cupy, tmp_path):
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    batch = [spec(cubin(tmp_path, b)) for b in ("ok", "fault", "ok", "launch-error")]
    answers = cupy_child.run_trials(batch)
    assert [a["status"] for a in answers] == ["ok", "runtime_error"]
    assert answers[-1]["poisoned"] and "illegal memory access" in answers[-1]["error"]
    answers = cupy_child.run_trials(batch[2:])
    assert [a["status"] for a in answers] == ["ok", "launch_error"] and answers[-1]["poisoned"]


def test_a_grid_that_depends_on_occupancy_is_planned_with_the_driver_s_answer(
    cupy, tmp_path, monkeypatch
):
    # A split row's grid is sized from the loaded kernel's resident blocks per SM. The
    # driver is asked with the loaded function's handle (CuPy: RawKernel.kernel.ptr; a
    # RawKernel has no ptr of its own, which once failed every such trial on an H200).
    planned: list[tuple[int, int]] = []
    trial = spec(cubin(tmp_path, "ok"))

    def launch_plan(kernel, workload, sm_count, blocks_per_sm):
        planned.append((sm_count, blocks_per_sm))
        return trial.plan

    codegen = types.ModuleType("replanning_codegen")
    codegen.launch_plan = launch_plan
    monkeypatch.setitem(sys.modules, "replanning_codegen", codegen)
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(
        TrialSpec(**{**trial.__dict__, "kernel": object(), "codegen": "replanning_codegen"})
    )
    assert answer["status"] == "ok", answer.get("error")
    assert planned == [(132, cupy.state.blocks_per_sm)]
    ((handle, block, smem),) = cupy.state.occupancy_queries
    assert (block, smem) == (32, 1024) and handle in cupy.state.handles


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
    for name in ("matmul_fp32", "matmul_fp16", "fp16_cast", "bf16_bits"):
        assert checks[name]["ok"], checks[name]
    assert not checks["conv_fp16_cudnn"]["ok"] and "torch" in checks["conv_fp16_cudnn"]["error"]
    described = cuda_side.describe()
    assert described["name"] == "NVIDIA H100 80GB HBM3" and described["torch"] is None
    assert described["clock_mhz"] == 1980 and described["memory_bus_bits"] == 5120
    answer = cuda_side.vendor_time(WORKLOAD.canonical(), 0, POLICY)
    assert answer["library"].startswith("cuBLAS") and answer["samples_ms"] == [0.01] * 5


def test_the_bf16_bits_check_fails_a_device_whose_conversions_differ():
    from pipetune.workers.campaign.checks import matmul_checks

    def off_by_one_bit(array):  # what a device whose shifts or rounding differ would give
        out = np.array(array, copy=True)
        out.view(np.uint8)[::4] ^= 1
        return out

    check = matmul_checks(np, off_by_one_bit)["bf16_bits"]
    assert not check["ok"] and check["mismatches"] > 1000
    assert matmul_checks(np, np.asarray)["bf16_bits"] == {
        "ok": True, "mismatches": 0, "values": check["values"],
    }  # fmt: skip


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


# --- the memory-intensive baselines through PyTorch -----------------------------------


class FakeTensor(np.ndarray):
    """A numpy array with the tensor methods the baselines call."""

    def cuda(self):
        return self

    def to(self, dtype):
        return np.asarray(self).astype(dtype).view(FakeTensor)

    def zero_(self):
        self[...] = 0
        return self

    # The element-wise maths of the composed RMS norm (PyTorch before rms_norm), computed.
    def float(self):
        return np.asarray(self, dtype=np.float32).view(FakeTensor)

    def half(self):
        return np.asarray(self, dtype=np.float16).view(FakeTensor)

    def pow(self, exponent):
        return np.power(self, exponent)

    def mean(self, dim, keepdim=False):
        return np.mean(np.asarray(self), axis=dim, keepdims=keepdim).view(FakeTensor)

    def t(self):
        return self.T

    # The causal mask of the attention softmax's baseline.
    device = "cuda"

    def tril(self, diagonal):
        return np.tril(self, diagonal).view(FakeTensor)


class FakeTorch(types.ModuleType):
    """PyTorch as the memops baselines use it: seeded device draws, the row operators
    (recorded with their arguments, computed by nothing), events, the flush buffer."""

    def __init__(self):
        super().__init__("torch")
        self.__version__ = "2.9.fake"
        self.version = types.SimpleNamespace(cuda="13.0")
        self.float32, self.float16, self.uint8 = np.float32, np.float16, np.uint8
        self.bool = np.bool_
        self.bfloat16 = ml_dtypes.bfloat16
        self.log: list[tuple[str, dict]] = []  # ops and flushes, in order
        self.drawn: list[tuple[tuple[int, ...], int]] = []  # (shape, seed) of device draws
        torch = self

        class Generator:
            def __init__(self, device):
                assert device == "cuda"

            def manual_seed(self, seed):
                self.seed = seed
                self.rng = np.random.default_rng(seed)
                return self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return 0.02

        class Flush(FakeTensor):
            def zero_(self):
                torch.log.append(("flush", {}))
                return self

        self.Generator = Generator
        self.cuda = types.SimpleNamespace(
            Event=Event, synchronize=lambda: None, empty_cache=lambda: None
        )
        self.no_grad = nullcontext
        self._flush = Flush

        def layer_norm(x, normalized_shape, weight, bias, eps):
            return self._op(
                "layer_norm",
                x,
                normalized_shape=normalized_shape,
                eps=eps,
                weight=weight,
                bias=bias,
            )

        def rms_norm(x, normalized_shape, weight, eps):
            return self._op(
                "rms_norm", x, normalized_shape=normalized_shape, eps=eps, weight=weight
            )

        def gelu(z, approximate):
            return self._op("gelu", z, approximate=approximate)

        def silu(z):
            return self._op("silu", z)

        self.nn = types.SimpleNamespace(
            functional=types.SimpleNamespace(
                layer_norm=layer_norm, rms_norm=rms_norm, gelu=gelu, silu=silu
            )
        )

        def gelu_out(z, approximate, out):
            self.log.append(
                ("gelu.out", {"shape": (z.shape, out.shape), "approximate": approximate})
            )
            return out

        self.ops = types.SimpleNamespace(
            aten=types.SimpleNamespace(gelu=types.SimpleNamespace(out=gelu_out))
        )

    def _op(self, name, x, **args):
        self.log.append((name, {"shape": x.shape, "dtype": x.dtype, **args}))
        return x

    def rand(self, shape, generator, device, dtype):
        assert device == "cuda" and dtype is np.float32
        self.drawn.append((tuple(shape), generator.seed))
        return generator.rng.random(shape, dtype=np.float32).view(FakeTensor)

    def empty(self, size, dtype, device):
        assert device == "cuda"
        return np.empty(size, dtype).view(self._flush)

    def softmax(self, x, dim):
        return self._op("softmax", x, dim=dim)

    def ones(self, *size, dtype, device):
        assert device == "cuda"
        return np.ones(size, dtype).view(FakeTensor)

    def tensor(self, value, dtype, device):
        assert device == "cuda"
        return np.asarray(value, dtype).view(FakeTensor)

    def where(self, condition, x, y):
        self.log.append(("where", {"shape": (condition.shape, x.shape)}))
        return np.where(condition, x, y).astype(x.dtype).view(FakeTensor)

    def from_numpy(self, array):
        return array.view(FakeTensor)

    def bmm(self, a, b, out):
        self.log.append(("bmm", {"shape": (a.shape, b.shape, out.shape), "dtype": a.dtype}))
        out[...] = a.astype(np.float32) @ b.astype(np.float32)
        return out

    def sum(self, x, dim):
        return self._op("sum", x, dim=dim)

    def matmul(self, a, b, out):
        self.log.append(("matmul", {"shape": (a.shape, b.shape, out.shape), "dtype": a.dtype}))
        out[...] = a.astype(np.float32) @ b.astype(np.float32)
        return out

    def addmm(self, bias, a, b, out):
        shapes = (bias.shape, a.shape, b.shape, out.shape)
        self.log.append(("addmm", {"shape": shapes, "dtype": a.dtype}))
        out[...] = a.astype(np.float32) @ b.astype(np.float32) + bias.astype(np.float32)
        return out

    def mul(self, x, y, out):
        self.log.append(("mul", {"shape": (x.shape, y.shape, out.shape)}))
        out[...] = x * y
        return out

    def rsqrt(self, x):
        return 1.0 / np.sqrt(x)

    def amax(self, x, dim):
        return self._op("amax", x, dim=dim)


@pytest.fixture
def torch(cupy, monkeypatch):
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    cuda_side.init(0)
    return fake


def test_the_device_draws_follow_the_reference_s_distributions():
    for workload in (
        reduce(64, 1024),
        softmax(64, 1024),
        layernorm(64, 1024),
        rmsnorm(64, 1024),
        bias_gelu(64, 1024),
        silu_mul(64, 1024),
    ):
        host = memops_reference.make_inputs(workload, 0)
        ranges = cuda_side.MEMOPS_INPUT_RANGES[workload.op]
        assert set(ranges) == set(host) == set(memops_reference.input_shapes(workload))
        for name, (low, high) in ranges.items():
            values = host[name].astype(np.float64)
            width = high - low
            assert low <= values.min() < low + 0.02 * width, (workload.op, name)
            assert high - 0.02 * width < values.max() <= high, (workload.op, name)


@pytest.mark.parametrize(
    ("workload", "op", "args"),
    [
        (MEMOPS["Softmax_BERT_b1_s128"], "softmax", {"dim": -1}),
        (
            MEMOPS["LayerNorm_BERT_b1_s128"],
            "layer_norm",
            {"normalized_shape": (768,), "eps": 1e-12},
        ),
        (MEMOPS["LayerNorm_GPT2_b1_s128"], "layer_norm", {"normalized_shape": (768,), "eps": 1e-5}),
        (
            LLAMA["RMSNorm_LLaMA2_7B_t128"],
            "rms_norm",
            {"normalized_shape": (4096,), "eps": 1e-5},
        ),
        (MEMOPS["BiasGELU_BERT_b1_s128"], "gelu", {"approximate": "none"}),
        (MEMOPS["BiasGELU_GPT2_b1_s128"], "gelu", {"approximate": "tanh"}),
        (LLAMA["SwiGLU_LLaMA2_7B_t128"], "silu", {}),  # on the gate: x's first half
        (reduce(96, 1024), "sum", {"dim": -1}),
        (reduce(96, 1024, "max"), "amax", {"dim": -1}),
    ],
)
def test_a_memops_baseline_is_pytorch_s_op_timed_as_kernels_are(torch, workload, op, args):
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert answer["library"].startswith("PyTorch 2.9.fake (CUDA 13.0) kernels: ")
    assert answer["samples_ms"] == [0.02] * 5  # settled after min_repeats
    ops = [(name, call) for name, call in torch.log if name != "flush"]
    assert {name for name, _ in ops} == {op}
    for _, call in ops:
        assert {k: call[k] for k in args} == args
        assert call["shape"] == (workload.rows, workload.cols) and call["dtype"] == np.float16
    if op == "layer_norm":
        assert all(c["weight"].shape == c["bias"].shape == (768,) for _, c in ops)
    if op == "rms_norm":
        assert all(c["weight"].shape == (workload.cols,) for _, c in ops)
    # One untimed first call, the warm-up, then 5 timed launches each after a flush.
    names = [name for name, _ in torch.log]
    assert names == [op, op] + ["flush", op] * 5
    shapes = memops_reference.input_shapes(workload)
    assert torch.drawn == [(shape, 7) for shape in shapes.values()]


def test_a_bfloat16_memops_baseline_runs_pytorch_s_op_in_bfloat16(torch):
    workload = rmsnorm(64, 1024).model_copy(update={"dtype": "bfloat16"})
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert answer["library"].endswith("bf16 in and out")
    calls = [call for name, call in torch.log if name == "rms_norm"]
    assert calls and all(c["dtype"] == BF16 and c["weight"].dtype == BF16 for c in calls)


def test_an_rmsnorm_baseline_before_pytorch_2_4_is_the_norm_in_float32(torch):
    """PyTorch before 2.4 has no rms_norm: the baseline composes it as LLaMA's reference
    code does, and it computes the operator (checked as the kernels are)."""
    del torch.nn.functional.rms_norm
    workload = rmsnorm(64, 1024)
    host = memops_reference.make_inputs(workload, 3)
    inputs = {k: v.view(FakeTensor) for k, v in host.items()}
    launch, what = cuda_side.memops_launch(torch, workload, inputs)
    assert "rsqrt(mean(x^2) + 1e-05) * gamma" in what
    out = np.asarray(launch())
    assert out.dtype == np.float16 and out.shape == (64, 1024)
    ref, tol = memops_reference.reference(np, workload, host)
    assert memops_reference.check(np, out, ref, tol)[0]


@pytest.mark.parametrize(
    ("workload", "what"),
    [
        (
            softmax(12, 64, 0.125, causal=True, queries=3),
            "torch.softmax(torch.where(mask, x * 0.125, -inf), dim=-1), mask = ones(3, 64)"
            ".tril(61) over each attention matrix",
        ),
        (
            softmax(128, 64, causal=True),
            "torch.softmax(torch.where(mask, x, -inf), dim=-1), mask = ones(64, 64).tril(0) "
            "over each attention matrix",
        ),
        (softmax(12, 64, 0.25), "torch.softmax(x * 0.25, dim=-1)"),
    ],
    ids=["causal-chunk", "causal-square", "scaled"],
)
def test_an_attention_softmax_baseline_scales_and_masks_as_the_kernels_do(
    torch, monkeypatch, workload, what
):
    """Eager attention's kernels (a multiply, torch.where, torch.softmax) compute the operator
    the kernels do: the same mask alignment (the last key), checked as a kernel is."""

    def computed(x, dim):  # as torch.softmax of a float16 tensor: float32 inside
        z = np.asarray(x, dtype=np.float32)
        e = np.exp(z - z.max(axis=dim, keepdims=True))
        return (e / e.sum(axis=dim, keepdims=True)).astype(x.dtype).view(FakeTensor)

    monkeypatch.setattr(torch, "softmax", computed)
    host = memops_reference.make_inputs(workload, 3)
    inputs = {k: v.view(FakeTensor) for k, v in host.items()}
    launch, text = cuda_side.memops_launch(torch, workload, inputs)
    assert text == what
    out = np.asarray(launch())
    assert out.dtype == np.float16 and out.shape == (workload.rows, 64)
    ref, tol = memops_reference.reference(np, workload, host)
    assert memops_reference.check(np, out, ref, tol)[0]
    # The multiply by a power of two is exact in fp16: the baseline is the operator itself.
    if workload.causal:
        first_hidden = 64 - workload.mask_queries + 1  # of each matrix's first query
        assert (out[0, :first_hidden] > 0).all() and (out[0, first_hidden:] == 0).all()


def test_a_bmm_baseline_is_cublas_batched_through_torch_bmm(torch):
    # Not cupy.matmul: on 3-D fp16 arrays it ran far below cuBLAS's batched GEMM on an H200.
    workload = bmm(12, 64, 32, 48)
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert answer["library"].startswith("cuBLAS (strided batched) through torch.bmm")
    assert answer["samples_ms"] == [0.02] * 5
    shapes = ((12, 64, 48), (12, 48, 32), (12, 64, 32))
    assert [name for name, _ in torch.log] == ["bmm", "bmm"] + ["flush", "bmm"] * 5
    assert all(call["shape"] == shapes for name, call in torch.log if name == "bmm")
    assert all(call["dtype"] == np.float16 for name, call in torch.log if name == "bmm")


BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_a_bfloat16_gemm_baseline_is_cublas_through_torch_in_bfloat16(torch, b_layout):
    """CuPy has no bfloat16: a bf16 GEMM's baseline is torch.matmul on torch.bfloat16
    tensors holding make_inputs's draws (their bits), into a bf16 output."""
    workload = gemm(64, 24, 40, b_layout=b_layout, dtype="bfloat16")
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert answer["library"].startswith("cuBLAS through torch.matmul (PyTorch 2.9.fake)")
    assert answer["library"].endswith("bf16 in and out") and answer["samples_ms"] == [0.02] * 5
    assert [name for name, _ in torch.log] == ["matmul", "matmul"] + ["flush", "matmul"] * 5
    calls = [call for name, call in torch.log if name == "matmul"]
    assert all(c["shape"] == ((64, 40), (40, 24), (64, 24)) for c in calls)
    assert all(c["dtype"] == BF16 for c in calls)


def test_bfloat16_bmm_and_swiglu_baselines_run_in_bfloat16(torch):
    answer = cuda_side.vendor_time(bmm(2, 64, 32, 48, dtype="bfloat16").canonical(), 7, POLICY)
    assert answer["library"].endswith("bf16 in and out")
    assert {c["dtype"] for name, c in torch.log if name == "bmm"} == {BF16}
    torch.log.clear()
    workload = gemm_swiglu(64, 24, 40, dtype="bfloat16")
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert "bf16 in and out: two kernels, unfused" in answer["library"]
    assert {c["dtype"] for name, c in torch.log if name == "matmul"} == {BF16}


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_a_fused_swiglu_s_baseline_is_the_unfused_gemm_and_silu_mul(torch, b_layout):
    """What a model runs without the fused kernel: cuBLAS's GEMM of both projections into
    an M x 2N intermediate, then silu(gate) * up over its halves, each timed launch both."""
    workload = gemm_swiglu(64, 24, 40, b_layout=b_layout)
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert answer["library"].startswith("cuBLAS through torch.matmul, then ")
    assert "unfused" in answer["library"] and answer["samples_ms"] == [0.02] * 5
    names = [name for name, _ in torch.log]
    assert names == ["matmul", "silu", "mul"] * 2 + ["flush", "matmul", "silu", "mul"] * 5
    matmul = next(call for name, call in torch.log if name == "matmul")
    assert matmul["shape"] == ((64, 40), (40, 48), (64, 48)) and matmul["dtype"] == np.float16
    silu = next(call for name, call in torch.log if name == "silu")
    assert silu["shape"] == (64, 24)  # the gate's half of the intermediate
    mul = next(call for name, call in torch.log if name == "mul")
    assert mul["shape"] == ((64, 24), (64, 24), (64, 24))


@pytest.mark.parametrize(
    ("b_layout", "approximate", "dtype"),
    [("kn", "none", "float16"), ("nk", "tanh", "float16"), ("nk", "none", "bfloat16")],
)
def test_a_fused_bias_gelu_s_baseline_is_linear_then_gelu(torch, b_layout, approximate, dtype):
    """What a model runs without the fused kernel: cuBLAS's GEMM with the bias (addmm) into
    an M x N intermediate, then GELU of the workload's form into C, each timed launch both,
    in the workload's element type, over the bias the runners check the kernel with."""
    workload = gemm_bias_gelu(64, 24, 40, b_layout=b_layout, approximate=approximate, dtype=dtype)
    answer = cuda_side.vendor_time(workload.canonical(), 7, POLICY)
    assert answer["library"].startswith("cuBLAS through torch.addmm(bias, A, B), then ")
    assert f"gelu(approximate='{approximate}')" in answer["library"]
    assert "two kernels, unfused" in answer["library"] and answer["samples_ms"] == [0.02] * 5
    names = [name for name, _ in torch.log]
    assert names == ["addmm", "gelu.out"] * 2 + ["flush", "addmm", "gelu.out"] * 5
    addmm = next(call for name, call in torch.log if name == "addmm")
    assert addmm["shape"] == ((24,), (64, 40), (40, 24), (64, 24))
    assert addmm["dtype"] == (BF16 if dtype == "bfloat16" else np.float16)
    gelu = next(call for name, call in torch.log if name == "gelu.out")
    assert gelu == {"shape": ((64, 24), (64, 24)), "approximate": approximate}


def _holding(cupy, torch, monkeypatch, works=True):
    """The spin kernel as cupy.RawKernel would run it, logged beside the torch calls."""
    streams = []

    def raw_kernel(code, name):
        if not works:
            raise fake_cupy.CUDADriverError("CUDA_ERROR_NOT_SUPPORTED")
        assert name == "pipetune_hold" and "clock64" in code
        return lambda grid, block, args: torch.log.append(("hold", {"cycles": int(args[0])}))

    def external(ptr):
        streams.append(ptr)
        return nullcontext()

    monkeypatch.setattr(cupy, "RawKernel", raw_kernel, raising=False)
    monkeypatch.setattr(cupy.cuda, "ExternalStream", external, raising=False)
    stream = types.SimpleNamespace(cuda_stream=0x5EED)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream, raising=False)
    cuda_side._STATE.pop("hold_kernel", None)
    return streams


def test_a_library_baseline_is_held_while_the_host_dispatches_it(torch, cupy, monkeypatch):
    streams = _holding(cupy, torch, monkeypatch)
    answer = cuda_side.vendor_time(bmm(12, 64, 32, 48).canonical(), 7, POLICY)
    assert answer["held"] and answer["samples_ms"] == [0.02] * 5
    names = [name for name, _ in torch.log]
    # One trial run of the hold, the untimed call, the warm-up, then per timed launch: the
    # flush, the hold (the GPU spins while the host dispatches), the call.
    assert names == ["bmm", "hold", "bmm"] + ["flush", "hold", "bmm"] * 5
    assert all(c["cycles"] == cuda_side.HOLD_CYCLES for n, c in torch.log if n == "hold")
    assert set(streams) == {0x5EED}  # on the library's own stream


def test_a_hold_that_cannot_run_leaves_the_baseline_unheld(torch, cupy, monkeypatch):
    _holding(cupy, torch, monkeypatch, works=False)
    answer = cuda_side.vendor_time(bmm(12, 64, 32, 48).canonical(), 7, POLICY)
    assert answer["held"] is False and answer["samples_ms"] == [0.02] * 5
    assert "hold" not in [name for name, _ in torch.log]


def test_the_simulated_memops_baseline_moves_the_compulsory_bytes_at_the_spec_s_bandwidth():
    sim_side.init(0, "h100")
    workload = MEMOPS["LayerNorm_GPT2_b8_s1024"]
    answer = sim_side.vendor_time(workload.canonical(), 0, POLICY)
    assert answer["simulated"] and "DRAM bandwidth" in answer["library"]
    expected_ms = workload.compulsory_bytes / (get_gpu("h100").dram_bandwidth_gbs * 1e9) * 1e3
    assert np.median(answer["samples_ms"]) == pytest.approx(expected_ms, rel=0.1)


@pytest.mark.parametrize("op", ["gemm", "hopper_gemm"])
def test_an_fp16_gemm_baseline_of_b_stored_n_by_k_multiplies_by_b_transposed(cupy, monkeypatch, op):
    """cuBLAS through cupy.matmul on B stored N x K takes B's transposed view, for the Hopper
    family's GEMM as for the tensor-core one (its op name is another, its B the same)."""
    monkeypatch.setitem(sys.modules, "torch", None)
    cuda_side.init(0)
    calls = []
    real = cupy.matmul

    def matmul(a, b, out=None):
        calls.append((a.shape, b.shape))
        return real(a, b, out=out)

    monkeypatch.setattr(cupy, "matmul", matmul)
    workload = {**gemm(64, 24, 40, b_layout="nk").canonical(), "op": op}
    answer = cuda_side.vendor_time(workload, 7, POLICY)
    assert answer["library"].startswith("cuBLAS") and len(answer["samples_ms"]) == 5
    assert calls and all(shapes == ((64, 40), (40, 24)) for shapes in calls)
