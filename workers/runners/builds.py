"""Kernel builds for the kernel runners: generate, compile on every core, keep the cubins.

A kernel depends on its workload only through what the family's generator says
(``build_key(workload, schedule)``: the tensor-core GEMMs' variant, since their sizes are
launch arguments; the memory-intensive kernels' op and register-cache length), so one cubin
per (build key, schedule) serves every workload with that key: a suite sweep compiles each
of them once. The generator is the workload's family's (workers.families.codegen_for).
Needs the generators and workers.compile (NVRTC), not a GPU.

Builds run in a pool of threads (NVRTC releases the GIL), one kernel per task, in the order
they were submitted: :meth:`KernelBuilds.submit` queues schedules and returns at once, so a
sweep can queue every operator ahead while the GPU measures the first ("compile ahead"),
and :meth:`KernelBuilds.get` waits for the one build it needs next.

``sample`` (simulated launches only): of each submitted list, only a sample is compiled
(the family generator's ``compile_sample``: for GEMMs the smallest tile of each
(smem_stages, reg_stages) stratum first, round-robin, the quickest to compile); the others
are generated but not compiled. A simulated launch needs no cubin, and a CPU rehearsal
cannot afford to compile thousands of kernels on a few cores (tests/test_compile_kernels.py
compiles the corners of the space instead).
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
from types import ModuleType
from typing import Any

from pipetune.model.family import family_of
from pipetune.workers.runners.base import Progress, RunnerUnavailableError
from pipetune.workers.runners.outcomes import clip


@dataclass(frozen=True)
class Compiled:
    """One (build key, schedule)'s build: a cubin on disk, or why there is none."""

    kernel: Any = None  # the generator's kernel source (its code dropped once compiled)
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


def generator_of(target: Any) -> ModuleType:
    """The code generator a build target needs: its workload's family's; a string is a
    variant name of the tensor-core GEMM generator (``pipetune.workers.codegen``)."""
    if isinstance(target, str):
        return importlib.import_module("pipetune.workers.codegen")
    from pipetune.workers.families import codegen_for

    try:
        return codegen_for(family_of(target))
    except ImportError as exc:
        raise RunnerUnavailableError(f"kernel builds need the kernel generator: {exc}") from None


def compile_sample(schedules: Sequence[Any], count: int) -> list[Any]:
    """Up to ``count`` of a tensor-core GEMM schedule list (the GEMM generator's rule; kept
    here under its old name)."""
    from pipetune.workers.codegen.sample import compile_sample as gemm_sample

    return gemm_sample(schedules, count)


class KernelBuilds:
    """Compiled kernels for one arch, cached per (build key, schedule) in a private folder.

    A build *target* is a workload (of any family), or a tensor-core GEMM variant name
    ("gemm_kn", ...): what the family's ``generate`` takes first.
    """

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

    @staticmethod
    def key(target: Any, schedule: Any) -> tuple[str, str]:
        """(build key, schedule id): what the kernel's source depends on."""
        if isinstance(target, str):
            return target, schedule.id
        return str(generator_of(target).build_key(target, schedule)), schedule.id

    def submit(self, target: Any, schedules: Sequence[Any]) -> None:
        """Queue every schedule not built or queued yet; returns at once."""
        keyed = {self.key(target, s): s for s in schedules}
        todo = {k: s for k, s in keyed.items() if k not in self._builds}
        chosen = None
        if self.sample is not None:
            picked = generator_of(target).compile_sample(list(todo.values()), self.sample)
            chosen = {self.key(target, s) for s in picked}
        for key, schedule in todo.items():
            compile_it = chosen is None or key in chosen
            if compile_it:
                self._compiling.add(key)
            self._builds[key] = self._pool.submit(
                self._build_one, target, key, schedule, compile_it
            )

    def get(self, target: Any, schedule: Any) -> Compiled:
        """The build of a submitted schedule (waits for it)."""
        return self._builds[self.key(target, schedule)].result()

    def backlog(self, target: Any, schedules: Sequence[Any]) -> int:
        """How many of these schedules still wait for NVRTC (queued or compiling)."""
        keys = [self.key(target, s) for s in schedules]
        return sum(1 for k in keys if k in self._compiling and not self._builds[k].done())

    def build(
        self, target: Any, schedules: Sequence[Any], progress: Progress | None = None
    ) -> None:
        """Build every schedule not built yet and wait for all of them."""
        self.submit(target, schedules)
        total = len(schedules)
        for done, schedule in enumerate(schedules, 1):
            self.get(target, schedule)
            if progress is not None:
                progress(done, total)

    def _build_one(
        self, target: Any, key: tuple[str, str], schedule: Any, compile_it: bool
    ) -> Compiled:
        try:
            kernel = generator_of(target).generate(target, schedule)
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
        path = self._keep(f"{key[0]}-{key[1]}.cubin", result.cubin)
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
        return str(self._keep(f"{name}.cubin", cubin))

    def _keep(self, name: str, cubin: bytes) -> Path:
        """Write a cubin into the builds' folder. A write that fails (a full disk, the folder
        removed by a cleaner of /tmp) is this machine's fault, not the schedule's: raised as
        the runner's, it stops the worker saying why, and the job returns to the queue for
        another worker. Taken for the trial's own failure, it was a `runtime_error` of every
        schedule the worker measured until its disk had room again, each recorded against the
        task (and teaching the tuner that the space fails)."""
        path = Path(self._folder.name) / name
        try:
            path.write_bytes(cubin)
        except OSError as exc:
            raise RunnerUnavailableError(
                f"cannot write compiled kernels to {self._folder.name}: "
                f"{exc.strerror or exc} (free space there, or point TMPDIR elsewhere)"
            ) from exc
        return path

    def close(self) -> None:
        # Queued builds are dropped; those compiling finish (NVRTC cannot be interrupted).
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._folder.cleanup()
