"""Heartbeats extend the leases a worker says it holds, and only those: a lease the worker
lost track of (the answer that granted it lost, a result it could not report, a process
under the same name killed while holding it) expires and its job returns to the queue. On
SQLite and PostgreSQL, through the HTTP API in-process."""

from __future__ import annotations

import datetime as dt

from service_support import WORKER_HEADERS, create_task, lease, register, service_of
from sqlalchemy import select, update

from pipetune.service.orm import JobRow

pytest_plugins = ["service_fixtures"]


def _beat(client, worker: int, leases: list[dict] | None) -> list[int]:
    """Send a heartbeat listing `leases`; the answer's `gone`."""
    body: dict = {"busy_jobs": 1}
    if leases is not None:
        body["leases"] = [{"job_id": j["job_id"], "lease_token": j["lease_token"]} for j in leases]
    response = client.post(f"/v1/workers/{worker}/heartbeat", json=body, headers=WORKER_HEADERS)
    assert response.status_code == 200, response.text
    return response.json()["gone"]


def _expiries(client, jobs: list[dict]) -> list[dt.datetime]:
    service = service_of(client)
    with service.db.read() as s:
        rows = dict(
            s.execute(
                select(JobRow.id, JobRow.lease_expires_at).where(
                    JobRow.id.in_([j["job_id"] for j in jobs])
                )
            ).all()
        )
    return [rows[j["job_id"]] for j in jobs]


def _age(client, jobs: list[dict], seconds: float) -> None:
    """Move the leases' expiry back (as if granted `seconds` earlier)."""
    service = service_of(client)
    expiries = _expiries(client, jobs)
    with service.db.write() as s:
        for job, expiry in zip(jobs, expiries, strict=True):
            s.execute(
                update(JobRow)
                .where(JobRow.id == job["job_id"])
                .values(lease_expires_at=expiry - dt.timedelta(seconds=seconds))
            )


def test_a_heartbeat_extends_only_the_leases_it_lists(client):
    create_task(client, budget=4, strategy="grid")
    worker = register(client)
    kept, lost = lease(client, worker, max_jobs=2)
    _age(client, [kept, lost], 60)
    aged = _expiries(client, [kept, lost])
    _beat(client, worker, [kept])
    after = _expiries(client, [kept, lost])
    assert after[0] > aged[0] + dt.timedelta(seconds=30)  # extended by a TTL from now
    assert after[1] == aged[1]  # left to expire: the worker no longer holds it
    # A token that is not the lease's extends nothing (an old lease of the job, or a guess).
    forged = {**kept, "lease_token": "0" * 32}
    _age(client, [kept], 60)
    before = _expiries(client, [kept])
    _beat(client, worker, [forged])
    assert _expiries(client, [kept]) == before


def test_a_heartbeat_matches_each_job_with_its_own_token(client):
    """A job and a token the worker holds apart are not a lease it holds: the pairs were
    matched as any listed job with any listed token, so crossed pairs extended both."""
    create_task(client, budget=4, strategy="grid")
    worker = register(client)
    (first,) = lease(client, worker, max_jobs=1)
    (second,) = lease(client, worker, max_jobs=1)  # another request: another token
    assert first["lease_token"] != second["lease_token"]
    _age(client, [first, second], 60)
    aged = _expiries(client, [first, second])
    crossed = [
        {**first, "lease_token": second["lease_token"]},
        {**second, "lease_token": first["lease_token"]},
    ]
    _beat(client, worker, crossed)
    assert _expiries(client, [first, second]) == aged
    _beat(client, worker, [first, second])
    assert all(a > b for a, b in zip(_expiries(client, [first, second]), aged, strict=True))


def test_a_heartbeat_that_lists_nothing_extends_nothing_and_one_without_the_field_all(client):
    create_task(client, budget=4, strategy="grid")
    worker = register(client)
    jobs = lease(client, worker, max_jobs=2)
    _age(client, jobs, 60)
    aged = _expiries(client, jobs)
    _beat(client, worker, [])
    assert _expiries(client, jobs) == aged
    _beat(client, worker, None)  # a worker from before the field: all, as before
    assert all(a > b for a, b in zip(_expiries(client, jobs), aged, strict=True))


