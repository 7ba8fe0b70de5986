"""Database rows -> wire documents (model/wire.py), and the queries that list them."""

from __future__ import annotations

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased, defer

from pipetune.model.wire import BestTrial, ScheduleDoc, TaskDoc, TrialDoc, WorkerDoc
from pipetune.service.orm import JobRow, TaskRow, WorkerRow, WorkloadRow
from pipetune.service.records import tflops

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
            latency_us=best.latency_us,
            tflops=tflops(workload.flops, best.latency_us),
            runner=best.runner,
        )
    return TaskDoc(
        id=task.id,
        state=task.state,  # type: ignore[arg-type]
        workload=workload.canonical,
        gpu=task.gpu,
        strategy=task.strategy,  # type: ignore[arg-type]
        budget=task.budget,
        seed=task.seed,
        trials_done=task.trials_done,
        trials_failed=task.trials_failed,
        best=best_doc,
        error=task.error,
        created_at=task.created_at,
        updated_at=task.updated_at,
    )


def task_flops(session: Session, task_id: int) -> int | None:
    """The FLOPs of a task's workload (None: no such task)."""
    return session.scalar(
        select(WorkloadRow.flops)
        .join(TaskRow, TaskRow.workload_id == WorkloadRow.id)
        .where(TaskRow.id == task_id)
    )


def get_task_doc(session: Session, task_id: int) -> TaskDoc | None:
    row = session.execute(_task_query().where(TaskRow.id == task_id)).first()
    return None if row is None else task_doc(*row)


def list_task_docs(session: Session, state: str | None, limit: int, offset: int) -> list[TaskDoc]:
    query = _task_query().order_by(TaskRow.id.desc()).limit(limit).offset(offset)
    if state is not None:
        query = query.where(TaskRow.state == state)
    return [task_doc(*row) for row in session.execute(query)]


def list_trial_docs(session: Session, task_id: int, after: int, limit: int) -> list[TrialDoc]:
    rows = session.execute(
        select(JobRow, WorkerRow.name)
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
            latency_us=job.latency_us,
            predicted_us=job.predicted_us,
            worker=worker,
            error=job.error,
            runner=job.runner,
        )
        for job, worker in rows
    ]


def worker_doc(worker: WorkerRow) -> WorkerDoc:
    return WorkerDoc(
        id=worker.id,
        name=worker.name,
        gpu=worker.gpu,
        arch=worker.arch,
        runner=worker.runner,
        last_heartbeat=worker.last_heartbeat,
    )
