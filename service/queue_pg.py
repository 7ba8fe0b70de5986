"""The queue's hot paths on PostgreSQL: a lease, a batch of results and a heartbeat are each
one statement, one round trip (data-modifying CTEs), sent as plain SQL through the driver
(service/db.py says why: measured, not SQLAlchemy).

Guarantees, and what gives them:

* No job leased twice: the claim's sub-select takes the rows `FOR UPDATE SKIP LOCKED` and
  is MATERIALIZED (it runs exactly once; inlined, PostgreSQL may run a LIMIT ... SKIP LOCKED
  sub-select more than once and claim more than n); the UPDATE re-checks `state = queued`.
* No result lost or counted twice: a result is applied by a compare-and-set on the job's
  current lease (`state = leased AND lease_token = presented`), or, for a late result (its
  lease expired and a reclaim queued the job again, nobody leased it since: service/queue.py
  says the rule), on the job still queued with no result and no expiry since the one the
  statement read (`attempts`); re-evaluated on the newest row version when another
  transaction changed it meanwhile (READ COMMITTED); the task's counters are incremented by
  the same statement, so they move only with an applied result.
* Expiry by the database clock: every stamp is `statement_timestamp()` (not now(), the
  transaction's start: see Database.now).
* No deadlock between concurrent statements: rows are locked jobs first, then tasks, each
  in id order (the `locked_*` sub-selects; LockRows runs above the sort), as the reclaim
  does; the heartbeat skips the jobs another statement holds (they are being finished).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pipetune.model.states import JobState, LeaseOutcome, TaskState
from pipetune.service.db import Database, json_param
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

_QUEUED, _LEASED = JobState.QUEUED.value, JobState.LEASED.value
_RUNNING, _TASK_QUEUED = TaskState.RUNNING.value, TaskState.QUEUED.value


def _claim_sql(one_task: bool, one_workload: bool, again: bool) -> str:
    """The lease statement: claim, lease audit rows and tasks started, in one. It takes
    the smallest fair keys first (service/fair_share.py), along the queue index. `again`
    (PostgresQueueStore.claim): the jobs already leased to the worker under the token
    (along the owner index) by the newest request that leased under it are the answer,
    and none is claimed when there are any."""
    # A worker measures for its own GPU only (WorkerKind): an H100 and an H200 are both
    # sm_90, and one's timings recorded as the other's would be wrong data.
    filters = "state = %(queued)s AND arch = %(arch)s AND gpu = %(gpu)s"
    # A task for one runner kind: only its workers (a job of any runner: every worker).
    filters += " AND (only_runner IS NULL OR only_runner = %(runner)s)"
    filters += " AND task_id = %(task_id)s" if one_task else ""
    if one_workload:
        filters += " AND workload_id = (SELECT id FROM workloads WHERE hash = %(workload)s)"
    columns = ", ".join(CLAIMED_COLUMNS)
    earlier, answer = "", f"SELECT {columns}, false AS earlier FROM claimed ORDER BY id"
    if again:
        earlier = f"""earlier AS MATERIALIZED (
    SELECT {columns} FROM jobs
    WHERE lease_owner = %(worker)s AND state = %(leased)s AND lease_token = %(token)s
), """
        filters += " AND NOT EXISTS (SELECT 1 FROM earlier)"
        # Of those, the newest request's: one claim's leases share its statement's stamp (and
        # every job leased under the token has its live lease under it: the claim writes both,
        # and they end together). A request id used again for a new request leased more jobs
        # under the same token, and a retry got the old request's with the new one's (more
        # than its max_jobs).
        live = "leases.job_id = repeated.id AND leases.token = %(token)s AND leases.outcome IS NULL"
        answer = f"""SELECT * FROM (
    SELECT {columns}, false AS earlier FROM claimed
    UNION ALL SELECT {columns}, true FROM (
        SELECT repeated.*, leases.leased_at, max(leases.leased_at) OVER () AS newest
        FROM earlier AS repeated JOIN leases ON {live}
    ) AS repeated WHERE leased_at = newest
) AS j ORDER BY id"""
    returned = ", ".join(f"jobs.{c}" for c in CLAIMED_COLUMNS)
    return f"""
