"""pipetune.kernel without a GPU: the source, the cubin, the launch (the cupy runner's own),
and the call's argument checks and DLPack pointers, with stand-in arrays on the CPU that
say they live on a CUDA device. Only the driver's launch itself is replaced here."""

from __future__ import annotations

import ctypes
import ctypes.util
import types
from typing import Any

import numpy as np
import pytest
from cubin_support import cubin_sm

import pipetune
from pipetune.clients.library import cuda_launch
from pipetune.clients.library.arrays import ArgumentError, data_pointer, describe
from pipetune.clients.library.cuda_launch import CudaUnavailableError, KernelParams
from pipetune.model.space import Schedule, ScheduleError
from pipetune.model.workloads import bmm, conv2d, conv3d, gemm
from pipetune.workers.codegen import generate
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
    bmm(4, 128, 64, 128),
    conv2d(2, 14, 14, 64, 64, 3, 3, pad=1),
    conv3d(1, 4, 8, 8, 16, 64, 3, 3, 3, pad=1),
]


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
        code = 2 if self.host.dtype.kind == "f" else 0
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


def arrays(workload, cls=StandIn, with_output: bool = True) -> list[StandIn]:
    k = pipetune.kernel(workload, "h100", schedule=S)
    made = [cls(np.zeros(op.shape, dtype=np.float16)) for op in k.operands]
    return made if with_output else made[:2]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record launches instead of calling the driver (the only part that needs a GPU)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(cuda_launch, "device_arch", lambda device: "sm_90")

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


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.label())
def test_the_launch_is_the_one_the_cupy_runner_times(workload):
    k = pipetune.kernel(workload, "h100", schedule=S)
    compiled = Compiled(kernel=generate(workload, S), cubin_path="/cubins/x.cubin")
    spec = trial_spec(compiled, workload, S, RepeatPolicy.of(MeasureSettings()))
    assert (spec.kernel_name, spec.grid, (spec.threads, 1, 1), spec.smem_bytes) == (
        k.launch.kernel,
        k.launch.grid,
        k.launch.block,
        k.launch.smem_bytes,
    )
    assert spec.scalars == tuple(k.launch.scalars.values())


def test_the_schedule_comes_from_the_local_database_else_the_model(tmp_path):
    k = pipetune.kernel(FC, "h100", db=f"sqlite:///{tmp_path / 'none.db'}")
    assert k.origin == "model" and k.runner is None
    assert not (tmp_path / "none.db").exists()  # a lookup creates nothing


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


def test_torch_style_tensors_are_accepted(launches):
    k = pipetune.kernel(conv2d(2, 14, 14, 64, 64, 3, 3, pad=1), "h100", schedule=S)
    a, b, c = arrays(conv2d(2, 14, 14, 64, 64, 3, 3, pad=1), cls=TorchStyle)
    assert k(a, b, c) is c and launches[-1]["pointers"][2] == c.host.ctypes.data


def test_the_output_is_allocated_by_the_callers_library(launches, monkeypatch):
    stream = types.SimpleNamespace(ptr=0xBEEF)
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
    fake.cuda = types.SimpleNamespace(Device=Device, get_current_stream=lambda: stream)  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)

    class CupyArray(StandIn):
        pass

    CupyArray.__module__ = "cupy._core.core"
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
