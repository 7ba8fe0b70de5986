"""What a tuned kernel needs from the array library its caller uses (CuPy or PyTorch): the
stream to launch on, and an output array when none is passed. Both are imported only when
the caller's arrays come from them."""

from __future__ import annotations

from typing import Any

from pipetune.clients.library.arrays import ArgumentError, Operand

KNOWN = ("cupy", "torch")
LEGACY_DEFAULT_STREAM = 0  # the driver's handle; DLPack calls it 1
DLPACK_LEGACY_DEFAULT = 1


def library_of(array: Any) -> str:
    """The top-level package an array type comes from ("cupy", "torch", ...)."""
    return type(array).__module__.partition(".")[0]


def current_stream(array: Any, device: int) -> int:
    """The stream the caller's library would run the next kernel on: launching there keeps
    the kernel in order with the caller's own work. Other libraries: the legacy default."""
    library = library_of(array)
    if library == "torch":
        import torch

        return int(torch.cuda.current_stream(device).cuda_stream)
    if library == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return int(cupy.cuda.get_current_stream().ptr)
    return LEGACY_DEFAULT_STREAM


def dlpack_stream(stream: int) -> int:
    """The stream as `__dlpack__(stream=...)` takes it (0 is not allowed there)."""
    return DLPACK_LEGACY_DEFAULT if stream == LEGACY_DEFAULT_STREAM else stream


def allocate_output(like: Any, device: int, spec: Operand) -> Any:
    """An uninitialised output of the operand's shape and dtype, from the library of
    `like`, on its device."""
    library = library_of(like)
    if library == "torch":
        import torch

        return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=like.device)
    if library == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(spec.shape, dtype=getattr(cupy, spec.dtype))
    raise ArgumentError(
        spec.name,
        f"pass the output array: pipetune allocates one only for {' and '.join(KNOWN)} "
        f"inputs, these are {library}",
    )
