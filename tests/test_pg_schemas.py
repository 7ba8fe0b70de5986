"""Two services on one PostgreSQL database, each in a schema of its own (a search_path in its
URL, as a shared company database hands them out): each hears only its own replicas'
messages. A NOTIFY channel belongs to the database, and both used one: a worker of one that
said it stops was answered no jobs in the other, where a worker had the same id."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from service_support import GEMM, PG_ADMIN_URL, TOKEN, live_server, require_pg
from sqlalchemy import create_engine, text

from benchmarks.harness import pg_database
from pipetune.service.migrate import upgrade
from pipetune.service.wakeup import CHANNEL, channel_of

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
WORKER = {"name": "w", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
SCHEMAS = ("team_a", "team_b")


@pytest.fixture
def schema_urls() -> Iterator[dict[str, str]]:
    """A fresh database with a migrated schema of each name: its URL for each."""
    require_pg()
    with pg_database(PG_ADMIN_URL) as url:
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE SCHEMA team_a"))
            conn.execute(text("CREATE SCHEMA team_b"))
        admin.dispose()
        urls = {schema: f"{url}?options=-csearch_path%3D{schema}" for schema in SCHEMAS}
        for schema_url in urls.values():
            upgrade(schema_url)
        yield urls


def test_each_schema_has_a_channel_of_its_own():
    assert channel_of("public") == CHANNEL  # (what earlier releases listen on)
    names = {channel_of(s) for s in ("public", "team_a", "Team B", "x" * 63)}  # (any name)
    assert len(names) == 4
    assert all(len(name.encode()) <= 63 for name in names)  # PostgreSQL's longest


def test_a_worker_stopping_in_one_schema_leaves_the_other_s_worker_of_that_id_alone(
    schema_urls,
):
    url_a, url_b = schema_urls.values()
    with (
        live_server(url_a) as a,
        live_server(url_b) as b,
        httpx.Client(base_url=a, timeout=30) as http_a,
        httpx.Client(base_url=b, timeout=30) as http_b,
    ):
        worker_a = http_a.post("/v1/workers", json=WORKER, headers=HEADERS).json()["id"]
        worker_b = http_b.post("/v1/workers", json=WORKER, headers=HEADERS).json()["id"]
        assert worker_a == worker_b  # (ids are per schema)
        stopping = http_a.post(f"/v1/workers/{worker_a}/stopping", headers=HEADERS)
        assert stopping.status_code == 204
        time.sleep(1.0)  # (the notice has reached every listener by now)
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
        assert http_b.post("/v1/tasks", json=body).status_code == 201
        lease = {"worker_id": worker_b, "max_jobs": 4, "wait_s": 5}
        jobs = http_b.post("/v1/jobs/lease", json=lease, headers=HEADERS).json()["jobs"]
        assert len(jobs) == 4
        # And A's worker, which said it stops, is still answered nothing in A.
        lease_a = {"worker_id": worker_a, "max_jobs": 4, "wait_s": 0}
        assert http_a.post("/v1/tasks", json=body).status_code == 201
        answer = http_a.post("/v1/jobs/lease", json=lease_a, headers=HEADERS).json()
        assert answer["jobs"] == []


@pytest.mark.parametrize("schema", SCHEMAS)
def test_replicas_in_one_schema_wake_each_other(schema_urls, schema):
    """A lease request waiting on one replica is woken by jobs another replica of the same
    schema enqueues (the fallback poll is 30 s here: only the NOTIFY can wake it)."""
    url = schema_urls[schema]
    slow = {"lease_poll_s": 30.0, "lease_wait_cap_s": 30.0}
    with (
        live_server(url, **slow) as first,
        live_server(url, **slow) as second,
        httpx.Client(base_url=first, timeout=60) as http_1,
        httpx.Client(base_url=second, timeout=60) as http_2,
    ):
        worker = http_1.post("/v1/workers", json=WORKER, headers=HEADERS).json()["id"]
        got: list[tuple[int, float]] = []

        def wait_for_jobs() -> None:
            lease = {"worker_id": worker, "max_jobs": 2, "wait_s": 20}
            started = time.monotonic()
            jobs = http_1.post("/v1/jobs/lease", json=lease, headers=HEADERS).json()["jobs"]
            got.append((len(jobs), time.monotonic() - started))

        waiting = threading.Thread(target=wait_for_jobs)
        waiting.start()
        time.sleep(1.0)  # (the request is waiting by now)
        body = {"workload": GEMM, "gpu": "h100", "budget": 2, "strategy": "grid"}
        assert http_2.post("/v1/tasks", json=body).status_code == 201
        waiting.join(30)
    (count, waited_s) = got[0]
    assert count == 2 and waited_s < 10, got
