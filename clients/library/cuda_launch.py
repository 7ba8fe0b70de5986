"""Launching a compiled kernel through the CUDA driver API (cuda-bindings, a dependency of
pipetune): no CuPy or PyTorch needed for the launch itself, and the arrays' memory is used
where it is.

Everything runs in the device's primary context, the one CuPy and PyTorch use, so their
pointers are valid here; it is made current only around each call and the caller's own
current context is restored. A kernel object keeps the modules it loaded, one per device.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pipetune.workers.launch_plan import KernelLaunch

STATIC_SMEM_LIMIT = 48 * 1024  # above this, dynamic shared memory must be opted into


class CudaUnavailableError(RuntimeError):
    """No CUDA driver or device here (everything but the launch works without one)."""


class CudaLaunchError(RuntimeError):
    """The driver refused a call (module load, attribute, launch)."""


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _check(result: Any, what: str) -> Any:
    """cuda-bindings return (CUresult, *values): the values, or CudaLaunchError."""
    cu = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        name = cu.cuGetErrorName(err)[1]
        text = name.decode() if isinstance(name, bytes) else str(err)
        raise CudaLaunchError(f"{what}: {text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@functools.cache
def _primary_context(device: int) -> Any:
    cu = _driver()
    try:
        _check(cu.cuInit(0), "cuInit")
    except CudaLaunchError as exc:
        raise CudaUnavailableError(f"no usable CUDA device: {exc}") from None
    except Exception as exc:  # no libcuda at all (a machine without the NVIDIA driver)
        raise CudaUnavailableError(f"no CUDA driver: {type(exc).__name__}: {exc}") from None
    handle = _check(cu.cuDeviceGet(device), f"cuDeviceGet({device})")
    return _check(cu.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")


@contextmanager
def _current(device: int) -> Iterator[None]:
    cu = _driver()
    _check(cu.cuCtxPushCurrent(_primary_context(device)), "cuCtxPushCurrent")
    try:
        yield
    finally:
        cu.cuCtxPopCurrent()


@functools.cache
def device_arch(device: int) -> str:
    """The device's architecture as NVRTC names it (sm_90 for an H100)."""
    cu = _driver()
    attribute = cu.CUdevice_attribute
    with _current(device):
        handle = _check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        major = _check(
            cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle),
            "compute capability",
        )
        minor = _check(
            cu.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle),
            "compute capability",
        )
    return f"sm_{major}{minor}"


class KernelParams:
    """cuLaunchKernel's ``void** kernelParams``: one slot per parameter in the launch's
    ``arguments`` order, each pointing at its value (buffers as ``void*``, in the order the
    pointers are given; scalars as ``int32`` or ``float32``, as the launch declares them)."""

    def __init__(self, config: KernelLaunch, pointers: Sequence[int]):
        buffers = iter(pointers)
        self.values: list[ctypes.c_void_p | ctypes.c_int32 | ctypes.c_float] = []
        for name, kind in config.parameters():
            if kind == "buffer":
                self.values.append(ctypes.c_void_p(next(buffers)))
            elif kind == "float32":
                self.values.append(ctypes.c_float(config.scalars[name]))
            else:
                self.values.append(ctypes.c_int32(int(config.scalars[name])))
        slots = ctypes.c_void_p * len(self.values)
        self.array = slots(*(ctypes.addressof(v) for v in self.values))

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def load_function(device: int, cubin: bytes, config: KernelLaunch) -> Any:
    """The kernel's function handle on `device` (the caller keeps it: loading is per call)."""
    cu = _driver()
    with _current(device):
        module = _check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        function = _check(
            cu.cuModuleGetFunction(module, config.kernel.encode()), "cuModuleGetFunction"
        )
        if config.smem_bytes > STATIC_SMEM_LIMIT:
            _check(
                cu.cuFuncSetAttribute(
                    function,
                    cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    config.smem_bytes,
                ),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )
    return function


def launch(
    device: int, function: Any, config: KernelLaunch, pointers: Sequence[int], stream: int
) -> None:
    """One launch on `stream` (0: the legacy default stream), asynchronous as any launch."""
    cu = _driver()
    params = KernelParams(config, pointers)
    with _current(device):
        _check(
            cu.cuLaunchKernel(
                function,
                *config.grid,
                *config.block,
                config.smem_bytes,
                cu.CUstream(stream),
                params.address,
                0,
            ),
            f"cuLaunchKernel({config.kernel})",
        )
