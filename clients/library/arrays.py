"""A tuned kernel's array arguments: what each must be, checked before any launch, and the
memory behind a CUDA array, read through DLPack without a copy.

The checks read what CuPy arrays and PyTorch tensors both expose (``shape``, ``dtype``,
``strides`` in bytes or PyTorch's ``stride()`` in elements, ``__dlpack_device__()``), so any
array object with those attributes is checked the same way (the tests use stand-ins on the
CPU). Every refusal is an :class:`ArgumentError` that names the argument.

The data pointer comes from the array's DLPack capsule, which is read, not consumed: the
capsule is left unrenamed, so its destructor hands the tensor back to its producer (the
DLPack protocol's rule for a capsule nobody took), and the array keeps owning its memory.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipetune.model.errors import InvalidArgumentError, InvalidArgumentTypeError
from pipetune.workers.launch_plan import ITEMSIZE as BUFFER_ITEMSIZE
from pipetune.workers.launch_plan import LaunchPlan

DTYPE = "float16"
ITEMSIZE = 2
# Every family's kernels move up to 16 bytes per load (cp.async, uint4 vectors): asked of
# every array, whatever the schedule's vector width (an allocation's start always is).
ALIGN_BYTES = 16

# DLPack device types (dlpack.h DLDeviceType).
KDL_CUDA = 2
KDL_CUDA_MANAGED = 13
CUDA_DEVICE_TYPES = (KDL_CUDA, KDL_CUDA_MANAGED)
DEVICE_NAMES = {
    1: "cpu",
    2: "cuda",
    3: "cuda_host",
    4: "opencl",
    7: "vulkan",
    8: "metal",
    10: "rocm",
    11: "rocm_host",
    13: "cuda_managed",
    14: "oneapi",
}
DLPACK_TYPE_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat"}  # dlpack.h DLDataTypeCode

# What the arrays hold, per kernel kind (the family generator's kernel_kind): the GEMM
# variants' layouts (workers/codegen/variants.py). A kind without an entry (the
# memory-intensive ops, whose buffer names say it) is described by the buffer's role.
ROLES: dict[str, dict[str, str]] = {
    "gemm_kn": {"A": "M×K", "B": "K×N", "C": "M×N output"},
    "gemm_nk": {"A": "M×K", "B": "N×K", "C": "M×N output"},
    # N: the width of each projection; B's 2N columns (rows) interleave gate and up by 8.
    "gemm_swiglu_kn": {"A": "M×K", "B": "K×2N, gate and up interleaved", "C": "M×N output"},
    "gemm_swiglu_nk": {"A": "M×K", "B": "2N×K, gate and up interleaved", "C": "M×N output"},
    "gemm_bias_gelu_kn": {"A": "M×K", "B": "K×N", "bias": "N", "C": "M×N output"},
    "gemm_bias_gelu_nk": {"A": "M×K", "B": "N×K", "bias": "N", "C": "M×N output"},
    "bmm": {"A": "batch×M×K", "B": "batch×K×N", "C": "batch×M×N output"},
    "bmm_nk": {"A": "batch×M×K", "B": "batch×N×K", "C": "batch×M×N output"},
    "conv2d": {"A": "input, NHWC", "B": "filter, KRSC", "C": "output, NPQK"},
    "conv3d": {"A": "input, NDHWC", "B": "filter, KTRSC", "C": "output, NOPQK"},
}


class ArgumentError(InvalidArgumentError):
    """An array argument the kernel cannot take; `argument` names it (A, B or C; x, gamma,
    beta, bias or y)."""


@dataclass(frozen=True)
class Operand:
    """What one array argument must be: this dtype and shape, dense row-major, on CUDA.
    ``output``: written by the kernel (allocated by the call when not passed)."""

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str = DTYPE
    output: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * BUFFER_ITEMSIZE[self.dtype]

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        out, step = [], 1
        for size in reversed(self.shape):
            out.append(step)
            step *= size
        return tuple(reversed(out))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "strides": list(self.strides),
            "output": self.output,
        }


def operands(plan: LaunchPlan, kind: str) -> tuple[Operand, ...]:
    """The arrays a caller passes, in call order: the launch plan's inputs, then its
    outputs, as the plan shapes them (the plan is the one the runners launch, so the call
    takes exactly what was timed). Workspaces are not the caller's: the kernel object
    allocates them."""
    roles = ROLES.get(kind, {})
    return tuple(
        Operand(b.name, roles.get(b.name, b.role), b.shape, b.dtype, output=b.role == "output")
        for b in (*plan.of_role("input"), *plan.of_role("output"))
    )


@dataclass(frozen=True)
class ArrayInfo:
    """What an array says about itself (strides in elements)."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    device: tuple[int, int]  # (DLPack device type, device id)


