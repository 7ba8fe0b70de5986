"""The task driver: a task's proposals, batch by batch, reproducible by any replica.

A task is (workload, GPU, strategy, seed, budget). Creating it proposes the first batch in
the same transaction that writes the task. When every job of the outstanding batch is final
(done, failed or lost), `advance` rebuilds the TuningSession, observes that batch and
enqueues the next, or marks the task done at its budget or when the space is exhausted.

Nothing lives only in memory: every proposed schedule is a job row with its batch number,
so any replica rebuilds the session with `TuningSession.replay` (which checks each batch
replays identically). Sessions are cached per process, keyed by the number of trials they
will have seen once their pending batch completes, so the usual advance observes one batch
instead of replaying all of them. Two replicas advancing the same task race on a
compare-and-set of `tasks.batches`: the loser's batch is never written.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import TaskCreate
from pipetune.model.workloads import AnyWorkload, parse_workload
from pipetune.service.db import Database
from pipetune.service.errors import ConflictError, InputError, NotFoundError
from pipetune.service.metrics import Metrics
from pipetune.service.orm import JobRow, LeaseRow, TaskRow, WorkloadRow
from pipetune.service.records import workload_row
from pipetune.service.settings import Settings
from pipetune.tuner.session import SessionError, TuningSession

log = logging.getLogger(__name__)

ACTIVE_TASK = ("queued", "running")
MAX_LIVE_SESSIONS = 512
OUTSTANDING_JOB = ("queued", "leased")


@dataclass
class _Live:
    """A session whose pending batch is the task's outstanding one."""

    session: TuningSession
    predicted_us: np.ndarray  # the model's latency per space row
    trials: int  # trials it will have observed once the pending batch completes


@dataclass
class _Plan:
    """What an advance will write, computed outside any write transaction."""

    task_id: int
    version: int  # tasks.batches when the plan was made
    first_trial: int
    batch: list[Schedule]
    predicted: list[float]
    curve: list[float | None]
    live: _Live | None = None
    error: str | None = None


@dataclass(frozen=True)
class _JobView:
    """A final job as the tuner sees it."""

    trial: int
    batch: int
    schedule: Schedule
    result: MeasureResult


def _observed(job: JobRow) -> MeasureResult:
    """A final job as the tuner sees it: lost and failed jobs are failures."""
    if job.state == "lost":
        return MeasureResult(status="timeout", error=job.error or "lost")
    return MeasureResult(
        status=job.status,  # type: ignore[arg-type]
        latency_us=job.latency_us if job.status == "ok" else None,
        error=job.error,
    )


def _extend_curve(curve: list[float | None], results: list[MeasureResult]) -> list[float | None]:
    best = curve[-1] if curve else None
    out = list(curve)
    for r in results:
        if r.ok and r.latency_us is not None and (best is None or r.latency_us < best):
            best = r.latency_us
        out.append(best)
    return out


