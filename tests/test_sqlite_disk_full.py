"""The embedded SQLite file's disk full ("database or disk is full", SQLITE_FULL): writes
fail and roll back whole. The answers must say why (a 503 that said "the database is
unavailable" sent an operator looking for a server that was up), /healthz must not answer
healthy meanwhile, and the service must resume once there is room again.

A full disk is made with PRAGMA max_page_count, which fails a write that would grow the file
past it with the very error a full disk gives (tmpfs, reproduced: the same 503s)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from service_support import (
    GEMM,
    WORKER_HEADERS,
    client_for,
    metric_value,
    register,
    service_of,
)
from sqlalchemy import event, text

from pipetune.service.db import DISK_FULL_WINDOW_S
from pipetune.service.migrate import upgrade


class PageCap:
    """Every connection of the service's pool limited to `cap` pages (None: SQLite's own
    limit); setting it reopens the pool's connections."""

    def __init__(self, db) -> None:  # type: ignore[no-untyped-def]
        self.engine = db.engine
        self.cap: int | None = None
        event.listen(self.engine, "connect", self._limit)

    def _limit(self, dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        if self.cap is not None:
            dbapi_connection.execute(f"PRAGMA max_page_count={int(self.cap)}")

    def set(self, cap: int | None) -> None:
        self.cap = cap
        self.engine.dispose()


def test_a_full_disk_is_a_503_naming_it_and_healthz_says_so_until_it_passes(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'pipetune.db'}"
    upgrade(url)
    with client_for(url) as client:
        db = service_of(client).db
        db.disk_full_window_s = 0.5
        register(client)
        assert client.get("/healthz").status_code == 200
        with db.read() as s:
            pages = s.execute(text("PRAGMA page_count")).scalar()
        cap = PageCap(db)
        cap.set(pages)
        tasks_before = client.get("/v1/tasks").json()["tasks"]
        body = {"workload": GEMM, "gpu": "h100", "budget": 50, "strategy": "random"}
        refused = None
        for _ in range(20):  # until a write needs a page more than the file has
            response = client.post("/v1/tasks", json=body)
            if response.status_code != 201:
                refused = response
                break
        assert refused is not None and refused.status_code == 503, refused and refused.text
        # A full disk does not clear in a second: retry after the window /healthz uses.
        assert refused.headers["Retry-After"] == str(math.ceil(DISK_FULL_WINDOW_S)) == "30"
        assert "full" in refused.json()["detail"], refused.text
        # Nothing half-written: the refused task is not there, the ones before it are whole.
        listed = client.get("/v1/tasks").json()["tasks"]
        assert all(t["state"] in ("queued", "running") for t in listed)
        assert len(listed) >= len(tasks_before)
        health = client.get("/healthz")
        assert health.status_code == 503, health.text
        assert "full" in health.json()["detail"]
        assert health.headers["Retry-After"] == refused.headers["Retry-After"]
        # The gauge agrees with /healthz (it read 1: reads answer), and the queue's gauges
        # are still there, read as before.
        scraped = client.get("/metrics").text
        assert metric_value(scraped, "pipetune_database_up") == 0
        assert (
            metric_value(scraped, "pipetune_workers_registered", gpu="h100", runner="simulated")
            == 1
        )
        # Room again: writes pass, and /healthz is healthy once no write has failed for
        # disk_full_window_s.
        cap.set(None)
        created = client.post("/v1/tasks", json=body)
        assert created.status_code == 201, created.text
        time.sleep(0.6)
        assert client.get("/healthz").status_code == 200
        assert metric_value(client.get("/metrics").text, "pipetune_database_up") == 1
        worker = register(client, "w2")
        leased = client.post(
            "/v1/jobs/lease", json={"worker_id": worker, "wait_s": 0}, headers=WORKER_HEADERS
        )
        assert leased.status_code == 200 and leased.json()["jobs"], leased.text


def test_a_database_made_read_only_is_a_503_naming_it_and_healthz_says_so(tmp_path: Path):
    """A SQLite file (its mount) made read-only while serving: each write answered 503 "the
    database is unavailable; retry shortly", /healthz 200 and `pipetune_database_up` 1, and a
    task stopped half-way with no word of why. PRAGMA query_only gives the very error."""
    url = f"sqlite:///{tmp_path / 'pipetune.db'}"
    upgrade(url)
    with client_for(url) as client:
        db = service_of(client).db
        db.disk_full_window_s = 3.0  # (what follows the refused write answers within it)
        read_only = {"on": False}

        def query_only(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            if read_only["on"]:
                dbapi_connection.execute("PRAGMA query_only=1")

        event.listen(db.engine, "connect", query_only)
        read_only["on"] = True
        db.engine.dispose()
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "random"}
        refused = client.post("/v1/tasks", json=body)
        assert refused.status_code == 503, refused.text
        assert refused.json()["detail"].startswith("the database is read-only"), refused.text
        assert refused.headers["Retry-After"] == "30"
        health = client.get("/healthz")
        assert health.status_code == 503, health.text
        assert health.json()["detail"].startswith("the database is read-only"), health.text
        assert metric_value(client.get("/metrics").text, "pipetune_database_up") == 0
        # Writable again: healthy once no write has failed for the window.
        read_only["on"] = False
        db.engine.dispose()
        assert client.post("/v1/tasks", json=body).status_code == 201
        time.sleep(3.1)
        assert client.get("/healthz").status_code == 200
