"""The simulated-launch runner: pipetune's kernels generated and compiled exactly as the
cupy runner does it, and launched by the simulated twin of its GPU side
(workers.runners.sim_child). For CPU rehearsals of the GPU path (``pipetune campaign
--runner simulated``): every result says ``runner="simulated"``, and nothing it reports is
a measurement.

Differences from the cupy runner, and only these: the child answers from the analytical
model (stated noise, no verification), and only a stratified sample of each submitted
schedule list is compiled (``compile_sample``; a simulated launch needs no cubin, and a CPU
cannot compile a whole suite in a rehearsal's minutes).
"""

from __future__ import annotations

from typing import Any

from pipetune.model.hardware import GPUSpec, get_gpu
from pipetune.model.trials import RunnerKind
from pipetune.workers.runners import sim_child
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.faults import FaultPlan
from pipetune.workers.runners.kernel_runner import KernelRunner

DEFAULT_COMPILE_SAMPLE = 4  # kernels compiled per submitted list (per operator, say)


class SimulatedLaunchRunner(KernelRunner):
    name = RunnerKind.SIMULATED.value
    simulated_launch = True

    def __init__(
        self,
        gpu: GPUSpec | str = "h100",
        *,
        settings: MeasureSettings | None = None,
        seed: int = 0,
        compile_sample: int = DEFAULT_COMPILE_SAMPLE,
        faults: FaultPlan | None = None,
        wrong: tuple[str, ...] = (),
        trial_timeout_s: float = 60.0,
        compile_workers: int | None = None,
        batch_size: int = 32,
        batch_seconds: float = 2.0,
        reference_cache: str | None = None,
        conv_reference: str = "cublas",
    ):
        spec = gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)
        self.compile_sample = compile_sample
        super().__init__(
            sim_child,
            (0, spec.key, faults, tuple(wrong), seed),
            spec,
            settings=settings,
            seed=seed,
            trial_timeout_s=trial_timeout_s,
            compile_workers=compile_workers,
            compile_sample=compile_sample,
            batch_size=batch_size,
            batch_seconds=batch_seconds,
            reference_cache=reference_cache,
            conv_reference=conv_reference,
        )

    @property
    def settings(self) -> dict[str, Any]:
        return {
            **super().settings,
            "simulated": True,
            "l2_flush": "none (simulated launch)",
            "verification": "none (simulated launch)",
            "launch": "simulated: analytical model (ALCOP Table 1) x lognormal noise "
            "(sigma 0.03, repeats 0.01); nothing verified",
            "compile": f"NVRTC, a stratified sample of {self.compile_sample} kernels per "
            "submitted list; the others generated only",
            "timing": "simulated (the timing loop of workers.runners.timing on a model clock)",
        }
