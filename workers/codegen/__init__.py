"""CUDA C++ generation for the pipelined tensor-core GEMM family (docs/architecture.md,
"Kernel families").

What every family's generator module gives the workers: ``generate(workload, schedule)``,
``kernel_kind``, ``build_key``, ``launch_plan``, ``grid_depends_on_occupancy`` (and, where
it can be true, ``grid_note``: how such a grid is sized, for a caller's own launch; never for
these GEMMs), ``shape_notes``, and for the checks ``compile_sample``, ``stratified_sample``,
``stratum`` and ``tails``."""

from pipetune.workers.codegen.generator import (
    KernelSource,
    build_key,
    generate,
    grid_depends_on_occupancy,
    kernel_kind,
    kernel_name,
    launch,
    launch_config,
    launch_plan,
    shape_notes,
)
from pipetune.workers.codegen.sample import compile_sample, stratified_sample, stratum, tails
from pipetune.workers.codegen.variants import (
    SCALAR_ARGS,
    VARIANTS,
    pointer_args,
    scalar_args,
    variant_of,
)

__all__ = [
    "SCALAR_ARGS",
    "VARIANTS",
    "KernelSource",
    "build_key",
    "compile_sample",
    "generate",
    "grid_depends_on_occupancy",
    "kernel_kind",
    "kernel_name",
    "launch",
    "launch_config",
    "launch_plan",
    "pointer_args",
    "scalar_args",
    "shape_notes",
    "stratified_sample",
    "stratum",
    "tails",
    "variant_of",
]
