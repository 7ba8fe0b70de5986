"""The worker side of the API (worker token): register, heartbeat, lease jobs, post results
(one at a time, or many in one request).

The worker daemon is its only user; it keeps one WorkerApi per thread (httpx clients are
not shared across threads here, so a long-polling lease never queues a heartbeat).
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import httpx

from pipetune.clients.sdk.client import seconds_argument
from pipetune.clients.sdk.errors import InvalidArgumentError
from pipetune.clients.sdk.http import DEFAULT_TIMEOUT_S, Http, header_value_problem
from pipetune.model.wire import (
    Heartbeat,
    HeartbeatAck,
    HeldLease,
    JobLease,
    JobResult,
    JobResultAck,
    JobResultAcks,
    JobResults,
    LeaseRequest,
    LeaseResponse,
    ReportedResult,
    ResultAck,
    WorkerDoc,
    WorkerRegister,
)

# A long-polled lease may legitimately take wait_s; the HTTP timeout must outlast it.
LEASE_TIMEOUT_MARGIN_S = 15.0


class WorkerApi:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        # As Client's credentials: refused here, naming the argument and never the value.
        if problem := header_value_problem(token):
            raise InvalidArgumentError("token", problem)
        timeout_s = seconds_argument("timeout_s", timeout_s)  # as Client's
        self._http = Http(base_url, {"Authorization": f"Bearer {token}"}, timeout_s, transport)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def register(self, body: WorkerRegister) -> WorkerDoc:
        return self._http.call(WorkerDoc, "POST", "/v1/workers", json=body.model_dump(mode="json"))

    def heartbeat(
        self, worker_id: int, busy_jobs: int = 0, leases: list[HeldLease] | None = None
    ) -> HeartbeatAck:
        """`leases`: the leases the worker holds, the only ones extended (None: all)."""
        body = Heartbeat(busy_jobs=busy_jobs, leases=leases).model_dump(
            mode="json", exclude_none=True
        )
        return self._http.call(
            HeartbeatAck, "POST", f"/v1/workers/{worker_id}/heartbeat", json=body
        )

    def lease(self, worker_id: int, max_jobs: int = 1, wait_s: float = 10.0) -> list[JobLease]:
        body = LeaseRequest(worker_id=worker_id, max_jobs=max_jobs, wait_s=wait_s)
        return self._http.call(
            LeaseResponse,
            "POST",
            "/v1/jobs/lease",
            json=body.model_dump(mode="json"),
            timeout_s=wait_s + LEASE_TIMEOUT_MARGIN_S,
        ).jobs

    def post_result(self, job_id: int, body: JobResult) -> ResultAck:
        return self._http.call(
            ResultAck, "POST", f"/v1/jobs/{job_id}/result", json=body.model_dump(mode="json")
        )

    def post_results(self, worker_id: int, results: list[ReportedResult]) -> list[JobResultAck]:
        """Many results in one request; one answer per result, in order (`status_code` says
        what the single-job route would have answered for it)."""
        return self.post_results_and_lease(worker_id, results).acks

    def post_results_and_lease(
        self, worker_id: int, results: list[ReportedResult], max_jobs: int = 0
    ) -> JobResultAcks:
        """`post_results`, and the worker's next lease in the same request: up to `max_jobs`
        queued jobs (`jobs` of the answer; none when nothing is queued, without waiting)."""
        body = JobResults(worker_id=worker_id, results=results, max_jobs=max_jobs)
        doc = body.model_dump(mode="json")
        if not max_jobs:
            del doc["max_jobs"]  # as before the field existed: a service of then takes it
        return self._http.call(JobResultAcks, "POST", "/v1/jobs/results", json=doc)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
