"""Database rows -> wire documents (model/wire.py), and the queries that list them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session, aliased, defer

from pipetune.model.family import family_for_op, parse_any_workload
from pipetune.model.states import ACTIVE_TASK_STATES, WorkerState
from pipetune.model.trials import RunnerKind
from pipetune.model.wire import BestTrial, ScheduleDoc, TaskDoc, TrialDoc, WorkerDoc, WorkerList
from pipetune.model.workloads import WorkloadError
from pipetune.service.db import database_now, database_now_plus
from pipetune.service.errors import cut_text
from pipetune.service.orm import JobRow, TaskRow, WorkerRow, WorkloadRow, in_state
from pipetune.service.records import measured_device_name, throughput

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


def task_doc(
    task: TaskRow, workload: WorkloadRow, best: JobRow | None, no_worker: str | None = None
) -> TaskDoc:
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
        priority=task.priority,
        imported_from=task.imported_from,
        imported_device_name=task.imported_device_name,
        imported_settings=task.imported_settings,
        trials_done=task.trials_done,
        trials_failed=task.trials_failed,
        trials_target=task.trials_target,
        best=best_doc,
        error=task.error,
        no_worker=no_worker,
        created_at=task.created_at,
        updated_at=task.updated_at,
        finished_at=task.finished_at,
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


def _worker_label(gpu: str, runner: str | None) -> str:
    return f"{runner} worker for {gpu}" if runner else f"{gpu} worker"


def _no_worker(
    task: TaskRow, workload: WorkloadRow, workers: list[Any], live_s: float
) -> str | None:
    """Why no live worker can take the task's trials (None: one can). `workers`: the
    workers of its GPU, grouped by (runner, workload_hash) with how many of them are live
    (orm.in_state), their last heartbeat, their last exit and the database's clock
    (`now`) when they were read. The rules are the lease's (service/queue_pg.py's claim):
    the task's GPU, its runner kind where it names one, and a replay worker's workload."""
    gpu, runner = task.gpu, task.only_runner
    if not workers:
        return f"no {gpu} worker has registered"
    kinds = sorted({str(RunnerKind.of(w.runner) or w.runner) for w in workers})
    of_kind = [w for w in workers if runner is None or RunnerKind.of(w.runner) == runner]
    if not of_kind:
        return (
            f"no {runner} worker for {gpu} has registered (the task takes {runner} workers "
            f"only; {gpu}'s registered workers are {', '.join(kinds)})"
        )
    fit = [w for w in of_kind if w.workload_hash in (None, workload.hash)]
    if not fit:
        return (
            f"no {_worker_label(gpu, runner)} takes this workload: those registered replay "
            "other workloads' datasets"
        )
    if any(w.live for w in fit):
        return None
    now = fit[0].now
    last = (now - max(w.last for w in fit)).total_seconds()
    if any(w.live for w in of_kind):
        # Live workers that cannot take it (replay workers of other workloads): "no worker
        # is live" of a working fleet sent its operator looking for a fault that was none.
        return (
            f"no {_worker_label(gpu, runner)} that takes this workload is live: the live ones "
            f"replay other workloads' datasets; the last that could, {last:.0f} s ago "
            f"(the lease TTL is {live_s:.0f} s)"
        )
    exits = [w.exited for w in fit if w.exited is not None]
    if exits and last <= live_s:
        # None live, yet heard from within the TTL: each such one said it exited (a fleet
        # stopped cleanly, scaled down). Said at once, not a TTL later.
        return (
            f"no {_worker_label(gpu, runner)} is live: those heard from within the lease TTL "
            f"({live_s:.0f} s) have exited, the last {(now - max(exits)).total_seconds():.0f} "
            "s ago"
        )
    return (
        f"no {_worker_label(gpu, runner)} is live: none heard from within the lease TTL "
        f"({live_s:.0f} s); the last, {last:.0f} s ago"
    )


def no_worker_reasons(
    session: Session, rows: list[Any], live_within_s: float | None
) -> dict[int, str | None]:
    """TaskDoc.no_worker of each active task among `rows` ((task, workload, best) rows):
    one grouped read of the workers of their GPUs with the database's clock, at read time
    only (never on a lease or a result). `live_within_s`: the lease TTL (a worker heard from
    longer ago is not live: its leases would have expired); None: not looked at."""
    active = [(task, workload) for task, workload, _ in rows if task.state in ACTIVE_TASK_STATES]
    if live_within_s is None or not active:
        return {}
    gpus = sorted({task.gpu for task, _ in active})
    is_sqlite = session.get_bind().dialect.name == "sqlite"
    by_gpu: dict[str, list[Any]] = {gpu: [] for gpu in gpus}
    since = database_now_plus(is_sqlite, -live_within_s)
    for w in session.execute(
        select(
            WorkerRow.gpu,
            WorkerRow.runner,
            WorkerRow.workload_hash,
            func.count(case((in_state(WorkerState.LIVE, since), 1))).label("live"),
            func.max(WorkerRow.last_heartbeat).label("last"),
            func.max(WorkerRow.exited_at).label("exited"),
            database_now(is_sqlite).label("now"),  # (in the same round trip)
        )
        .where(WorkerRow.gpu.in_(gpus))
        .group_by(WorkerRow.gpu, WorkerRow.runner, WorkerRow.workload_hash)
    ):
        by_gpu[w.gpu].append(w)
    return {
        task.id: _no_worker(task, workload, by_gpu[task.gpu], live_within_s)
        for task, workload in active
    }


def get_task_doc(
    session: Session, task_id: int, live_within_s: float | None = None
) -> TaskDoc | None:
    """The task's document; with `live_within_s` (the lease TTL), its `no_worker` too."""
    row = session.execute(_task_query().where(TaskRow.id == task_id)).first()
    if row is None:
        return None
    reasons = no_worker_reasons(session, [row], live_within_s)
    return task_doc(*row, reasons.get(task_id))


