"""The queue's hot paths on SQLite: SQLAlchemy Core statements in one write transaction each.

SQLite has no data-modifying CTEs, and needs none: it runs in the service's process (a
statement is a function call, not a network round trip), and a write transaction opened
with BEGIN IMMEDIATE (service/db.py) holds the database's write lock from its first
statement, so what it reads stays true until it commits. A lease first looks without that
lock, so that an idle poll never takes it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import replace
from typing import Any

from sqlalchemy import bindparam, case, func, insert, literal, or_, select, tuple_, update

from pipetune.model.states import JobState, LeaseOutcome, TaskState
from pipetune.service.db import Database
from pipetune.service.orm import JobRow, LeaseRow, TaskRow, WorkerRow, WorkloadRow
from pipetune.service.queue_types import (
    CLAIMED_COLUMNS,
    RESULT_COLUMNS,
    Claimed,
    Held,
    Report,
    Seen,
    TaskProgress,
    WorkerRef,
    recorded_runner,
    result_columns,
)
from pipetune.service.records import below_latency_floor

JOBS, LEASES, TASKS, WORKERS = (
    JobRow.__table__,
    LeaseRow.__table__,
    TaskRow.__table__,
    WorkerRow.__table__,
)

# Built once: executemany with bound parameters per report.
_RESULT_VALUES = dict(
    state=bindparam("b_state"),
    status=bindparam("b_status"),
    latency_us=bindparam("b_latency_us"),
    samples_us=bindparam("b_samples_us"),
    spread=bindparam("b_spread"),
    registers=bindparam("b_registers"),
    spill_bytes=bindparam("b_spill_bytes"),
    smem_bytes=bindparam("b_smem_bytes"),
    compile_ms=bindparam("b_compile_ms"),
    max_abs_error=bindparam("b_max_abs_error"),
    error=bindparam("b_error"),
    runner=bindparam("b_runner"),
    generator_revision=bindparam("b_generator_revision"),
    result_token=bindparam("b_token"),
    result_worker=bindparam("b_worker"),
    lease_expires_at=None,
    finished_at=bindparam("b_now"),
)
# A result on the job's current lease.
_APPLY = (
    update(JOBS)
    .where(
        JOBS.c.id == bindparam("b_id"),
        JOBS.c.state == JobState.LEASED,
        JOBS.c.lease_token == bindparam("b_token"),
    )
    .values(**_RESULT_VALUES)
)
# A late result (its lease expired, the job queued again and leased by nobody since: the
# record checks that its lease is the job's newest). The reclaim cleared its lease: it stays
# cleared.
_APPLY_LATE = (
    update(JOBS)
    .where(
        JOBS.c.id == bindparam("b_id"),
        JOBS.c.state == JobState.QUEUED,
        JOBS.c.result_token.is_(None),
    )
    .values(**_RESULT_VALUES)
)
_CLAIMED = [JOBS.c[name] for name in CLAIMED_COLUMNS]
_RESULT_COLUMNS = [JOBS.c[name] for name in RESULT_COLUMNS]
_END_LEASE = (
    update(LEASES)
    .where(
        LEASES.c.job_id == bindparam("b_id"),
        LEASES.c.token == bindparam("b_token"),
        LEASES.c.outcome.is_(None),  # (a token's earlier lease of the job, released, stays)
    )
    .values(outcome=LeaseOutcome.RESULT, ended_at=bindparam("b_now"))
)
# A late result's lease: the job's newest, ended `expired` by its reclaim.
_END_LATE_LEASE = (
    update(LEASES)
    .where(LEASES.c.id == bindparam("b_lease"), LEASES.c.outcome == LeaseOutcome.EXPIRED)
    .values(outcome=LeaseOutcome.RESULT, ended_at=bindparam("b_now"))
)


def _state_of(ok: bool) -> str:
    return JobState.DONE if ok else JobState.FAILED


class SqliteQueueStore:
    def __init__(self, db: Database):
        self.db = db

    def _eligible(self, worker: WorkerRef, task_id: int | None) -> list:
        conditions = [
            JOBS.c.state == JobState.QUEUED,
            JOBS.c.arch == worker.arch,
            JOBS.c.gpu == worker.gpu,  # its own GPU's only (WorkerKind)
        ]
        if task_id is not None:
            conditions.append(JOBS.c.task_id == task_id)
        # A task for one runner kind: only its workers (a job of any runner: every worker).
        runner = JOBS.c.only_runner
        conditions.append(or_(runner.is_(None), runner == worker.runner_kind))
        if worker.workload_hash is not None:
            workload = select(WorkloadRow.id).where(WorkloadRow.hash == worker.workload_hash)
            conditions.append(JOBS.c.workload_id == workload.scalar_subquery())
        return conditions

    def claim(
        self,
        worker: WorkerRef,
        n: int,
        task_id: int | None,
        token: str,
        ttl_s: float,
        again: bool = False,
    ) -> list[Claimed]:
        if again and (earlier := self._leased_under(worker, token)):
            return earlier
        eligible = self._eligible(worker, task_id)
        # A read first: an idle poll must not take SQLite's write lock.
        with self.db.read_conn() as conn:
            if conn.scalar(select(JOBS.c.id).where(*eligible).limit(1)) is None:
                return []
        # The smallest fair keys first (service/fair_share.py), along the queue index.
        picked = (
            select(JOBS.c.id)
            .where(*eligible)
            .order_by(JOBS.c.fair_key, JOBS.c.id)
            .limit(n)
            .cte("picked")
        )
        with self.db.write_conn() as conn:
            rows = conn.execute(
                update(JOBS)
                .where(JOBS.c.id == picked.c.id, JOBS.c.state == JobState.QUEUED)
                .values(
                    state=JobState.LEASED,
                    lease_owner=worker.id,
                    lease_token=token,
                    lease_expires_at=self.db.now_plus(ttl_s),
                )
                .returning(*_CLAIMED, self.db.now().label("now"))
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
            conn.execute(
                update(TASKS)
                .where(
                    TASKS.c.id.in_({r.task_id for r in rows}),
                    TASKS.c.state == TaskState.QUEUED,
                )
                .values(state=TaskState.RUNNING, updated_at=self.db.now())
            )
        return [
            Claimed(*(getattr(r, c) for c in CLAIMED_COLUMNS))
            for r in sorted(rows, key=lambda r: r.id)
        ]

    def _leased_under(self, worker: WorkerRef, token: str) -> list[Claimed]:
        """The jobs leased to the worker under `token` by the newest request that leased
        under it (a retried request's answer): its jobs' live leases share one stamp, the
        claim's. A request id used again for a new request leased more jobs under the same
        token, and a retry got the old request's with the new one's (more than max_jobs)."""
        with self.db.read_conn() as conn:
            rows = conn.execute(
                select(*_CLAIMED, LEASES.c.leased_at)
                .join(LEASES, LEASES.c.job_id == JOBS.c.id)
                .where(
                    JOBS.c.lease_owner == worker.id,
                    JOBS.c.state == JobState.LEASED,
                    JOBS.c.lease_token == token,
                    LEASES.c.token == token,
                    LEASES.c.outcome.is_(None),  # (its live lease, not a released earlier one)
                )
                .order_by(JOBS.c.id)
            ).all()
        # (Every job leased under the token has its live lease under it: both are written by
        # the claim and ended together, so the join loses none.)
        newest = max((r.leased_at for r in rows), default=None)
        return [Claimed(*r[:-1], earlier=True) for r in rows if r.leased_at == newest]

    def record(self, worker: WorkerRef | None, reports: list[Report]) -> list[Seen]:
        ids = sorted({r.job_id for r in reports})
        with self.db.write_conn() as conn:
            now = conn.scalar(select(self.db.now()))
            jobs = {
                j.id: j
                for j in conn.execute(
                    select(
                        JOBS.c.id,
                        JOBS.c.task_id,
                        JOBS.c.trial,
                        JOBS.c.state,
                        JOBS.c.lease_token,
                        JOBS.c.result_token,
                        TASKS.c.latency_floor_us,
                    )
                    .join(TASKS, TASKS.c.id == JOBS.c.task_id)
                    .where(JOBS.c.id.in_(ids))
                )
            }
            grants = {
                (lease.job_id, lease.token): lease.worker_id
                for lease in conn.execute(
                    select(LEASES.c.job_id, LEASES.c.token, LEASES.c.worker_id).where(
                        LEASES.c.job_id.in_(ids),
                        LEASES.c.token.in_({r.lease_token for r in reports}),
                    )
                )
            }
            # job -> (id, token, outcome) of its newest lease
            newest = {
                lease.job_id: (lease.id, lease.token, lease.outcome)
                for lease in conn.execute(
                    select(LEASES.c.job_id, LEASES.c.id, LEASES.c.token, LEASES.c.outcome).where(
                        LEASES.c.id.in_(
                            select(func.max(LEASES.c.id))
                            .where(LEASES.c.job_id.in_(ids))
                            .group_by(LEASES.c.job_id)
                        )
                    )
                )
            }
            seen: list[Seen] = []
            applied: list[tuple[int, Report]] = []
            # report index -> its lease's row, for the results applied late
            late: dict[int, int] = {}
            # job -> (lease token, state) of the result this batch recorded for it
            taken: dict[int, tuple[str, str]] = {}
            for i, report in enumerate(reports):
                job = jobs.get(report.job_id)
                lease_worker = grants.get((report.job_id, report.lease_token))
                # An ok latency below the task's floor is no measurement: not applied here,
                # but answered with the floor (Queue.submit_many records it as failed).
                floor = None if job is None else job.latency_floor_us
                below = floor if below_latency_floor(report.result, floor) else None
                mine = (
                    job is not None
                    and worker is not None
                    and lease_worker == worker.id
                    and job.id not in taken
                    and below is None
                )
                if mine and job.state == JobState.LEASED:
                    apply = job.lease_token == report.lease_token
                elif mine and job.state == JobState.QUEUED and job.result_token is None:
                    # Late (the rule: service/queue.py): its lease expired, a reclaim queued
                    # the job again, and nobody leased it since (its lease is the newest). Not
                    # a `lost` job (another state): its failure was counted when given up.
                    lease_id, token, outcome = newest.get(job.id, (None, None, None))
                    apply = token == report.lease_token and outcome == LeaseOutcome.EXPIRED
                    if apply:
                        late[i] = lease_id
                else:
                    apply = False
                # A repeat within this batch sees the result recorded before it.
                before = taken.get(report.job_id)
                seen.append(
                    Seen(
                        found=job is not None,
                        job_state=before[1] if before else (job.state if job else None),
                        lease_token=job.lease_token if job is not None else None,
                        result_token=before[0] if before else (job.result_token if job else None),
                        lease_worker=lease_worker,
                        applied=apply,
                        below_floor_us=below,
                    )
                )
                if apply:
                    ok = report.result.ok
                    taken[report.job_id] = (report.lease_token, _state_of(ok))
                    applied.append((i, report))
            if not applied:
                return seen
            assert worker is not None
            rows = [self._apply_params(r, worker, now) for i, r in applied if i not in late]
            later = [
                {**self._apply_params(r, worker, now), "b_lease": late[i]}
                for i, r in applied
                if i in late
            ]
            for record, end, params in (
                (_APPLY, _END_LEASE, rows),
                (_APPLY_LATE, _END_LATE_LEASE, later),
            ):
                if params:
                    changed = conn.execute(record, params).rowcount
                    # Under the write lock nothing else changed these rows since they were read.
                    assert changed == len(params), (changed, len(params))
                    conn.execute(end, params)
            progress = self._count(conn, [(jobs[r.job_id], r) for _, r in applied], now)
        for i, report in applied:
            seen[i] = replace(seen[i], task=progress[jobs[report.job_id].task_id])
        return seen

    @staticmethod
    def _apply_params(report: Report, worker: WorkerRef, now: dt.datetime) -> dict:
        columns = {
            **result_columns(report.result),
            "runner": recorded_runner(report.result, worker),
        }
        return {
            "b_id": report.job_id,
            "b_token": report.lease_token,
            **{f"b_{name}": value for name, value in columns.items()},
            "b_worker": worker.id,
            "b_now": now,
        }

    def _count(self, conn, applied: list, now: dt.datetime) -> dict[int, TaskProgress]:
        """Count the applied results on their tasks (and keep each task's best)."""
        by_task: dict[int, list] = defaultdict(list)
        for job, report in applied:
            by_task[job.task_id].append((job, report.result))
        progress = {}
        for task_id in sorted(by_task):
            results = by_task[task_id]
            ok = [(r.latency_us, job.trial) for job, r in results if r.ok]
            best = min(ok) if ok else None
            improves = (
                literal(False)
                if best is None
                else TASKS.c.best_latency_us.is_(None) | (TASKS.c.best_latency_us > best[0])
            )
            row = conn.execute(
                update(TASKS)
                .where(TASKS.c.id == task_id)
                .values(
                    trials_done=TASKS.c.trials_done + len(results),
                    trials_failed=TASKS.c.trials_failed + sum(not r.ok for _, r in results),
                    best_trial=case(
                        (improves, best[1] if best else None), else_=TASKS.c.best_trial
                    ),
                    best_latency_us=case(
                        (improves, best[0] if best else None), else_=TASKS.c.best_latency_us
                    ),
                    state=case(
                        (TASKS.c.state == TaskState.QUEUED, TaskState.RUNNING),
                        else_=TASKS.c.state,
                    ),
                    updated_at=now,
                )
                .returning(
                    TASKS.c.id,
                    TASKS.c.trials_done,
                    TASKS.c.trials_enqueued,
                    TASKS.c.state,
                    TASKS.c.batch_size,
                    TASKS.c.strategy,
                    TASKS.c.trials_target,
                )
            ).one()
            progress[task_id] = TaskProgress(*row)
        return progress

    def settled(self, job_ids: list[int]) -> dict[int, tuple[str, str | None]]:
        with self.db.read_conn() as conn:
            rows = conn.execute(
                select(JOBS.c.id, JOBS.c.state, JOBS.c.result_token).where(JOBS.c.id.in_(job_ids))
            )
            return {r.id: (r.state, r.result_token) for r in rows}

    def recorded(self, job_ids: list[int]) -> dict[int, dict[str, Any]]:
        with self.db.read_conn() as conn:
            rows = conn.execute(select(JOBS.c.id, *_RESULT_COLUMNS).where(JOBS.c.id.in_(job_ids)))
            return {r.id: dict(r._mapping) for r in rows}

    def heartbeat(
        self, worker_id: int, busy_jobs: int, ttl_s: float, held: Held = None
    ) -> tuple[dt.datetime, list[int]]:
        now = self.db.now()
        live = [
            JOBS.c.lease_owner == worker_id,
            JOBS.c.state == JobState.LEASED,
            JOBS.c.lease_expires_at >= now,
        ]
        if held is not None:  # only the leases the worker says it holds, as pairs: an id
            # and a token that the worker holds apart are not a lease it holds
            live.append(tuple_(JOBS.c.id, JOBS.c.lease_token).in_(list(held)))
        with self.db.write_conn() as conn:
            conn.execute(
                update(WORKERS)
                .where(WORKERS.c.id == worker_id)
                .values(last_heartbeat=now, busy_jobs=busy_jobs, exited_at=None)
            )
            conn.execute(update(JOBS).where(*live).values(lease_expires_at=self.db.now_plus(ttl_s)))
            gone: list[int] = []
            if held:
                mine = conn.execute(
                    select(JOBS.c.id, JOBS.c.lease_token).where(
                        JOBS.c.id.in_([job_id for job_id, _ in held]),
                        JOBS.c.lease_owner == worker_id,
                        JOBS.c.state == JobState.LEASED,
                    )
                )
                alive = {(r.id, r.lease_token) for r in mine}
                gone = sorted({job_id for job_id, token in held if (job_id, token) not in alive})
            return conn.scalar(select(now)), gone
