"""Database rows -> wire documents (model/wire.py), and the queries that list them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased, defer

from pipetune.model.family import family_for_op, parse_any_workload
from pipetune.model.wire import BestTrial, ScheduleDoc, TaskDoc, TrialDoc, WorkerDoc
from pipetune.model.workloads import WorkloadError
from pipetune.service.orm import JobRow, TaskRow, WorkerRow, WorkloadRow
from pipetune.service.records import throughput

_WORKLOADS: dict[str, Any] = {}  # workload hash -> parsed (rows never change)
_WORKLOAD_CACHE_SIZE = 4096


def _workload(row: WorkloadRow) -> Any:
    """The parsed workload of a row (None if today's rules refuse it: labels then fall back
    to the family's generic ones)."""
    found = _WORKLOADS.get(row.hash)
    if found is None and row.hash not in _WORKLOADS:
        if len(_WORKLOADS) > _WORKLOAD_CACHE_SIZE:
            _WORKLOADS.clear()
        try:
            found = parse_any_workload(dict(row.canonical))
        except WorkloadError:
            found = None
        _WORKLOADS[row.hash] = found
    return found


def schedule_label(workload: WorkloadRow, knobs: dict[str, int]) -> str | None:
    """The schedule in one cell, as its family writes it (None for knobs it refuses)."""
    try:
        return family_for_op(workload.op).schedule_label(knobs, _workload(workload))
    except (KeyError, ValueError):
        return None


_BestJob = aliased(JobRow, name="best_job")


def _task_query():
    # The stored curve (a float per trial) is for the aggregate view only: not loaded here.
    return (
        select(TaskRow, WorkloadRow, _BestJob)
        .options(defer(TaskRow.curve))
        .join(WorkloadRow, TaskRow.workload_id == WorkloadRow.id)
        .outerjoin(
            _BestJob, and_(_BestJob.task_id == TaskRow.id, _BestJob.trial == TaskRow.best_trial)
        )
    )


def task_doc(task: TaskRow, workload: WorkloadRow, best: JobRow | None) -> TaskDoc:
    best_doc = None
    if best is not None and best.latency_us is not None:
        best_doc = BestTrial(
            trial=best.trial,
            schedule=ScheduleDoc(**best.schedule),
            schedule_label=schedule_label(workload, best.schedule),
            latency_us=best.latency_us,
            **throughput(workload.op, workload.flops, best.latency_us),
            runner=best.runner,
        )
    return TaskDoc(
        id=task.id,
        state=task.state,  # type: ignore[arg-type]
        workload=workload.canonical,
        label=workload.label,
        gpu=task.gpu,
        strategy=task.strategy,  # type: ignore[arg-type]
        budget=task.budget,
        seed=task.seed,
        batch_size=task.batch_size,
        prior_task=task.prior_task,
        learned_from=task.learned_from,
        runner=task.only_runner,
        imported_from=task.imported_from,
        trials_done=task.trials_done,
        trials_failed=task.trials_failed,
        trials_target=task.trials_target,
        best=best_doc,
        error=task.error,
        created_at=task.created_at,
        updated_at=task.updated_at,
    )


def task_work(session: Session, task_id: int) -> tuple[str, int] | None:
    """The op and the work of one run (WorkloadRow.flops: in the family's work unit) of a
    task's workload; None: no such task."""
    row = session.execute(
        select(WorkloadRow.op, WorkloadRow.flops)
        .join(TaskRow, TaskRow.workload_id == WorkloadRow.id)
        .where(TaskRow.id == task_id)
    ).first()
    return None if row is None else (row.op, row.flops)


def get_task_doc(session: Session, task_id: int) -> TaskDoc | None:
    row = session.execute(_task_query().where(TaskRow.id == task_id)).first()
    return None if row is None else task_doc(*row)


def list_task_docs(
    session: Session, state: str | None, limit: int, offset: int, before: int | None = None
) -> list[TaskDoc]:
    """A page of tasks, newest first: those with ids below `before` (a cursor: the last id of
    the page before, which tasks created meanwhile do not shift), after skipping `offset`."""
    query = _task_query().order_by(TaskRow.id.desc()).limit(limit).offset(offset)
    if state is not None:
        query = query.where(TaskRow.state == state)
    if before is not None:
        query = query.where(TaskRow.id < before)
    return [task_doc(*row) for row in session.execute(query)]


def list_trial_docs(
    session: Session, task_id: int, after: int, limit: int, samples: bool = False
) -> list[TrialDoc]:
    """A page of the task's trials after trial `after`; `samples`: with each trial's timed
    repeats (the caller bounds the page: SAMPLES_PAGE)."""
    workload = session.scalars(
        select(WorkloadRow)
        .join(TaskRow, TaskRow.workload_id == WorkloadRow.id)
        .where(TaskRow.id == task_id)
    ).one_or_none()
    rows = session.execute(
        select(JobRow, WorkerRow.name, WorkerRow.device_name)
        .outerjoin(WorkerRow, WorkerRow.id == JobRow.result_worker)
        .where(JobRow.task_id == task_id, JobRow.trial > after)
        .order_by(JobRow.trial)
        .limit(limit)
    )
    return [
        TrialDoc(
            trial=job.trial,
            state=job.state,  # type: ignore[arg-type]
            status=job.status,  # type: ignore[arg-type]
            schedule=ScheduleDoc(**job.schedule),
            schedule_label=None if workload is None else schedule_label(workload, job.schedule),
            latency_us=job.latency_us,
            predicted_us=job.predicted_us,
            worker=worker,
            worker_device=device,
            error=job.error,
            runner=job.runner,
            samples_us=list(job.samples_us or ()) if samples else None,
            spread=job.spread,
            registers=job.registers,
            spill_bytes=job.spill_bytes,
            smem_bytes=job.smem_bytes,
            compile_ms=job.compile_ms,
            max_abs_error=job.max_abs_error,
            generator_revision=job.generator_revision,
            finished_at=job.finished_at,
        )
        for job, worker, device in rows
    ]


def worker_doc(worker: WorkerRow) -> WorkerDoc:
    return WorkerDoc(
        id=worker.id,
        name=worker.name,
        gpu=worker.gpu,
        arch=worker.arch,
        runner=worker.runner,
        last_heartbeat=worker.last_heartbeat,
        workload_hash=worker.workload_hash,
    )
