"""The replay runner: answers from a recorded pipetune dataset (exact lookup by schedule).

Failed configurations come back with their recorded failure status. A schedule the dataset
does not hold raises :class:`ScheduleNotInDatasetError`; a dataset recorded for another workload
or GPU is refused when the runner is built (or when measure() is asked about another
workload) unless ``ignore_mismatch=True``. Results say ``runner="replay:<recorded runner>"``,
so a replay of a simulated sweep still reads as simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipetune.model.hardware import GPUSpec, resolve_gpu_key
from pipetune.model.trials import (
    RUNNER_MAX_CHARS,
    RUNNER_PATTERN,
    MeasureResult,
    runner_kind_shown,
)
from pipetune.workers.datasets import (
    Dataset,
    Record,
    check_pipetune,
    load_dataset,
    record_runner,
    result_from_record,
)
from pipetune.workers.datasets.pipetune import UNKNOWN_RUNNER
from pipetune.workers.runners.base import AnyWorkload, Runner, RunnerError, Schedule


class ScheduleNotInDatasetError(RunnerError, KeyError):
    """A schedule the replayed dataset has no record of."""

    def __init__(self, schedule: Schedule, dataset: str):
        super().__init__(f"schedule {schedule.id} is not in dataset {dataset}")
        self.schedule = schedule
        self.dataset = dataset

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DatasetMismatchError(RunnerError, ValueError):
    """A dataset recorded for another workload or GPU than the one asked about: the
    caller's argument, so also a ValueError (what the public API raises for one)."""


class ReplayRunner(Runner):
    name = "replay"

    def __init__(
        self,
        dataset: Dataset | str | Path,
        *,
        workload: AnyWorkload | None = None,
        gpu: GPUSpec | str | None = None,
        ignore_mismatch: bool = False,
    ):
        super().__init__()
        self.dataset = dataset if isinstance(dataset, Dataset) else load_dataset(dataset)
        self.info = check_pipetune(self.dataset)
        self.ignore_mismatch = ignore_mismatch
        if workload is not None:
            self._check_workload(workload)
        if gpu is not None:
            key = gpu.key if isinstance(gpu, GPUSpec) else resolve_gpu_key(gpu)
            if key != self.info.gpu and not ignore_mismatch:
                raise DatasetMismatchError(
                    f"dataset {self.dataset.name} was recorded on {self.info.gpu}, not {key}"
                )

    def _check_workload(self, workload: AnyWorkload) -> None:
        if workload.canonical() != self.info.workload.canonical() and not self.ignore_mismatch:
            raise DatasetMismatchError(
                f"dataset {self.dataset.name} holds {self.info.workload.label()}, "
                f"not {workload.label()}"
            )

    @property
    def device_name(self) -> str | None:
        return self.info.device_name

    @property
    def only_workload(self) -> AnyWorkload | None:
        # (ignore_mismatch answers any workload from the dataset's schedules: tests only.)
        return None if self.ignore_mismatch else self.info.workload

    @property
    def settings(self) -> dict[str, Any]:
        return {"replayed": self.dataset.name, **self.info.metadata.get("settings", {})}

    def _measure(self, workload: AnyWorkload, schedules: list[Schedule]) -> list[MeasureResult]:
        self._check_workload(workload)
        records = []
        for schedule in schedules:
            record = self.dataset.lookup(schedule.as_dict())
            if record is None:
                raise ScheduleNotInDatasetError(schedule, self.dataset.name)
            records.append(record)
        return [result_from_record(r, self.replayed(r)) for r in records]

    def replayed(self, record: Record) -> str:
        """The runner a replayed record's result names: `replay:<the runner that measured
        it>`, once (a replay of a replay's recording replays the same measurement: it said
        "replay:replay:cupy", longer than a result's runner, and every trial failed to
        replay), and where its runner is several runners' label too long to prefix (a file
        that names no runner per record), the kind that label is shown as."""
        recorded = record_runner(record, self.info.runner) or UNKNOWN_RUNNER
        prefix = f"{self.name}:"
        recorded = recorded.removeprefix(prefix)
        if len(prefix) + len(recorded) > RUNNER_MAX_CHARS or not RUNNER_PATTERN.fullmatch(
            prefix + recorded
        ):  # (a hand-written file's label that is not a runner's name: its kind, as shown)
            recorded = runner_kind_shown(recorded) or UNKNOWN_RUNNER
        return prefix + recorded
