"""NVRTC compilation to cubins (no GPU needed), ptxas resource reports and a cubin cache."""

from pipetune.workers.compile.cache import cache_dir, clear_memory
from pipetune.workers.compile.compiler import (
    CompileError,
    CompileResult,
    check_arch,
    compile_kernel,
    compile_many,
    compile_source,
    kernel_arch,
    nvrtc_calls,
)
from pipetune.workers.compile.nvrtc import NvrtcError
from pipetune.workers.compile.nvrtc import version as nvrtc_version

__all__ = [
    "CompileError",
    "CompileResult",
    "NvrtcError",
    "cache_dir",
    "check_arch",
    "clear_memory",
    "compile_kernel",
    "compile_many",
    "compile_source",
    "kernel_arch",
    "nvrtc_calls",
    "nvrtc_version",
]
