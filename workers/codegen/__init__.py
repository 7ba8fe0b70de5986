"""CUDA C++ generation for the pipelined tensor-core GEMM family (DESIGN.md, "Kernel family")."""

from pipetune.workers.codegen.generator import KernelSource, generate, kernel_name, launch
from pipetune.workers.codegen.variants import SCALAR_ARGS, VARIANTS, scalar_args, variant_of

__all__ = [
    "SCALAR_ARGS",
    "VARIANTS",
    "KernelSource",
    "generate",
    "kernel_name",
    "launch",
    "scalar_args",
    "variant_of",
]