def test_a_lease_the_worker_lost_track_of_returns_to_the_queue(client):
    """The answer that granted job `lost` never reached the worker: its heartbeats go on
    listing what it holds, the lease expires, and the job is leased again."""
    create_task(client, budget=2, strategy="grid")
    worker = register(client)
    held, lost = lease(client, worker, max_jobs=2)
    # A heartbeat extends only leases not yet expired: leave 20 s of the TTL (a second was
    # too little on a loaded CI box), then move both back past the unextended one's expiry.
    _age(client, [held, lost], 100)
    _beat(client, worker, [held])
    _age(client, [held, lost], 30)
    service_of(client).queue.reclaim()
    again = lease(client, register(client, "w2"), max_jobs=2)
    assert [j["job_id"] for j in again] == [lost["job_id"]]


def test_a_malformed_lease_list_is_a_422_naming_it(client):
    worker = register(client)
    for leases, where in (
        ([{"job_id": 1}], "lease_token"),
        ([{"job_id": 0, "lease_token": "x" * 16}], "job_id"),
        ([{"job_id": 1, "lease_token": "short"}], "lease_token"),
        ("all", "leases"),
    ):
        response = client.post(
            f"/v1/workers/{worker}/heartbeat",
            json={"busy_jobs": 0, "leases": leases},
            headers=WORKER_HEADERS,
        )
        assert response.status_code == 422, response.text
        assert response.json()["field"].endswith(where), response.json()


def test_a_lease_says_the_ttl_a_heartbeat_extends_it_by(client):
    """The worker daemon extends a lease only once half of this has passed
    (workers/daemon/heartbeats.py): the lease itself says it, through either route."""
    create_task(client, budget=3, strategy="random")
    worker = register(client)
    ttl = service_of(client).settings.lease_ttl_s
    jobs = lease(client, worker, max_jobs=2)
    assert [j["lease_ttl_s"] for j in jobs] == [ttl, ttl]
    item = {"job_id": jobs[0]["job_id"], "lease_token": jobs[0]["lease_token"]}
    item["result"] = {"status": "ok", "latency_us": 5.0}
    body = {"worker_id": worker, "results": [item], "max_jobs": 1}
    answer = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
    assert answer.status_code == 200, answer.text
    assert [j["lease_ttl_s"] for j in answer.json()["jobs"]] == [ttl]


def test_a_heartbeat_names_the_listed_leases_that_are_no_longer_the_workers(client):
    """A worker leases ahead: jobs of a task cancelled meanwhile, or whose leases expired and
    moved, sat in its queue and were measured for nothing (their results refused). The
    heartbeat's answer names them (`gone`), and only them: a live lease, and one expired
    but not yet reclaimed (its result would still count), are not."""
    cancelled_task = create_task(client, budget=2, strategy="grid")
    create_task(client, budget=3, strategy="grid")
    worker = register(client)
    jobs = lease(client, worker, max_jobs=5)
    by_task: dict[int, list[dict]] = {}
    for job in jobs:
        by_task.setdefault(job["task_id"], []).append(job)
    doomed = by_task[cancelled_task["id"]]
    live, expiring, moved = by_task[next(t for t in by_task if t != cancelled_task["id"])]
    assert _beat(client, worker, jobs) == []
    response = client.delete(f"/v1/tasks/{cancelled_task['id']}")
    assert response.status_code == 200, response.text
    _age(client, [expiring, moved], 600)  # expired, neither reclaimed yet
    assert _beat(client, worker, jobs) == sorted(j["job_id"] for j in doomed)
    service_of(client).queue.reclaim()  # both requeued; `moved` leased to another worker
    again = lease(client, register(client, "w2"), max_jobs=2)
    assert {j["job_id"] for j in again} == {expiring["job_id"], moved["job_id"]}
    gone = _beat(client, worker, jobs)
    assert gone == sorted([*(j["job_id"] for j in doomed), expiring["job_id"], moved["job_id"]])
    assert live["job_id"] not in gone
    assert _beat(client, worker, None) == []  # (a heartbeat that lists nothing: nothing named)


def test_a_gone_lease_listed_twice_is_named_once(client):
    """A worker that lists a job twice (a retried report kept beside the queued entry, say)
    is told once that it is gone, on both databases: PostgreSQL named it once per listing."""
    cancelled = create_task(client, budget=1, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker, max_jobs=1)
    response = client.delete(f"/v1/tasks/{cancelled['id']}")
    assert response.status_code == 200, response.text
    stale = {**job, "lease_token": "0" * 32}
    assert _beat(client, worker, [job, job, stale]) == [job["job_id"]]
