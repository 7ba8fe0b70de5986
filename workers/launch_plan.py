"""How to run a generated kernel on a workload: the buffers it needs and its launches.

A family's code generator describes a run as a :class:`LaunchPlan` (what a runner
allocates, fills, zeroes and launches, in order), so a runner needs no knowledge of the
family: the tensor-core GEMM family's is one launch over A, B and C; the memory-intensive
family's has parameter vectors, a workspace and, for two-pass splitting, a second launch.
A plan may also hold TMA tensor maps (:class:`TensorMap`): descriptors a runner encodes on
the host from an operand's device address and passes, in device memory, as a pointer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

BufferRole = Literal["input", "output", "workspace"]
BufferDtype = Literal["float16", "bfloat16", "float32", "uint32"]  # uint32: counters
ITEMSIZE: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "uint32": 4}
C_TYPES: dict[str, str] = {
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "uint32": "unsigned",
}


@dataclass(frozen=True)
class Buffer:
    """A device buffer: inputs come from the family's reference module (make_inputs),
    outputs are filled with NaN before the first launch (an element the kernel never writes
    fails the check), workspaces are zeroed once (the kernels leave them zeroed)."""

    name: str
    shape: tuple[int, ...]
    dtype: BufferDtype
    role: BufferRole

    @property
    def nbytes(self) -> int:
        size = 1
        for s in self.shape:
            size *= s
        return size * ITEMSIZE[self.dtype]

    @property
    def c_type(self) -> str:
        """The kernel parameter's C type: only outputs and workspaces are written."""
        element = C_TYPES[self.dtype]
        return f"const {element}*" if self.role == "input" else f"{element}*"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "role": self.role,
        }


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: the extern "C" entry, grid and block, dynamic shared memory (above 48 KiB
    the function's MaxDynamicSharedMemorySize must be raised first), and the parameters in
    order: buffer names, then scalars by name (int32 unless given as a float), then
    ``trailing`` pointers by name (buffers or tensor maps, as the wgmma kernels take their
    tensor maps and stream-K workspaces after the scalars). ``cooperative``: the grid's
    blocks wait for each other, so all must be resident at once: launched with
    cuLaunchCooperativeKernel, the driver refuses a grid that cannot be, where a plain
    launch beside other work on the GPU could hang."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    arguments: tuple[str, ...]
    scalars: dict[str, int | float] = field(default_factory=dict)
    trailing: tuple[str, ...] = ()
    cooperative: bool = False

    def __post_init__(self) -> None:
        if not self.trailing:
            return
        if len(self.arguments) < len(self.scalars) + len(self.trailing):
            raise ValueError(
                f"{self.kernel}: {len(self.arguments)} arguments cannot hold "
                f"{len(self.scalars)} scalars and {len(self.trailing)} trailing pointers"
            )
        if self.arguments[len(self.arguments) - len(self.trailing) :] != tuple(self.trailing):
            raise ValueError(
                f"{self.kernel}: the arguments {list(self.arguments)} must end with the "
                f"trailing pointers {list(self.trailing)}"
            )

    @property
    def _scalars_end(self) -> int:
        return len(self.arguments) - len(self.trailing)

    @property
    def buffer_arguments(self) -> tuple[str, ...]:
        """The leading parameters: buffer names."""
        return self.arguments[: self._scalars_end - len(self.scalars)]

    @property
    def scalar_arguments(self) -> tuple[str, ...]:
        """The parameters after the leading pointers: scalar names (a scalar may share a
        buffer's name, as a convolution's channel count C does the output C: position
        decides)."""
        return self.arguments[self._scalars_end - len(self.scalars) : self._scalars_end]

    @property
    def trailing_arguments(self) -> tuple[str, ...]:
        """The parameters after the scalars: buffer or tensor map names."""
        return self.arguments[self._scalars_end :]

    @property
    def pointer_arguments(self) -> tuple[str, ...]:
        """Every pointer parameter in parameter order: the leading, then the trailing."""
        return self.buffer_arguments + self.trailing_arguments

    def parameters(self) -> list[tuple[str, str]]:
        """(name, kind) per parameter: kind is "buffer" (any pointer, a tensor map's
        included), "int32" or "float32"."""
        out = [(name, "buffer") for name in self.buffer_arguments]
        for name in self.scalar_arguments:
            out.append((name, "float32" if isinstance(self.scalars[name], float) else "int32"))
        out += [(name, "buffer") for name in self.trailing_arguments]
        return out

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kernel": self.kernel,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem_bytes": self.smem_bytes,
            "arguments": list(self.arguments),
            "scalars": dict(self.scalars),
        }
        if self.trailing:
            doc["trailing"] = list(self.trailing)
        if self.cooperative:
            doc["cooperative"] = True
        return doc


@dataclass(frozen=True)
class TensorMap:
    """A TMA tensor map over buffer ``operand`` of the plan: cuTensorMapEncodeTiled's 128
    bytes (elements of ``dtype``, the 128-byte swizzle, no interleave, zeros past the edges,
    256-byte L2 promotion), encoded on the host from the operand's device address and passed
    in device memory (workers.runners.tensor_maps). Sizes and box innermost first, byte
    strides of the outer dimensions (wgmma.tensor_map_specs makes the wgmma kernels')."""

    name: str
    operand: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    # The operand's element type, which the driver's encoding names (the operand buffer's
    # dtype; float16 unless said, as every map was before bfloat16).
    dtype: Literal["float16", "bfloat16"] = "float16"

    def __post_init__(self) -> None:
        # cuTensorMapEncodeTiled takes ranks 1 to 5, a box extent per dimension and a stride
        # per dimension but the innermost (dense).
        rank = len(self.dims)
        if not 1 <= rank <= 5 or len(self.box) != rank or len(self.strides) != rank - 1:
            raise ValueError(
                f"tensor map {self.name}: {rank} dims (1 to 5), {len(self.box)} box extents "
                f"and {len(self.strides)} strides; the box needs one per dim, the strides "
                "one fewer"
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "operand": self.operand,
            "dims": list(self.dims),
            "strides": list(self.strides),
            "box": list(self.box),
            # Always said, float16 too: a float16 map's document named none (as before
            # bfloat16), and code encoding the maps from the launch JSON alone had to know
            # that its absence meant float16.
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class LaunchPlan:
    buffers: tuple[Buffer, ...]
    launches: tuple[KernelLaunch, ...]
    output: str  # the buffer the reference check compares
    tensor_maps: tuple[TensorMap, ...] = ()

    def __post_init__(self) -> None:
        if not self.tensor_maps:
            return
        names = {b.name for b in self.buffers}
        for tm in self.tensor_maps:
            if tm.operand not in names:
                raise ValueError(f"tensor map {tm.name} is over {tm.operand}, not a buffer")
            if tm.name in names:
                raise ValueError(f"tensor map {tm.name} has a buffer's name")

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def tensor_map(self, name: str) -> TensorMap:
        for tm in self.tensor_maps:
            if tm.name == name:
                return tm
        raise KeyError(name)

    def of_role(self, role: BufferRole) -> tuple[Buffer, ...]:
        """The buffers of one role, in plan order (what a caller passes: the inputs, then
        the outputs; the workspaces are the launcher's to allocate and zero)."""
        return tuple(b for b in self.buffers if b.role == role)

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "buffers": [b.as_dict() for b in self.buffers],
            "launches": [launch.as_dict() for launch in self.launches],
            "output": self.output,
        }
        if self.tensor_maps:
            doc["tensor_maps"] = [tm.as_dict() for tm in self.tensor_maps]
        return doc
