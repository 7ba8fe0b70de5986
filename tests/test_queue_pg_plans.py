"""The results statement on PostgreSQL looks up each report's job and lease by index, whatever
the planner estimates of the report (service/queue_pg.py, RECORD_SQL).

Planned as joins, a request's reports (a jsonb_to_recordset, estimated at 100 rows whatever
it holds) were hashed against a sequential scan of the whole jobs and leases tables while
they held a few thousand rows: every results request read every job and lease ever recorded.
"""

from __future__ import annotations

import json

from service_support import client_for, create_task, lease, register, service_of
from sqlalchemy import create_engine, event, text

from pipetune.model.states import JobState, LeaseOutcome, TaskState
from pipetune.service.fair_share import key_after_sql
from pipetune.service.queue_pg import CLAIM_SQL, RECORD_SQL
from pipetune.service.records import measured_or_failures

pytest_plugins = ["service_fixtures"]

# Copies of the first batch's jobs, each with a lease: a few thousand rows, the size at which
# the joins' plan read both tables whole (checked against the statement before the fix).
COPIES = 400


def _grow(url: str) -> None:
    """COPIES finished copies of every job, each with an ended lease, then ANALYZE."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(
                text(
                    "INSERT INTO jobs (task_id, workload_id, gpu, arch, trial, batch, schedule,"
                    " schedule_id, predicted_us, only_runner, state, attempts, status,"
                    " latency_us)"
                    " SELECT task_id, workload_id, gpu, arch, trial + 1000 * g, batch, schedule,"
                    " schedule_id, predicted_us, only_runner, 'done', attempts, 'ok', 10.0"
                    " FROM jobs, generate_series(1, :copies) AS g"
                ),
                {"copies": COPIES},
            )
            conn.execute(
                text(
                    "INSERT INTO leases (job_id, worker_id, token, leased_at, outcome, ended_at)"
                    " SELECT jobs.id, workers.id, md5(jobs.id::text), now(), 'result', now()"
                    " FROM jobs CROSS JOIN (SELECT min(id) AS id FROM workers) AS workers"
                    " WHERE jobs.state = 'done'"
                ),
            )
            conn.execute(text("ANALYZE jobs"))
            conn.execute(text("ANALYZE leases"))
            jobs = conn.scalar(text("SELECT count(*) FROM jobs"))
    finally:
        engine.dispose()
    assert jobs > 1000 * 2  # the statement below runs against a table of thousands


def _plan_of_results(url: str, worker_id: int, jobs: list[dict]) -> str:
    reports = [
        {
            "i": i,
            "job_id": j["job_id"],
            "token": j["lease_token"],
            "ok": True,
            "state": JobState.DONE.value,
            "status": "ok",
            "latency_us": 10.0,
            "samples_us": [10.0],
            "spread": 0.0,
        }
        for i, j in enumerate(jobs)
    ]
    params = {
        "reports": json.dumps(reports),
        "worker": worker_id,
        "queued": JobState.QUEUED.value,
        "leased": JobState.LEASED.value,
        "result_outcome": LeaseOutcome.RESULT.value,
        "expired_outcome": LeaseOutcome.EXPIRED.value,
        "task_queued": TaskState.QUEUED.value,
        "running": TaskState.RUNNING.value,
    }
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.driver_connection
            with raw.cursor() as cur:
                # ANALYZE runs the statement: rolled back, the leases stay held.
                cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + RECORD_SQL, params)
                plan = "\n".join(row[0] for row in cur.fetchall())
            raw.rollback()
    finally:
        engine.dispose()
    return plan


def test_a_results_request_reads_its_own_jobs_and_leases_not_the_whole_tables(pg):
    with client_for(pg, batch_size=4) as c:
        create_task(c, budget=8, strategy="random", seed=3)
        worker = register(c)
        _grow(pg)
        held = lease(c, worker, max_jobs=2)
        assert len(held) == 2
        plan = _plan_of_results(pg, worker, held)
    assert "Seq Scan on jobs" not in plan, plan
    assert "Seq Scan on leases" not in plan, plan
    # Each job's newest lease (whether a late result may apply) along the jobs' index, not
    # the primary key's walked backwards through every lease ever granted.
    assert "leases_pkey" not in plan, plan
    # The statement did its work in that plan: both results applied (then rolled back).
    assert plan.count("Update on jobs") == 1


def _plan(url: str, sql: str, params: dict | None = None) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.driver_connection
            with raw.cursor() as cur:
                cur.execute("EXPLAIN (COSTS OFF) " + sql, params)
                plan = "\n".join(row[0] for row in cur.fetchall())
            raw.rollback()
    finally:
        engine.dispose()
    return plan


def test_the_fair_queue_reads_its_index_not_the_jobs_table(pg):
    """A lease takes the smallest fair keys and a batch reads the GPU's virtual time
    (service/fair_share.py): each along the queue index, however many jobs are recorded."""
    with client_for(pg, batch_size=4) as c:
        create_task(c, budget=8, strategy="random", seed=3)
        worker = register(c)
        _grow(pg)
    params = {
        "queued": JobState.QUEUED.value,
        "leased": JobState.LEASED.value,
        "running": TaskState.RUNNING.value,
        "task_queued": TaskState.QUEUED.value,
        "arch": "sm_90",
        "gpu": "h100",
        "runner": "simulated",
        "task_id": None,
        "workload": None,
        "n": 8,
        "worker": worker,
        "token": "t",
        "ttl": 60.0,
    }
    claim = _plan(pg, CLAIM_SQL[False, False, False], params)
    # Taken in the index's order: no sort of every queued job by key.
    assert "Index Scan using ix_jobs_queue" in claim and "fair_key" not in claim, claim
    # A retry (LeaseRequest.retry) looks for the jobs its request leased along an index
    # (of the leased jobs: the owner's, or the queue's by state), then claims as a first
    # request does; no scan of every job recorded.
    retry = _plan(pg, CLAIM_SQL[False, False, True], params)
    earlier = retry.split("CTE earlier", 1)[1].splitlines()[1]
    assert "Index" in earlier and "Seq Scan on jobs" not in retry, retry
    # The key a batch's task moves on to, as the batch's statement embeds it: one probe
    # of the queue index each for the smallest key queued and the largest leased, done and
    # failed.
    plan = _plan(pg, f"SELECT {key_after_sql('n')} FROM tasks WHERE id = 1", {"n": 8})
    assert "Seq Scan on jobs" not in plan and plan.count("ix_jobs_queue") == 4, plan


def test_a_best_schedule_lookup_walks_the_best_index_not_every_trial(pg):
    """A schedule lookup (POST /v1/schedules, `pipetune schedule`, `export`) read every
    successful trial of the workload to answer the fastest: the workload's id came through a
    join, and the planner could not walk ix_jobs_best fastest first (239 ms at 99,000 trials).
    """
    with client_for(pg, batch_size=4) as c:
        create_task(c, budget=8, strategy="random", seed=3)
        engine = create_engine(pg, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            # 30,000 GPU-measured trials of the workload, a third of them on the H100, at
            # latencies in no order.
            conn.execute(
                text(
                    "INSERT INTO jobs (task_id, workload_id, gpu, arch, trial, batch, schedule,"
                    " schedule_id, predicted_us, state, attempts, status, latency_us, runner)"
                    " SELECT task_id, workload_id, (ARRAY['h100','a100','h200'])[1 + g % 3],"
                    " arch, trial + 1000 * g, batch, schedule, schedule_id, predicted_us, 'done',"
                    " 0, 'ok', 10.0 + (g * 7919 % 1000) / 10.0, 'cupy'"
                    " FROM jobs, generate_series(1, 3750) AS g"
                )
            )
            conn.execute(text("ANALYZE jobs"))
            digest = conn.scalar(text("SELECT hash FROM workloads"))
        engine.dispose()
        db = service_of(c).db
        asked: list[tuple[str, dict]] = []

        def record(conn, cursor, statement, parameters, context, executemany):
            asked.append((statement, parameters))

        event.listen(db.engine, "before_cursor_execute", record)
        try:
            with db.read() as s:
                job, _ = measured_or_failures(s, digest, "h100")
        finally:
            event.remove(db.engine, "before_cursor_execute", record)
    assert job is not None and job.gpu == "h100" and job.latency_us == 10.0
    (fastest,) = [(sql, params) for sql, params in asked if "ORDER BY jobs.latency_us" in sql]
    plan = _plan(pg, *fastest)
    assert "ix_jobs_best" in plan, plan
    assert "Seq Scan on jobs" not in plan and "Bitmap Heap Scan on jobs" not in plan, plan
