"""`POST /v1/jobs/release`, through the worker's SDK (WorkerApi.release): a stopping worker
hands back the jobs it will not measure, which are queued again at once without using an
attempt (left to their leases they waited out the TTL, an attempt used each). Only the
worker's own current leases: another worker's, or a lease that is not the job's, is left as
it is."""

from __future__ import annotations

import pytest
from service_support import TOKEN, client_for, create_task, lease, register, service_of
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
