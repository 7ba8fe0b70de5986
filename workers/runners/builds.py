"""Kernel builds for the cupy runner: generate, compile on every core, keep the cubins.

A variant's kernel does not depend on the shape (the sizes are launch arguments), so one
cubin per (variant, schedule) serves every workload of that variant: a suite sweep
compiles each of them once. Needs workers.codegen and workers.compile (NVRTC), not a GPU.
"""

from __future__ import annotations

import importlib
import inspect
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipetune.model.space import Schedule
from pipetune.workers.runners.base import Progress, RunnerUnavailableError
from pipetune.workers.runners.outcomes import clip


@dataclass(frozen=True)
class Compiled:
    """One (variant, schedule)'s build: a cubin on disk, or why there is none."""

    kernel: Any = None  # workers.codegen.KernelSource
    cubin_path: str | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    smem_static_bytes: int = 0
    compile_ms: float | None = None
    error: str | None = None

    @property
    def smem_bytes(self) -> int | None:
        """Shared memory per block: the kernel's dynamic buffers plus its static ones."""
        if self.kernel is None:
            return None
        return int(self.kernel.smem_bytes) + int(self.smem_static_bytes or 0)


def load_toolchain() -> tuple[Any, Any]:
    """pipetune.workers.codegen and workers.compile, imported only when builds are needed."""
    try:
        codegen = importlib.import_module("pipetune.workers.codegen")
        compiler = importlib.import_module("pipetune.workers.compile")
    except ImportError as exc:
        raise RunnerUnavailableError(f"kernel builds need the kernel generator: {exc}") from None
    return codegen, compiler


class KernelBuilds:
    """Compiled kernels for one arch, cached per (variant, schedule) in a private folder."""

    def __init__(self, arch: str, *, workers: int | None = None):
        self.codegen, self.compiler = load_toolchain()
        self.arch = arch
        self.workers = workers or os.cpu_count() or 1
        self._folder = tempfile.TemporaryDirectory(prefix="pipetune-cubins-")
        self._builds: dict[tuple[str, str], Compiled] = {}
        self.compiled_count = 0  # kernels sent to the compiler (cache misses here)

    def get(self, variant: str, schedule: Schedule) -> Compiled:
        return self._builds[(variant, schedule.id)]

    def build(
        self, variant: str, schedules: Sequence[Schedule], progress: Progress | None = None
    ) -> None:
        """Build every schedule not built yet, in batches that fill every core."""
        todo = [s for s in dict.fromkeys(schedules) if (variant, s.id) not in self._builds]
        done, total = len(schedules) - len(todo), len(schedules)
        batch = 4 * self.workers
        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            kernels = []
            for schedule in chunk:
                try:
                    kernels.append((schedule, self.codegen.generate(variant, schedule)))
                except Exception as exc:  # a generator refusal is this schedule's failure
                    message = f"code generation failed: {type(exc).__name__}: {exc}"
                    self._builds[(variant, schedule.id)] = Compiled(error=clip(message))
            results = self._compile_many([k for _, k in kernels])
            self.compiled_count += len(kernels)
            for (schedule, kernel), result in zip(kernels, results, strict=True):
                self._builds[(variant, schedule.id)] = self._store(variant, kernel, result)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
        if progress is not None and not todo:
            progress(total, total)

    def _compile_many(self, kernels: list[Any]) -> list[Any]:
        """CompileResult, or the CompileError in a failed kernel's place (input order)."""
        if not kernels:
            return []
        compile_many = self.compiler.compile_many
        if "return_exceptions" in inspect.signature(compile_many).parameters:
            return compile_many(kernels, self.arch, workers=self.workers, return_exceptions=True)
        return compile_many(kernels, self.arch, workers=self.workers)

    def _store(self, variant: str, kernel: Any, result: Any) -> Compiled:
        if isinstance(result, BaseException):
            log = getattr(result, "log", "") or ""
            message = str(result) + (f"\n{log}" if log and log not in str(result) else "")
            return Compiled(kernel=kernel, error=clip(message))
        path = Path(self._folder.name) / f"{variant}-{kernel.schedule.id}.cubin"
        path.write_bytes(result.cubin)
        return Compiled(
            kernel=kernel,
            cubin_path=str(path),
            registers=result.registers,
            spill_bytes=result.spill_bytes,
            smem_static_bytes=result.smem_static_bytes,
            compile_ms=result.compile_ms,
        )

    def close(self) -> None:
        self._folder.cleanup()
