"""CUDA C++ generation for the memory-intensive family (docs/architecture.md,
"Kernel families")."""

from pipetune.workers.codegen.memops.generator import (
    ARGUMENTS,
    MemKernelSource,
    build_key,
    generate,
    grid_depends_on_occupancy,
    grid_note,
    kernel_kind,
    kernel_name,
    launch_plan,
    shape_notes,
    source_parts,
    variant_of,
)
from pipetune.workers.codegen.memops.sample import (
    compile_sample,
    covering_sample,
    stratified_sample,
    stratum,
    tails,
)

__all__ = [
    "ARGUMENTS",
    "MemKernelSource",
    "build_key",
    "compile_sample",
    "covering_sample",
    "generate",
    "grid_depends_on_occupancy",
    "grid_note",
    "kernel_kind",
    "kernel_name",
    "launch_plan",
    "shape_notes",
    "source_parts",
    "stratified_sample",
    "stratum",
    "tails",
    "variant_of",
]
