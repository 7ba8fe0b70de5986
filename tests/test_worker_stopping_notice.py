"""`POST /v1/workers/{id}/stopping`: a worker that stops says so, and the service answers its
waiting lease request empty at once, on whichever replica it waits, and leases it nothing more
until it registers again. Before, a stopped worker's long-poll stayed open while its process
ended, and jobs enqueued meanwhile were leased into it, never read, and waited out their
lease TTL (an attempt used each)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from service_support import (
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    live_server,
    ok,
    register,
    service_of,
)
from sqlalchemy import select
from worker_support import run_in_thread, simulated_daemon, wait_until

from pipetune.clients.sdk import NotFoundError, WorkerApi
from pipetune.service import wakeup as wakeup_module
from pipetune.service.migrate import upgrade
from pipetune.service.orm import LeaseRow
from pipetune.service.wakeup import Wakeup

pytest_plugins = ["service_fixtures"]


def _poll_in_thread(client, worker_id: int, wait_s: float) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(
        target=lambda: got.append(lease(client, worker_id, 2, wait_s=wait_s)), daemon=True
    )
    thread.start()
    return thread, got


def test_a_stopping_worker_s_waiting_poll_is_answered_empty_and_it_leases_nothing_more(db_url):
    with client_for(db_url, lease_poll_s=60) as c:
        api = WorkerApi(str(c.base_url), TOKEN, transport=c._transport)
        stopping, other = register(c, "stopping"), register(c, "other")
        wakeup = service_of(c).wakeup
        poll, got = _poll_in_thread(c, stopping, wait_s=20)
        assert wait_until(lambda: wakeup.waiting == 1)
        started = time.monotonic()
        api.stopping(stopping, timeout_s=5)
        poll.join(5)
        assert got == [[]] and time.monotonic() - started < 3  # (it waited its whole 20 s)
        # Jobs enqueued from now on are not leased to it, not even by a request it sends.
        create_task(c, budget=2, strategy="grid")
        started = time.monotonic()
        assert lease(c, stopping, 2, wait_s=5) == []
        assert time.monotonic() - started < 2  # answered at once, not after its wait
        assert len(lease(c, other, 2)) == 2  # another worker takes them
        # Registered again (a restart under its name), it leases again.
        assert register(c, "stopping") == stopping
        create_task(c, budget=1, strategy="grid")
        assert len(lease(c, stopping, 2)) == 1
        with pytest.raises(NotFoundError):
            api.stopping(999)
        api.close()


def test_a_notice_that_comes_while_the_poll_claims_is_not_missed(db_url):
    """The notice arrives while the worker's lease request claims (its claim runs off the
    event loop: the request is not yet waiting, so the notice's wake-up finds nothing to
    wake). Before, the request then waited out its whole poll (60 s here, --lease-wait 30 on
    a daemon, whose stop waited 10 s for it and then left it open for jobs enqueued after)."""
    with client_for(db_url, lease_poll_s=60) as c:
        worker = register(c, "claiming")
        service = service_of(c)
        claim = service.queue.lease_now

        async def claim_then_stop(*args, **kwargs):
            jobs = await claim(*args, **kwargs)
            service.wakeup.stop_worker(worker)  # (as the stopping route does)
            await asyncio.sleep(0.05)  # its wake-up runs on the loop: no request waits yet
            return jobs

        service.queue.lease_now = claim_then_stop
        started = time.monotonic()
        assert lease(c, worker, 2, wait_s=20) == []
        assert time.monotonic() - started < 3  # answered at once, not after its 20 s


def test_the_notice_reaches_a_poll_waiting_on_another_replica(pg):
    """The poll waits on replica A, the notice goes to replica B (a load balancer may send
    each request of one worker to another replica): A answers it through NOTIFY."""
    from service_support import wait_until_listening

    with client_for(pg, lease_poll_s=60) as a, client_for(pg, lease_poll_s=60) as b:
        wait_until_listening(a)
        worker = register(a)
        poll, got = _poll_in_thread(a, worker, wait_s=20)
        assert wait_until(lambda: service_of(a).wakeup.waiting == 1)
        started = time.monotonic()
        response = b.post(f"/v1/workers/{worker}/stopping", headers=WORKER_HEADERS)
        assert response.status_code == 204, response.text
        poll.join(10)
        assert got == [[]] and time.monotonic() - started < 5
        # Neither replica leases it the jobs enqueued after.
        create_task(b, budget=2, strategy="grid")
        assert lease(a, worker, 2) == [] and lease(b, worker, 2) == []


def test_a_stopping_message_from_another_replica_marks_the_worker_until_it_registers():
    here, there = Wakeup(shared=True), Wakeup(shared=True)
    here.deliver(there.stopping_payload(5))
    assert here.stopping(5) and not here.stopping(6)
    here.forget_stopping(5)  # (its re-registration)
    assert not here.stopping(5)
    for bad in (
        json.dumps({"origin": "x", "stopping": "five"}),
        '{"origin": "x", "stopping": 1e999}',
    ):
        here.deliver(bad)  # logged and dropped, never raised into the listener
    assert not here.stopping(5)


def test_a_stop_is_remembered_for_a_while_only(monkeypatch):
    """A client that said it stops and then went on leasing without registering again is
    not refused for good."""
    wakeup = Wakeup(shared=False)
    wakeup.stop_worker(3)
    assert wakeup.stopping(3)
    monkeypatch.setattr(wakeup_module, "STOPPING_MEMORY_S", 0.0)
    assert not wakeup.stopping(3)
    monkeypatch.setattr(wakeup_module, "MAX_STOPPING", 2)
    for worker_id in (10, 11, 12):
        wakeup.stop_worker(worker_id)
    assert set(wakeup._stopping) == {11, 12}  # the oldest forgotten first


def test_an_idle_daemon_stopped_mid_poll_has_no_job_leased_into_its_poll(tmp_path):
    """End to end over HTTP: an idle worker (its long-poll waiting, --lease-wait 30) is
    stopped; a task created as soon as run() has returned gets no lease for it. Before, the
    poll stayed open until its wait ended and took the task's jobs (in a process that had
    exited: never read; here, in-process, its lease thread handed them back, each lease
    recorded)."""
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    upgrade(url)
    with live_server(url, lease_poll_s=30.0, lease_wait_cap_s=30.0) as base:
        worker = simulated_daemon(base, lease_wait_s=30, name="idle")
        runner, status = run_in_thread(worker)
        with httpx.Client(base_url=base, timeout=30) as client:

            def registered() -> bool:
                names = [w["name"] for w in client.get("/v1/workers").json()["workers"]]
                return "idle" in names

            assert wait_until(registered, timeout_s=10)
            time.sleep(0.5)  # its first poll waits on the service (the queue is empty)
            started = time.monotonic()
            worker.request_stop()
            runner.join(10)
            assert not runner.is_alive() and status == [0]
            assert time.monotonic() - started < 5
            task = client.post(
                "/v1/tasks",
                json={"workload": {"op": "gemm", "m": 64, "n": 64, "k": 64}, "gpu": "h100",
                      "budget": 2, "strategy": "grid"},
            ).json()["id"]  # fmt: skip
            time.sleep(1.0)  # the wake-up would reach a poll still waiting
            trials = client.get(f"/v1/tasks/{task}/trials").json()["trials"]
            assert trials and all(t["state"] == "queued" for t in trials), trials
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(select(LeaseRow.job_id)).all() == []  # never leased at all
    engine.dispose()


@pytest.mark.parametrize("notice", ["stopping", "exit"])
def test_a_report_from_a_stopping_or_exited_worker_leases_nothing_new(db_url, notice):
    """A results request leases the worker's next jobs (`max_jobs`); from a worker that said
    it stops, or exited, it leased them all the same, and they waited out their lease TTL.
    A retry of a report sent before the notice still gets back what that report leased."""
    with client_for(db_url) as c:
        worker = register(c, "w")
        create_task(c, budget=6, strategy="grid")
        first, second = lease(c, worker, 1), lease(c, worker, 1)

        def report(job: dict, request_id: str, retry: bool = False) -> dict:
            item = {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": ok(9.0)}
            body = {"worker_id": worker, "results": [item], "max_jobs": 2}
            body |= {"request_id": request_id, "retry": retry}
            response = c.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
            assert response.status_code == 200, response.text
            return response.json()

        before = report(first[0], "report-0001")
        assert len(before["jobs"]) == 2  # (before the notice: it tops the worker up)
        response = c.post(f"/v1/workers/{worker}/{notice}", headers=WORKER_HEADERS)
        assert response.status_code == 204, response.text
        after = report(second[0], "report-0002")
        assert after["acks"][0]["accepted"] and after["jobs"] == []
        again = report(first[0], "report-0001", retry=True)
        assert {j["job_id"] for j in again["jobs"]} == {j["job_id"] for j in before["jobs"]}
        with service_of(c).db.read() as s:
            leased = s.scalars(select(LeaseRow).where(LeaseRow.worker_id == worker)).all()
        assert len(leased) == 4  # two by lease requests, two by the first report
