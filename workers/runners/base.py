"""The runner interface: measure schedules of one workload, return one result per schedule.

A runner answers per-schedule failures as results (compile_error, wrong_result, ...) and
raises only when it cannot answer at all (closed, unavailable, a schedule it has no record
of). Every result names the runner that produced it in ``MeasureResult.runner``.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Self

import numpy as np

from pipetune.model.errors import PipetuneError
from pipetune.model.trials import MeasureResult

# A runner measures any kernel family's schedules of its workloads: a workload of one of the
# families (model.family) and that family's schedule objects.
AnyWorkload = Any
Schedule = Any

# progress(done, total): called as work completes, for progress bars.
Progress = Callable[[int, int], None]


class RunnerError(PipetuneError, RuntimeError):
    """The runner cannot answer (as opposed to a schedule that failed, which is a result)."""


class RunnerUnavailableError(RunnerError):
    """The runner cannot run here (no GPU, no CuPy, no code generator)."""


def cupy_missing() -> str | None:
    """Why CuPy cannot be used here, with what to install (None: it is installed). One
    wording for every command that needs it: `pipetune worker --runner cupy` said only the
    probe child's ModuleNotFoundError, where the others named the package to install."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'pipetune[gpu]')"
    return None


class RunnerSettingError(RunnerError, ValueError):
    """The runner was set up wrongly by its user (an unknown runner name, a malformed setting
    from the environment): bad input, which the CLI reports with exit 2, not a failure to run."""


class RunnerClosedError(RunnerError):
    """measure() after close()."""


@dataclass(frozen=True)
class MeasureSettings:
    """How one schedule is timed. Kept in every dataset's metadata.

    warmup: untimed launches before the repeats (clocks up, instruction cache warm);
    repeats: timed launches (the most, with adaptive repeats), each after an L2 flush, CUDA
    events around each;
    seed: inputs are random fp16 from this seed (numpy PCG64), drawn as the workload's
    family's reference module says (workers.runners.reference: uniform in [-1, 1) or, for a
    deep reduction, integers in {-1, 0, 1}; workers.runners.memops_reference: per op);
    min_repeats: adaptive repeats (None: always ``repeats``): time ``min_repeats`` launches,
    stop there if their spread ((p90 - p10) / median) is at most ``settle``, else time more
    in rounds of ``min_repeats`` up to ``repeats`` (workers.runners.timing).
    """

    warmup: int = 3
    repeats: int = 30
    seed: int = 0
    min_repeats: int | None = None
    settle: float = 0.02

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError("warmup must be >= 0 and repeats >= 1")
        if self.min_repeats is not None and not 1 <= self.min_repeats <= self.repeats:
            raise ValueError("min_repeats must be between 1 and repeats")
        if not self.settle >= 0:
            raise ValueError("settle must be >= 0")

    @property
    def fewest_repeats(self) -> int:
        """Timed launches every schedule gets (``repeats`` unless adaptive)."""
        return self.repeats if self.min_repeats is None else self.min_repeats

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(samples: Sequence[float]) -> tuple[float, float]:
    """(median, spread) of timed repeats; spread = (p90 - p10) / median (0 for one sample)."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    median = float(np.median(values))
    if values.size == 1:
        return median, 0.0
    p10, p90 = np.percentile(values, [10, 90])
    return median, float((p90 - p10) / median)


class Runner(ABC):
    """Measures schedules. Use as a context manager, or call close()."""

    name: str = "runner"

    def __init__(self) -> None:
        self._closed = False

    @abstractmethod
    def _measure(self, workload: AnyWorkload, schedules: list[Schedule]) -> list[MeasureResult]:
        """One result per schedule, in order (the schedule list is non-empty)."""

    def measure(self, workload: AnyWorkload, schedules: Sequence[Schedule]) -> list[MeasureResult]:
        if self._closed:
            raise RunnerClosedError(f"the {self.name} runner is closed")
        schedules = list(schedules)
        if not schedules:
            return []
        results = self._measure(workload, schedules)
        if len(results) != len(schedules):  # pragma: no cover - a runner bug
            raise RunnerError(f"{self.name}: {len(results)} results for {len(schedules)} schedules")
        return results

    def prepare(
        self,
        workload: AnyWorkload,
        schedules: Sequence[Schedule],
        progress: Progress | None = None,
    ) -> None:
        """Do ahead what measure() would do first (the cupy runner compiles); optional."""
        if progress is not None:
            progress(len(schedules), len(schedules))

    @property
    def device_name(self) -> str | None:
        """The device measured on, if the runner has one."""
        return None

    @property
    def only_workload(self) -> AnyWorkload | None:
        """The one workload this runner can answer (a replay of a dataset), else None: a
        worker registers with it and leases no other workload's jobs."""
        return None

    @property
    def settings(self) -> dict[str, Any]:
        """What a dataset should record about how this runner measured."""
        return {}

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
