"""An embedded (SQLite) service whose database file another program holds locked.

A `sqlite3` shell or a backup tool that holds the file's write lock makes the service's
writes wait (up to the busy timeout). The lease's claim, the result's record and the
heartbeat waited on the event loop, so every other request, /healthz too, waited with them:
the service stopped answering for as long as the lock was held. They now wait in a worker
thread on SQLite.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from service_support import (
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    ok,
    register,
    settle,
)

from pipetune.service.migrate import upgrade

LOCK_S = 3.0


@pytest.mark.parametrize("blocked", ["result", "lease", "heartbeat"])
def test_the_service_answers_while_another_program_holds_the_sqlite_lock(
    tmp_path: Path, blocked: str
) -> None:
    path = tmp_path / "pipetune.db"
    upgrade(f"sqlite:///{path}")
    with client_for(f"sqlite:///{path}", batch_size=2) as client:
        worker = register(client)
        create_task(client, budget=4)
        settle(client)
        job = lease(client, worker)[0]

        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")  # what `sqlite3 pipetune.db` + BEGIN EXCLUSIVE does
        answers: dict[str, object] = {}

        def blocked_request() -> None:
            if blocked == "result":
                body = {"worker_id": worker, "lease_token": job["lease_token"], "result": ok(50)}
                response = client.post(
                    f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS
                )
            elif blocked == "heartbeat":
                held = [{"job_id": job["job_id"], "lease_token": job["lease_token"]}]
                response = client.post(
                    f"/v1/workers/{worker}/heartbeat",
                    json={"busy_jobs": 1, "leases": held},
                    headers=WORKER_HEADERS,
                )
            else:
                response = client.post(
                    "/v1/jobs/lease",
                    json={"worker_id": worker, "max_jobs": 1, "wait_s": 0},
                    headers=WORKER_HEADERS,
                )
            answers["response"] = response

        waiting = threading.Thread(target=blocked_request)
        started = time.monotonic()
        waiting.start()
        try:
            time.sleep(0.5)  # the request is waiting for the lock by now
            assert waiting.is_alive(), "the request did not wait for the lock"
            health = client.get("/healthz")
            answered_after = time.monotonic() - started
            assert health.status_code == 200, health.text
            # Before: /healthz waited on the blocked event loop until the lock was let go.
            assert answered_after < LOCK_S - 1.0, f"/healthz answered after {answered_after:.1f} s"
            time.sleep(max(0.0, LOCK_S - (time.monotonic() - started)))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            waiting.join(timeout=35)
        response = answers["response"]
        assert response.status_code == 200, response.text
        if blocked == "result":
            assert response.json()["accepted"] is True
        elif blocked == "heartbeat":
            assert response.json()["gone"] == []
        else:
            assert len(response.json()["jobs"]) == 1  # the task's second job, once let go
