"""A lease request sent again with its request id, as a retry, gets the jobs the first one
leased, on both databases: an answer lost on the way (a connection reset, a proxy's
timeout) followed by the worker's retry left the first jobs leased to a worker that never
got them until their TTL, and used up one of their attempts."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from service_support import (
    TOKEN,
    WORKER_HEADERS,
    after_the_newest_lease,
    client_for,
    create_task,
    metric_value,
    ok,
    register,
    service_of,
)
from sqlalchemy import func, select

from pipetune.service.orm import LeaseRow

pytest_plugins = ["service_fixtures"]


def _lease(
    c,
    worker: int,
    max_jobs: int,
    request_id: str | None = None,
    wait_s: float = 0,
    retry: bool = False,
):
    body = {"worker_id": worker, "max_jobs": max_jobs, "wait_s": wait_s}
    if request_id is not None:
        body["request_id"] = request_id
    if retry:
        body["retry"] = True
    r = c.post("/v1/jobs/lease", json=body, headers=WORKER_HEADERS)
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def _held(jobs: list[dict]) -> list[tuple[int, str]]:
    return [(j["job_id"], j["lease_token"]) for j in jobs]


def _leases(c) -> int:
    with service_of(c).db.write() as s:
        return s.scalar(select(func.count()).select_from(LeaseRow))


def test_a_lease_request_sent_again_with_its_id_gets_what_the_first_leased(db_url):
    with client_for(db_url) as c:
        worker, other = register(c, "w"), register(c, "other")
        create_task(c, budget=6, strategy="grid")
        first = _lease(c, worker, 2, "lease-0001")
        assert len(first) == 2
        again = _lease(c, worker, 2, "lease-0001", retry=True)  # the first answer was lost
        assert _held(again) == _held(first)
        assert _leases(c) == 2  # nothing more was leased
        metrics = c.get("/metrics").text  # and counted once
        assert metric_value(metrics, "pipetune_jobs_leased_total", gpu="h100") == 2.0
        # The same id from another worker is another request.
        theirs = _lease(c, other, 2, "lease-0001", retry=True)
        assert len(theirs) == 2 and not {j["job_id"] for j in theirs} & {j["job_id"] for j in first}
        # A new id leases anew; no id, as before the field, too.
        assert len(_lease(c, worker, 1, "lease-0002")) == 1
        assert len(_lease(c, worker, 1)) == 1
        assert _leases(c) == 6
        # Once the first jobs are no longer leased to the worker (their results recorded),
        # the id finds nothing of them, and leases what is queued (nothing here).
        for job in first:
            body = {"worker_id": worker, "lease_token": job["lease_token"], "result": ok(10.0)}
            r = c.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS)
            assert r.status_code == 200 and r.json()["accepted"]
        assert _lease(c, worker, 2, "lease-0001", retry=True) == []


def test_the_same_id_without_retry_is_a_new_request(db_url):
    """Only a retry looks for earlier jobs (a first request costs no more than before)."""
    with client_for(db_url) as c:
        worker = register(c, "w")
        create_task(c, budget=4, strategy="grid")
        first = _lease(c, worker, 2, "lease-0001")
        after_the_newest_lease(c)  # (a new request within SQLite's millisecond is the same)
        second = _lease(c, worker, 2, "lease-0001")
        assert len(second) == 2 and not set(_held(first)) & set(_held(second))
        # A retry repeats the newest request under the id: its jobs, never more than max_jobs
        # (it got both requests' jobs, 4 for max_jobs 2).
        assert sorted(_held(_lease(c, worker, 2, "lease-0001", retry=True))) == sorted(
            _held(second)
        )


def test_a_retry_looks_back_even_where_the_queue_is_known_empty(db_url):
    """The replica remembers that a kind of worker's queue is empty and skips the claim
    statement then; the jobs a retried request is after are not in the queue."""
    with client_for(db_url, lease_poll_s=60) as c:
        worker = register(c, "w")
        create_task(c, budget=2, strategy="grid")
        first = _lease(c, worker, 2, "lease-0001")
        assert _lease(c, worker, 2) == []  # the queue is empty now, and known to be
        assert _held(_lease(c, worker, 2, "lease-0001", wait_s=5, retry=True)) == _held(first)


def test_a_report_sent_again_with_its_id_gets_the_jobs_it_leased(db_url):
    with client_for(db_url) as c:
        worker = register(c, "w")
        create_task(c, budget=4, strategy="grid")
        (job,) = _lease(c, worker, 1)
        body = {
            "worker_id": worker,
            "results": [
                {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": ok(9.0)}
            ],
            "max_jobs": 2,
            "request_id": "report-0001",
        }
        answers = [
            c.post("/v1/jobs/results", json=b, headers=WORKER_HEADERS)
            for b in (body, {**body, "retry": True})
        ]
        assert [a.status_code for a in answers] == [200, 200]
        first, again = (a.json() for a in answers)
        assert len(first["jobs"]) == 2 and _held(again["jobs"]) == _held(first["jobs"])
        assert again["acks"][0]["detail"] == "duplicate: already recorded"
        assert _leases(c) == 3


@pytest.mark.parametrize("request_id", ["short", "has space1", "x" * 65, 7])
def test_a_request_id_of_the_wrong_form_is_a_422_naming_it(client, request_id):
    worker = register(client, "w")
    for path, body in (
        ("/v1/jobs/lease", {"worker_id": worker, "wait_s": 0}),
        ("/v1/jobs/results", {"worker_id": worker, "results": [], "max_jobs": 1}),
    ):
        r = client.post(path, json={**body, "request_id": request_id}, headers=WORKER_HEADERS)
        assert r.status_code == 422
        fields = [e["loc"][-1] for e in r.json()["detail"]]
        assert "request_id" in fields, r.text


def test_a_retry_without_a_request_id_is_a_422_naming_retry(client):
    worker = register(client, "w")
    result = {"job_id": 1, "lease_token": "token-0001", "result": ok(1.0)}
    for path, body in (
        ("/v1/jobs/lease", {"worker_id": worker, "wait_s": 0}),
        ("/v1/jobs/results", {"worker_id": worker, "results": [result], "max_jobs": 1}),
    ):
        r = client.post(path, json={**body, "retry": True}, headers=WORKER_HEADERS)
        assert r.status_code == 422 and r.json()["field"] == "retry", r.text


class _AnswersLost(httpx.BaseTransport):
    """The service in process (a TestClient's transport), but the answer of the first
    request to `path` is lost on the way back: the service did the work, the worker sees a
    connection reset."""

    def __init__(self, inner: httpx.BaseTransport, path: str):
        self.inner, self.path, self.lost = inner, path, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == self.path and not self.lost:
            self.lost += 1
            response.read()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def _daemon(api):
    import io

    from pipetune.workers.daemon import EventLog, WorkerConfig
    from pipetune.workers.daemon.gpu import describe_model_gpu
    from pipetune.workers.daemon.worker import Worker

    config = {"server": api.base_url, "token": TOKEN, "runner": "simulated", "gpu": "h100"}
    return Worker(
        WorkerConfig(**config),  # type: ignore[arg-type]
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=io.StringIO()),
        api_factory=lambda: api,
    )


def test_the_worker_daemon_gets_the_jobs_of_a_lease_answer_lost_on_the_way(db_url):
    """The daemon's lease request claimed two jobs and its answer was lost: its retry gets
    those two, and they are measured now, not queued again after their TTL (120 s)."""
    from pipetune.clients.sdk.worker_api import WorkerApi

    with client_for(db_url) as c:
        create_task(c, budget=4, strategy="grid")
        transport = _AnswersLost(c._transport, "/v1/jobs/lease")
        api = WorkerApi(str(c.base_url), TOKEN, transport=transport)
        worker = _daemon(api)
        assert worker._register(api)
        jobs = worker._lease(api, 2)
        assert transport.lost == 1 and len(jobs) == 2
        assert _leases(c) == 2  # the retry leased nothing more
        with service_of(c).db.write() as s:
            leased = s.execute(
                select(LeaseRow.job_id, LeaseRow.token).where(LeaseRow.outcome.is_(None))
            ).all()
        assert sorted(leased) == sorted((j.job_id, j.lease_token) for j in jobs)


def test_a_report_retried_for_none_new_gets_what_its_lost_answer_leased(db_url):
    """A worker that will register again first (after an outage) asks its retried report
    for no new jobs; it still gets the ones the lost answer held (and nothing more)."""
    with client_for(db_url) as c:
        worker = register(c, "w")
        create_task(c, budget=4, strategy="grid")
        (job,) = _lease(c, worker, 1)
        item = {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": ok(9.0)}
        body = {"worker_id": worker, "results": [item], "request_id": "report-0001"}
        lost = c.post("/v1/jobs/results", json={**body, "max_jobs": 2}, headers=WORKER_HEADERS)
        assert len(lost.json()["jobs"]) == 2
        again = c.post(
            "/v1/jobs/results", json={**body, "max_jobs": 0, "retry": True}, headers=WORKER_HEADERS
        )
        assert _held(again.json()["jobs"]) == _held(lost.json()["jobs"])
        assert _leases(c) == 3
        # With nothing earlier, such a retry leases nothing.
        other = {**body, "request_id": "report-0002", "max_jobs": 0, "retry": True}
        assert c.post("/v1/jobs/results", json=other, headers=WORKER_HEADERS).json()["jobs"] == []
        assert _leases(c) == 3


def test_the_worker_daemon_gets_the_jobs_of_a_report_answer_lost_on_the_way(db_url):
    """The daemon's report leased jobs and its answer was lost: the retry (which asks for no
    new jobs: the worker registers again after a failure) gets those jobs for the worker's
    pool; they were left leased until their TTL."""
    from pipetune.clients.sdk.worker_api import WorkerApi
    from pipetune.model.trials import MeasureResult
    from pipetune.model.wire import JobLease

    with client_for(db_url) as c:
        create_task(c, budget=4, strategy="grid")
        transport = _AnswersLost(c._transport, "/v1/jobs/results")
        api = WorkerApi(str(c.base_url), TOKEN, transport=transport)
        worker = _daemon(api)
        assert worker._register(api)
        (job,) = api.lease(worker.worker_id, 1, wait_s=0)
        handed: list[JobLease] = []
        worker._pool = SimpleNamespace(submit=lambda _fn, unit: handed.extend(unit))
        worker._busy = 2  # (another job in hand: the report leases ahead, capacity 3)
        worker._report_batch(api, [(job, MeasureResult(status="ok", latency_us=5.0))])
        assert transport.lost == 1 and len(handed) == 2  # what the lost answer leased
        assert _leases(c) == 3  # the first lease, and those two: nothing more
        with service_of(c).db.write() as s:
            live = s.execute(
                select(LeaseRow.job_id, LeaseRow.token).where(LeaseRow.outcome.is_(None))
            ).all()
        assert sorted(live) == sorted((j.job_id, j.lease_token) for j in handed)
