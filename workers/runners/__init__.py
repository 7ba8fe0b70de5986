"""Measurement runners: ``cupy`` (a real GPU), ``replay`` (a recorded dataset) and
``simulated`` (the analytical model plus stated noise; demos and CI only).

>>> with make_runner("simulated", gpu="h100") as runner:
...     results = runner.measure(workload, schedules)   # list[MeasureResult], same order

The cupy runner imports CuPy and the kernel generator only when it is built, so that
everything else works on machines without a GPU.
"""

from __future__ import annotations

from typing import Any

from pipetune.model.trials import RunnerKind
from pipetune.workers.runners.base import (
    MeasureSettings,
    Progress,
    Runner,
    RunnerClosedError,
    RunnerError,
    RunnerSettingError,
    RunnerUnavailableError,
    summarise,
)
from pipetune.workers.runners.replay import (
    DatasetMismatchError,
    ReplayRunner,
    ScheduleNotInDatasetError,
)
from pipetune.workers.runners.simulated import TIME_SCALE_ENV, SimulatedRunner

RUNNER_NAMES: tuple[str, ...] = tuple(RunnerKind)  # declared with the result they return

__all__ = [
    "RUNNER_NAMES",
    "TIME_SCALE_ENV",
    "DatasetMismatchError",
    "MeasureSettings",
    "Progress",
    "ReplayRunner",
    "Runner",
    "RunnerClosedError",
    "RunnerError",
    "RunnerSettingError",
    "RunnerUnavailableError",
    "ScheduleNotInDatasetError",
    "SimulatedRunner",
    "make_runner",
    "summarise",
]


def make_runner(name: str, **kwargs: Any) -> Runner:
    """Build a runner by name; keyword arguments go to its constructor:

    - ``cupy``: gpu=None (detected), device=0, settings, seed, trial_timeout_s, ...
    - ``replay``: dataset (path or Dataset), workload=None, gpu=None, ignore_mismatch=False
    - ``simulated``: gpu="h100", seed=0, sigma=0.03, settings, compile_s=1, time_scale=None
    """
    if name == "simulated":
        return SimulatedRunner(**kwargs)
    if name == "replay":
        return ReplayRunner(**kwargs)
    if name == "cupy":
        from pipetune.workers.runners.cupy_runner import CupyRunner

        return CupyRunner(**kwargs)
    raise RunnerSettingError(f"unknown runner {name!r}; known: {', '.join(RUNNER_NAMES)}")