class Driver:
    def __init__(self, db: Database, settings: Settings, metrics: Metrics):
        self.db = db
        self.settings = settings
        self.metrics = metrics
        # Bounded: a replica that stops driving a task (another one finished it) must not
        # keep its session forever.
        self._live: OrderedDict[int, _Live] = OrderedDict()
        self._live_lock = threading.Lock()
        self._task_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)

    # ---- sessions ------------------------------------------------------------------

    def _new_session(
        self, workload: AnyWorkload, gpu: str, strategy: str, seed: int, budget: int
    ) -> tuple[TuningSession, np.ndarray]:
        session = TuningSession(workload, get_gpu(gpu), strategy, seed, budget)
        return session, evaluate(session.space).latency_us

    @staticmethod
    def _propose(
        session: TuningSession, predicted: np.ndarray, batch_size: int
    ) -> tuple[list, list]:
        n = min(batch_size, session.remaining)
        batch = session.propose(n) if n > 0 else []
        return batch, [float(predicted[session.space.index(s)]) for s in batch]

    def _take_live(self, task_id: int) -> _Live | None:
        with self._live_lock:
            return self._live.pop(task_id, None)

    def _keep_live(self, task_id: int, live: _Live | None) -> None:
        with self._live_lock:
            self._live.pop(task_id, None)
            if live is not None:
                self._live[task_id] = live
                while len(self._live) > MAX_LIVE_SESSIONS:
                    self._live.popitem(last=False)

    # ---- create --------------------------------------------------------------------

    def create(self, body: TaskCreate) -> int:
        """Write the task and its first batch in one transaction; returns the task id."""
        session, predicted = self._new_session(
            body.workload, body.gpu, body.strategy, body.seed, body.budget
        )
        if len(session.space) == 0:
            raise InputError(
                ["body", "workload"], f"no schedule of the kernel family is valid on {body.gpu}"
            )
        batch, batch_predicted = self._propose(session, predicted, self.settings.batch_size)
        with self.db.write() as s:
            workload = workload_row(s, body.workload)
            task = TaskRow(
                workload_id=workload.id,
                gpu=body.gpu,
                arch=session.gpu.arch,
                strategy=body.strategy,
                budget=body.budget,
                seed=body.seed,
                batch_size=self.settings.batch_size,
                state="queued",
                batches=1,
                trials_target=min(body.budget, len(session.space)),
                trials_enqueued=len(batch),
                trials_done=0,
                trials_failed=0,
                curve=[],
            )
            s.add(task)
            s.flush()
            self._insert_jobs(s, task, 0, 0, batch, batch_predicted)
            task_id = task.id
        self.metrics.batches.inc()
        self._keep_live(task_id, _Live(session, predicted, len(batch)))
        return task_id

    @staticmethod
    def _insert_jobs(
        s: Session,
        task: TaskRow,
        batch_no: int,
        first_trial: int,
        batch: list[Schedule],
        predicted: list[float],
    ) -> None:
        s.execute(
            JobRow.__table__.insert(),
            [
                {
                    "task_id": task.id,
                    "workload_id": task.workload_id,
                    "gpu": task.gpu,
                    "arch": task.arch,
                    "trial": first_trial + i,
                    "batch": batch_no,
                    "schedule": schedule.as_dict(),
                    "schedule_id": schedule.id,
                    "predicted_us": p,
                    "state": "queued",
                    "attempts": 0,
                }
                for i, (schedule, p) in enumerate(zip(batch, predicted, strict=True))
            ],
        )

    # ---- advance -------------------------------------------------------------------

    def advance(self, task_id: int) -> bool:
        """Enqueue the task's next batch (or finish it) if its outstanding batch is
        complete. True when this call changed the task."""
        with self._task_locks[task_id]:
            plan = self._plan(task_id)
            if plan is None:
                return False
            changed = self._commit(plan)
            self._keep_live(task_id, plan.live if changed and plan.batch else None)
            if changed and not plan.batch:
                self._task_locks.pop(task_id, None)
            return changed

    def _jobs(
        self, task_id: int, batch: int | None = None, before: int | None = None
    ) -> list[_JobView]:
        """The task's jobs: of one batch, or of the batches numbered below `before`."""
        query = select(JobRow).where(JobRow.task_id == task_id)
        if batch is not None:
            query = query.where(JobRow.batch == batch)
        if before is not None:
            query = query.where(JobRow.batch < before)
        with self.db.read() as s:
            jobs = s.scalars(query.order_by(JobRow.trial)).all()
            return [_JobView(j.trial, j.batch, Schedule(**j.schedule), _observed(j)) for j in jobs]

    def _plan(self, task_id: int) -> _Plan | None:
        with self.db.read() as s:
            task = s.get(TaskRow, task_id)
            if task is None or task.state not in ACTIVE_TASK or self._outstanding(s, task_id):
                return None
            canonical = s.scalar(
                select(WorkloadRow.canonical).where(WorkloadRow.id == task.workload_id)
            )
            spec = (parse_workload(canonical), task.gpu, task.strategy, task.seed, task.budget)
            version, enqueued, curve = task.batches, task.trials_enqueued, list(task.curve or [])
            batch_size = task.batch_size  # the task's own, whatever this replica's setting
        plan = _Plan(task_id, version, 0, [], [], [])
        live = self._take_live(task_id)
        views = self._jobs(task_id, version - 1) if live and live.trials == enqueued else []
        try:
            if live is not None and self._live_matches(live, views, curve):
                session, predicted = live.session, live.predicted_us
                session.observe([(v.schedule, v.result) for v in views])
                plan.curve = _extend_curve(curve, [v.result for v in views])
            else:
                # Only the batches this plan saw complete: another replica may have queued
                # the next one since (its jobs unmeasured); this plan then loses the
                # compare-and-set on `batches` in _commit, as it should, quietly.
                views = self._jobs(task_id, before=version)
                session, predicted = self._replay(spec, views)
                plan.curve = _extend_curve([], [v.result for v in views])
            plan.first_trial = len(session.history)
            plan.batch, plan.predicted = self._propose(session, predicted, batch_size)
        except (SessionError, ValueError) as exc:
            log.exception("task %s cannot advance", task_id)
            plan.error = f"cannot rebuild the tuning session: {exc}"
            return plan
        plan.live = _Live(session, predicted, plan.first_trial + len(plan.batch))
        return plan

    @staticmethod
    def _live_matches(live: _Live, views: list[_JobView], curve: list) -> bool:
        if not views:
            return False
        pending = [live.session.space[r] for r in live.session.pending]
        return pending == [v.schedule for v in views] and len(curve) == views[0].trial

    def _replay(self, spec: tuple, views: list[_JobView]) -> tuple[TuningSession, np.ndarray]:
        workload, gpu, strategy, seed, budget = spec
        session, predicted = self._new_session(workload, gpu, strategy, seed, budget)
        batches: dict[int, list] = defaultdict(list)
        for v in views:
            batches[v.batch].append((v.schedule, v.result))
        replayed = TuningSession.replay(
            workload,
            session.gpu,
            strategy,
            seed,
            budget,
            [batches[b] for b in sorted(batches)],
            space=session.space,
        )
        return replayed, predicted

    @staticmethod
    def _outstanding(s: Session, task_id: int) -> int:
        return s.scalar(
            select(func.count())
            .select_from(JobRow)
            .where(JobRow.task_id == task_id, JobRow.state.in_(OUTSTANDING_JOB))
        )

    def _commit(self, plan: _Plan) -> bool:
        now = self.db.now()
        if plan.error is not None:
            values = {"state": "failed", "error": plan.error, "finished_at": now}
        elif not plan.batch:
            values = {"state": "done", "finished_at": now}
        else:
            values = {
                "batches": plan.version + 1,
                "trials_enqueued": plan.first_trial + len(plan.batch),
            }
        if plan.error is None:
            values["curve"] = plan.curve
        with self.db.write() as s:
            # The compare-and-set: only the replica that still sees `version` writes.
            task = s.execute(
                update(TaskRow)
                .where(
                    TaskRow.id == plan.task_id,
                    TaskRow.batches == plan.version,
                    TaskRow.state.in_(ACTIVE_TASK),
                )
                .values(**values, updated_at=now)
                .returning(TaskRow.id, TaskRow.workload_id, TaskRow.gpu, TaskRow.arch)
                .execution_options(synchronize_session=False)
            ).first()
            if task is None:
                return False
            if plan.batch:
                self._insert_jobs(
                    s, task, plan.version, plan.first_trial, plan.batch, plan.predicted
                )
        if plan.batch:
            self.metrics.batches.inc()
        else:
            self.metrics.tasks_finished.inc(values["state"])
        return True

    def advance_ready(self) -> int:
        """Advance every active task whose outstanding batch is complete (the safety net
        for a replica that stopped between a result and its advance)."""
        outstanding = (
            select(JobRow.id)
            .where(JobRow.task_id == TaskRow.id, JobRow.state.in_(OUTSTANDING_JOB))
            .exists()
        )
        with self.db.read() as s:
            ready = list(
                s.scalars(select(TaskRow.id).where(TaskRow.state.in_(ACTIVE_TASK), ~outstanding))
            )
        return sum(self.advance(task_id) for task_id in ready)

    # ---- cancel --------------------------------------------------------------------

    def cancel(self, task_id: int) -> None:
        now = self.db.now()
        with self.db.write() as s:
            # Locked: an advance committing meanwhile would leave its new batch queued.
            state = s.scalar(select(TaskRow.state).where(TaskRow.id == task_id).with_for_update())
            if state is None:
                raise NotFoundError(f"task {task_id} does not exist")
            if state in ("done", "failed"):
                raise ConflictError(f"task {task_id} is already {state}")
            if state == "cancelled":
                return
            jobs = s.scalars(
                update(JobRow)
                .where(JobRow.task_id == task_id, JobRow.state.in_(OUTSTANDING_JOB))
                .values(state="cancelled", lease_expires_at=None, finished_at=now)
                .returning(JobRow.id)
                .execution_options(synchronize_session=False)
            ).all()
            if jobs:
                s.execute(
                    update(LeaseRow)
                    .where(LeaseRow.job_id.in_(jobs), LeaseRow.outcome.is_(None))
                    .values(outcome="cancelled", ended_at=now)
                    .execution_options(synchronize_session=False)
                )
            s.execute(
                update(TaskRow)
                .where(TaskRow.id == task_id)
                .values(state="cancelled", finished_at=now, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        self._keep_live(task_id, None)
        self.metrics.tasks_finished.inc("cancelled")
