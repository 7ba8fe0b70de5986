"""Measure a whole schedule space (or a seeded sample of it) and make a dataset of it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipetune.model.family import FamilySpace
from pipetune.model.hardware import GPUSpec
from pipetune.workers.datasets import Dataset, dataset_from_results, now_timestamp
from pipetune.workers.runners.base import AnyWorkload, Progress, Runner, Schedule

CHUNK = 32  # schedules per measure() call: progress granularity, one timestamp per chunk


def select_schedules(space: FamilySpace, limit: int | None, seed: int) -> list[Schedule]:
    """The whole space, or ``limit`` schedules drawn uniformly with ``seed`` (in space
    order), so a limited sweep is a fair sample rather than the space's first corner."""
    if limit is None or limit >= len(space):
        return list(space)
    if limit < 1:
        raise ValueError("limit must be at least 1")
    picked = np.sort(np.random.default_rng(seed).choice(len(space), size=limit, replace=False))
    return [space[int(i)] for i in picked]


def sweep(
    runner: Runner,
    workload: AnyWorkload,
    gpu: GPUSpec,
    schedules: Sequence[Schedule],
    progress: Progress | None = None,
) -> Dataset:
    """Measure every schedule with the runner; the dataset records runner and settings."""
    schedules = list(schedules)
    results = []
    timestamps: list[str] = []
    for start in range(0, len(schedules), CHUNK):
        chunk = schedules[start : start + CHUNK]
        results.extend(runner.measure(workload, chunk))
        timestamps.extend([now_timestamp()] * len(chunk))
        if progress is not None:
            progress(len(results), len(schedules))
    return dataset_from_results(
        workload,
        gpu,
        schedules,
        results,
        runner=runner.name,
        device_name=runner.device_name,
        settings=runner.settings,
        timestamps=timestamps,
    )
