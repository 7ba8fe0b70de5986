"""CUDA C++ generation for the memory-intensive family (docs/architecture.md,
"Kernel families")."""

from pipetune.workers.codegen.memops.generator import (
    ARGUMENTS,
    MemKernelSource,
    generate,
    kernel_name,
    launch_plan,
    source_parts,
    variant_of,
)

__all__ = [
    "ARGUMENTS",
    "MemKernelSource",
    "generate",
    "kernel_name",
    "launch_plan",
    "source_parts",
    "variant_of",
]
