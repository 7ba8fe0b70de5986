"""pipetune.kernel without a GPU: the source, the cubin, the launch (the cupy runner's own),
and the call's argument checks and DLPack pointers, with stand-in arrays on the CPU that
say they live on a CUDA device, for both kernel families (the tensor-core GEMMs; the
memory-intensive row operators, with their parameter vectors, split-row workspace, second
launch and occupancy-sized grids). Only the driver's calls themselves (load, launch,
occupancy, workspace allocation) are replaced here."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import types
from typing import Any

import numpy as np
import pytest
from cubin_support import cubin_sm
from launch_support import runner_spec

import pipetune
from pipetune.clients.library import cuda_launch
from pipetune.clients.library.arrays import ArgumentError, data_pointer, describe
from pipetune.clients.library.cuda_launch import CudaUnavailableError, KernelParams
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import MemSchedule, workspace_bytes
from pipetune.model.memops.workloads import (
    bias_gelu,
    layernorm,
    reduce,
    rmsnorm,
    silu_mul,
    softmax,
)
from pipetune.model.space import Schedule, ScheduleError
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm, gemm_bias_gelu, gemm_swiglu
from pipetune.workers.codegen import generate
from pipetune.workers.codegen import memops as memops_codegen
from pipetune.workers.compile import compile_source
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.builds import Compiled
from pipetune.workers.runners.kernel_runner import trial_spec
from pipetune.workers.runners.timing import RepeatPolicy

S = Schedule(
    block_row_warps=2,
    block_col_warps=2,
    warp_row_tiles=2,
    warp_col_tiles=2,
    chunk=2,
    smem_stages=3,
    reg_stages=2,
)
FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
WORKLOADS = [
    gemm(1024, 64, 2048),
    gemm(256, 128, 256, b_layout="nk"),
    gemm_swiglu(256, 64, 256),
    gemm_swiglu(256, 64, 256, b_layout="nk"),
    gemm_bias_gelu(256, 64, 256),
    gemm_bias_gelu(256, 64, 256, b_layout="nk", approximate="tanh"),
    bmm(4, 128, 64, 128),
    bmm(4, 128, 64, 128, b_layout="nk"),
    conv2d(2, 14, 14, 64, 64, 3, 3, pad=1),
    conv3d(1, 4, 8, 8, 16, 64, 3, 3, 3, pad=1),
]
# Memory-intensive schedules (knobs in model/memops/space.py order): a row per block of 128
# threads; a row split over 4 blocks joined by a second kernel (two-pass); the same split
# joined inside the kernel (fused: its grid is one wave, so it depends on the occupancy);
# a register-cached row.
ROW = MemSchedule(128, 1, 1, 8, 0, 0, 0)
TWO_PASS = MemSchedule(32, 1, 4, 8, 0, 0, 0)
FUSED = MemSchedule(32, 1, 4, 8, 0, 1, 1)
REGISTERS = MemSchedule(64, 1, 1, 8, 2, 0, 0)
SOFTMAX = softmax(512, 1024)
LAYERNORM = layernorm(512, 1024)
MEM_CASES = [(w, s) for w in (SOFTMAX, LAYERNORM) for s in (ROW, TWO_PASS, FUSED, REGISTERS)] + [
    (reduce(512, 1024), TWO_PASS),
    (bias_gelu(512, 1024, "tanh"), TWO_PASS),
]
H100_SMS = get_gpu("h100").sm_count
SCALARS = ("rows", "cols", "eps", "scale", "queries")


# ---- stand-in arrays: CPU memory that says it is on a CUDA device ----------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_NAME = b"dltensor"
CUDA = (2, 0)


class StandIn:
    """What a CuPy array shows a consumer: shape, dtype, byte strides, DLPack device and a
    DLPack capsule (dlpack.h layout, built here independently of pipetune's reader)."""

    dl_code: int | None = None  # DLPack's type code, where numpy's dtype cannot say it

    def __init__(self, host: np.ndarray, device: tuple[int, int] = CUDA):
        self.host = host
        self.shape = host.shape
        self.dtype = host.dtype
        self.strides = host.strides
        self.device = device
        self.streams: list[Any] = []
        self._keep: list[Any] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, stream: Any = None) -> Any:
        self.streams.append(stream)
        ndim = self.host.ndim
        shape = (ctypes.c_int64 * ndim)(*self.host.shape)
        strides = (ctypes.c_int64 * ndim)(*(s // self.host.itemsize for s in self.host.strides))
        managed = _DLManagedTensor()
        t = managed.dl_tensor
        t.data = self.host.ctypes.data
        t.device = _DLDevice(*self.device)
        t.ndim = ndim
        code = self.dl_code if self.dl_code is not None else 2 if self.host.dtype.kind == "f" else 0
        t.dtype = _DLDataType(code, self.host.dtype.itemsize * 8, 1)
        t.shape, t.strides, t.byte_offset = shape, strides, 0
        self._keep += [managed, shape, strides]
        return _capsule_new(ctypes.addressof(managed), _NAME, None)


class TorchStyle(StandIn):
    """What a PyTorch tensor shows: stride() in elements, dtype 'torch.float16', no
    `strides` attribute."""

    def __init__(self, host: np.ndarray, device: tuple[int, int] = CUDA):
        super().__init__(host, device)
        del self.strides
        self.dtype = f"torch.{host.dtype}"

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.host.itemsize for s in self.host.strides)


def arrays(workload, cls=StandIn, with_output: bool = True, schedule: Any = S) -> list[StandIn]:
    k = pipetune.kernel(workload, "h100", schedule=schedule)
    made = [cls(np.zeros(op.shape, dtype=np.float16)) for op in k.operands]
    return (
        made
        if with_output
        else [a for a, op in zip(made, k.operands, strict=True) if not op.output]
    )


H100_SMEM_OPTIN = 232_448  # bytes of shared memory a block may opt in to on an H100
DRIVER_BLOCKS_PER_SM = 5  # the fake driver's occupancy: below the model's, as it may be


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record launches instead of calling the driver (the only part that needs a GPU); the
    driver's occupancy, SM count and workspace allocations are faked and recorded too
    (occupancy and "alloc" entries, which a GEMM never makes)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(cuda_launch, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(cuda_launch, "sm_count", lambda device: H100_SMS)
    monkeypatch.setattr(cuda_launch, "max_shared_per_block", lambda device: H100_SMEM_OPTIN)

    def occupancy(device: int, function: Any, config: Any) -> int:
        calls.append({"occupancy": function, "block": config.block, "smem": config.smem_bytes})
        return DRIVER_BLOCKS_PER_SM

    def allocate_zeroed(device: int, nbytes: int, stream: int) -> Any:
        memory = np.zeros(nbytes, dtype=np.uint8)
        calls.append({"alloc": nbytes, "device": device, "stream": stream, "memory": memory})
        return types.SimpleNamespace(address=memory.ctypes.data, nbytes=nbytes, keep=memory)

    monkeypatch.setattr(cuda_launch, "occupancy", occupancy)
    monkeypatch.setattr(cuda_launch, "allocate_zeroed", allocate_zeroed)

    def load(device: int, cubin: bytes, config: Any) -> str:
        calls.append({"load": device, "sm": cubin_sm(cubin), "kernel": config.kernel})
        return f"function-{config.kernel}"

    def launch(device: int, function: Any, config: Any, pointers: list[int], stream: int) -> None:
        calls.append(
            {"device": device, "function": function, "config": config, "pointers": pointers}
            | {"stream": stream}
        )

    monkeypatch.setattr(cuda_launch, "load_function", load)
    monkeypatch.setattr(cuda_launch, "launch", launch)
    return calls


# ---- what the kernel object gives without a GPU ------------------------------------------


def test_a_hopper_kernels_cubin_for_another_arch_is_refused_by_name():
    # NVRTC answered sm_80a with "invalid --nv_arch", from deep inside.
    k = pipetune.kernel({"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}, "h100")
    with pytest.raises(
        ValueError, match=r"uses sm_90a-only instructions: it compiles for sm_90a, not sm_80"
    ):
        k.cubin("sm_80")
    assert cubin_sm(k.cubin("sm_90a")) == 90 and cubin_sm(k.cubin()) == 90
    # Its launch document names the target its cubin is built for (it said sm_90, and
    # documented sm_80, which no cubin of it is built for).
    assert k.launch_document("sm_90")["arch"] == k.launch_document()["arch"] == "sm_90a"
    with pytest.raises(ValueError, match=r"compiles for sm_90a, not sm_80"):
        k.launch_document("sm_80")


@pytest.mark.parametrize("arch", ["bogus", "sm_75", ""])
def test_an_arch_nvrtc_cannot_build_for_is_refused_by_every_method_taking_one(arch):
    """launch_document wrote any text as its "arch" (sm_75, which cubin() refuses, or
    "bogus"); cubin("") built for the tuned GPU, as if no arch had been given."""
    k = pipetune.kernel(FC, "h100", schedule=S.as_dict())
    for method in (k.launch_document, k.cubin):
        with pytest.raises(ValueError, match=r"arch"):
            method(arch)
    assert k.launch_document("sm_80")["arch"] == "sm_80"


def test_source_cubin_and_launch_of_a_given_schedule():
    k = pipetune.kernel(FC, "h100", schedule=S.as_dict())
    assert k.schedule == S and k.origin == "given"
    assert 'extern "C" __global__' in k.source and k.name in k.source
    assert cubin_sm(k.cubin()) == 90 and cubin_sm(k.cubin("sm_80")) == 80
    assert compile_source(k.source, "sm_90", entry=k.name).registers > 0
    assert k.launch.kernel == k.name
    assert k.launch.grid == (1024 // 64 * 1, 1, 1)  # BM = BN = 64: 16 x 1 tiles
    assert k.launch.block == (128, 1, 1)
    assert k.launch.smem_bytes == S.smem_bytes
    assert k.launch.arguments == ("A", "B", "C", "M", "N", "K")
    assert k.launch.scalars == {"M": 1024, "N": 64, "K": 2048}
    assert [op.shape for op in k.operands] == [(1024, 2048), (2048, 64), (1024, 64)]


def test_a_kernel_built_directly_takes_what_pipetune_kernel_takes():
    """pipetune.TunedKernel(...) failed on a schedule dict ("'dict' object has no attribute
    'as_dict'") and on a workload dict ("unknown operator None"), and kept a GPU alias as its
    `gpu` (so its launch document named "NVIDIA H100", not "h100")."""
    k = pipetune.TunedKernel(FC, "NVIDIA H100", S.as_dict())
    assert (k.workload, k.gpu, k.schedule) == (gemm(1024, 64, 2048), "h100", S)
    assert k.launch_document() == pipetune.kernel(FC, "h100", schedule=S).launch_document()
    with pytest.raises(ScheduleError, match="chunk"):
        pipetune.TunedKernel(FC, "h100", {**S.as_dict(), "chunk": 3})
    with pytest.raises(ScheduleError, match=r"^schedule: a schedule must be a dict of knob"):
        pipetune.TunedKernel(FC, "h100", 42)  # type: ignore[arg-type]


def test_a_kernel_takes_the_schedule_id_that_tables_and_exports_show():
    """export, `pipetune tasks` and `schedule` show schedules by id: given back, one was
    refused as "a schedule must be a dict of knob values, got str"."""
    assert pipetune.kernel(FC, "h100", schedule=S.id).schedule == S
    assert pipetune.kernel(FC, "h100", schedule=f" {S.id}\n").schedule == S  # (copied)
    # Named as every other refused argument is (it had no `.argument`).
    with pytest.raises(ScheduleError, match=r"^schedule: 's-2-2' is no schedule id") as info:
        pipetune.kernel(FC, "h100", schedule="s-2-2")
    assert isinstance(info.value, pipetune.InvalidArgumentError)
    assert info.value.argument == "schedule"
    with pytest.raises(ScheduleError, match="chunk must be one of"):
        pipetune.kernel(FC, "h100", schedule="s-2-2-2-2-3-3-2")
    # Another family's id: refused as another family's knobs are.
    with pytest.raises(ScheduleError):
        pipetune.kernel(FC, "h100", schedule="wg128x256s3_p")
    with pytest.raises(ValueError, match=r"^gpu: unknown GPU 'nope'"):
        pipetune.TunedKernel(FC, "nope", S)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.label())
def test_the_launch_is_the_one_the_cupy_runner_times(workload):
    k = pipetune.kernel(workload, "h100", schedule=S)
    compiled = Compiled(kernel=generate(workload, S), cubin_path="/cubins/x.cubin")
    spec = trial_spec(compiled, workload, S, RepeatPolicy.of(MeasureSettings()))
    _assert_same_launch(spec, k)


def _assert_same_launch(spec: Any, k: Any) -> None:
    """The callable's (first) launch is the runner's: kernel, grid, block, shared memory and
    scalar arguments."""
    assert (spec.kernel_name, spec.grid, (spec.threads, 1, 1), spec.smem_bytes) == (
        k.launch.kernel,
        k.launch.grid,
        k.launch.block,
        k.launch.smem_bytes,
    )
    assert spec.scalars == tuple(k.launch.scalars.values())


def _empty_database(tmp_path) -> str:
    """A database with the schema and nothing measured (a named file that is not there is
    refused: a mistyped path)."""
    from pipetune.service.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    return url


def test_the_schedule_comes_from_the_local_database_else_the_model(tmp_path):
    k = pipetune.kernel(FC, "h100", db=_empty_database(tmp_path))
    assert k.origin == "model" and k.runner is None
    with pytest.raises(ValueError, match=r"^db: no database file at "):
        pipetune.kernel(FC, "h100", db=f"sqlite:///{tmp_path / 'none.db'}")
    assert not (tmp_path / "none.db").exists()  # a lookup creates nothing


def test_the_answer_of_best_schedule_is_a_schedule_and_a_lookup_beside_one_is_refused(tmp_path):
    """kernel(w, gpu, schedule=pipetune.best_schedule(w, gpu)) was refused ("got
    ScheduleResponse"), and kernel(..., schedule=..., server=...) ignored the server."""
    db = _empty_database(tmp_path)
    answer = pipetune.best_schedule(FC, "h100", db=db)
    k = pipetune.kernel(FC, "h100", schedule=answer)
    assert k.schedule.id == answer.schedule_id
    for where in ({"server": "http://gpu-host:8000"}, {"db": db}, {"api_key": "k-123"}):
        name = next(iter(where))
        with pytest.raises(ValueError, match=f"^{name}: give schedule or {name}, not both"):
            pipetune.kernel(FC, "h100", schedule=answer, **where)


def test_an_answer_for_another_workload_or_gpu_is_refused_and_a_matching_one_keeps_its_label(
    tmp_path,
):
    """best_schedule's answer for a 1024x64x2048 GEMM on an H100 was run, silently, as the
    schedule of any other GEMM on any GPU; and the answer for this one lost its origin (a
    simulated runner's pick was shown as "given", without the simulated label)."""
    answer = pipetune.best_schedule(FC, "h100", db=_empty_database(tmp_path))
    for workload, gpu in (({**FC, "m": 4096}, "h100"), (FC, "a100")):
        with pytest.raises(ValueError, match=r"^schedule: is the best schedule of gemm 1024x64"):
            pipetune.kernel(workload, gpu, schedule=answer)
    assert pipetune.kernel(FC, "h100", schedule=answer.schedule).origin == "given"
    simulated = answer.model_copy(
        update={"source": "measured", "runner": "simulated", "latency_us": 12.5}
    )
    k = pipetune.kernel(FC, "H100", schedule=simulated)
    assert (k.origin, k.runner, k.latency_us, k.simulated) == ("measured", "simulated", 12.5, True)
    assert "latency_label" in k.launch_document()


def test_tuned_kernel_given_an_answer_labels_and_checks_it_as_pipetune_kernel_does(tmp_path):
    """pipetune.TunedKernel(w, gpu, answer) labelled a measured answer "given" and ran an
    answer for another workload, where pipetune.kernel keeps "measured" and refuses it."""
    answer = pipetune.best_schedule(FC, "h100", db=_empty_database(tmp_path))
    measured = answer.model_copy(update={"source": "measured", "runner": "cupy", "latency_us": 9.5})
    for make in (pipetune.TunedKernel, pipetune.kernel):
        k = make(FC, "h100", measured)
        assert (k.origin, k.runner, k.latency_us) == ("measured", "cupy", 9.5)
        with pytest.raises(ValueError, match=r"^schedule: is the best schedule of gemm 1024x64"):
            make({**FC, "m": 4096}, "h100", measured)
    assert pipetune.TunedKernel(FC, "h100", answer).origin == answer.source == "model"
    assert pipetune.TunedKernel(FC, "h100", answer.schedule).origin == "given"


def test_a_schedule_outside_the_gpus_space_is_refused():
    big = Schedule(4, 4, 4, 4, 8, 6, 2)  # 6 stages of 256x256x128 tiles: far over smem
    with pytest.raises(ScheduleError, match="not valid for gemm 1024x64x2048 on h100"):
        pipetune.kernel(FC, "h100", schedule=big)
    with pytest.raises(ScheduleError, match="chunk"):
        pipetune.kernel(FC, "h100", schedule={**S.as_dict(), "chunk": 3})


# ---- the call: checks ----------------------------------------------------------------------


def _refused(k, args, argument: str, words: str) -> None:
    with pytest.raises(ArgumentError) as info:
        k(*args)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: ") and words in str(info.value)


def test_a_fused_swiglu_kernel_takes_the_interleaved_weights_and_writes_n_columns(launches):
    workload = {"op": "gemm_swiglu", "m": 256, "n": 64, "k": 256}
    k = pipetune.kernel(workload, "h100", schedule=S)
    assert [(op.name, op.shape, op.role) for op in k.operands] == [
        ("A", (256, 256), "M×K"),
        ("B", (256, 128), "K×2N, gate and up interleaved"),
        ("C", (256, 64), "M×N output"),
    ]
    a, b, c = arrays(workload)
    _refused(k, [a, StandIn(np.zeros((256, 64), np.float16)), c], "B", "shape must be (256, 128)")
    k(a, b, c)
    (launch,) = [entry for entry in launches if "function" in entry]
    assert "'N': 128" in repr(launch)  # the GEMM's N: both projections


def test_a_bias_gelu_kernel_takes_the_bias_after_b_and_passes_the_gelu_form(launches):
    workload = {"op": "gemm_bias_gelu", "m": 256, "n": 64, "k": 256, "approximate": "tanh"}
    k = pipetune.kernel(workload, "h100", schedule=S)
    assert [(op.name, op.shape, op.role) for op in k.operands] == [
        ("A", (256, 256), "M×K"),
        ("B", (256, 64), "K×N"),
        ("bias", (64,), "N"),
        ("C", (256, 64), "M×N output"),
    ]
    a, b, bias, c = arrays(workload)
    _refused(k, [a, b, StandIn(np.zeros(63, np.float16)), c], "bias", "shape must be (64,)")
    k(a, b, bias, c)
    (launch,) = [entry for entry in launches if "function" in entry]
    assert "'gelu_tanh': 1" in repr(launch)


def test_a_wrong_shape_dtype_stride_or_device_is_refused_by_name(launches):
    k = pipetune.kernel(FC, "h100", schedule=S)
    a, b, c = arrays(FC)
    _refused(k, [a, StandIn(np.zeros((2048, 63), np.float16)), c], "B", "shape must be (2048, 64)")
    _refused(k, [a, b, StandIn(np.zeros((1024, 64), np.float32))], "C", "dtype must be float16")
    transposed = StandIn(np.zeros((2048, 1024), np.float16).T)
    _refused(k, [transposed, b, c], "A", "dense row-major")
    _refused(k, [a, StandIn(b.host, device=(1, 0)), c], "B", "must be on a CUDA device, is on cpu")
    _refused(k, [a, b, StandIn(c.host, device=(2, 1))], "C", "but A is on cuda:0")
    _refused(k, [a, [[0.0]], c], "B", "expected a CUDA array that speaks DLPack")
    with pytest.raises(TypeError, match="takes A, B and optionally C"):
        k(a)
    assert launches == []  # nothing was launched


class RequiresGrad(TorchStyle):
    """What a PyTorch tensor that requires grad (an nn.Parameter) does when exported."""

    def __dlpack__(self, stream: Any = None) -> Any:
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")


def test_an_array_its_library_will_not_export_is_refused_by_name(launches):
    """A layer's weight passed as gamma raised PyTorch's own BufferError, naming no
    argument, from inside the call."""
    k = pipetune.kernel(LAYERNORM, "h100", schedule=TWO_PASS)
    x, gamma, beta, y = arrays(LAYERNORM, cls=TorchStyle, schedule=TWO_PASS)
    _refused(k, [x, RequiresGrad(gamma.host), beta, y], "gamma", "use tensor.detach()")
    assert [c for c in launches if "config" in c] == []


def test_a_misaligned_array_is_refused_by_name(launches):
    k = pipetune.kernel(FC, "h100", schedule=S)
    a, b, _ = arrays(FC)
    raw = np.zeros(1024 * 64 + 8, dtype=np.float16)
    offset = next(i for i in range(8) if (raw.ctypes.data + 2 * i) % 16)
    _refused(k, [a, b, StandIn(raw[offset : offset + 1024 * 64].reshape(1024, 64))], "C", "aligned")


def test_size_one_dimensions_may_have_any_stride(launches):
    k = pipetune.kernel(bmm(1, 128, 64, 128), "h100", schedule=S)
    a, b, c = arrays(bmm(1, 128, 64, 128), cls=TorchStyle)
    a.stride = lambda: (999, 128, 1)  # PyTorch leaves a size-1 dimension's stride free
    assert k(a, b, c) is c and len(launches) == 2


# ---- the call: DLPack pointers, the output, the launch ---------------------------------------


def test_a_call_launches_on_the_arrays_memory_in_place(launches):
    k = pipetune.kernel(FC, "h100", schedule=S)
    a, b, c = arrays(FC)
    assert k(a, b, c) is c
    load, launch = launches
    assert load == {"load": 0, "sm": 90, "kernel": k.name}
    assert launch["config"] == k.launch and launch["stream"] == 0
    assert launch["pointers"] == [x.host.ctypes.data for x in (a, b, c)]
    assert a.streams == [1]  # DLPack's name for the legacy default stream the launch uses
    k(a, b, c)
    assert len(launches) == 3  # the module is loaded once per device


def test_a_schedule_needing_more_shared_memory_than_the_device_has_is_refused(
    launches, monkeypatch
):
    """An H100 schedule called on a device with less shared memory per block (an A100 has
    163 KiB where an H100 has 227) failed with the driver's bare
    cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES): CUDA_ERROR_INVALID_VALUE."""
    k = pipetune.kernel(FC, "h100", schedule=S)
    monkeypatch.setattr(cuda_launch, "max_shared_per_block", lambda device: S.smem_bytes - 1)
    with pytest.raises(cuda_launch.CudaLaunchError) as refused:
        k(*arrays(FC))
    assert str(refused.value) == (
        f"{k.name} needs {S.smem_bytes} bytes of shared memory per block where device 0 "
        f"allows {S.smem_bytes - 1}: it was tuned for h100; tune it for this GPU"
    )
    assert launches == []  # nothing loaded or launched
    monkeypatch.setattr(cuda_launch, "max_shared_per_block", lambda device: S.smem_bytes)
    k(*arrays(FC))  # exactly at the limit it runs
    assert [c.get("kernel") for c in launches[:1]] == [k.name]


def test_torch_style_tensors_are_accepted(launches):
    k = pipetune.kernel(conv2d(2, 14, 14, 64, 64, 3, 3, pad=1), "h100", schedule=S)
    a, b, c = arrays(conv2d(2, 14, 14, 64, 64, 3, 3, pad=1), cls=TorchStyle)
    assert k(a, b, c) is c and launches[-1]["pointers"][2] == c.host.ctypes.data


class TorchBfloat16(TorchStyle):
    """A torch.bfloat16 tensor: its bits held as uint16, DLPack's bfloat type code (4)."""

    dl_code = 4

    def __init__(self, host: np.ndarray, device: tuple[int, int] = CUDA):
        super().__init__(host.astype(np.uint16), device)
        self.dtype = "torch.bfloat16"


BF16_FC = {**FC, "dtype": "bfloat16"}


def test_a_bfloat16_kernel_takes_bfloat16_tensors(launches):
    k = pipetune.kernel(BF16_FC, "h100", schedule=S)
    assert k.name.endswith("_bf16") and "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in (
        k.source
    )
    assert [op.dtype for op in k.operands] == ["bfloat16"] * 3
    assert cubin_sm(k.cubin()) == 90
    a, b, c = arrays(BF16_FC, cls=TorchBfloat16)
    assert k(a, b, c) is c and launches[-1]["pointers"][2] == c.host.ctypes.data
    assert launches[-1]["config"] == k.launch and launches[-1]["config"].kernel == k.name


def test_a_bfloat16_kernel_refuses_float16_arrays_and_says_cupy_has_no_bfloat16(launches):
    k = pipetune.kernel(BF16_FC, "h100", schedule=S)
    _refused(k, arrays(BF16_FC), "A", "dtype must be bfloat16, got float16")
    bits = [StandIn(np.zeros(op.shape, dtype=np.uint16)) for op in k.operands]
    _refused(k, bits, "A", "CuPy has no bfloat16: pass PyTorch tensors of torch.bfloat16")
    # And a float16 kernel refuses bfloat16 tensors.
    fp16 = pipetune.kernel(FC, "h100", schedule=S)
    _refused(fp16, arrays(FC, cls=TorchBfloat16), "A", "dtype must be float16, got bfloat16")


class CupyArray(StandIn):
    """A stand-in that names CuPy's module, so pipetune takes it for a CuPy array."""


CupyArray.__module__ = "cupy._core.core"


def fake_cupy(monkeypatch, stream_ptr: int) -> list[Any]:
    """A `cupy` module whose `empty` makes CupyArray stand-ins (returned in the list, in
    order) and whose current stream is `stream_ptr`, installed for one test."""
    allocated: list[Any] = []

    class Device:
        def __init__(self, index: int):
            assert index == 0

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    def empty(shape: tuple[int, ...], dtype: Any) -> StandIn:
        allocated.append(CupyArray(np.zeros(shape, dtype=dtype)))
        return allocated[-1]

    fake = types.ModuleType("cupy")
    fake.float16 = np.float16  # type: ignore[attr-defined]
    fake.empty = empty  # type: ignore[attr-defined]
    fake.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Device=Device, get_current_stream=lambda: types.SimpleNamespace(ptr=stream_ptr)
    )
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    return allocated


def test_the_output_is_allocated_by_the_callers_library(launches, monkeypatch):
    allocated = fake_cupy(monkeypatch, 0xBEEF)
    k = pipetune.kernel(FC, "h100", schedule=S)
    a, b = (CupyArray(x.host) for x in arrays(FC, with_output=False))
    c = k(a, b)
    assert allocated == [c] and c.shape == (1024, 64)
    assert launches[-1]["stream"] == 0xBEEF and a.streams == [0xBEEF]


def test_an_unknown_library_must_pass_the_output(launches):
    k = pipetune.kernel(FC, "h100", schedule=S)
    a, b = arrays(FC, with_output=False)
    _refused(k, [a, b], "C", "pass the output array")


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is here")
def test_without_a_driver_the_checked_call_says_so():
    k = pipetune.kernel(FC, "h100", schedule=S)
    with pytest.raises(CudaUnavailableError, match="no CUDA driver"):
        k(*arrays(FC))


def test_the_dlpack_reader_finds_numpys_own_pointer():
    host = np.arange(64, dtype=np.float16).reshape(8, 8)
    for view in (host, host[2:]):
        assert data_pointer("A", view, describe("A", view)) == view.ctypes.data


def test_kernel_params_point_at_the_values_in_order():
    launch = pipetune.kernel(FC, "h100", schedule=S).launch
    params = KernelParams(launch, [0x1000, 0x2000, 0x3000])
    slots = (ctypes.c_void_p * 6).from_address(params.address)
    pointers = [ctypes.c_void_p.from_address(slots[i]).value for i in range(3)]
    scalars = [ctypes.c_int32.from_address(slots[i]).value for i in range(3, 6)]
    assert pointers == [0x1000, 0x2000, 0x3000] and scalars == [1024, 64, 2048]


def test_repr_says_where_the_schedule_came_from():
    assert "(given)" in repr(pipetune.kernel(FC, "h100", schedule=S))


# ---- the memory-intensive family ---------------------------------------------------------


def _mem_id(case: tuple[Any, MemSchedule]) -> str:
    return f"{case[0].label()}-{case[1].id}"


def _signature(source: str, entry: str) -> list[str]:
    """The parameter types of an extern "C" entry in the generated source, in order."""
    match = re.search(rf"\b{re.escape(entry)}\s*\(([^)]*)\)", source)
    assert match, f"no entry {entry} in the source"
    types_ = []
    for param in match.group(1).split(","):
        words = param.replace("__restrict__", "").split()[:-1]  # drop the parameter name
        types_.append(" ".join(words).replace(" *", "*"))
    return types_


@pytest.mark.parametrize("case", MEM_CASES, ids=_mem_id)
def test_a_memops_source_compiles_for_sm_90_with_the_launchs_signature(case):
    workload, schedule = case
    k = pipetune.kernel(workload, "h100", schedule=schedule)
    assert k.schedule == schedule and k.origin == "given"
    assert cubin_sm(k.cubin()) == 90
    entry = k.name if len(k.launches) == 1 else None  # several entries: the worst case
    assert compile_source(k.source, "sm_90", entry=entry).registers > 0
    for launch in k.launches:
        # Each entry takes exactly the launch's parameters, in its order, with the types
        # its buffers and scalars say (const for what the kernel only reads).
        want = [
            k.plan.buffer(name).c_type if kind == "buffer" else kind.removesuffix("32")
            for name, kind in launch.parameters()
        ]
        assert _signature(k.source, launch.kernel) == want
        assert launch.block == (schedule.threads, 1, 1)


@pytest.mark.parametrize("case", MEM_CASES, ids=_mem_id)
def test_a_memops_launch_is_the_one_the_cupy_runner_times(case):
    workload, schedule = case
    k = pipetune.kernel(workload, "h100", schedule=schedule)
    # As KernelRunner.run_trials makes it: the device's SMs, the model's occupancy.
    spec, occupancy = runner_spec(workload, schedule)
    assert k.plan == spec.plan and k.launches == spec.plan.launches
    _assert_same_launch(spec, k)
    # The child plans again from the driver's occupancy exactly where the call does.
    assert (spec.codegen is not None) == k.grid_depends_on_occupancy
    assert (k.blocks_per_sm, k.sm_count) == (occupancy, H100_SMS)


@pytest.mark.parametrize(
    ("workload", "names", "shapes", "p0_p1"),
    [
        (softmax(512, 1024), ["x", "y"], [(512, 1024), (512, 1024)], ("x", "x")),
        (
            layernorm(512, 1024),
            ["x", "gamma", "beta", "y"],
            [(512, 1024), (1024,), (1024,), (512, 1024)],
            ("gamma", "beta"),
        ),
        (
            rmsnorm(512, 1024),
            ["x", "gamma", "y"],
            [(512, 1024), (1024,), (512, 1024)],
            ("gamma", "x"),
        ),
        (
            bias_gelu(512, 1024),
            ["x", "bias", "y"],
            [(512, 1024), (1024,), (512, 1024)],
            ("bias", "x"),
        ),
        (reduce(512, 1024, "max"), ["x", "y"], [(512, 1024), (512,)], ("x", "x")),
        # gate and up side by side in x's rows
        (silu_mul(512, 1024), ["x", "y"], [(512, 2048), (512, 1024)], ("x", "x")),
    ],
    ids=["softmax", "layernorm", "rmsnorm", "bias_gelu", "reduce", "silu_mul"],
)
def test_memops_arguments_are_the_launch_plans_inputs_then_output(workload, names, shapes, p0_p1):
    k = pipetune.kernel(workload, "h100", schedule=ROW)
    assert [op.name for op in k.operands] == names
    assert [op.shape for op in k.operands] == shapes
    assert all(op.dtype == "float16" for op in k.operands)
    assert [op.output for op in k.operands] == [False] * (len(names) - 1) + [True]
    # The generator's parameters (x, p0, p1, y, ws, rows, cols, eps, scale, queries): p0 and
    # p1 carry the buffer that fills them (an op without parameter vectors passes x, never
    # read).
    assert len(memops_codegen.ARGUMENTS) == len(k.launch.arguments)
    assert k.launch.arguments == ("x", *p0_p1, "y", "ws", *SCALARS)
    assert [w.name for w in k.workspace] == ["ws"]


def test_a_memops_schedule_is_checked_against_its_family():
    with pytest.raises(ScheduleError, match="not valid for reduce-sum 512x1024 on h100"):
        pipetune.kernel(reduce(512, 1024), "h100", schedule=FUSED)  # no output pass to fuse
    with pytest.raises(ScheduleError, match=r"unknown knob.*block_col_warps"):
        pipetune.kernel(SOFTMAX, "h100", schedule=S)  # a GEMM schedule


def test_a_memops_kernel_defaults_to_the_models_pick(tmp_path):
    k = pipetune.kernel(LAYERNORM, "h100", db=_empty_database(tmp_path))
    assert k.origin == "model" and isinstance(k.schedule, MemSchedule)
    assert cubin_sm(k.cubin()) == 90


def test_a_wrong_memops_argument_is_refused_by_name(launches):
    k = pipetune.kernel(LAYERNORM, "h100", schedule=TWO_PASS)
    x, gamma, beta, y = arrays(LAYERNORM, schedule=TWO_PASS)
    _refused(k, [x, StandIn(np.zeros(1023, np.float16)), beta, y], "gamma", "shape must be (1024,)")
    _refused(k, [x, gamma, StandIn(np.zeros(1024, np.float32)), y], "beta", "dtype must be float16")
    _refused(k, [x, gamma, beta, StandIn(np.zeros((512, 1024), np.float32))], "y", "float16")
    _refused(k, [StandIn(np.zeros((1024, 512), np.float16).T), gamma, beta, y], "x", "row-major")
    _refused(k, [x, gamma, StandIn(beta.host, device=(1, 0)), y], "beta", "is on cpu")
    _refused(k, [x, gamma, beta, StandIn(y.host, device=(2, 1))], "y", "but x is on cuda:0")
    every_other = StandIn(np.zeros(2048, np.float16)[::2])
    _refused(k, [x, every_other, beta, y], "gamma", "dense row-major")
    with pytest.raises(TypeError, match="takes x, gamma, beta and optionally y"):
        k(x, gamma)
    _refused(k, [x, gamma, beta], "y", "pass the output array")  # not CuPy, not PyTorch
    s = pipetune.kernel(SOFTMAX, "h100", schedule=ROW)
    _refused(s, [StandIn(np.zeros((512, 1023), np.float16))], "x", "shape must be (512, 1024)")
    assert launches == []  # nothing was loaded, allocated or launched


def test_a_two_pass_split_runs_both_launches_on_one_zeroed_workspace(launches, monkeypatch):
    k = pipetune.kernel(SOFTMAX, "h100", schedule=TWO_PASS)
    assert len(k.launches) == 2 and k.launches[1].kernel == f"{k.name}_out"
    (ws,) = k.workspace
    assert ws.dtype == "float32" and ws.role == "workspace"
    needed = int(workspace_bytes(TWO_PASS.knob_arrays(), SOFTMAX)[0])
    assert needed > 0 and ws.nbytes == needed  # a partial per (row, block) and two counters
    x, y = arrays(SOFTMAX, schedule=TWO_PASS)
    assert k(x, y) is y
    loads = [c for c in launches if "load" in c]
    allocs = [c for c in launches if "alloc" in c]
    runs = [c for c in launches if "config" in c]
    assert [c["kernel"] for c in loads] == [launch.kernel for launch in k.launches]
    assert [(c["alloc"], c["stream"]) for c in allocs] == [(ws.nbytes, 0)]
    assert [c["config"] for c in runs] == list(k.launches)  # no occupancy here: the plan
    address = {"x": x.host.ctypes.data, "y": y.host.ctypes.data}
    address["ws"] = allocs[0]["memory"].ctypes.data
    for run in runs:
        assert run["function"] == f"function-{run['config'].kernel}"
        assert run["pointers"] == [address[n] for n in run["config"].buffer_arguments]
        assert run["pointers"][:5] == [address[n] for n in ("x", "x", "x", "y", "ws")]
    k(x, y)  # the kernels return the counters to zero: the same workspace, not zeroed again
    assert len([c for c in launches if "alloc" in c]) == 1 and len(launches) == 7
    monkeypatch.setattr(
        "pipetune.clients.library.frameworks.current_stream", lambda array, device: 0xBEEF
    )
    k(x, y)  # another stream may run at the same time: a workspace of its own
    allocs = [c for c in launches if "alloc" in c]
    assert [c["stream"] for c in allocs] == [0, 0xBEEF]
    assert launches[-1]["pointers"][4] == allocs[1]["memory"].ctypes.data


def test_a_kernel_keeps_a_bounded_number_of_workspaces(launches, monkeypatch):
    """A caller that makes a stream for each call kept one workspace per stream for the
    kernel's life; the least recently used beyond WORKSPACE_CACHE are let go."""
    from pipetune.clients.library.kernel import WORKSPACE_CACHE

    k = pipetune.kernel(SOFTMAX, "h100", schedule=TWO_PASS)
    x, y = arrays(SOFTMAX, schedule=TWO_PASS)
    stream = iter(range(1, 1000))
    monkeypatch.setattr(
        "pipetune.clients.library.frameworks.current_stream", lambda array, device: next(stream)
    )
    for _ in range(WORKSPACE_CACHE + 10):
        k(x, y)
    assert len(k._workspaces) == WORKSPACE_CACHE
    kept = {key[1] for key in k._workspaces}
    assert kept == set(range(11, WORKSPACE_CACHE + 11))  # the newest streams'


def test_an_output_that_shares_memory_with_an_input_is_refused(launches):
    """An in-place call was accepted, and could only be wrong: a GEMM's blocks read A while
    others write C, a split row's second pass reads x after the first wrote y."""
    k = pipetune.kernel(FC, "h100", schedule=S)
    a, b, _ = arrays(FC)
    over_a = StandIn(a.host.reshape(-1)[: 1024 * 64].reshape(1024, 64))  # C inside A's memory
    _refused(k, [a, b, over_a], "C", "shares memory with A")
    s = pipetune.kernel(SOFTMAX, "h100", schedule=TWO_PASS)
    x, y = arrays(SOFTMAX, schedule=TWO_PASS)
    _refused(s, [x, x], "y", "shares memory with x: the kernel does not run in place")
    assert launches == []
    assert s(x, y) is y  # separate arrays run


def test_a_fused_split_is_sized_again_from_the_drivers_occupancy(launches):
    k = pipetune.kernel(LAYERNORM, "h100", schedule=FUSED)
    assert k.grid_depends_on_occupancy and len(k.launches) == 1 and k.workspace
    assert k.blocks_per_sm > DRIVER_BLOCKS_PER_SM  # the model's grid would not be resident
    x, gamma, beta, y = arrays(LAYERNORM, schedule=FUSED)
    assert k(x, gamma, beta, y) is y
    (occupancy,) = [c for c in launches if "occupancy" in c]
    assert occupancy == {"occupancy": f"function-{k.name}", "block": (32, 1, 1), "smem": 16}
    run = launches[-1]
    kernel = memops_codegen.generate(LAYERNORM, FUSED)
    again = memops_codegen.launch_plan(kernel, LAYERNORM, H100_SMS, DRIVER_BLOCKS_PER_SM)
    assert run["config"] == again.launches[0] != k.launch
    # Whole rows of 4 blocks, all resident at once: one wave of the driver's occupancy.
    assert run["config"].grid == (H100_SMS * DRIVER_BLOCKS_PER_SM // 4 * 4, 1, 1)
    assert run["pointers"][:4] == [a.host.ctypes.data for a in (x, gamma, beta, y)]
    k(x, gamma, beta, y)
    assert len([c for c in launches if "occupancy" in c]) == 1  # planned once per device


def test_a_memops_output_is_allocated_by_the_callers_library(launches, monkeypatch):
    allocated = fake_cupy(monkeypatch, 0xCAFE)
    w = reduce(512, 1024)
    k = pipetune.kernel(w, "h100", schedule=TWO_PASS)
    (x,) = (CupyArray(a.host) for a in arrays(w, with_output=False, schedule=TWO_PASS))
    y = k(x)
    assert allocated == [y] and y.shape == (512,) and y.dtype == np.float16
    assert [c["stream"] for c in launches if "alloc" in c] == [0xCAFE]
    assert [c["config"].grid for c in launches if "config" in c] == [
        launch.grid for launch in k.launches
    ]


def test_a_memops_repr_counts_its_launches():
    assert "then 1 more launch" in repr(pipetune.kernel(SOFTMAX, "h100", schedule=TWO_PASS))
    assert "more launch" not in repr(pipetune.kernel(SOFTMAX, "h100", schedule=ROW))


def test_an_attention_softmax_kernel_takes_its_scale_and_mask_as_arguments():
    """A masked softmax is a kernel of its own; its scale and query length are arguments of
    the launch (so one cubin serves every scale), and a plain softmax passes no mask."""
    attention = pipetune.kernel(softmax(512, 1024, 0.125, causal=True, queries=8), "h100",
                                schedule=ROW)  # fmt: skip
    assert attention.name == "pipetune_mem_softmax_causal_m_128_1_1_8_0_0_0"
    assert attention.launch.scalars["scale"] == 0.125 and attention.launch.scalars["queries"] == 8
    plain = pipetune.kernel(SOFTMAX, "h100", schedule=ROW)
    assert plain.name == "pipetune_mem_softmax_m_128_1_1_8_0_0_0"
    assert plain.launch.scalars["scale"] == 1.0 and plain.launch.scalars["queries"] == 0
    scaled = pipetune.kernel(softmax(512, 1024, 0.5), "h100", schedule=ROW)
    assert scaled.name == plain.name and scaled.launch.scalars["scale"] == 0.5
