"""What the public functions accept: a workload as a dict or a workload object, a GPU by key or
alias, a schedule as a dict, a `Schedule` or a wire `ScheduleDoc`. Bad input raises a
ValueError subclass whose message names the field (WorkloadError, HardwareError,
ScheduleError), never a bare pydantic error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipetune.model.hardware import resolve_gpu_key
from pipetune.model.space import Schedule, ScheduleError
from pipetune.model.wire import ScheduleDoc
from pipetune.model.workloads import AnyWorkload, Bmm, Conv2d, Conv3d, Gemm, parse_workload

WorkloadLike = Mapping[str, Any] | Gemm | Bmm | Conv2d | Conv3d
ScheduleLike = Mapping[str, Any] | Schedule | ScheduleDoc


def as_workload(workload: WorkloadLike) -> AnyWorkload:
    """The workload object (a dict is validated: WorkloadError names the bad field)."""
    if isinstance(workload, Gemm | Bmm | Conv2d | Conv3d):
        return workload
    if isinstance(workload, Mapping):
        return parse_workload(dict(workload))
    raise TypeError(
        "workload: expected a dict such as {'op': 'gemm', 'm': 1024, 'n': 64, 'k': 2048} or "
        f"a pipetune.Gemm/Bmm/Conv2d/Conv3d, got {type(workload).__name__}"
    )


def as_gpu(gpu: str) -> str:
    """The GPU's key (HardwareError lists the known GPUs)."""
    return resolve_gpu_key(gpu)


def as_schedule(schedule: ScheduleLike) -> Schedule:
    """The schedule object (a dict is validated: ScheduleError names the bad knob)."""
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, ScheduleDoc):
        return schedule.to_schedule()
    if isinstance(schedule, Mapping):
        return Schedule.from_dict(dict(schedule))
    raise ScheduleError(f"a schedule must be a dict of knob values, got {type(schedule).__name__}")
