"""A recorded dataset imported as a finished task (`pipetune db import-dataset FILE`).

A pipetune dataset (a sweep of one workload on one GPU, from `pipetune sweep`, a GPU campaign,
or `pipetune export --format t4` of another service's task) becomes a task in state `done`
whose trials are the dataset's records, measured elsewhere: `imported_from` names the file.
Then the service knows what it holds: a task on another GPU can warm-start from it
(`prior_task`), `POST /v1/schedules` answers with its best schedule, and the best-in-k curves
normalise to it. It is left out of the per-strategy curves (nothing was tuned here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import insert
from sqlalchemy.orm import Session

from pipetune.model.hardware import get_gpu
from pipetune.model.states import TaskState
from pipetune.service.orm import JobRow, TaskRow
from pipetune.service.queue_types import result_columns
from pipetune.service.records import workload_row
from pipetune.workers.datasets import Dataset
from pipetune.workers.datasets.pipetune import PipetuneInfo, result_from_record

# The strategy an imported task is filed under: the records were not proposed by a search
# here; a sweep of the space in its own order is what `grid` names.
IMPORTED_STRATEGY = "grid"


def import_dataset(
    session: Session, data: Dataset, info: PipetuneInfo, source: str, now: Any
) -> int:
    """Write `data` (checked by check_pipetune into `info`) as a finished task; its id.
    `now`: the database's time (Database.now())."""
    if not len(data):
        raise ValueError(f"{source}: the dataset holds no configuration")
    fam, gpu = info.family, get_gpu(info.gpu)
    schedules = [fam.parse_schedule(dict(r.configuration)) for r in data.records]
    results = [result_from_record(r, info.runner) for r in data.records]
    knobs = {
        k: np.array([getattr(s, k) for s in schedules], dtype=np.int64) for k in fam.knob_names
    }
    predicted = fam.evaluate(fam.space_of(info.workload, gpu, knobs)).latency_us
    ok = [(r.latency_us, i) for i, r in enumerate(results) if r.ok and r.latency_us is not None]
    best = min(ok) if ok else None
    workload = workload_row(session, info.workload)
    task = TaskRow(
        workload_id=workload.id,
        gpu=info.gpu,
        arch=gpu.arch,
        strategy=IMPORTED_STRATEGY,
        budget=len(results),
        seed=0,
        batch_size=len(results),
        imported_from=source[:512],
        state=TaskState.DONE,
        batches=1,
        trials_target=len(results),
        trials_enqueued=len(results),
        trials_done=len(results),
        trials_failed=sum(not r.ok for r in results),
        best_trial=None if best is None else best[1],
        best_latency_us=None if best is None else best[0],
        curve=None,  # not a tuning run: kept out of the per-strategy curves
        finished_at=now,
    )
    session.add(task)
    session.flush()
    rows = zip(schedules, results, predicted, strict=True)
    session.execute(insert(JobRow), [_job(task, i, *row) for i, row in enumerate(rows)])
    return task.id


def _job(task: TaskRow, trial: int, schedule: Any, result: Any, predicted_us: Any) -> dict:
    predicted_us = float(predicted_us)
    return {
        **result_columns(result),
        "task_id": task.id,
        "workload_id": task.workload_id,
        "gpu": task.gpu,
        "arch": task.arch,
        "trial": trial,
        "batch": 0,
        "schedule": schedule.as_dict(),
        "schedule_id": schedule.id,
        "predicted_us": predicted_us if np.isfinite(predicted_us) else None,
        "attempts": 0,
    }
