"""A lease request whose worker went away while it waited (killed mid-poll) claims nothing:
it took the jobs its wake-up announced for a dead worker, and they waited out a lease TTL
and used up one of their attempts. On a live server with the service's own HTTP protocol
(a disconnect is a socket closing, which an in-process client cannot show)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_support import GEMM, WORKER_HEADERS, live_server

from pipetune.service.http_protocol import protocol_with
from pipetune.service.migrate import upgrade


@pytest.fixture
def live(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    upgrade(url)
    # The fallback poll longer than the test: only a wake-up ends the wait.
    with live_server(url, protocol_with(60.0), lease_poll_s=30.0, lease_wait_cap_s=30.0) as base:
        yield base


def _register(client: httpx.Client, name: str) -> int:
    body = {"name": name, "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def test_a_lease_request_whose_worker_died_while_it_waited_takes_no_job(live):
    port = int(live.rsplit(":", 1)[1])
    with httpx.Client(base_url=live, timeout=30) as client:
        dead = _register(client, "killed-mid-poll")
        body = json.dumps({"worker_id": dead, "max_jobs": 4, "wait_s": 20}).encode()
        head = [
            "POST /v1/jobs/lease HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in WORKER_HEADERS.items()),
        ]
        poll = socket.create_connection(("127.0.0.1", port))
        poll.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        time.sleep(1.0)  # the request waits on a wake-up (the queue is empty)
        poll.close()  # the worker is killed: its socket closes
        time.sleep(0.5)
        task = client.post(
            "/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 4, "strategy": "random"}
        ).json()["id"]
        time.sleep(1.0)  # the wake-up reaches the waiting request
        trials = client.get(f"/v1/tasks/{task}/trials").json()["trials"]
        assert trials and all(t["state"] == "queued" for t in trials), trials
        # A live worker takes them at once.
        alive = _register(client, "alive")
        leased = client.post(
            "/v1/jobs/lease",
            json={"worker_id": alive, "max_jobs": 4, "wait_s": 0},
            headers=WORKER_HEADERS,
        ).json()["jobs"]
        assert len(leased) == len(trials)


def test_jobs_a_gone_request_was_woken_for_go_to_a_worker_that_may_take_them(tmp_path):
    """A request whose worker went away passes the jobs it was woken for to the next request
    waiting. It passed them on for any runner: a cupy-only task's job then woke a simulated
    worker waiting first (which found nothing), and the cupy worker behind it waited out
    its poll (here its whole 10 s wait, measured)."""
    import threading

    from service_support import TOKEN, client_for, create_task, lease, register, service_of

    from pipetune.model.wire import LeaseRequest
    from pipetune.service.settings import token_hash

    url = f"sqlite:///{tmp_path / 'lease.db'}"
    upgrade(url)
    with client_for(url, lease_poll_s=60) as c:
        queue, wakeup = service_of(c).queue, service_of(c).wakeup
        simulated = register(c, "simulated", runner="simulated")
        dead, alive = register(c, "gpu-1", runner="cupy"), register(c, "gpu-2", runner="cupy")
        got: dict[str, tuple[int, float]] = {}

        def waiting(name: str, worker: int, wait_s: float) -> threading.Thread:
            def run() -> None:
                started = time.monotonic()
                got[name] = (len(lease(c, worker, 1, wait_s)), time.monotonic() - started)

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        def until_waiting(n: int) -> None:
            while wakeup.waiting < n:
                time.sleep(0.01)

        async def gone() -> bool:
            return True

        async def dead_lease():
            body = LeaseRequest(worker_id=dead, max_jobs=1, wait_s=10)
            return await queue.lease(dead, token_hash(TOKEN), body, gone)

        threads = [waiting("simulated", simulated, 3)]
        until_waiting(1)
        answer = c.portal.start_task_soon(dead_lease)
        until_waiting(2)
        threads.append(waiting("cupy", alive, 10))
        until_waiting(3)
        create_task(c, budget=1, strategy="grid", runner="cupy")
        assert answer.result().jobs == []  # the dead worker took nothing
        threads[1].join(15)
        jobs, waited = got["cupy"]
        assert jobs == 1 and waited < 5
        threads[0].join(15)
