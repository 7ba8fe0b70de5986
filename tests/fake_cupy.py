"""A stand-in for CuPy built on numpy: the arrays, events, streams, devices, runtime queries
and RawModules that the GPU-side functions call (workers.runners.cupy_child,
workers.campaign.cuda_side). With it, those functions run on a CPU in the test process.

What this checks: their control flow (the order of load, NaN fill, launch, check and timing;
a fault poisoning a batch; the disk-cached reference; the timing loop on events). What it
cannot check: CuPy's real API or anything a GPU does. A "kernel" here is a Python function
chosen by the cubin file's content (``KERNELS``).
"""

from __future__ import annotations

import types
from typing import Any, ClassVar

import numpy as np


class CUDADriverError(RuntimeError):
    pass


class CUDARuntimeError(RuntimeError):
    pass


def _gemm_kernel(grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
    """A correct kernel for gemm_kn: C = A @ B in fp32, stored as fp16."""
    a, b, c = args[:3]
    c[...] = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)


def _wrong_kernel(grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
    a, b, c = args[:3]
    c[...] = (a.astype(np.float32) @ b.astype(np.float32) + 1).astype(np.float16)


def _failing_launch(grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
    raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: invalid argument")


class _State:
    faulted = False
    launches = 0
    elapsed_ms = 0.01
    handles: ClassVar[dict[int, Any]] = {}  # driver handle -> function, for the driver's queries
    occupancy_queries: ClassVar[list[tuple[int, int, int]]] = []
    blocks_per_sm = 3  # what the fake driver's occupancy query answers
    cooperative: ClassVar[list[bool]] = []  # each launch: made cooperatively or not


def _occupancy(func: int, block_size: int, dynamic_smem: int) -> int:
    """cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor: takes the handle (an
    int), as the real one does; anything else is the driver's invalid-handle error."""
    if not isinstance(func, int) or func not in _State.handles:
        raise CUDADriverError(f"CUDA_ERROR_INVALID_HANDLE: {func!r}")
    _State.occupancy_queries.append((func, block_size, dynamic_smem))
    return _State.blocks_per_sm


def _faulting_kernel(grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
    _State.faulted = True  # reported at the next synchronisation, as a GPU does


def _empty_kernel(grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
    pass


# The first line of a fake cubin names its kernel's behaviour.
KERNELS = {
    b"ok": _gemm_kernel,
    b"wrong": _wrong_kernel,
    b"launch-error": _failing_launch,
    b"fault": _faulting_kernel,
    b"empty": _empty_kernel,
}


class _LoadedFunction:
    """What CuPy's ``RawKernel.kernel`` gives: the loaded function, whose ``ptr`` is the
    driver's handle (a RawKernel itself has no ``ptr``), and whose call takes
    ``enable_cooperative_groups`` (cuLaunchCooperativeKernel) per launch."""

    def __init__(self, ptr: int, owner: _Function):
        self.ptr = ptr
        self.owner = owner

    def __call__(
        self,
        grid: Any,
        block: Any,
        args: tuple,
        shared_mem: int = 0,
        stream: Any = None,
        enable_cooperative_groups: bool = False,
    ) -> None:
        self.owner.launch(grid, block, args, shared_mem, enable_cooperative_groups)


class _Function:
    def __init__(self, behaviour: Any):
        self.behaviour = behaviour
        self.max_dynamic_shared_size_bytes = 0
        self.kernel = _LoadedFunction(0x7F00 + len(_State.handles), self)
        _State.handles[self.kernel.ptr] = self

    def __call__(self, grid: Any, block: Any, args: tuple, shared_mem: int = 0) -> None:
        # (A RawKernel's call: cooperative only where its module was loaded so, never here.)
        self.launch(grid, block, args, shared_mem, cooperative=False)

    def launch(
        self, grid: Any, block: Any, args: tuple, shared_mem: int, cooperative: bool
    ) -> None:
        _State.launches += 1
        _State.cooperative.append(cooperative)
        if shared_mem > max(self.max_dynamic_shared_size_bytes, 48 * 1024):
            raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: too much shared memory")
        self.behaviour(grid, block, args, shared_mem)


class _RawModule:
    def __init__(self, path: str | None = None, code: str | None = None, **_: Any):
        with open(path, "rb") as handle:
            self.behaviour = KERNELS[handle.readline().strip()]

    def get_function(self, name: str) -> _Function:
        return _Function(self.behaviour)


def _synchronize() -> None:
    if _State.faulted:
        _State.faulted = False
        raise CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access")


class _Event:
    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        _synchronize()


class _Device:
    def __init__(self, index: int = 0):
        self.index = self.id = index  # CuPy's Device names it id

    def use(self) -> None:
        pass

    def synchronize(self) -> None:
        _synchronize()


PROPERTIES = {
    "name": b"NVIDIA H100 80GB HBM3",
    "major": 9,
    "minor": 0,
    "multiProcessorCount": 132,
    "l2CacheSize": 1 << 20,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
    "totalGlobalMem": 80 << 30,
}
ATTRIBUTES = {13: 1980000, 36: 2619000, 37: 5120}


def make() -> types.ModuleType:
    """A fresh fake ``cupy`` module (put it in sys.modules["cupy"])."""
    _State.faulted, _State.launches = False, 0
    _State.handles, _State.occupancy_queries, _State.cooperative = {}, [], []
    cupy = types.ModuleType("cupy")
    for name in (
        "abs", "argmax", "array", "asarray", "count_nonzero", "empty", "float16", "float32",
        "int64", "isfinite", "isnan", "matmul", "pad", "stack", "uint8", "uint16", "uint32",
        "uint64", "where", "zeros",
    ):  # fmt: skip
        setattr(cupy, name, getattr(np, name))
    cupy.asnumpy = np.asarray
    cupy.__version__ = "14.0.0-fake"
    runtime = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError,
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda device: dict(PROPERTIES),
        deviceGetAttribute=lambda attr, device: ATTRIBUTES[attr],
        runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000,
    )
    stream = types.SimpleNamespace(synchronize=_synchronize)
    cupy.cuda = types.SimpleNamespace(
        runtime=runtime,
        driver=types.SimpleNamespace(
            CUDADriverError=CUDADriverError,
            occupancyMaxActiveBlocksPerMultiprocessor=_occupancy,
        ),
        nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)),
        Device=_Device,
        Event=_Event,
        get_current_stream=lambda: stream,
        get_elapsed_time=lambda start, end: _State.elapsed_ms,
    )
    cupy.RawModule = _RawModule
    cupy.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    cupy.state = _State
    return cupy
