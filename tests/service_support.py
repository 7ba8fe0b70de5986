"""Helpers shared by the service tests (their fixtures are in service_fixtures.py)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine

from pipetune.service.app import create_app
from pipetune.service.settings import Settings

with warnings.catch_warnings():
    # starlette's TestClient nags about httpx; the client is what FastAPI documents.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PG_ADMIN_URL = os.environ.get(
    "PIPETUNE_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
TOKEN = "test-worker-token"
WORKER_HEADERS = {"Authorization": f"Bearer {TOKEN}"}
GEMM = {"op": "gemm", "m": 1024, "n": 1024, "k": 1024, "dtype": "float16"}
SMALL_GEMM = {"op": "gemm", "m": 256, "n": 256, "k": 256, "dtype": "float16"}


def pg_reachable() -> bool:
    """Whether the local PostgreSQL answers (its tests are skipped only when it does not)."""
    try:
        engine = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


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


def register(client: TestClient, name: str = "w1", gpu: str = "h100", runner: str = "simulated"):
    arch = {"a100": "sm_80", "h100": "sm_90", "h200": "sm_90"}[gpu]
    body = {"name": name, "gpu": gpu, "arch": arch, "runner": runner}
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


def post_result(client: TestClient, worker_id: int, job: dict, result: dict):
    body = {"worker_id": worker_id, "lease_token": job["lease_token"], "result": result}
    return client.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS)


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


def create_task(client: TestClient, budget: int = 20, **extra: Any) -> dict:
    body = {"workload": GEMM, "gpu": "h100", "budget": budget, **extra}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    return response.json()
