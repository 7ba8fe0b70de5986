"""A lease whose claim committed but whose answer could not be made (the workloads' documents
could not be read: a database error after the claim) hands the jobs back at once, on both
databases: they were leased to a worker that never got them, and waited out their TTL."""

from __future__ import annotations

import threading
import time

import pytest
from service_support import (
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    ok,
    register,
    service_of,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from pipetune.model.states import JobState, LeaseOutcome
from pipetune.service.orm import JobRow, LeaseRow
from pipetune.service.settings import token_hash

pytest_plugins = ["service_fixtures"]


def _workload_read_fails(queue, before_raising=lambda: None):
    """Make the queue's next read of workload documents fail (once), after `before_raising`."""
    read = queue._canonical
    calls = []

    def fails_once(ids):
        calls.append(ids)
        if len(calls) == 1:
            before_raising()
            raise sa_exc.OperationalError("select workloads", {}, Exception("connection lost"))
        return read(ids)

    queue._canonical = fails_once
    queue._workloads.clear()  # (a document cached by an earlier answer is not read again)


def test_jobs_claimed_for_an_answer_that_failed_are_queued_again_at_once(db_url):
    with client_for(db_url) as c:
        queue = service_of(c).queue
        failed, other = register(c, "failed"), register(c, "other")
        create_task(c, budget=2, strategy="grid")
        _workload_read_fails(queue)
        r = c.post(
            "/v1/jobs/lease",
            json={"worker_id": failed, "max_jobs": 2, "wait_s": 0},
            headers=WORKER_HEADERS,
        )
        assert r.status_code == 503
        jobs = lease(c, other, 2)  # not leased to `failed` until the TTL (120 s)
        assert len(jobs) == 2
        with service_of(c).db.write() as s:
            rows = s.execute(select(LeaseRow.worker_id, LeaseRow.outcome)).all()
            attempts = s.scalars(select(JobRow.attempts)).all()
        assert (
            sorted((w, o) for w, o in rows if w == failed) == [(failed, LeaseOutcome.RELEASED)] * 2
        )
        assert sorted((w, o) for w, o in rows if w == other) == [(other, None)] * 2
        assert attempts == [0, 0]  # the worker never had them: no attempt used


def test_released_jobs_wake_a_request_waiting_for_them(db_url):
    """The release signals the jobs as an enqueue does: a request that began waiting while
    they were claimed gets them now, not at its fallback poll (60 s here)."""
    with client_for(db_url, lease_poll_s=60) as c:
        service = service_of(c)
        queue = service.queue
        failed, waiting = register(c, "failed"), register(c, "waiting")
        create_task(c, budget=2, strategy="grid")
        claimed, go_on = threading.Event(), threading.Event()

        def hold() -> None:
            claimed.set()
            go_on.wait(10)

        _workload_read_fails(queue, hold)
        ref = queue.worker_ref(failed, token_hash(TOKEN))
        errors: list[BaseException] = []

        def try_lease() -> None:
            try:
                queue.try_lease(ref, 2)
            except BaseException as exc:  # the test reads it
                errors.append(exc)

        first = threading.Thread(target=try_lease)
        first.start()
        assert claimed.wait(10)
        got: list = []
        second = threading.Thread(target=lambda: got.append(lease(c, waiting, 2, wait_s=20)))
        second.start()
        deadline = time.monotonic() + 10
        while service.wakeup.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.wakeup.waiting == 1
        started = time.monotonic()
        go_on.set()
        first.join(10)
        second.join(25)
        assert len(errors) == 1 and isinstance(errors[0], sa_exc.OperationalError)
        assert len(got[0]) == 2
        assert time.monotonic() - started < 3
        with service.db.write() as s:
            states = s.scalars(select(JobRow.state)).all()
        assert states == [JobState.LEASED] * 2


@pytest.mark.parametrize("outcome", list(LeaseOutcome))
def test_every_lease_outcome_fits_its_column(outcome):
    assert len(outcome.value) <= LeaseRow.__table__.c.outcome.type.length


def test_a_retry_that_claims_the_released_jobs_again_leaves_their_released_leases_be(db_url):
    """A request id's token is the same for its retries, so a retry may claim again the
    jobs its failed answer released, under that token: their results then ended both of
    the job's leases with that token (`released` overwritten by `result`), and the load
    audit read two results for one job."""
    with client_for(db_url) as c:
        queue = service_of(c).queue
        worker = register(c, "w")
        create_task(c, budget=2, strategy="grid")
        _workload_read_fails(queue)
        body = {"worker_id": worker, "max_jobs": 2, "wait_s": 0, "request_id": "lease-0001"}
        assert c.post("/v1/jobs/lease", json=body, headers=WORKER_HEADERS).status_code == 503
        r = c.post("/v1/jobs/lease", json={**body, "retry": True}, headers=WORKER_HEADERS)
        jobs = r.json()["jobs"]
        assert len(jobs) == 2
        for job in jobs:
            report = {"worker_id": worker, "lease_token": job["lease_token"], "result": ok(5.0)}
            answer = c.post(f"/v1/jobs/{job['job_id']}/result", json=report, headers=WORKER_HEADERS)
            assert answer.json()["accepted"]
        with service_of(c).db.write() as s:
            outcomes = s.scalars(select(LeaseRow.outcome).order_by(LeaseRow.id)).all()
        assert outcomes == [LeaseOutcome.RELEASED] * 2 + [LeaseOutcome.RESULT] * 2
