"""`POST /v1/jobs/release`, through the worker's SDK (WorkerApi.release): a stopping worker
hands back the jobs it will not measure, which are queued again at once without using an
attempt (left to their leases they waited out the TTL, an attempt used each). Only the
worker's own current leases: another worker's, or a lease that is not the job's, is left as
it is."""

from __future__ import annotations

import pytest
from service_support import (
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import select

from pipetune.clients.sdk import NotFoundError, WorkerApi
from pipetune.model.states import JobState, LeaseOutcome
from pipetune.model.wire import HeldLease
from pipetune.service.orm import JobRow, LeaseRow

pytest_plugins = ["service_fixtures"]


def _held(job: dict, token: str | None = None) -> HeldLease:
    return HeldLease(job_id=job["job_id"], lease_token=token or job["lease_token"])


def test_a_worker_hands_back_its_leased_jobs(db_url):
    with client_for(db_url) as c:
        api = WorkerApi(str(c.base_url), TOKEN, transport=c._transport)
        stopping, other = register(c, "stopping"), register(c, "other")
        create_task(c, budget=3, strategy="grid")
        jobs = lease(c, stopping, 3)
        assert len(jobs) == 3
        first, second, third = jobs
        # Another worker cannot hand back this one's jobs, nor this one a lease that is not
        # the job's.
        assert api.release(other, [_held(third)]) == []
        assert api.release(stopping, [_held(third, token="not-its-lease-token")]) == []
        released = api.release(stopping, [_held(first), _held(second)], timeout_s=5)
        assert sorted(released) == sorted([first["job_id"], second["job_id"]])
        assert api.release(stopping, [_held(first)]) == []  # (once)
        with service_of(c).db.write() as s:
            rows = {
                r.id: r
                for r in s.execute(
                    select(JobRow.id, JobRow.state, JobRow.attempts, JobRow.lease_owner)
                )
            }
            outcomes = dict(s.execute(select(LeaseRow.job_id, LeaseRow.outcome)).all())
        for job in (first, second):
            row = rows[job["job_id"]]
            assert (row.state, row.attempts, row.lease_owner) == (JobState.QUEUED, 0, None)
            assert outcomes[job["job_id"]] == LeaseOutcome.RELEASED
        assert rows[third["job_id"]].state == JobState.LEASED
        assert outcomes[third["job_id"]] is None
        # Queued again at once: the next lease gets them, not one a TTL later.
        again = lease(c, other, 3)
        assert sorted(j["job_id"] for j in again) == sorted([first["job_id"], second["job_id"]])
        with pytest.raises(NotFoundError):
            api.release(999, [_held(third)])
        api.close()


def test_a_release_of_many_lease_tokens_is_one_transaction(db_url, monkeypatch):
    """A release request of up to 4,096 leases each under its own token ran one write
    transaction per token (2.2 s on SQLite; on PostgreSQL as many round trips on the event
    loop): one transaction now, releasing the leases that hold and no other."""
    with client_for(db_url) as c:
        api = WorkerApi(str(c.base_url), TOKEN, transport=c._transport)
        worker = register(c, "stopping")
        create_task(c, budget=3, strategy="grid")
        first, second, third = lease(c, worker, 3)
        db = service_of(c).db
        writes = []
        real_write = db.write

        def counted_write(*args, **kwargs):
            writes.append(1)
            return real_write(*args, **kwargs)

        monkeypatch.setattr(db, "write", counted_write)
        stale = [_held(first, token=f"stale-{i:04d}") for i in range(500)]
        released = api.release(worker, [*stale, _held(first), _held(second)], timeout_s=30)
        monkeypatch.undo()
        assert sorted(released) == sorted([first["job_id"], second["job_id"]])
        assert len(writes) == 1
        with db.write() as s:
            states = dict(s.execute(select(JobRow.id, JobRow.state)).all())
            outcomes = dict(s.execute(select(LeaseRow.job_id, LeaseRow.outcome)).all())
        assert states[first["job_id"]] == states[second["job_id"]] == JobState.QUEUED
        assert states[third["job_id"]] == JobState.LEASED and outcomes[third["job_id"]] is None
        assert outcomes[first["job_id"]] == outcomes[second["job_id"]] == LeaseOutcome.RELEASED
        api.close()


@pytest.mark.parametrize(
    "changed",
    [{"runner": "cupy"}, {"gpu": "a100"}, {"device_name": "NVIDIA H100 PCIe"}],
    ids=["runner kind", "gpu", "device"],
)
def test_a_worker_re_registered_as_another_kind_hands_back_its_leases(db_url, changed):
    """A simulated lease's result, posted after its worker's name re-registered as a GPU
    runner, was recorded as a `cupy` measurement (and an H100 job's result accepted from the
    name re-registered as an A100, a late result of the old process recorded as the device
    that took the name over): the leases of the worker it was are handed back at the
    re-registration, and a result under one is refused as stale, recording nothing."""
    with client_for(db_url) as c:
        worker = register(c, "w1")
        task = create_task(c, budget=3, strategy="grid")
        first, second = lease(c, worker, 2)
        assert register(c, "w1") == worker  # the same kind again: its leases stay
        with service_of(c).db.write() as s:
            assert s.get(JobRow, first["job_id"]).state == JobState.LEASED
        # (Its process said it exited: a live name is not registered as another kind.)
        exited = c.post(f"/v1/workers/{worker}/exit", headers=WORKER_HEADERS)
        assert exited.status_code == 204, exited.text
        register(c, "w1", **changed)
        with service_of(c).db.write() as s:
            rows = {r.id: r for r in s.execute(select(JobRow.id, JobRow.state, JobRow.attempts))}
            outcomes = dict(s.execute(select(LeaseRow.job_id, LeaseRow.outcome)).all())
        for job in (first, second):
            assert rows[job["job_id"]].state == JobState.QUEUED
            assert outcomes[job["job_id"]] == LeaseOutcome.RELEASED
        answer = post_result(c, worker, first, ok(12.0))
        assert answer.status_code in (200, 409), answer.text
        assert answer.status_code == 409 or not answer.json()["accepted"], answer.text
        trials = c.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
        assert [t for t in trials if t["latency_us"] is not None] == []


@pytest.mark.parametrize(
    "changed", [{"runner": "cupy"}, {"gpu": "a100"}], ids=["runner kind", "gpu"]
)
def test_a_live_name_is_not_registered_as_another_kind(db_url, changed):
    """Two processes under one --name: the second registered the worker as an A100 while
    the first, an H100's, still ran, and the first leased the A100 task's jobs under the
    shared id and had its timings recorded as the A100's. Refused while the name is live
    (409, saying when it can be), as another token's registration of it is."""
    with client_for(db_url) as c:
        worker = register(c, "w1")
        create_task(c, budget=3, strategy="grid")
        held = lease(c, worker, 2)
        body = {"name": "w1", "gpu": "h100", "arch": "sm_90", "runner": "simulated"} | changed
        if changed.get("gpu") == "a100":
            body["arch"] = "sm_80"
        refused = c.post("/v1/workers", json=body, headers=WORKER_HEADERS)
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert "'w1' is live, registered for gpu h100 and runner simulated" in detail
        assert "once it has been silent for the lease TTL" in detail and "--name" in detail
        listed = c.get("/v1/workers").json()["workers"]
        assert [(w["gpu"], w["runner"]) for w in listed] == [("h100", "simulated")]
        with service_of(c).db.write() as s:
            states = {s.get(JobRow, j["job_id"]).state for j in held}
        assert states == {JobState.LEASED}  # its leases are its own still
