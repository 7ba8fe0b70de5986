"""A PostgreSQL server that is up and never answers (its processes stopped with SIGSTOP, as a
storage hung in fsync stops them): TCP keepalives do not find it (its kernel still
acknowledges), and a lease's statement, sent from the event loop, held every request of the
replica, /healthz and /metrics included, for as long as the server was stopped.

With a client-side statement deadline (PIPETUNE_DB_STATEMENT_DEADLINE_S, service/db.py
DeadlineConnection) the replica answers 503 with Retry-After within about the deadline,
/healthz names the stall, `pipetune_database_up` reads 0; resumed (SIGCONT), it recovers
by itself, and nothing is lost or counted twice: a statement the client gave up on may
still commit when the server resumes (a lease nobody received expires by its TTL and is
requeued; a result is idempotent per lease, so the worker's retry is accepted once).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
from live_support import audit_task
from pg_instance import PostgresInstance
from service_support import GEMM, WORKER_HEADERS, live_server, metric_value
from sqlalchemy import create_engine, select

from pipetune.service.migrate import upgrade
from pipetune.service.orm import JobRow

DEADLINE_S = 2.0
SLACK_S = 3.0  # what an answer may take past the deadline on a busy 2-core machine
BUDGET = 8  # one batch (the default batch size)


@contextlib.contextmanager
def stopped(pg: PostgresInstance) -> Iterator[None]:
    """Every process of the server stopped (the postmaster first: it forks nothing more),
    continued at the end (its children first)."""
    pids = pg.server_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _timed(call) -> tuple[httpx.Response, float]:
    began = time.monotonic()
    response = call()
    return response, time.monotonic() - began


def _result(worker: int, job: dict, latency_us: float) -> dict:
    result = {"status": "ok", "latency_us": latency_us, "samples_us": [latency_us], "spread": 0}
    return {"worker_id": worker, "lease_token": job["lease_token"], "result": result}


def _result_token(url: str, job_id: int) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(JobRow.result_token).where(JobRow.id == job_id)).scalar_one()
    finally:
        engine.dispose()


def test_a_stopped_postgresql_is_answered_503_and_the_replica_recovers(
    private_postgres: PostgresInstance,
):
    url = private_postgres.url
    upgrade(url)
    overrides = {
        "db_statement_deadline_s": DEADLINE_S,
        "lease_ttl_s": 3,  # a lease committed after its client gave up expires soon
        "sweep_interval_s": 0.5,
        "lease_poll_s": 0.5,
    }
    # An HTTP client that gives up long after the deadline: the old code hung past it.
    with (
        live_server(url, **overrides) as base,
        httpx.Client(base_url=base, timeout=4 * DEADLINE_S + 10) as http,
    ):
        body = {"name": "w1", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
        worker = http.post("/v1/workers", json=body, headers=WORKER_HEADERS).json()["id"]
        task = http.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": BUDGET})
        assert task.status_code == 201, task.text
        task_id = task.json()["id"]

        def lease(n: int) -> httpx.Response:
            body = {"worker_id": worker, "max_jobs": n, "wait_s": 0}
            return http.post("/v1/jobs/lease", json=body, headers=WORKER_HEADERS)

        def report(job: dict) -> httpx.Response:
            return http.post(
                f"/v1/jobs/{job['job_id']}/result",
                json=_result(worker, job, 100.0 + job["trial"]),
                headers=WORKER_HEADERS,
            )

        held = lease(2)
        assert held.status_code == 200, held.text
        first, second = held.json()["jobs"]

        with stopped(private_postgres):
            # A result: its statement may still commit when the server resumes.
            answer, took = _timed(lambda: report(first))
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            assert took < DEADLINE_S + SLACK_S, took

            health, took = _timed(lambda: http.get("/healthz"))
            assert health.status_code == 503, health.text
            assert "has not answered within 2 s" in health.json()["detail"]
            assert took < DEADLINE_S + SLACK_S, took
            metrics = http.get("/metrics")
            assert metric_value(metrics.text, "pipetune_database_up") == 0

            # A lease (its claim may commit too) while /healthz is asked: the loop is free.
            answers: dict[str, tuple[httpx.Response, float]] = {}
            leasing = threading.Thread(
                target=lambda: answers.update(lease=_timed(lambda: lease(1)))
            )
            leasing.start()
            time.sleep(0.2)
            answers["health"] = _timed(lambda: http.get("/healthz"))
            leasing.join()
            for name, (response, took) in answers.items():
                assert response.status_code == 503, (name, response.text)
                assert took < DEADLINE_S + SLACK_S, (name, took)

        # Resumed: the replica finds it by itself (its probe), no restart.
        deadline = time.monotonic() + 20
        while (health := http.get("/healthz")).status_code != 200:
            assert time.monotonic() < deadline, health.text
            time.sleep(0.2)
        metrics = http.get("/metrics")
        assert metric_value(metrics.text, "pipetune_database_up") == 1

        # The worker retries its result. Its statement of the stall committed when the
        # server resumed (the server had it whole): the retry is a duplicate, accepted and
        # not counted again. Had it not, the lease expired meanwhile (a TTL of 3 s): the
        # retry is refused as stale, and the job is leased again below.
        committed = _result_token(url, first["job_id"]) == first["lease_token"]
        again = report(first)
        assert again.status_code == 200, again.text
        if committed:
            assert again.json()["accepted"], again.text
            assert again.json()["detail"] == "duplicate: already recorded", again.text
        # The other job's lease expired during the stall: its result is refused, never
        # counted, and the job done again by a later lease (the audit below).
        answer = report(second)
        assert answer.status_code == 200, answer.text

        # The rest of the task, a lease claimed during the stall included (requeued after its
        # TTL by the sweep).
        deadline = time.monotonic() + 20
        while http.get(f"/v1/tasks/{task_id}").json()["state"] != "done":
            assert time.monotonic() < deadline, "the task did not finish"
            got = lease(4)
            assert got.status_code == 200, got.text
            for job in got.json()["jobs"]:
                answer = report(job)
                assert answer.status_code == 200 and answer.json()["accepted"], answer.text
            if not got.json()["jobs"]:
                time.sleep(0.2)
    audit_task(url, task_id, budget=BUDGET)


def test_orm_routes_fail_at_once_while_a_stalled_databases_probe_is_out(
    private_postgres: PostgresInstance,
):
    """The hot routes' statements go one at a time while the database is stalled (one probes,
    the rest answer 503 at once); the routes that read and write through an ORM session
    (task and worker lists, a registration) each waited a whole deadline in a worker thread,
    and a burst of them held the thread pool, which the stall's hot paths and /healthz need.
    They take their turn as the probe too now, and fail at once while it is out."""
    url = private_postgres.url
    upgrade(url)
    # The probe's wait is the window the ORM requests are sent in: twice the other test's,
    # room for the four on a busy 2-core machine.
    deadline_s = 2 * DEADLINE_S
    with (
        live_server(url, db_statement_deadline_s=deadline_s, sweep_interval_s=0) as base,
        httpx.Client(base_url=base, timeout=4 * deadline_s + 10) as http,
    ):
        body = {"name": "w1", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
        worker = http.post("/v1/workers", json=body, headers=WORKER_HEADERS).json()["id"]
        task = http.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": BUDGET})
        assert task.status_code == 201, task.text
        task_id = task.json()["id"]
        lease = {"worker_id": worker, "max_jobs": 1, "wait_s": 0}
        assert http.post("/v1/jobs/lease", json=lease, headers=WORKER_HEADERS).status_code == 200

        with stopped(private_postgres):
            # The stall found by a hot statement, which waits out the deadline.
            hot = http.post("/v1/jobs/lease", json=lease, headers=WORKER_HEADERS)
            assert hot.status_code == 503, hot.text
            probing = threading.Thread(target=lambda: http.get("/healthz"))
            probing.start()
            time.sleep(0.3)  # /healthz's probe is out (it waits a deadline)
            orm = {
                "tasks": lambda: http.get("/v1/tasks"),
                "task": lambda: http.get(f"/v1/tasks/{task_id}"),
                "workers": lambda: http.get("/v1/workers"),
                "register": lambda: http.post("/v1/workers", json=body, headers=WORKER_HEADERS),
            }
            for name, call in orm.items():
                answer, took = _timed(call)
                assert answer.status_code == 503, (name, answer.text)
                # The hot routes' 503: the same detail and Retry-After.
                assert answer.json() == hot.json(), (name, answer.text)
                assert answer.headers["Retry-After"] == hot.headers["Retry-After"] == "1"
                assert took < DEADLINE_S / 2, (name, took)  # (each waited deadline_s)
            probing.join()

        # Resumed: an ORM route is the probe now, and its answer ends the stall.
        deadline = time.monotonic() + 20
        while (listed := http.get("/v1/tasks")).status_code != 200:
            assert time.monotonic() < deadline, listed.text
            time.sleep(0.2)
        assert [t["id"] for t in listed.json()["tasks"]] == [task_id]
        assert http.get("/healthz").status_code == 200
