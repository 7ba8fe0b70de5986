"""The job queue: workers, leases, lease expiry and results.

Leasing claims up to n queued jobs of the worker's arch in one statement:
``WITH picked AS MATERIALIZED (SELECT id ... ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED)
UPDATE jobs SET state='leased', ... FROM picked WHERE jobs.id = picked.id AND
state='queued' RETURNING ...``. On PostgreSQL SKIP LOCKED lets concurrent leasers pass each
other without waiting or double-claiming; on SQLite the write transaction holds the database
lock (BEGIN IMMEDIATE, service/db.py) and ``state='queued'`` is the compare-and-set.

Expiry is judged by the database clock. A result is applied only while its lease is the
job's current one; the lease token that delivered a result is kept on the job, so a repeat
of the same result is acknowledged, not counted twice.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import math
import secrets
import threading
import time
from dataclasses import dataclass

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Connection, case, insert, literal, select, update
from sqlalchemy.orm import Session

from pipetune.model.hardware import get_gpu
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import (
    HeartbeatAck,
    JobLease,
    JobResult,
    LeaseRequest,
    LeaseResponse,
    ResultAck,
    ScheduleDoc,
    WorkerDoc,
    WorkerRegister,
)
from pipetune.service.db import Database
from pipetune.service.errors import ConflictError, ForbiddenError, InputError, NotFoundError
from pipetune.service.metrics import Metrics
from pipetune.service.orm import ID_MAX, JobRow, LeaseRow, TaskRow, WorkerRow, WorkloadRow
from pipetune.service.settings import Settings
from pipetune.service.views import worker_doc

JOBS, LEASES, TASKS, WORKERS = (
    JobRow.__table__,
    LeaseRow.__table__,
    TaskRow.__table__,
    WorkerRow.__table__,
)

# Runners that answer for one named GPU (a model or a recorded dataset of it) get only that
# GPU's jobs; a real GPU (cupy) takes any job compiled for its architecture.
GPU_BOUND_RUNNERS = ("simulated", "replay")
RECLAIM_EVERY_S = 1.0
WORKER_CACHE_S = 5.0
WORKLOAD_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class WorkerRef:
    id: int
    gpu: str
    arch: str
    runner: str


def authorised_worker(session: Session, worker_id: int, token_hash: str) -> WorkerRow:
    """The worker, if the presented token is the one it registered with (403 otherwise)."""
    worker = session.get(WorkerRow, worker_id) if 0 < worker_id <= ID_MAX else None
    if worker is None:
        raise NotFoundError(f"worker {worker_id} is not registered")
    if not hmac.compare_digest(worker.token_hash, token_hash):
        raise ForbiddenError(f"worker {worker_id} belongs to another token")
    return worker


def _check_storable(r: MeasureResult) -> None:
    """What the wire model allows but a trial row cannot hold (or JSON cannot carry)."""
    if r.ok and r.latency_us is None:
        raise InputError(["body", "result", "latency_us"], "required when status is ok")
    for name in ("registers", "spill_bytes", "smem_bytes"):
        value = getattr(r, name)
        if value is not None and value > ID_MAX:
            raise InputError(["body", "result", name], f"must be at most {ID_MAX}")
    for name in ("latency_us", "spread", "compile_ms", "max_abs_error", "samples_us"):
        value = getattr(r, name)
        values = value if isinstance(value, list) else [value]
        if any(v is not None and not math.isfinite(v) for v in values):
            raise InputError(["body", "result", name], "must be a finite number")


class Queue:
    def __init__(self, db: Database, settings: Settings, metrics: Metrics):
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self._reclaimed_at = 0.0
        self._reclaim_lock = threading.Lock()
        self._workloads: dict[int, dict] = {}
        self._running: set[int] = set()
        self._worker_refs: dict[tuple[int, str], tuple[WorkerRef, float]] = {}
        self._stop_polling = threading.Event()

    def stop_polling(self) -> None:
        """Answer pending and later lease long-polls at once (the service is stopping: a
        draining worker should not wait out its poll)."""
        self._stop_polling.set()

    # ---- workers -------------------------------------------------------------------

    def register(self, token_hash: str, body: WorkerRegister) -> tuple[WorkerDoc, bool]:
        """Register (or re-register, by name) a worker; returns the doc and whether new."""
        expected = get_gpu(body.gpu).arch
        if body.arch.rstrip("a") != expected:
            raise InputError(["body", "arch"], f"{body.gpu} is {expected}, got {body.arch}")
        for name in ("sm_count", "clocks_mhz"):
            if (getattr(body, name) or 0) > ID_MAX:
                raise InputError(["body", name], f"must be at most {ID_MAX}")
        values = body.model_dump(exclude={"name"})
        with self.db.write() as s:
            worker = s.scalars(select(WorkerRow).where(WorkerRow.name == body.name)).first()
            created = worker is None
            if worker is None:
                worker = WorkerRow(name=body.name, token_hash=token_hash, **values)
                s.add(worker)
            elif not hmac.compare_digest(worker.token_hash, token_hash):
                raise ConflictError(f"worker name {body.name!r} is registered with another token")
            else:
                for key, value in values.items():
                    setattr(worker, key, value)
                worker.last_heartbeat = s.scalar(select(self.db.now()))
            s.flush()
            s.refresh(worker)
            doc = worker_doc(worker)
        self._worker_refs.pop((doc.id, token_hash), None)
        return doc, created

    def heartbeat(self, worker_id: int, token_hash: str, busy_jobs: int) -> HeartbeatAck:
        """Record the heartbeat and extend the worker's live leases by one TTL."""
        now = self.db.now()
        with self.db.write() as s:
            authorised_worker(s, worker_id, token_hash)
            s.execute(
                update(WorkerRow)
                .where(WorkerRow.id == worker_id)
                .values(last_heartbeat=now, busy_jobs=min(busy_jobs, ID_MAX))
            )
            s.execute(
                update(JobRow)
                .where(
                    JobRow.lease_owner == worker_id,
                    JobRow.state == "leased",
                    JobRow.lease_expires_at >= now,
                )
                .values(lease_expires_at=self.db.now_plus(self.settings.lease_ttl_s))
                .execution_options(synchronize_session=False)
            )
            server_time = s.scalar(select(now))
        return HeartbeatAck(ok=True, server_time=server_time)

    def worker_ref(self, worker_id: int, token_hash: str) -> WorkerRef:
        """The worker's GPU and arch, checked against its token. Cached a few seconds:
        every lease poll needs it, and a worker re-registers rarely."""
        key = (worker_id, token_hash)
        cached = self._worker_refs.get(key)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        with self.db.read() as s:
            w = authorised_worker(s, worker_id, token_hash)
            ref = WorkerRef(id=w.id, gpu=w.gpu, arch=w.arch, runner=w.runner)
        self._worker_refs[key] = (ref, time.monotonic() + WORKER_CACHE_S)
        return ref

    # ---- leases --------------------------------------------------------------------

    def _eligible(self, worker: WorkerRef) -> list:
        conditions = [JOBS.c.state == "queued", JOBS.c.arch == worker.arch]
        if worker.runner in GPU_BOUND_RUNNERS:
            conditions.append(JOBS.c.gpu == worker.gpu)
        return conditions

    def try_lease(self, worker: WorkerRef, max_jobs: int) -> list[JobLease]:
        """Claim up to max_jobs queued jobs for the worker (none: an empty list)."""
        self.maybe_reclaim()
        eligible = self._eligible(worker)
        if self.db.is_sqlite:
            # A read first: an idle poll must not take SQLite's write lock. (On PostgreSQL
            # the SKIP LOCKED claim below is as cheap as this check.)
            with self.db.read_conn() as conn:
                if conn.scalar(select(JOBS.c.id).where(*eligible).limit(1)) is None:
                    return []
        token = secrets.token_urlsafe(24)
        # MATERIALIZED: the sub-select runs exactly once. (Inlined into the UPDATE,
        # PostgreSQL may run a LIMIT ... SKIP LOCKED sub-select more than once and claim
        # more than max_jobs.)
        picked = (
            select(JOBS.c.id)
            .where(*eligible)
            .order_by(JOBS.c.id)
            .limit(max_jobs)
            .with_for_update(skip_locked=True)
            .cte("picked")
            .prefix_with("MATERIALIZED")
        )
        with self.db.write_conn() as conn:
            rows = conn.execute(
                update(JOBS)
                .where(JOBS.c.id == picked.c.id, JOBS.c.state == "queued")
                .values(
                    state="leased",
                    lease_owner=worker.id,
                    lease_token=token,
                    lease_expires_at=self.db.now_plus(self.settings.lease_ttl_s),
                )
                .returning(
                    JOBS.c.id,
                    JOBS.c.task_id,
                    JOBS.c.trial,
                    JOBS.c.workload_id,
                    JOBS.c.gpu,
                    JOBS.c.schedule,
                    JOBS.c.lease_expires_at,
                    self.db.now().label("now"),
                )
            ).all()
            if not rows:
                return []
            conn.execute(
                insert(LEASES),
                [
                    {"job_id": r.id, "worker_id": worker.id, "token": token, "leased_at": r.now}
                    for r in rows
                ],
            )
            starting = {r.task_id for r in rows} - self._running
            if starting:
                conn.execute(
                    update(TASKS)
                    .where(TASKS.c.id.in_(starting), TASKS.c.state == "queued")
                    .values(state="running", updated_at=self.db.now())
                )
            canonical = self._canonical(conn, {r.workload_id for r in rows})
        # Tasks never return to `queued`: this process need not mark them running again.
        self._running |= starting
        for r in rows:
            self.metrics.leases.inc(r.gpu)
        return [
            JobLease(
                job_id=r.id,
                lease_token=token,
                lease_expires_at=r.lease_expires_at,
                task_id=r.task_id,
                trial=r.trial,
                workload=canonical[r.workload_id],
                gpu=r.gpu,
                schedule=ScheduleDoc(**r.schedule),
            )
            for r in sorted(rows, key=lambda r: r.id)
        ]

    def _canonical(self, conn: Connection, ids: set[int]) -> dict[int, dict]:
        """Workload documents by id (rows never change, so they are cached)."""
        missing = ids - self._workloads.keys()
        if missing and len(self._workloads) > WORKLOAD_CACHE_SIZE:
            self._workloads.clear()
        if missing:
            found = conn.execute(
                select(WorkloadRow.id, WorkloadRow.canonical).where(WorkloadRow.id.in_(missing))
            )
            self._workloads.update(dict(found.all()))
        return {i: self._workloads[i] for i in ids}

    async def lease(self, worker_id: int, token_hash: str, body: LeaseRequest) -> LeaseResponse:
        """Long-poll: return as soon as jobs are claimed, or empty after wait_s."""
        cached = self._worker_refs.get((worker_id, token_hash))
        if cached is not None and cached[1] > time.monotonic():
            worker = cached[0]
        else:
            worker = await run_in_threadpool(self.worker_ref, worker_id, token_hash)
        deadline = time.monotonic() + min(body.wait_s, self.settings.lease_wait_cap_s)
        while True:
            jobs = await run_in_threadpool(self.try_lease, worker, body.max_jobs)
            left = deadline - time.monotonic()
            if jobs or left <= 0 or self._stop_polling.is_set():
                return LeaseResponse(jobs=jobs)
            await asyncio.sleep(min(self.settings.lease_poll_s, left))

    # ---- expiry --------------------------------------------------------------------

    def maybe_reclaim(self) -> set[int]:
        """reclaim(), at most once a second per process (it runs on the lease path)."""
        with self._reclaim_lock:
            if time.monotonic() - self._reclaimed_at < RECLAIM_EVERY_S:
                return set()
            self._reclaimed_at = time.monotonic()
        return self.reclaim()

    def reclaim(self) -> set[int]:
        """Requeue jobs whose lease expired (by the database clock); give up on a job as
        `lost` after max_attempts expiries. Returns the tasks that lost a job (their batch
        may be complete now)."""
        now = self.db.now()
        give_up = JobRow.attempts + 1 >= self.settings.max_attempts
        with self.db.write() as s:
            rows = s.execute(
                update(JobRow)
                .where(JobRow.state == "leased", JobRow.lease_expires_at < now)
                .values(
                    state=case((give_up, "lost"), else_="queued"),
                    attempts=JobRow.attempts + 1,
                    lease_owner=None,
                    lease_token=None,
                    lease_expires_at=None,
                    finished_at=case((give_up, now), else_=None),
                    error=case(
                        (give_up, f"lost: {self.settings.max_attempts} leases expired"),
                        else_=JobRow.error,
                    ),
                )
                .returning(JobRow.id, JobRow.task_id, JobRow.state)
                .execution_options(synchronize_session=False)
            ).all()
            if not rows:
                return set()
            s.execute(
                update(LeaseRow)
                .where(LeaseRow.job_id.in_([r.id for r in rows]), LeaseRow.outcome.is_(None))
                .values(outcome="expired", ended_at=now)
                .execution_options(synchronize_session=False)
            )
            lost = collections.Counter(r.task_id for r in rows if r.state == "lost")
            for task_id, n in lost.items():
                s.execute(
                    update(TaskRow)
                    .where(TaskRow.id == task_id)
                    .values(
                        trials_done=TaskRow.trials_done + n,
                        trials_failed=TaskRow.trials_failed + n,
                        updated_at=now,
                    )
                    .execution_options(synchronize_session=False)
                )
        for r in rows:
            self.metrics.lease_expiries.inc(r.state)
        return set(lost)

    # ---- results -------------------------------------------------------------------

    def submit(self, job_id: int, token_hash: str, body: JobResult) -> tuple[ResultAck, int | None]:
        """Apply a result; returns the ack and, when it completed its task's outstanding
        batch, the task to advance."""
        result = body.result
        if not 0 < body.worker_id <= ID_MAX:
            raise ForbiddenError(f"job {job_id} was not leased to worker {body.worker_id}")
        _check_storable(result)
        now = self.db.now()
        with self.db.write_conn() as conn:
            # The job, and the worker and token of the presented lease, in one round trip.
            job = conn.execute(
                select(
                    JOBS.c.id,
                    JOBS.c.task_id,
                    JOBS.c.trial,
                    JOBS.c.state,
                    JOBS.c.lease_token,
                    JOBS.c.result_token,
                    LEASES.c.worker_id.label("lease_worker"),
                    WORKERS.c.token_hash,
                    WORKERS.c.runner.label("worker_runner"),
                )
                .select_from(
                    JOBS.outerjoin(
                        LEASES,
                        (LEASES.c.job_id == JOBS.c.id) & (LEASES.c.token == body.lease_token),
                    ).outerjoin(WORKERS, WORKERS.c.id == LEASES.c.worker_id)
                )
                .where(JOBS.c.id == job_id)
            ).first()
            if job is None:
                raise NotFoundError(f"job {job_id} does not exist")
            if job.lease_worker != body.worker_id or not hmac.compare_digest(
                job.token_hash or "", token_hash
            ):
                raise ForbiddenError(f"job {job_id} was not leased to worker {body.worker_id}")
            if job.result_token is not None and hmac.compare_digest(
                job.result_token, body.lease_token
            ):
                return self._ack(result.status, True, job.state, "duplicate: already recorded")
            current = job.state == "leased" and job.lease_token == body.lease_token
            # A result that does not say which runner made it was made by the worker's.
            runner = body.result.runner or job.worker_runner
            if not (current and self._apply(conn, job.id, body, now, runner)):
                # Look again: the same result, posted twice at once, lost the race to itself.
                state, recorded = conn.execute(
                    select(JOBS.c.state, JOBS.c.result_token).where(JOBS.c.id == job_id)
                ).one()
                if recorded is not None and hmac.compare_digest(recorded, body.lease_token):
                    return self._ack(result.status, True, state, "duplicate: already recorded")
                why = "task cancelled" if state == "cancelled" else "stale lease"
                return self._ack(result.status, False, state, f"{why}: not recorded")
            improves = self._improves(result)
            task = conn.execute(
                update(TASKS)
                .where(TASKS.c.id == job.task_id)
                .values(
                    trials_done=TASKS.c.trials_done + 1,
                    trials_failed=TASKS.c.trials_failed + (0 if result.ok else 1),
                    best_trial=case((improves, job.trial), else_=TASKS.c.best_trial),
                    best_latency_us=case(
                        (improves, result.latency_us), else_=TASKS.c.best_latency_us
                    ),
                    state=case((TASKS.c.state == "queued", "running"), else_=TASKS.c.state),
                    updated_at=now,
                )
                .returning(TASKS.c.trials_done, TASKS.c.trials_enqueued, TASKS.c.state)
            ).one()
        ack, _ = self._ack(result.status, True, "done" if result.ok else "failed", None)
        complete = task.trials_done >= task.trials_enqueued and task.state == "running"
        return ack, job.task_id if complete else None

    @staticmethod
    def _improves(result):
        if not result.ok:
            return literal(False)
        best = TASKS.c.best_latency_us
        return best.is_(None) | (best > result.latency_us)

    def _apply(
        self, conn: Connection, job_id: int, body: JobResult, now, runner: str | None
    ) -> bool:
        """The compare-and-set that records a result: only while the lease is current."""
        r = body.result
        applied = conn.execute(
            update(JOBS)
            .where(
                JOBS.c.id == job_id,
                JOBS.c.state == "leased",
                JOBS.c.lease_token == body.lease_token,
            )
            .values(
                state="done" if r.ok else "failed",
                status=r.status,
                latency_us=r.latency_us if r.ok else None,
                samples_us=list(r.samples_us),
                spread=r.spread,
                registers=r.registers,
                spill_bytes=r.spill_bytes,
                smem_bytes=r.smem_bytes,
                compile_ms=r.compile_ms,
                max_abs_error=r.max_abs_error,
                error=r.error,
                runner=runner,
                result_token=body.lease_token,
                result_worker=body.worker_id,
                lease_expires_at=None,
                finished_at=now,
            )
        ).rowcount
        if applied != 1:
            return False
        conn.execute(
            update(LEASES)
            .where(LEASES.c.job_id == job_id, LEASES.c.token == body.lease_token)
            .values(outcome="result", ended_at=now)
        )
        return True

    def _ack(
        self, status: str, accepted: bool, job_state: str, detail: str | None
    ) -> tuple[ResultAck, None]:
        self.metrics.results.inc(status, "true" if accepted else "false")
        ack = ResultAck(accepted=accepted, job_state=job_state, detail=detail)  # type: ignore[arg-type]
        return ack, None
