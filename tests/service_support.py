"""Helpers shared by the service tests (their fixtures are in service_fixtures.py)."""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pg_instance import UNAVAILABLE_ENV, admin_url, connection_problem
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from pipetune.service.app import create_app
from pipetune.service.orm import JobRow, LeaseRow
from pipetune.service.settings import Settings

with warnings.catch_warnings():
    # starlette's TestClient nags about httpx; the client is what FastAPI documents.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

# The tests' PostgreSQL (conftest.py has settled it before any test module is imported).
PG_ADMIN_URL = admin_url()
TOKEN = "test-worker-token"
WORKER_HEADERS = {"Authorization": f"Bearer {TOKEN}"}
GEMM = {"op": "gemm", "m": 1024, "n": 1024, "k": 1024, "dtype": "float16"}
SMALL_GEMM = {"op": "gemm", "m": 256, "n": 256, "k": 256, "dtype": "float16"}


def pg_reachable() -> bool:
    """Whether the tests' PostgreSQL answers."""
    return pg_problem() is None


def pg_problem() -> str | None:
    """Why the tests have no PostgreSQL, in one line (None when they have one)."""
    if os.environ.get(UNAVAILABLE_ENV):
        return os.environ[UNAVAILABLE_ENV]
    problem = connection_problem(PG_ADMIN_URL)
    return None if problem is None else f"no PostgreSQL answers at {PG_ADMIN_URL}: {problem}"


def require_pg() -> str:
    """The tests' PostgreSQL admin URL; fails the calling test (never skips it) when there
    is none, with the reason and how to get one."""
    problem = pg_problem()
    if problem is not None:
        pytest.fail(f"{problem} (make test sets PostgreSQL up)", pytrace=False)
    return PG_ADMIN_URL


def table_names(url: str) -> set[str]:
    """The tables a database holds now."""
    from sqlalchemy import inspect

    from pipetune.service.db import make_engine

    engine = make_engine(url, pool_size=1)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def row_count(url: str, column: Any) -> int:
    """How many rows the database at `url` holds of `column`'s table (what a refused write
    must have left as it was)."""
    from sqlalchemy import func, select

    from pipetune.service.db import Database

    db = Database(url)
    try:
        with db.read() as s:
            return int(s.scalar(select(func.count(column))) or 0)
    finally:
        db.dispose()


