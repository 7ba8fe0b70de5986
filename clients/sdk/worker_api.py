"""The worker side of the API (worker token): register, heartbeat, lease jobs, post results
(one at a time, or many in one request), hand back jobs it will not measure.

The worker daemon is its only user; it keeps one WorkerApi per thread (httpx clients are
not shared across threads here, so a long-polling lease never queues a heartbeat).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import httpx

from pipetune.clients.sdk.client import seconds_argument
from pipetune.clients.sdk.errors import ApiError, InvalidArgumentError
from pipetune.clients.sdk.http import DEFAULT_TIMEOUT_S, Http, M, header_value_problem
from pipetune.model.wire import (
    Heartbeat,
    HeartbeatAck,
    HeldLease,
    JobLease,
    JobResult,
    JobResultAck,
    JobResultAcks,
    JobResults,
    LeaseRelease,
    LeaseRequest,
    LeaseResponse,
    ReleaseAck,
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
        # A URL with a user and password (a proxy's basic auth in front of the service):
        # httpx sends them as the Authorization header, which replaced the bearer token (a
        # 401 "give --token", the token given); the service's own header carries it then.
        header = (
            {"X-Worker-Token": token}
            if httpx.URL(base_url).userinfo
            else {"Authorization": f"Bearer {token}"}
        )
        self._http = Http(base_url, header, timeout_s, transport)
        # Whether the service takes request ids (LeaseRequest.request_id): until one from
        # before them refuses the field (422), when they are left out from then on.
        self.request_ids = True

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

    def lease(
        self,
        worker_id: int,
        max_jobs: int = 1,
        wait_s: float = 10.0,
        request_id: str | None = None,
        retry: bool = False,
    ) -> list[JobLease]:
        """`request_id`: the same for the retries of one request, and `retry` on those (see
        LeaseRequest), so that a retry gets what a request whose answer was lost leased."""
        body = LeaseRequest(
            worker_id=worker_id,
            max_jobs=max_jobs,
            wait_s=wait_s,
            request_id=request_id,
            retry=retry,
        )
        return self._post_with_request_id(
            LeaseResponse,
            "/v1/jobs/lease",
            body.model_dump(mode="json"),
            timeout_s=wait_s + LEASE_TIMEOUT_MARGIN_S,
        ).jobs

    def _post_with_request_id(
        self, model: type[M], path: str, doc: dict[str, Any], timeout_s: float | None = None
    ) -> M:
        """POST `doc`, its `request_id` and `retry` left out where they are the defaults or
        the service does not take request ids (found out here: it refuses the field, and the
        request is sent again without them). A service from before the fields refuses them
        even at their defaults."""
        if doc.get("request_id") is None or not self.request_ids:
            doc.pop("request_id", None)
            doc.pop("retry", None)
        elif not doc.get("retry"):
            doc.pop("retry", None)
        try:
            return self._http.call(model, "POST", path, json=doc, timeout_s=timeout_s)
        except ApiError as exc:
            if "request_id" not in doc or exc.status_code != 422:
                raise
            if exc.field not in ("request_id", "retry"):
                raise
        self.request_ids = False
        doc.pop("request_id", None)
        doc.pop("retry", None)
        return self._http.call(model, "POST", path, json=doc, timeout_s=timeout_s)

    def post_result(self, job_id: int, body: JobResult) -> ResultAck:
        return self._http.call(
            ResultAck, "POST", f"/v1/jobs/{job_id}/result", json=body.model_dump(mode="json")
        )

    def post_results(self, worker_id: int, results: list[ReportedResult]) -> list[JobResultAck]:
        """Many results in one request; one answer per result, in order (`status_code` says
        what the single-job route would have answered for it)."""
        return self.post_results_and_lease(worker_id, results).acks

    def post_results_and_lease(
        self,
        worker_id: int,
        results: list[ReportedResult],
        max_jobs: int = 0,
        request_id: str | None = None,
        retry: bool = False,
    ) -> JobResultAcks:
        """`post_results`, and the worker's next lease in the same request: up to `max_jobs`
        queued jobs (`jobs` of the answer; none when nothing is queued, without waiting).
        `request_id` and `retry`: as `lease`'s, for those jobs; a retry with `max_jobs` 0
        gets the jobs the report it repeats leased and leases none new."""
        looks_back = retry and request_id is not None
        body = JobResults(
            worker_id=worker_id,
            results=results,
            max_jobs=max_jobs,
            request_id=request_id if max_jobs or looks_back else None,
            retry=looks_back,
        )
        doc = body.model_dump(mode="json")
        if not max_jobs:
            del doc["max_jobs"]  # as before the field existed: a service of then takes it
        return self._post_with_request_id(JobResultAcks, "/v1/jobs/results", doc)

    def release(
        self, worker_id: int, leases: list[HeldLease], timeout_s: float | None = None
    ) -> list[int]:
        """Hand back leased jobs the worker will not measure (it is stopping): the service
        queues them again at once, without counting an attempt. The ids of the jobs it
        released (a lease no longer the worker's is left as it is). A service from before
        the route answers 404 (NotFoundError): the leases then expire as before."""
        body = LeaseRelease(worker_id=worker_id, leases=leases).model_dump(mode="json")
        answer = self._http.call(
            ReleaseAck, "POST", "/v1/jobs/release", json=body, timeout_s=timeout_s
        )
        return answer.released

    def stopping(self, worker_id: int, timeout_s: float | None = None) -> None:
        """Say the worker is stopping: it leases nothing more. Its lease requests waiting
        on the service are answered empty now (those it sends later, at once, until it
        registers again). A service from before the route answers 404 (NotFoundError): a
        long-poll then runs its course, and may lease jobs that nobody reads."""
        self._http.request("POST", f"/v1/workers/{worker_id}/stopping", timeout_s=timeout_s)

    def exiting(self, worker_id: int, timeout_s: float | None = None) -> None:
        """Say the worker's process ends (after its last report and release): the service
        counts it live no more, and its name is free to a worker on another token at once,
        until it is heard from again. A service from before the route answers 404
        (NotFoundError): the worker is then live until its lease TTL has passed, as before."""
        self._http.request("POST", f"/v1/workers/{worker_id}/exit", timeout_s=timeout_s)

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
