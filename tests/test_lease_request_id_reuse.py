"""A lease request's answer never holds more than its `max_jobs`, whatever was sent before
under its `request_id` (LeaseRequest.request_id), on both databases.

A request id names one request and its retries: the lease token derives from it, and a retry
is answered with the jobs leased under that token. A request id reused for a new request
(retry false) leased more jobs under the same token, and a retry then got the old request's
jobs with the new one's: 4 jobs for max_jobs 2. A retry with a smaller max_jobs than the
request it repeats got every job that request leased, more than it asked for. Now a retry
gets the jobs of the newest request under its id, exactly, and one that asks for fewer than
those is refused (422 naming max_jobs and the request id), leasing nothing."""

from __future__ import annotations

from service_support import (
    WORKER_HEADERS,
    after_the_newest_lease,
    create_task,
    register,
    service_of,
)
from sqlalchemy import func, select

from pipetune.service.orm import LeaseRow

pytest_plugins = ["service_fixtures"]

REQUEST_ID = "lease-reused-01"


def _ask(c, worker: int, max_jobs: int, retry: bool = False):  # type: ignore[no-untyped-def]
    body = {"worker_id": worker, "max_jobs": max_jobs, "wait_s": 0, "request_id": REQUEST_ID}
    if retry:
        body["retry"] = True
    return c.post("/v1/jobs/lease", json=body, headers=WORKER_HEADERS)


def _jobs(c, worker: int, max_jobs: int, retry: bool = False) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    r = _ask(c, worker, max_jobs, retry)
    assert r.status_code == 200, r.text
    return [(j["job_id"], j["lease_token"]) for j in r.json()["jobs"]]


def _leases(c) -> int:  # type: ignore[no-untyped-def]
    with service_of(c).db.read() as s:
        return s.scalar(select(func.count()).select_from(LeaseRow))


def test_a_reused_request_id_does_not_merge_the_old_requests_jobs_into_a_retry(client):
    worker = register(client, "w")
    create_task(client, budget=6, strategy="grid", batch_size=6)
    first = _jobs(client, worker, 2)
    after_the_newest_lease(client)
    second = _jobs(client, worker, 2)  # the id used again, for a new request
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    # Its answer lost, the second request is retried: it gets what it leased, no more.
    assert _jobs(client, worker, 2, retry=True) == second
    assert _leases(client) == 4  # and the retry leased nothing


def test_a_retry_asking_for_fewer_jobs_than_its_request_leased_is_refused(client):
    worker = register(client, "w")
    create_task(client, budget=6, strategy="grid", batch_size=6)
    first = _jobs(client, worker, 3)
    assert len(first) == 3
    refused = _ask(client, worker, 1, retry=True)
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["field"] == "max_jobs", body
    assert REQUEST_ID in body["reason"] and "the 3 jobs" in body["reason"], body
    assert _leases(client) == 3  # nothing leased by it
    # The same retry with the request's own max_jobs (or more) gets them, exactly.
    assert _jobs(client, worker, 3, retry=True) == first
    assert _jobs(client, worker, 4, retry=True) == first
    assert _leases(client) == 3


def test_a_retry_that_finds_nothing_earlier_leases_at_most_max_jobs(client):
    """A retry whose request leased nothing claims anew, at most max_jobs, under its id; its
    own retry then gets exactly those."""
    worker = register(client, "w")
    create_task(client, budget=6, strategy="grid", batch_size=6)
    got = _jobs(client, worker, 2, retry=True)
    assert len(got) == 2
    assert _jobs(client, worker, 2, retry=True) == got
    assert _leases(client) == 2
