"""How to run a generated kernel on a workload: the buffers it needs and its launches.

A family's code generator describes a run as a :class:`LaunchPlan` (what a runner
allocates, fills, zeroes and launches, in order), so a runner needs no knowledge of the
family: the tensor-core GEMM family's is one launch over A, B and C; the memory-intensive
family's has parameter vectors, a workspace and, for two-pass splitting, a second launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

BufferRole = Literal["input", "output", "workspace"]


@dataclass(frozen=True)
class Buffer:
    """A device buffer: inputs come from the family's reference module (make_inputs),
    outputs are filled with NaN before the first launch (an element the kernel never writes
    fails the check), workspaces are zeroed once (the kernels leave them zeroed)."""

    name: str
    shape: tuple[int, ...]
    dtype: Literal["float16", "float32"]
    role: BufferRole

    @property
    def nbytes(self) -> int:
        size = 1
        for s in self.shape:
            size *= s
        return size * (2 if self.dtype == "float16" else 4)

    @property
    def c_type(self) -> str:
        """The kernel parameter's C type: only outputs and workspaces are written."""
        element = "__half" if self.dtype == "float16" else "float"
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
    order: buffer names, then scalars by name (int32 unless given as a float)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    arguments: tuple[str, ...]
    scalars: dict[str, int | float] = field(default_factory=dict)

    @property
    def buffer_arguments(self) -> tuple[str, ...]:
        """The leading parameters: buffer names."""
        return self.arguments[: len(self.arguments) - len(self.scalars)]

    @property
    def scalar_arguments(self) -> tuple[str, ...]:
        """The trailing parameters: scalar names (a scalar may share a buffer's name, as a
        convolution's channel count C does the output C: position decides)."""
        return self.arguments[len(self.arguments) - len(self.scalars) :]

    def parameters(self) -> list[tuple[str, str]]:
        """(name, kind) per parameter: kind is "buffer", "int32" or "float32"."""
        out = [(name, "buffer") for name in self.buffer_arguments]
        for name in self.scalar_arguments:
            out.append((name, "float32" if isinstance(self.scalars[name], float) else "int32"))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem_bytes": self.smem_bytes,
            "arguments": list(self.arguments),
            "scalars": dict(self.scalars),
        }


@dataclass(frozen=True)
class LaunchPlan:
    buffers: tuple[Buffer, ...]
    launches: tuple[KernelLaunch, ...]
    output: str  # the buffer the reference check compares

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def of_role(self, role: BufferRole) -> tuple[Buffer, ...]:
        """The buffers of one role, in plan order (what a caller passes: the inputs, then
        the outputs; the workspaces are the launcher's to allocate and zero)."""
        return tuple(b for b in self.buffers if b.role == role)

    def as_dict(self) -> dict[str, Any]:
        return {
            "buffers": [b.as_dict() for b in self.buffers],
            "launches": [launch.as_dict() for launch in self.launches],
            "output": self.output,
        }
