"""The launch the cupy runner would make for a schedule, for tests that compare pipetune's
callables and exports with it."""

from __future__ import annotations

from typing import Any

from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.workers.families import codegen_for
from pipetune.workers.runners.base import MeasureSettings
from pipetune.workers.runners.builds import Compiled
from pipetune.workers.runners.cupy_child import TrialSpec
from pipetune.workers.runners.kernel_runner import model_view, trial_spec
from pipetune.workers.runners.timing import RepeatPolicy


def runner_spec(workload: Any, schedule: Any, gpu_name: str = "h100") -> tuple[TrialSpec, int]:
    """The trial KernelRunner.run_trials sends the cupy child for this schedule (the family's
    code, the device's SMs, the model's occupancy), and that occupancy."""
    gpu = get_gpu(gpu_name)
    occupancy = model_view(workload, gpu, [schedule])[1][0]
    code = codegen_for(family_of(workload)).generate(workload, schedule)
    spec = trial_spec(
        Compiled(kernel=code, cubin_path="/x.cubin"),
        workload,
        schedule,
        RepeatPolicy.of(MeasureSettings()),
        sm_count=gpu.sm_count,
        blocks_per_sm=occupancy,
    )
    return spec, occupancy
