"""The cupy runner: real kernels on a real GPU.

The parent side is workers.runners.kernel_runner's (generation, NVRTC compiles on every
core, batches of trials, restarts after a fault); the GPU side, in the child process, is
workers.runners.cupy_child (load, verify against the fp32 reference, time with CUDA events).
"""

from __future__ import annotations

from pipetune.model.hardware import GPUSpec
from pipetune.model.trials import RunnerKind
from pipetune.workers.runners import cupy_child
from pipetune.workers.runners.base import (
    MeasureSettings,
    RunnerUnavailableError,
    cupy_missing,
)
from pipetune.workers.runners.builds import Compiled
from pipetune.workers.runners.kernel_runner import KernelRunner, compile_failure, trial_result

__all__ = ["Compiled", "CupyRunner", "compile_failure", "trial_result"]


class CupyRunner(KernelRunner):
    name = RunnerKind.CUPY.value

    def __init__(
        self,
        gpu: GPUSpec | str | None = None,
        *,
        device: int = 0,
        settings: MeasureSettings | None = None,
        seed: int = 0,
        trial_timeout_s: float = 60.0,
        prepare_timeout_s: float = 600.0,
        start_timeout_s: float = 180.0,
        compile_workers: int | None = None,
        batch_size: int = 32,
        batch_seconds: float = 2.0,
        reference_cache: str | None = None,
        conv_reference: str = "cublas",
    ):
        if missing := cupy_missing():
            raise RunnerUnavailableError(f"the cupy runner needs CuPy and an NVIDIA GPU; {missing}")
        super().__init__(
            cupy_child,
            (device,),
            gpu,
            settings=settings,
            seed=seed,
            trial_timeout_s=trial_timeout_s,
            prepare_timeout_s=prepare_timeout_s,
            start_timeout_s=start_timeout_s,
            compile_workers=compile_workers,
            batch_size=batch_size,
            batch_seconds=batch_seconds,
            reference_cache=reference_cache,
            conv_reference=conv_reference,
        )