def _device_text(device: tuple[int, int]) -> str:
    kind, index = device
    return f"{DEVICE_NAMES.get(kind, f'device type {kind}')}:{index}"


def _element_strides(array: Any, ndim: int) -> tuple[int, ...]:
    stride = getattr(array, "stride", None)
    if callable(stride) and not hasattr(array, "strides"):  # PyTorch: elements
        return tuple(int(s) for s in stride())
    strides = getattr(array, "strides", None)
    if strides is None:  # DLPack's convention: none given means dense row-major
        return Operand("", "", tuple(int(s) for s in array.shape)).strides
    itemsize = int(getattr(array, "itemsize", 0) or getattr(array.dtype, "itemsize", ITEMSIZE))
    return tuple(int(s) // itemsize for s in strides)[:ndim]


def describe(name: str, array: Any) -> ArrayInfo:
    """The array's shape, dtype, strides and device, or an ArgumentError naming it."""
    if not (hasattr(array, "__dlpack__") and hasattr(array, "__dlpack_device__")):
        raise ArgumentError(
            name,
            "expected a CUDA array that speaks DLPack (a CuPy array or a PyTorch CUDA tensor), "
            f"got {type(array).__module__}.{type(array).__name__}",
        )
    kind, index = array.__dlpack_device__()
    shape = tuple(int(d) for d in array.shape)
    dtype = str(array.dtype).removeprefix("torch.")
    return ArrayInfo(shape, dtype, _element_strides(array, len(shape)), (int(kind), int(index)))


def _dense(info: ArrayInfo, expected: tuple[int, ...]) -> bool:
    # A dimension of size 1 is never stepped over: its stride is free (PyTorch sets any).
    return all(
        size == 1 or got == want
        for size, got, want in zip(info.shape, info.strides, expected, strict=True)
    )


def check_arguments(specs: Sequence[Operand], arrays: Sequence[Any]) -> list[ArrayInfo]:
    """Check each array against its operand: device, dtype, shape, strides (in that order:
    the first problem of the first wrong argument is the one reported). The outputs come
    last and may all be left out (the call allocates them)."""
    inputs = [s for s in specs if not s.output]
    if len(arrays) not in (len(inputs), len(specs)):
        names = ", ".join(s.name for s in inputs)
        outputs = " and ".join(s.name for s in specs if s.output)
        raise InvalidArgumentTypeError(
            "arrays",
            f"the kernel takes {names} and optionally {outputs} (the output, allocated "
            f"when not given); got {len(arrays)} arrays",
        )
    infos: list[ArrayInfo] = []
    for spec, array in zip(specs, arrays, strict=False):
        info = describe(spec.name, array)
        if info.device[0] not in CUDA_DEVICE_TYPES:
            raise ArgumentError(
                spec.name, f"must be on a CUDA device, is on {_device_text(info.device)}"
            )
        if infos and info.device[1] != infos[0].device[1]:
            raise ArgumentError(
                spec.name,
                f"is on {_device_text(info.device)}, but {specs[0].name} is on "
                f"{_device_text(infos[0].device)}: all arrays must be on one GPU",
            )
        if info.dtype != spec.dtype:
            hint = (
                " (CuPy has no bfloat16: pass PyTorch tensors of torch.bfloat16)"
                if spec.dtype == "bfloat16"
                else ""
            )
            raise ArgumentError(spec.name, f"dtype must be {spec.dtype}, got {info.dtype}{hint}")
        if info.shape != spec.shape:
            raise ArgumentError(
                spec.name, f"shape must be {spec.shape} ({spec.role}), got {info.shape}"
            )
        if not _dense(info, spec.strides):
            raise ArgumentError(
                spec.name,
                f"must be dense row-major (strides {spec.strides} in elements), got strides "
                f"{info.strides}: pass a contiguous copy",
            )
        infos.append(info)
    return infos


# ---- DLPack: the data pointer -----------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    # The first member of DLManagedTensor, so a capsule's pointer points at one of these.
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _dlpack_dtype(dtype: _DLDataType) -> str:
    """A DLPack element type by its usual name ("float16"; "other" for vector lanes)."""
    code = DLPACK_TYPE_CODES.get(int(dtype.code))
    return f"{code}{int(dtype.bits)}" if code and int(dtype.lanes) == 1 else "other"


_CAPSULE_NAME = b"dltensor"
# Prototypes of our own (not ctypes.pythonapi's shared function objects, whose argtypes other
# libraries set too).
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def check_separate_outputs(specs: Sequence[Operand], addresses: dict[str, int]) -> None:
    """No output may share memory with another argument: a kernel's blocks read their inputs
    while others have written outputs (a GEMM's C over its A; a split row's second pass
    reading x): an in-place call could only give wrong results, and silently."""
    spans = {s.name: (addresses[s.name], addresses[s.name] + s.nbytes) for s in specs}
    for out in (s for s in specs if s.output):
        start, end = spans[out.name]
        for other in specs:
            other_start, other_end = spans[other.name]
            if other is not out and start < other_end and other_start < end:
                raise ArgumentError(
                    out.name,
                    f"shares memory with {other.name}: the kernel does not run in place; pass "
                    f"a separate output (or none: one is allocated)",
                )


def data_pointer(name: str, array: Any, info: ArrayInfo, stream: int | None = None) -> int:
    """The address of the array's first element, from its DLPack capsule (no copy).

    `stream`: the CUDA stream the kernel will run on, passed to ``__dlpack__`` so that the
    producer orders its pending work before it (DLPack: 1 is the legacy default stream).
    The capsule must agree with what the array said of itself (device, shape, dtype,
    strides), and the address must be 16-byte aligned.
    """
    try:
        capsule = array.__dlpack__() if stream is None else array.__dlpack__(stream=stream)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        # The producer's refusal (PyTorch: a tensor that requires grad, an nn.Parameter;
        # NumPy: a read-only array), named by the argument it concerns.
        raise ArgumentError(
            name, f"its library would not export it through DLPack: {type(exc).__name__}: {exc}"
        ) from None
    if not _capsule_is_valid(capsule, _CAPSULE_NAME):
        raise ArgumentError(name, "__dlpack__() did not return an unconsumed DLPack capsule")
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, _CAPSULE_NAME))
    ndim = int(tensor.ndim)
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    strides = (
        tuple(int(tensor.strides[i]) for i in range(ndim))
        if tensor.strides
        else Operand("", "", shape).strides
    )
    device = (int(tensor.device.device_type), int(tensor.device.device_id))
    seen = ArrayInfo(shape, _dlpack_dtype(tensor.dtype), strides, device)
    if (seen.shape, seen.dtype, seen.device) != (info.shape, info.dtype, info.device) or not (
        _dense(seen, Operand("", "", info.shape).strides)
    ):
        raise ArgumentError(name, "its DLPack tensor does not match its shape, dtype or device")
    address = int(tensor.data or 0) + int(tensor.byte_offset)
    if address % ALIGN_BYTES:
        raise ArgumentError(
            name,
            f"data must be {ALIGN_BYTES}-byte aligned (the kernel loads 16 bytes at a time), "
            f"got address {address:#x}",
        )
    return address  # the capsule is dropped unconsumed: its producer gets the tensor back