WITH {earlier}picked AS MATERIALIZED (
    SELECT id FROM jobs WHERE {filters}
    ORDER BY fair_key, id LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs SET state = %(leased)s, lease_owner = %(worker)s, lease_token = %(token)s,
        lease_expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
    FROM picked
    WHERE jobs.id = picked.id AND jobs.state = %(queued)s
    RETURNING {returned}
), audit AS (
    INSERT INTO leases (job_id, worker_id, token, leased_at)
    SELECT id, %(worker)s, %(token)s, statement_timestamp() FROM claimed
), started AS (
    UPDATE tasks SET state = %(running)s, updated_at = statement_timestamp()
    WHERE id IN (SELECT task_id FROM claimed) AND state = %(task_queued)s
)
{answer}
"""


CLAIM_SQL = {
    (t, w, a): _claim_sql(t, w, a)
    for t in (False, True)
    for w in (False, True)
    for a in (False, True)
}

# Each report is one element of a JSON array (one parameter, whatever the batch size).
RECORD_SQL = """
WITH report AS (
    SELECT * FROM jsonb_to_recordset(CAST(%(reports)s AS jsonb)) AS r(
        i int, job_id int, token text, ok boolean, state text, status text,
        latency_us float8, samples_us jsonb, spread float8, registers int, spill_bytes int,
        smem_bytes int, compile_ms float8, max_abs_error float8, error text, runner text,
        generator_revision int)
), seen AS (
    -- Each report's job and lease looked up by index, one report at a time (LATERAL ...
    -- LIMIT 1, which the planner cannot turn into a join): planned as joins, the report's
    -- rows were estimated at jsonb_to_recordset's default of 100 and both tables hashed
    -- whole, a scan of every job and lease ever recorded for each request.
    SELECT report.*, job.id AS found, job.task_id, job.trial, job.state AS job_state,
        job.lease_token, job.result_token, lease.worker_id AS lease_worker,
        newest.id AS newest_lease,
        -- A late result (its lease expired): applicable while its lease is the job's newest
        -- and the job has not been leased since, i.e. it is still leased under it (no
        -- reclaim yet: one may commit before this statement gets the row) or was queued
        -- again by a reclaim and has no result. The job's `attempts` it must then hold (a
        -- reclaim counts one): any other lease's expiry since this statement's snapshot
        -- shows as one more, and refuses it. NULL: not applicable late. A job given up as
        -- `lost` is never: its failure was counted when it was given up.
        CASE WHEN newest.token = report.token AND job.result_token IS NULL AND (
                (job.state = %(leased)s AND job.lease_token = report.token
                    AND newest.outcome IS NULL)
                OR (job.state = %(queued)s AND newest.outcome = %(expired_outcome)s))
            THEN job.attempts + CASE WHEN job.state = %(leased)s THEN 1 ELSE 0 END
        END AS late_attempts,
        -- An ok latency below the task's floor is no measurement: not applied here, but
        -- answered with the floor (Queue.submit_many records it as a failed trial).
        CASE WHEN report.ok AND report.latency_us < job.latency_floor_us
            THEN job.latency_floor_us END AS below_floor
    FROM report
    LEFT JOIN LATERAL (
        -- (With its task's latency floor, along the tasks' primary key: the row that an
        -- applied result updates anyway.)
        SELECT jobs.id, jobs.task_id, jobs.trial, jobs.state, jobs.attempts,
            jobs.lease_token, jobs.result_token, tasks.latency_floor_us
        FROM jobs JOIN tasks ON tasks.id = jobs.task_id
        WHERE jobs.id = report.job_id LIMIT 1
    ) AS job ON true
    LEFT JOIN LATERAL (
        SELECT worker_id FROM leases
        WHERE leases.job_id = report.job_id AND leases.token = report.token LIMIT 1
    ) AS lease ON true
    LEFT JOIN LATERAL (
        -- The job's newest lease, along the job's index (`id + 0`: ordered by the primary
        -- key, the planner may walk every lease ever granted backwards to find the job's).
        SELECT id, token, outcome FROM leases
        WHERE leases.job_id = report.job_id ORDER BY leases.id + 0 DESC LIMIT 1
    ) AS newest ON true
), once AS (  -- a report repeated within the request: the first is the one applied
    SELECT DISTINCT ON (job_id, token) * FROM seen WHERE below_floor IS NULL
    ORDER BY job_id, token, i
), locked_jobs AS (
    SELECT jobs.id FROM jobs JOIN seen ON jobs.id = seen.job_id
    WHERE seen.lease_worker = %(worker)s
    ORDER BY jobs.id FOR UPDATE OF jobs
), applied AS (
    UPDATE jobs SET state = seen.state, status = seen.status, latency_us = seen.latency_us,
        samples_us = CAST(seen.samples_us AS json), spread = seen.spread,
        registers = seen.registers, spill_bytes = seen.spill_bytes,
        smem_bytes = seen.smem_bytes, compile_ms = seen.compile_ms,
        max_abs_error = seen.max_abs_error, error = seen.error,
        generator_revision = seen.generator_revision,
        runner = seen.runner, result_token = seen.token,
        result_worker = %(worker)s, lease_expires_at = NULL,
        finished_at = statement_timestamp()
    FROM once AS seen JOIN locked_jobs ON locked_jobs.id = seen.job_id
    -- The report's own lease must be this worker's: locked_jobs holds a job where any of
    -- the request's reports of it is (an old lease of the job let another worker's
    -- current lease, named beside it, end with this worker's result).
    WHERE jobs.id = seen.job_id AND seen.lease_worker = %(worker)s AND (
        (jobs.state = %(leased)s AND jobs.lease_token = seen.token)
        -- Late: queued again by a reclaim and leased by nobody since (a lease since changed
        -- `state`, or, expired too, `attempts`). The reclaim cleared its lease: it stays so.
        OR (jobs.state = %(queued)s AND jobs.result_token IS NULL
            AND jobs.attempts = seen.late_attempts))
    RETURNING jobs.id, jobs.task_id, jobs.trial, seen.i, seen.ok, seen.token, seen.latency_us,
        seen.newest_lease, jobs.lease_token IS NULL AS late
), ended AS (
    UPDATE leases SET outcome = %(result_outcome)s, ended_at = statement_timestamp()
    FROM applied WHERE leases.job_id = applied.id AND leases.token = applied.token
        AND (leases.outcome IS NULL  -- (a token's earlier lease of the job, released, stays)
            -- A late result's lease, ended `expired` by its reclaim (perhaps committed while
            -- this statement waited for the job: read open, re-checked as `expired`).
            OR (applied.late AND leases.id = applied.newest_lease
                AND leases.outcome = %(expired_outcome)s))
), per_task AS (
    SELECT task_id, count(*) AS n, count(*) FILTER (WHERE NOT ok) AS failed,
        min(latency_us) FILTER (WHERE ok) AS best_latency,
        (array_agg(trial ORDER BY latency_us, trial) FILTER (WHERE ok))[1] AS best_trial
    FROM applied GROUP BY task_id
), locked_tasks AS (
    SELECT tasks.id FROM tasks JOIN per_task ON tasks.id = per_task.task_id
    ORDER BY tasks.id FOR UPDATE OF tasks
), counted AS (
    UPDATE tasks SET trials_done = tasks.trials_done + per_task.n,
        trials_failed = tasks.trials_failed + per_task.failed,
        best_trial = CASE
            WHEN per_task.best_latency < coalesce(tasks.best_latency_us, 'infinity')
            THEN per_task.best_trial ELSE tasks.best_trial END,
        best_latency_us = CASE
            WHEN per_task.best_latency < coalesce(tasks.best_latency_us, 'infinity')
            THEN per_task.best_latency ELSE tasks.best_latency_us END,
        state = CASE WHEN tasks.state = %(task_queued)s THEN %(running)s ELSE tasks.state END,
        updated_at = statement_timestamp()
    FROM per_task JOIN locked_tasks ON locked_tasks.id = per_task.task_id
    WHERE tasks.id = per_task.task_id
    RETURNING tasks.id, tasks.trials_done, tasks.trials_enqueued, tasks.state,
        tasks.batch_size, tasks.strategy, tasks.trials_target
)
SELECT seen.i, seen.found, seen.job_state, seen.lease_token, seen.result_token,
    seen.lease_worker, seen.below_floor, applied.i IS NOT NULL AS applied,
    counted.id AS task,
    counted.trials_done, counted.trials_enqueued, counted.state AS task_state,
    counted.batch_size, counted.strategy, counted.trials_target
