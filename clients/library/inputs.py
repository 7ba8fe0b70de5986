"""What the public functions accept: a workload as a dict or a workload object (of any kernel
family: the tensor-core GEMMs' Gemm, GemmSwiglu, GemmBiasGelu, Bmm, Conv2d, Conv3d; the
memory-intensive operators' Reduce, Softmax, LayerNorm, RMSNorm, BiasGelu, SiluMul; the Hopper
family's HopperGemm, HopperBmm, HopperGemmBiasGelu, HopperGemmSwiglu, subclasses of the GEMMs'
and BMM's types: each exported by `pipetune`), a GPU by key or alias, a
schedule as a dict, a `Schedule` (or another family's schedule object) or a wire
`ScheduleDoc`. Bad input raises a ValueError subclass whose message names the field
(WorkloadError, HardwareError, ScheduleError), never a bare pydantic error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pipetune.model.errors import InvalidArgumentError, InvalidArgumentTypeError
from pipetune.model.family import (
    family_for_knobs,
    op_families,
    parse_any_workload,
    schedule_of_id,
)
from pipetune.model.hardware import HardwareError, resolve_gpu_key
from pipetune.model.hopper.space import HopperSchedule
from pipetune.model.knobs import ScheduleError
from pipetune.model.memops.space import MemSchedule
from pipetune.model.memops.workloads import (
    BiasGelu,
    LayerNorm,
    MemWorkload,
    Reduce,
    RMSNorm,
    SiluMul,
    Softmax,
)
from pipetune.model.plain_numbers import plain
from pipetune.model.space import Schedule
from pipetune.model.wire import ScheduleDoc, ScheduleResponse
from pipetune.model.workloads import (
    AnyWorkload,
    Bmm,
    Conv2d,
    Conv3d,
    Gemm,
    GemmBiasGelu,
    GemmSwiglu,
)

WorkloadLike = (
    Mapping[str, Any]
    | Gemm
    | GemmSwiglu
    | GemmBiasGelu
    | Bmm
    | Conv2d
    | Conv3d
    | Reduce
    | Softmax
    | LayerNorm
    | RMSNorm
    | BiasGelu
    | SiluMul
)
# A schedule object of any kernel family: what a tuning, a lookup or a kernel hands back.
AnySchedule = Schedule | MemSchedule | HopperSchedule
# What a schedule argument takes: knob values, a family's schedule object, a wire document,
# pipetune.best_schedule's answer as is, or a schedule's id ("s-2-2-1-1-8-6-2": what tables,
# exports and `pipetune tasks` show).
ScheduleLike = Mapping[str, Any] | AnySchedule | ScheduleDoc | ScheduleResponse | str
# Every kernel family's workload types, from the families' registry (one per operator).
WORKLOAD_TYPES: tuple[type, ...] = tuple(
    dict.fromkeys(fam.ops[op] for op, fam in op_families().items())
)


def as_workload(workload: WorkloadLike) -> AnyWorkload | MemWorkload:
    """The workload object (a dict is validated: WorkloadError names the bad field)."""
    if isinstance(workload, WORKLOAD_TYPES):  # (a tuple built at import: no narrowing)
        return cast("AnyWorkload | MemWorkload", workload)
    if isinstance(workload, Mapping):
        parsed: AnyWorkload | MemWorkload = parse_any_workload(plain(dict(workload)))
        return parsed
    raise InvalidArgumentTypeError(
        "workload",
        "expected a dict such as {'op': 'gemm', 'm': 1024, 'n': 64, 'k': 2048} or "
        f"a workload object ({', '.join(f'pipetune.{t.__name__}' for t in WORKLOAD_TYPES)}), "
        f"got {type(workload).__name__}",
    )


class GpuArgumentError(HardwareError, InvalidArgumentError):
    """A `gpu` argument that names no GPU: a HardwareError, as the registry's refusals are,
    and an InvalidArgumentError naming the argument, as every other refused argument is
    (`except pipetune.InvalidArgumentError` let it through)."""

    def __init__(self, reason: str):
        InvalidArgumentError.__init__(self, "gpu", reason)


def as_gpu(gpu: str) -> str:
    """The GPU's key (GpuArgumentError lists the known GPUs)."""
    if not isinstance(gpu, str):  # (None was an AttributeError from deep inside)
        raise GpuArgumentError(f"expected a GPU name such as 'h100', got {type(gpu).__name__}")
    try:
        return resolve_gpu_key(gpu)
    except HardwareError as exc:  # name the argument, as every other bad input does
        raise GpuArgumentError(str(exc)) from None


class ScheduleArgumentError(ScheduleError, InvalidArgumentError):
    """A `schedule` argument that is none of the workload's: a ScheduleError, as a schedule
    document's refusals are, and an InvalidArgumentError naming the argument."""

    def __init__(self, reason: str):
        InvalidArgumentError.__init__(self, "schedule", reason)


def as_schedule(schedule: ScheduleLike) -> AnySchedule:
    """The schedule object of the family whose knobs it names, or whose id it is (a dict is
    validated: ScheduleError names the bad knob)."""
    if isinstance(schedule, ScheduleDoc):
        return cast("AnySchedule", schedule.to_schedule())
    if isinstance(schedule, ScheduleResponse):  # pipetune.best_schedule's answer, as is
        return cast("AnySchedule", schedule.schedule.to_schedule())
    if isinstance(schedule, Mapping):
        # (NumPy knob values: the schedule types' from_dict makes them ints)
        data = dict(schedule)
        return cast("AnySchedule", family_for_knobs(data).parse_schedule(data))
    if isinstance(schedule, str):
        by_id = schedule_of_id(schedule.strip())
        if by_id is None:
            raise ScheduleError(
                f"{schedule!r} is no schedule id (ids read as 's-2-2-1-1-8-6-2', "
                "'m-32-1-1-4-2-0-0' or 'wg128x256s3_p'); give the knob values as a dict"
            )
        return cast("AnySchedule", by_id)
    if hasattr(schedule, "as_dict") and hasattr(schedule, "id"):
        return schedule  # a family's schedule object (or one built like it)
    raise ScheduleError(
        f"a schedule must be a dict of knob values or a schedule id, got {type(schedule).__name__}"
    )