def list_task_docs(
    session: Session,
    state: str | None,
    limit: int,
    offset: int,
    before: int | None = None,
    live_within_s: float | None = None,
) -> list[TaskDoc]:
    """A page of tasks, newest first: those with ids below `before` (a cursor: the last id of
    the page before, which tasks created meanwhile do not shift), after skipping `offset`;
    with `live_within_s`, each active one's `no_worker`."""
    query = _task_query().order_by(TaskRow.id.desc()).limit(limit).offset(offset)
    if state is not None:
        query = query.where(TaskRow.state == state)
    if before is not None:
        query = query.where(TaskRow.id < before)
    rows = list(session.execute(query))
    reasons = no_worker_reasons(session, rows, live_within_s)
    return [task_doc(*row, reasons.get(row[0].id)) for row in rows]


def list_trial_docs(
    session: Session,
    task_id: int,
    after: int,
    limit: int,
    samples: bool = False,
    error_chars: int | None = None,
) -> list[TrialDoc]:
    """A page of the task's trials after trial `after`; `samples`: with each trial's timed
    repeats (the caller bounds the page: SAMPLES_PAGE); `error_chars`: each error cut to so
    many characters, saying how many more it had."""
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
            worker_device=measured_device_name(job.result_device_name, device),
            error=job.error
            if job.error is None or error_chars is None
            else cut_text(job.error, error_chars),
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


def worker_doc(worker: WorkerRow, state: WorkerState | None) -> WorkerDoc:
    return WorkerDoc(
        id=worker.id,
        name=worker.name,
        gpu=worker.gpu,
        arch=worker.arch,
        runner=worker.runner,
        last_heartbeat=worker.last_heartbeat,
        exited_at=worker.exited_at,
        state=state,
        # A silent worker's leases have expired (not heard from within their TTL): what its
        # last heartbeat said it held, shown for ever, read as jobs still in its hands.
        busy_jobs=worker.busy_jobs if state in (WorkerState.LIVE, None) else 0,
        workload_hash=worker.workload_hash,
    )


def list_worker_docs(
    session: Session, state: WorkerState | None, limit: int, live_within_s: float
) -> WorkerList:
    """GET /v1/workers: up to `limit` workers in `state` (any: None), most recent heartbeat
    first, each with its state by the database's clock, and how many are in each state.
    `live_within_s`: the lease TTL."""
    is_sqlite = session.get_bind().dialect.name == "sqlite"
    since = database_now_plus(is_sqlite, -live_within_s)
    query = select(WorkerRow, database_now(is_sqlite)).order_by(
        WorkerRow.last_heartbeat.desc(), WorkerRow.id.desc()
    )
    if state is not None:
        query = query.where(in_state(state, since))
    docs = [
        worker_doc(worker, worker.state(now, live_within_s))
        for worker, now in session.execute(query.limit(limit))
    ]
    counted = session.execute(
        select(*(func.count(case((in_state(s, since), 1))) for s in WorkerState))
    ).one()
    return WorkerList(workers=docs, counts=dict(zip(WorkerState, counted, strict=True)))
