"""Launching a compiled kernel through the CUDA driver API (cuda-bindings, a dependency of
pipetune): no CuPy or PyTorch needed for the launch itself, and the arrays' memory is used
where it is.

Everything runs in the device's primary context, the one CuPy and PyTorch use, so their
pointers are valid here; it is made current only around each call and the caller's own
current context is restored. A kernel object keeps the modules it loaded, one per device,
and the workspaces and TMA tensor maps it allocated (:class:`DeviceMemory`, freed with the
kernel object).
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pipetune.model.errors import InvalidArgumentError, PipetuneError
from pipetune.workers.launch_plan import KernelLaunch

STATIC_SMEM_LIMIT = 48 * 1024  # above this, dynamic shared memory must be opted into


class CudaUnavailableError(PipetuneError, RuntimeError):
    """No CUDA driver or device here (everything but the launch works without one)."""


class CudaLaunchError(PipetuneError, RuntimeError):
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


@functools.cache
def sm_count(device: int) -> int:
    """The device's streaming multiprocessors (a wave of resident blocks is this times the
    blocks per SM)."""
    cu = _driver()
    with _current(device):
        handle = _check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        count = _check(
            cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, handle
            ),
            "multiprocessor count",
        )
    return int(count)


@functools.cache
def max_shared_per_block(device: int) -> int:
    """The most dynamic shared memory one block may opt in to on the device, in bytes."""
    cu = _driver()
    with _current(device):
        handle = _check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        limit = _check(
            cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                handle,
            ),
            "shared memory per block",
        )
    return int(limit)


def occupancy(device: int, function: Any, config: KernelLaunch) -> int:
    """Blocks of `config`'s launch of the loaded `function` resident at once per SM, as the
    driver computes them (its registers, block size and dynamic shared memory)."""
    cu = _driver()
    with _current(device):
        blocks = _check(
            cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                function, config.block[0] * config.block[1] * config.block[2], config.smem_bytes
            ),
            f"cuOccupancyMaxActiveBlocksPerMultiprocessor({config.kernel})",
        )
    return int(blocks)


def _free(device: int, address: int) -> None:
    # A kernel launched on any stream may still use the memory: wait for the device first
    # (cuMemFree "may" synchronise, which is not a promise). Errors are ignored: at
    # interpreter exit the driver may be gone already, taking the memory with it.
    try:
        cu = _driver()
        with _current(device):
            cu.cuCtxSynchronize()
            cu.cuMemFree(cu.CUdeviceptr(address))
    except Exception:  # a finalizer must not raise
        pass


class DeviceMemory:
    """Device memory of our own (cuMemAlloc in the primary context), freed when the object
    is collected: a kernel's workspace or tensor map, which no caller's array library has to
    provide."""

    def __init__(self, device: int, nbytes: int):
        cu = _driver()
        with _current(device):
            pointer = _check(cu.cuMemAlloc(max(1, nbytes)), f"cuMemAlloc({nbytes})")
        self.device = device
        self.nbytes = nbytes
        self.address = int(pointer)
        self.staged: Any = None  # host bytes an asynchronous upload may still read (upload)
        self._finalizer = weakref.finalize(self, _free, device, self.address)


def allocate_zeroed(device: int, nbytes: int, stream: int) -> DeviceMemory:
    """`nbytes` of device memory, zeroed on `stream` (asynchronously: the launches that
    follow on the same stream see the zeros)."""
    memory = DeviceMemory(device, nbytes)
    cu = _driver()
    with _current(device):
        _check(
            cu.cuMemsetD8Async(cu.CUdeviceptr(memory.address), 0, nbytes, cu.CUstream(stream)),
            "cuMemsetD8Async",
        )
    return memory


def upload(device: int, data: bytes, stream: int) -> DeviceMemory:
    """`data` in device memory of its own, copied on `stream` (asynchronously: the launches
    that follow on the same stream see it): a TMA tensor map a kernel takes by pointer."""
    memory = DeviceMemory(device, len(data))
    # The driver may read pageable host memory after the call returns: keep it with the copy.
    memory.staged = (ctypes.c_char * len(data)).from_buffer_copy(data)
    cu = _driver()
    with _current(device):
        _check(
            cu.cuMemcpyHtoDAsync(
                cu.CUdeviceptr(memory.address),
                ctypes.addressof(memory.staged),
                len(data),
                cu.CUstream(stream),
            ),
            "cuMemcpyHtoDAsync",
        )
    return memory


class KernelParams:
    """cuLaunchKernel's ``void** kernelParams``: one slot per parameter in the launch's
    ``arguments`` order, each pointing at its value (pointers as ``void*``, one per
    ``pointer_arguments`` name in that order: the leading ones, then those after the
    scalars; scalars as ``int32`` or ``float32``, as the launch declares them)."""

    def __init__(self, config: KernelLaunch, pointers: Sequence[int]):
        if len(pointers) != len(config.pointer_arguments):
            raise InvalidArgumentError(
                "pointers",
                f"{config.kernel} takes {len(config.pointer_arguments)} pointers "
                f"({', '.join(config.pointer_arguments)}), given {len(pointers)}",
            )
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
    """One launch on `stream` (0: the legacy default stream), asynchronous as any launch. A
    cooperative one (its blocks wait for each other) goes through cuLaunchCooperativeKernel:
    a plain launch of it beside the caller's other work on the GPU could leave some blocks
    unscheduled and the rest spinning for ever; the driver refuses such a grid instead."""
    cu = _driver()
    params = KernelParams(config, pointers)
    shape = (*config.grid, *config.block, config.smem_bytes, cu.CUstream(stream), params.address)
    with _current(device):
        if config.cooperative:
            _check(
                cu.cuLaunchCooperativeKernel(function, *shape),
                f"cuLaunchCooperativeKernel({config.kernel})",
            )
            return
        _check(cu.cuLaunchKernel(function, *shape, 0), f"cuLaunchKernel({config.kernel})")