FROM seen
LEFT JOIN applied ON applied.i = seen.i
LEFT JOIN counted ON counted.id = applied.task_id
ORDER BY seen.i
"""

SETTLED_SQL = "SELECT id, state, result_token FROM jobs WHERE id = ANY(%(ids)s)"
RECORDED_SQL = f"SELECT id, {', '.join(RESULT_COLUMNS)} FROM jobs WHERE id = ANY(%(ids)s)"

HEARTBEAT_SQL = """
WITH beat AS (
    UPDATE workers SET last_heartbeat = statement_timestamp(), busy_jobs = %(busy)s,
        exited_at = NULL
    WHERE id = %(worker)s
), live AS (
    SELECT id FROM jobs
    WHERE lease_owner = %(worker)s AND state = %(leased)s
        AND lease_expires_at >= statement_timestamp()
        AND (%(all)s OR (id, lease_token) IN (
            SELECT * FROM unnest(%(ids)s::int[], %(tokens)s::text[])))
    ORDER BY id FOR UPDATE SKIP LOCKED
), extended AS (
    UPDATE jobs SET lease_expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
    FROM live WHERE jobs.id = live.id
)
SELECT statement_timestamp() AS now, ARRAY(
    SELECT DISTINCT h.id FROM unnest(%(ids)s::int[], %(tokens)s::text[]) AS h(id, token)
    WHERE NOT EXISTS (
        SELECT 1 FROM jobs j WHERE j.id = h.id AND j.lease_token = h.token
            AND j.lease_owner = %(worker)s AND j.state = %(leased)s)
    ORDER BY h.id) AS gone
