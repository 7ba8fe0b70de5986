"""A retried report that asks for no new jobs (max_jobs 0, with its request id: what the
worker daemon sends after a failed report) only looks for the jobs its lost answer leased.
It claimed for 0 jobs, found none, and the replica then remembered the queue as empty for
that kind of worker: every lease request of that kind skipped its claim and waited for the
fallback poll (PIPETUNE_LEASE_POLL_S) with jobs queued. On SQLite and PostgreSQL."""

from __future__ import annotations

import time

from service_support import WORKER_HEADERS, client_for, create_task, lease, ok, register, service_of

from pipetune.service.wakeup import WorkerKind

pytest_plugins = ["service_fixtures"]

# A fallback poll far longer than any lease request below waits: a request that skips its
# claim gets nothing back at all (the assertion cannot depend on timing).
POLL_S = 600.0


def _listening(c) -> None:
    """Wait for the replica to hear every message (PostgreSQL: its listener is connected);
    only then does it trust a memory of an empty queue (Wakeup.known_empty)."""
    wakeup = service_of(c).queue.wakeup
    deadline = time.monotonic() + 30
    while not wakeup.hears_all:
        assert time.monotonic() < deadline, "the replica's listener did not connect"
        time.sleep(0.01)


def test_a_retried_report_for_no_new_jobs_leaves_the_queue_known_non_empty(db_url):
    with client_for(db_url, lease_poll_s=POLL_S) as c:
        _listening(c)
        queue = service_of(c).queue
        kind = WorkerKind("sm_90", "h100", None, "simulated")
        create_task(c, budget=8, batch_size=8, strategy="grid")
        a, b = register(c, "a"), register(c, "b")
        (job,) = lease(c, b)  # 7 jobs stay queued
        # The memory works: a claim that finds nothing is remembered (the fixture is sound).
        queue.wakeup.found_empty(kind, queue.wakeup.generation)
        assert queue.wakeup.known_empty(kind, POLL_S, new=False)
        queue.wakeup.bump()
        assert not queue.wakeup.known_empty(kind, POLL_S, new=False)

        item = {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": ok(9.0)}
        body = {
            "worker_id": a,
            "results": [item],  # b's lease: refused item by item (403)
            "max_jobs": 0,
            "request_id": "report-0001",
            "retry": True,
        }
        answer = c.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
        assert answer.status_code == 200, answer.text
        assert answer.json()["jobs"] == [] and answer.json()["acks"][0]["status_code"] == 403

        # Nothing was learnt of the queue: it holds 7 jobs.
        assert not queue.wakeup.known_empty(kind, POLL_S, new=False)
        assert not queue.wakeup.known_empty(kind, POLL_S, new=True)
        # A lease request claims at once (with the memory it waited the whole wait_s and
        # came back empty: the poll is far longer).
        got = lease(c, b, wait_s=1.0)
        assert len(got) == 1 and got[0]["job_id"] != job["job_id"]