def metric_value(exposition: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a Prometheus text exposition (None when absent); labels
    match whatever order the exposition writes them in."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def libpq_url(url: str) -> str:
    """A PostgreSQL SQLAlchemy URL as psycopg connects to it (a test's own session beside the
    service's: one holding a lock, say)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def settings(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": url,
        "worker_tokens": [TOKEN],
        "api_keys": [],
        "sweep_interval_s": 0,  # tests drive upkeep themselves
        "lease_poll_s": 0.02,
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def client_for(url: str, **overrides: Any) -> Iterator[TestClient]:
    app = create_app(settings(url, **overrides))
    with TestClient(app) as client:
        yield client


def service_of(client: TestClient):
    return client.app.state.service


def register(
    client: TestClient,
    name: str = "w1",
    gpu: str = "h100",
    runner: str = "simulated",
    device_name: str | None = None,
):
    arch = {"a100": "sm_80", "h100": "sm_90", "h200": "sm_90"}[gpu]
    body = {"name": name, "gpu": gpu, "arch": arch, "runner": runner}
    if device_name is not None:
        body["device_name"] = device_name
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def lease(client: TestClient, worker_id: int, max_jobs: int = 1, wait_s: float = 0.0) -> list:
    response = client.post(
        "/v1/jobs/lease",
        json={"worker_id": worker_id, "max_jobs": max_jobs, "wait_s": wait_s},
        headers=WORKER_HEADERS,
    )
    assert response.status_code == 200, response.text
    return response.json()["jobs"]


def ok(latency_us: float) -> dict:
    return {"status": "ok", "latency_us": latency_us, "samples_us": [latency_us], "spread": 0.0}


def settle(client: TestClient, timeout_s: float = 60.0) -> None:
    """Wait until the service's proposer loop has advanced the tasks that results asked it
    to: the advance runs off the request path, after the response (service/proposer.py)."""
    proposer = service_of(client).proposer
    deadline = time.monotonic() + timeout_s
    while not proposer.idle():
        assert time.monotonic() < deadline, "the proposer loop did not settle"
        time.sleep(0.002)


def post_result(client: TestClient, worker_id: int, job: dict, result: dict):
    """Post one result, then let the proposer settle (as the tests read the task next)."""
    body = {"worker_id": worker_id, "lease_token": job["lease_token"], "result": result}
    response = client.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS)
    settle(client)
    return response


def result_item(job: dict, result: dict) -> dict:
    """One item of a batched report (`POST /v1/jobs/results`) of `job`'s lease."""
    return {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": result}


def post_results(client: TestClient, worker_id: int, items: list[dict]) -> list[dict]:
    """Post a batched report (result_item's), let the proposer settle; its acks."""
    body = {"worker_id": worker_id, "results": items}
    response = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
    settle(client)
    assert response.status_code == 200, response.text
    return response.json()["acks"]


def after_the_newest_lease(client: TestClient, timeout_s: float = 60.0) -> None:
    """Wait until the database's clock has moved past the newest lease's stamp: SQLite's
    counts milliseconds, and the leases of one request are told from the next one's by it
    (two requests of one worker under one request id within a millisecond are not told
    apart: a retry then repeats both)."""
    db = service_of(client).db
    deadline = time.monotonic() + timeout_s
    while True:
        with db.read() as s:
            newest = s.scalar(select(func.max(LeaseRow.leased_at)))
            now = s.scalar(select(db.now()))
        if newest is None or now > newest:
            return
        assert time.monotonic() < deadline, "the database's clock did not move"
        time.sleep(0.001)


def job_row(client: TestClient, job_id: int) -> Any:
    """A job's row (JobRow) as committed now, detached from its session."""
    with service_of(client).db.read() as s:
        job = s.get(JobRow, job_id)
        s.expunge(job)
        return job


def fake_latency(schedule: dict) -> float:
    """A deterministic stand-in measurement (distinct per schedule) for driving tasks."""
    return 50.0 + sum((i + 1) * v for i, v in enumerate(schedule.values())) % 97


def drain(client: TestClient, worker_id: int, result_of=None, max_jobs: int = 8) -> int:
    """Lease and answer jobs until none is left; returns how many were answered."""
    result_of = result_of or (lambda job: ok(fake_latency(job["schedule"])))
    answered = 0
    while jobs := lease(client, worker_id, max_jobs=max_jobs):
        for job in jobs:
            response = post_result(client, worker_id, job, result_of(job))
            assert response.status_code == 200, response.text
            assert response.json()["accepted"], response.json()
            answered += 1
    return answered


def drain_rebuilding(client: TestClient, worker_id: int, task_id: int) -> int:
    """drain() with made-up results, dropping task_id's session and every cached prior
    before each of its results: its next advance rebuilds the session from the record, as a
    replica with empty caches would (the prior read or fitted again)."""
    driver = service_of(client).driver

    def result_of(job: dict) -> dict:
        if job["task_id"] == task_id:
            driver._live.pop(task_id, None)
            driver._priors.clear()
        return ok(fake_latency(job["schedule"]))

    return drain(client, worker_id, result_of)


def create_task(client: TestClient, budget: int = 20, **extra: Any) -> dict:
    body = {"workload": GEMM, "gpu": "h100", "budget": budget, **extra}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    return response.json()


@dataclass
class TwoReplicas:
    """Two replicas of one database, a task created on the first, a simulated worker."""

    a: TestClient
    b: TestClient
    task_id: int
    ref: Any  # the worker, as the queue takes it (WorkerRef)
    first: Any  # the replicas' drivers
    second: Any
    queue: Any  # the first replica's queue


@contextmanager
def two_replicas_on_a_task(
    url: str, strategy: str, budget: int, seed: int, batch_size: int = 4
) -> Iterator[TwoReplicas]:
    from pipetune.service.queue import WorkerRef

    with client_for(url, batch_size=batch_size) as a, client_for(url, batch_size=batch_size) as b:
        task_id = create_task(a, budget=budget, strategy=strategy, seed=seed)["id"]
        worker = register(a)
        ref = WorkerRef(id=worker, gpu="h100", arch="sm_90", runner="simulated")
        first, second = service_of(a).driver, service_of(b).driver
        yield TwoReplicas(a, b, task_id, ref, first, second, service_of(a).queue)


def wait_until_listening(client: TestClient, timeout_s: float = 10.0) -> None:
    """Until the replica's NOTIFY listener is connected (PostgreSQL)."""
    wakeup = service_of(client).wakeup
    deadline = time.monotonic() + timeout_s
    while not wakeup.listening:
        assert time.monotonic() < deadline, "the NOTIFY listener did not connect"
        time.sleep(0.02)


@contextmanager
def live_server(
    url: str, http: Any = "auto", tls: tuple[Path, Path] | None = None, **overrides: Any
) -> Iterator[str]:
    """A service on the (upgraded) database `url`, served by uvicorn on a free port in a
    thread of this process (`settings(url, **overrides)`; `http`: uvicorn's protocol, e.g.
    the service's own; `tls`: a certificate and its key, to serve https://localhost as a
    TLS-terminating proxy would): yields its base URL. What a browser or a raw socket talks
    to, where an in-process client cannot stand in."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(settings(url, **overrides))
    certificate, key = tls if tls is not None else (None, None)
    config = uvicorn.Config(
        app, port=port, log_level="warning", http=http, ssl_certfile=certificate, ssl_keyfile=key
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"https://localhost:{port}" if tls is not None else f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