"""

_STATES = {
    "queued": _QUEUED,
    "leased": _LEASED,
    "running": _RUNNING,
    "task_queued": _TASK_QUEUED,
    "result_outcome": LeaseOutcome.RESULT.value,
    "expired_outcome": LeaseOutcome.EXPIRED.value,
}


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)


def _report_row(i: int, report: Report, worker: WorkerRef | None) -> dict[str, Any]:
    return {
        "i": i,
        "job_id": report.job_id,
        "token": report.lease_token,
        "ok": report.result.ok,
        **result_columns(report.result),
        "runner": recorded_runner(report.result, worker),
    }


class PostgresQueueStore:
    def __init__(self, db: Database):
        self.db = db

    def claim(
        self,
        worker: WorkerRef,
        n: int,
        task_id: int | None,
        token: str,
        ttl_s: float,
        again: bool = False,
    ) -> list[Claimed]:
        params = {
            **_STATES,
            "arch": worker.arch,
            "gpu": worker.gpu,
            "task_id": task_id,
            "workload": worker.workload_hash,
            "runner": worker.runner_kind,
            "n": n,
            "worker": worker.id,
            "token": token,
            "ttl": float(ttl_s),
        }
        with self.db.driver_statement() as cur:
            one_workload = worker.workload_hash is not None
            cur.execute(CLAIM_SQL[task_id is not None, one_workload, again], params)
            rows = cur.fetchall()
        return [
            Claimed(
                id=r.id,
                task_id=r.task_id,
                trial=r.trial,
                workload_id=r.workload_id,
                gpu=r.gpu,
                schedule=r.schedule,
                lease_expires_at=_utc(r.lease_expires_at),
                earlier=r.earlier,
            )
            for r in rows
        ]

    def record(self, worker: WorkerRef | None, reports: list[Report]) -> list[Seen]:
        params = {
            **_STATES,
            "reports": json_param([_report_row(i, r, worker) for i, r in enumerate(reports)]),
            # No worker matches 0: an unauthorised report is looked at, never applied.
            "worker": worker.id if worker is not None else 0,
        }
        with self.db.driver_statement() as cur:
            cur.execute(RECORD_SQL, params)
            rows = cur.fetchall()
        return [
            Seen(
                found=r.found is not None,
                job_state=r.job_state,
                lease_token=r.lease_token,
                result_token=r.result_token,
                lease_worker=r.lease_worker,
                applied=r.applied,
                below_floor_us=r.below_floor,
                task=TaskProgress(
                    r.task,
                    r.trials_done,
                    r.trials_enqueued,
                    r.task_state,
                    r.batch_size,
                    r.strategy,
                    r.trials_target,
                )
                if r.applied
                else None,
            )
            for r in rows
        ]

    def settled(self, job_ids: list[int]) -> dict[int, tuple[str, str | None]]:
        with self.db.driver_statement() as cur:
            cur.execute(SETTLED_SQL, {"ids": job_ids})
            return {r.id: (r.state, r.result_token) for r in cur.fetchall()}

    def recorded(self, job_ids: list[int]) -> dict[int, dict[str, Any]]:
        with self.db.driver_statement() as cur:
            cur.execute(RECORDED_SQL, {"ids": job_ids})
            return {r.id: r._asdict() for r in cur.fetchall()}

    def heartbeat(
        self, worker_id: int, busy_jobs: int, ttl_s: float, held: Held = None
    ) -> tuple[dt.datetime, list[int]]:
        params = {
            "worker": worker_id,
            "busy": busy_jobs,
            "ttl": float(ttl_s),
            "all": held is None,
            "ids": [job_id for job_id, _ in held or ()],
            "tokens": [token for _, token in held or ()],
            **_STATES,
        }
        with self.db.driver_statement() as cur:
            cur.execute(HEARTBEAT_SQL, params)
            row = cur.fetchone()
            return _utc(row.now), list(row.gone)
