"""Kernel builds for the kernel runners: generate, compile on every core, keep the cubins.

A variant's kernel does not depend on the shape (the sizes are launch arguments), so one
cubin per (variant, schedule) serves every workload of that variant: a suite sweep
compiles each of them once. Needs workers.codegen and workers.compile (NVRTC), not a GPU.

Builds run in a pool of threads (NVRTC releases the GIL), one kernel per task, in the order
they were submitted: :meth:`KernelBuilds.submit` queues schedules and returns at once, so a
sweep can queue every operator ahead while the GPU measures the first ("compile ahead"),
and :meth:`KernelBuilds.get` waits for the one build it needs next.

``sample`` (simulated launches only): of each submitted list, only a stratified sample is
compiled (the smallest tile of each (smem_stages, reg_stages) stratum first, round-robin:
the quickest to compile); the others are generated but not compiled. A simulated launch
needs no cubin, and a CPU rehearsal cannot afford to compile thousands of kernels on a few
cores (tests/test_compile_kernels.py compiles the corners of the space instead).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipetune.model.space import Schedule
from pipetune.workers.runners.base import Progress, RunnerUnavailableError
from pipetune.workers.runners.outcomes import clip


@dataclass(frozen=True)
class Compiled:
    """One (variant, schedule)'s build: a cubin on disk, or why there is none."""

    kernel: Any = None  # workers.codegen.KernelSource (its code dropped once compiled)
    cubin_path: str | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    smem_static_bytes: int = 0
    compile_ms: float | None = None
    error: str | None = None
    generated_only: bool = False  # left uncompiled on purpose (``sample``)

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


def compile_sample(schedules: Sequence[Schedule], count: int) -> list[Schedule]:
    """Up to ``count`` schedules: round-robin over (smem_stages, reg_stages) strata, each
    stratum's smallest block tile first (the quickest to compile)."""
    strata: dict[tuple[int, int], list[Schedule]] = {}
    by_size = sorted(schedules, key=lambda s: (s.block_m * s.block_n * s.block_k, s.id))
    for schedule in by_size:
        strata.setdefault((schedule.smem_stages, schedule.reg_stages), []).append(schedule)
    picked: list[Schedule] = []
    depth = 0
    while len(picked) < min(count, len(by_size)):
        for key in sorted(strata):
            if depth < len(strata[key]) and len(picked) < count:
                picked.append(strata[key][depth])
        depth += 1
    return picked


class KernelBuilds:
    """Compiled kernels for one arch, cached per (variant, schedule) in a private folder."""

    def __init__(self, arch: str, *, workers: int | None = None, sample: int | None = None):
        self.codegen, self.compiler = load_toolchain()
        self.arch = arch
        self.workers = workers or os.cpu_count() or 1
        self.sample = sample
        self._folder = tempfile.TemporaryDirectory(prefix="pipetune-cubins-")
        self._builds: dict[tuple[str, str], Future[Compiled]] = {}
        self._compiling: set[tuple[str, str]] = set()  # submitted to be compiled, not sampled out
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="pipetune-nvrtc")
        self._lock = threading.Lock()
        self.compiled_count = 0  # kernels sent to the compiler (cache misses here)

    def submit(self, variant: str, schedules: Sequence[Schedule]) -> None:
        """Queue every schedule not built or queued yet; returns at once."""
        todo = [s for s in dict.fromkeys(schedules) if (variant, s.id) not in self._builds]
        chosen = None if self.sample is None else {s.id for s in compile_sample(todo, self.sample)}
        for schedule in todo:
            compile_it = chosen is None or schedule.id in chosen
            if compile_it:
                self._compiling.add((variant, schedule.id))
            self._builds[(variant, schedule.id)] = self._pool.submit(
                self._build_one, variant, schedule, compile_it
            )

    def get(self, variant: str, schedule: Schedule) -> Compiled:
        """The build of a submitted schedule (waits for it)."""
        return self._builds[(variant, schedule.id)].result()

    def backlog(self, variant: str, schedules: Sequence[Schedule]) -> int:
        """How many of these schedules still wait for NVRTC (queued or compiling)."""
        return sum(
            1
            for s in schedules
            if (variant, s.id) in self._compiling and not self._builds[(variant, s.id)].done()
        )

    def build(
        self, variant: str, schedules: Sequence[Schedule], progress: Progress | None = None
    ) -> None:
        """Build every schedule not built yet and wait for all of them."""
        self.submit(variant, schedules)
        total = len(schedules)
        for done, schedule in enumerate(schedules, 1):
            self.get(variant, schedule)
            if progress is not None:
                progress(done, total)

    def _build_one(self, variant: str, schedule: Schedule, compile_it: bool) -> Compiled:
        try:
            kernel = self.codegen.generate(variant, schedule)
        except Exception as exc:  # a generator refusal is this schedule's failure
            return Compiled(error=clip(f"code generation failed: {type(exc).__name__}: {exc}"))
        if not compile_it:
            return Compiled(kernel=dataclasses.replace(kernel, code=""), generated_only=True)
        with self._lock:
            self.compiled_count += 1
        try:
            result = self.compiler.compile_kernel(kernel, self.arch)
        except Exception as exc:  # CompileError: the log; anything else: what NVRTC said
            return self._failed(kernel, exc)
        path = Path(self._folder.name) / f"{variant}-{schedule.id}.cubin"
        path.write_bytes(result.cubin)
        return Compiled(
            # The source is no longer needed (the cubin is on disk): thousands of queued
            # builds would otherwise hold hundreds of megabytes of CUDA text.
            kernel=dataclasses.replace(kernel, code=""),
            cubin_path=str(path),
            registers=result.registers,
            spill_bytes=result.spill_bytes,
            smem_static_bytes=result.smem_static_bytes,
            compile_ms=result.compile_ms,
        )

    def _failed(self, kernel: Any, exc: BaseException) -> Compiled:
        log = getattr(exc, "log", "") or ""
        message = str(exc) or type(exc).__name__
        message += f"\n{log}" if log and log not in message else ""
        return Compiled(kernel=dataclasses.replace(kernel, code=""), error=clip(message))

    def write_cubin(self, name: str, cubin: bytes) -> str:
        """Keep another cubin (the timing-floor kernel) in the builds' folder."""
        path = Path(self._folder.name) / f"{name}.cubin"
        path.write_bytes(cubin)
        return str(path)

    def close(self) -> None:
        # Queued builds are dropped; those compiling finish (NVRTC cannot be interrupted).
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._folder.cleanup()
