"""CUDA C++ generation for the pipelined tensor-core GEMM family (docs/architecture.md,
"Kernel families")."""

from pipetune.workers.codegen.generator import (
    POINTER_ARGS,
    KernelSource,
    generate,
    kernel_name,
    launch,
    launch_config,
)
from pipetune.workers.codegen.variants import SCALAR_ARGS, VARIANTS, scalar_args, variant_of

__all__ = [
    "POINTER_ARGS",
    "SCALAR_ARGS",
    "VARIANTS",
    "KernelSource",
    "generate",
    "kernel_name",
    "launch",
    "launch_config",
    "scalar_args",
    "variant_of",
]
