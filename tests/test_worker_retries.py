"""The worker's retry loops (tenacity, workers/daemon/reporting.py): registering and leasing
go on with backoff through an unreachable or failing service, give up or stop as told, and
log what they wait for. No service: a fake API stands in for it."""

from __future__ import annotations

import io
import re
import threading
import time
from types import SimpleNamespace

import pytest

from pipetune.clients.sdk import (
    AuthError,
    ProtocolError,
    RetryLaterError,
    ServerError,
    ServiceUnavailableError,
)
from pipetune.model.wire import REQUEST_ID_PATTERN
from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import Worker

DOC = SimpleNamespace(
    id=7, name="w", gpu="h100", arch="sm_90", runner="simulated", name_in_use=None
)


class FakeApi:
    """Fails the first `failures` calls of each kind with `error`, then answers."""

    base_url = "http://fake"

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error = failures, error
        self.calls: dict[str, int] = {"register": 0, "lease": 0}

    def _call(self, kind: str, answer: object) -> object:
        self.calls[kind] += 1
        if self.calls[kind] <= self.failures:
            raise self.error
        return answer

    def register(self, body: object) -> object:
        return self._call("register", DOC)

    def lease(
        self,
        worker_id: int,
        max_jobs: int,
        wait_s: float,
        request_id: str | None = None,
        retry: bool = False,
    ) -> object:
        return self._call("lease", [])


def _job() -> object:
    """A leased job to report (job 1)."""
    import datetime as dt

    from pipetune.model.wire import JobLease, ScheduleDoc

    return JobLease(
        job_id=1,
        lease_token="token-0001",
        lease_expires_at=dt.datetime.now(dt.UTC),
        task_id=1,
        trial=0,
        workload={"op": "gemm", "m": 64, "n": 64, "k": 64},
        gpu="h100",
        schedule=ScheduleDoc(
            block_row_warps=2, block_col_warps=2, warp_row_tiles=2, warp_col_tiles=2,
            chunk=2, smem_stages=3, reg_stages=2,
        ),
    )  # fmt: skip


def _report_one(api: FakeApi, job: object, worker_id: int) -> Worker:
    """A busy worker of `worker_id`, the service up, that has reported `job` as ok once."""
    from pipetune.model.trials import MeasureResult

    api.down = 0  # type: ignore[attr-defined]
    worker, _ = _worker(api)
    worker.worker_id = worker_id
    worker._busy = 1
    worker._report_batch(api, [(job, MeasureResult(status="ok", latency_us=5.0))])  # type: ignore[arg-type]
    return worker


def _worker(api: FakeApi, **config: object) -> tuple[Worker, io.StringIO]:
    settings = {"server": "http://fake", "token": "t", "runner": "simulated", "gpu": "h100"}
    log = io.StringIO()
    worker = Worker(
        WorkerConfig(**{**settings, **config}),  # type: ignore[arg-type]
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=log),
        api_factory=lambda: api,  # type: ignore[arg-type,return-value]
    )
    return worker, log


def test_registering_waits_for_the_service_with_backoff():
    api = FakeApi(2, ServiceUnavailableError("http://fake", "connection refused"))
    worker, log = _worker(api, register_timeout_s=30)
    assert worker._register(api) is True  # type: ignore[arg-type]
    assert api.calls["register"] == 3 and worker.worker_id == 7
    assert "waiting_for_service" in log.getvalue() and "registered" in log.getvalue()


def test_registering_gives_up_after_its_timeout():
    api = FakeApi(100, ServiceUnavailableError("http://fake", "connection refused"))
    worker, _ = _worker(api, register_timeout_s=0)
    with pytest.raises(ServiceUnavailableError):
        worker._register(api)  # type: ignore[arg-type]
    assert api.calls["register"] == 1


def test_a_stop_ends_the_wait_for_the_service():
    api = FakeApi(100, ServiceUnavailableError("http://fake", "connection refused"))
    worker, _ = _worker(api, register_timeout_s=600)
    threading.Timer(0.3, worker._stop.set).start()
    started = time.monotonic()
    assert worker._register(api) is False  # type: ignore[arg-type]
    assert time.monotonic() - started < 3


def test_leasing_retries_a_failing_service_then_takes_its_answer():
    api = FakeApi(2, ServerError(503, "busy"))
    worker, log = _worker(api)
    worker.worker_id = 7
    assert worker._lease(api, 1) == []  # type: ignore[arg-type]
    assert api.calls["lease"] == 3
    assert log.getvalue().count("lease_failed") == 1  # throttled: one line, not one per retry


def test_leasing_stops_retrying_when_the_worker_stops():
    api = FakeApi(100, ServiceUnavailableError("http://fake", "connection refused"))
    worker, _ = _worker(api)
    worker.worker_id = 7
    threading.Timer(0.3, worker._stop.set).start()
    started = time.monotonic()
    assert worker._lease(api, 1) == []  # type: ignore[arg-type]
    assert time.monotonic() - started < 3 and api.calls["lease"] >= 1


def test_a_token_refused_mid_run_reaches_the_cli_as_the_refusal_it_is():
    """A worker token refused while leasing was wrapped in WorkerError, so `pipetune worker`
    said "the service refused to lease jobs" without naming --token or its variable (at
    start-up the same refusal did); the whole run, through the CLI's message."""
    from pipetune.clients.cli.remote import cli_error
    from pipetune.workers.daemon.config import TOKEN_ENV

    refused = AuthError(401, "a valid worker token required", method="POST", path="/v1/jobs/lease")
    api = FakeApi(0, refused)
    api.lease = lambda *args, **kwargs: (_ for _ in ()).throw(refused)  # type: ignore[method-assign]
    api.close = lambda: None  # type: ignore[attr-defined]
    worker, _ = _worker(api)
    with pytest.raises(AuthError) as caught:
        worker.run()
    message = str(cli_error(caught.value, credential=f"give --token or set {TOKEN_ENV}"))
    assert message.endswith(f"give --token or set {TOKEN_ENV}"), message


@pytest.mark.parametrize(
    "error",
    [
        RetryLaterError(429, "rate limited"),
        RetryLaterError(408, "request timeout"),
        ProtocolError("POST /v1/jobs/lease: the answer is not a LeaseResponse: <html>"),
    ],
)
def test_leasing_retries_a_proxys_429_408_or_garbled_answer(error):
    """One such answer from a proxy stopped the worker (exit 1): a 429 was a final refusal,
    a garbled 200 was not caught at all."""
    api = FakeApi(2, error)
    worker, _ = _worker(api)
    worker.worker_id = 7
    assert worker._lease(api, 1) == []  # type: ignore[arg-type]
    assert api.calls["lease"] == 3


def test_registering_does_not_retry_a_garbled_answer():
    """At registration a page that is not the API's more likely means --server names another
    program: said at once, not hidden behind retries."""
    api = FakeApi(1, ProtocolError("POST /v1/workers: the answer is not a WorkerDoc"))
    worker, _ = _worker(api, register_timeout_s=600)
    with pytest.raises(ProtocolError):
        worker._register(api)  # type: ignore[arg-type]
    assert api.calls["register"] == 1


class RestartedApi:
    """A service that goes down and comes back on a new database: the worker's id (7) is
    another worker's there (ids start again), and registering by name gives this one 2."""

    base_url = "http://fake"

    def __init__(self) -> None:
        self.down = 1  # lease requests refused before it is back
        self.leased_as: list[int] = []
        self.registered = 0

    def register(self, body: object) -> object:
        self.registered += 1
        return SimpleNamespace(**{**vars(DOC), "id": 2})

    def lease(
        self,
        worker_id: int,
        max_jobs: int,
        wait_s: float,
        request_id: str | None = None,
        retry: bool = False,
    ) -> object:
        if self.down:
            self.down -= 1
            raise ServiceUnavailableError("http://fake", "connection refused")
        self.leased_as.append(worker_id)
        return []


def test_after_an_outage_the_worker_registers_again_before_it_leases():
    """A service restarted on a new database gave the stale id 7 to another worker (of
    another GPU, maybe): leasing under it took that worker's jobs and recorded this worker's
    measurements as that GPU's. Registering again by name first gets the worker its own."""
    api = RestartedApi()
    worker, log = _worker(api)
    worker.worker_id = 7
    assert worker._lease(api, 1) == []  # type: ignore[arg-type]
    assert api.registered == 1 and api.leased_as == [2] and worker.worker_id == 2
    assert "registered" in log.getvalue()
    assert worker._lease(api, 1) == []  # type: ignore[arg-type]
    assert api.registered == 1  # once: the service has not failed since


def test_a_report_that_met_an_outage_leases_nothing_until_the_worker_registers_again():
    """The reporter leases with its reports: retried after an outage under the stale id,
    it too would take another worker's jobs."""
    from pipetune.model.wire import JobResultAck, JobResultAcks

    job = _job()
    asked: list[tuple[int, int]] = []  # (worker id, max_jobs) of each report sent

    class ReportApi(RestartedApi):
        def post_results_and_lease(
            self,
            worker_id: int,
            results: list,
            max_jobs: int = 0,
            request_id: str | None = None,
            retry: bool = False,
        ):
            asked.append((worker_id, max_jobs))
            if len(asked) == 1:
                raise ServiceUnavailableError("http://fake", "connection refused")
            ack = JobResultAck(job_id=1, status_code=200, accepted=True, job_state="done")
            return JobResultAcks(acks=[ack], jobs=[])

    api = ReportApi()
    worker = _report_one(api, job, worker_id=7)
    assert asked[0][1] > 0 and asked[1] == (7, 0)  # sent again, leasing nothing
    assert worker._lease_with_report(1) == 0
    worker._lease(api, 1)  # type: ignore[arg-type]
    assert api.registered == 1 and api.leased_as == [2] and worker._lease_with_report(1) > 0


def test_registering_again_on_the_same_database_says_nothing_of_a_name_in_use():
    """After an outage the worker registers again by name; on the same database it gets its
    own id back, and the name is "in use" by its own heartbeats: no warning of another
    process under the name. On a new database the id changes, and that is said."""
    api = RestartedApi()
    api.register = lambda body: SimpleNamespace(**{**vars(DOC), "name_in_use": True})  # type: ignore[method-assign]
    worker, log = _worker(api)
    worker.worker_id = 7
    worker._lease(api, 1)  # type: ignore[arg-type]
    assert api.leased_as == [7]
    assert "name_in_use" not in log.getvalue() and "registered_again" not in log.getvalue()
    moved = RestartedApi()
    worker, log = _worker(moved)
    worker.worker_id = 7
    worker._lease(moved, 1)  # type: ignore[arg-type]
    assert moved.leased_as == [2] and "registered_again" in log.getvalue()


def test_a_retry_after_longer_than_the_backoff_is_waited_out():
    """A proxy's 429 (or a 503) asking for 60 s was asked again after 0.5, 1, 2, 4 and then
    every 5 s: the header was never read. It is waited out now, up to MAX_RETRY_AFTER_S;
    a shorter one leaves the backoff as it is."""
    from pipetune.clients.sdk.errors import RetryLaterError, ServerError
    from pipetune.workers.daemon.reporting import MAX_RETRY_AFTER_S, call_with_retries

    errors = [
        RetryLaterError(429, "slow down", retry_after_s=60.0),
        ServerError(503, "later", retry_after_s=0.1),
        RetryLaterError(429, "much later", retry_after_s=86_400.0),
        ServerError(502, "no header"),
    ]
    waits: list[float] = []
    abort = threading.Event()

    def call() -> str:
        if errors:
            raise errors.pop(0)
        return "ok"

    def waited(attempt: int, exc: BaseException, wait_s: float) -> None:
        waits.append(wait_s)

    import pipetune.workers.daemon.reporting as reporting

    sleeps: list[float] = []
    original = reporting.Retrying

    class NoSleep(original):  # type: ignore[misc,valid-type]
        def __init__(self, **kwargs: object) -> None:
            kwargs["sleep"] = sleeps.append
            super().__init__(**kwargs)

    reporting.Retrying = NoSleep  # type: ignore[misc]
    try:
        assert call_with_retries(call, give_up_after_s=None, abort=abort, on_retry=waited) == "ok"
    finally:
        reporting.Retrying = original  # type: ignore[misc]
    assert waits == [60.0, 1.0, MAX_RETRY_AFTER_S, 4.0] == sleeps


def test_a_retry_after_longer_than_the_time_left_does_not_outlast_the_deadline():
    """A 503 asking for 300 s had a result (or the start) wait it out, then try once more,
    300 s past --result-retry (--register-timeout). The wait ends at the deadline."""
    from pipetune.clients.sdk.errors import ServerError
    from pipetune.workers.daemon.reporting import call_with_retries

    attempts = [0]

    def call() -> str:
        attempts[0] += 1
        raise ServerError(503, "later", retry_after_s=5.0)

    started = time.monotonic()
    with pytest.raises(ServerError):
        call_with_retries(call, give_up_after_s=0.5, abort=threading.Event())
    assert time.monotonic() - started < 2.0 and attempts[0] == 2


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), (" 0 ", 0.0), ("soon", None), ("-3", None), ("", None), (None, None)],
)
def test_retry_after_is_read_as_seconds(header, expected):
    from pipetune.clients.sdk.http import retry_after_s

    assert retry_after_s(header) == expected


def test_retry_after_as_an_http_date_is_read_as_seconds_from_now():
    import datetime as dt
    import email.utils

    from pipetune.clients.sdk.http import retry_after_s

    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=90)
    waited = retry_after_s(email.utils.format_datetime(later, usegmt=True))
    assert waited is not None and 85 <= waited <= 90
    past = email.utils.format_datetime(later - dt.timedelta(hours=1), usegmt=True)
    assert retry_after_s(past) == 0.0


def test_an_http_date_retry_after_is_counted_from_the_answers_date_not_this_clock():
    """A client whose clock is minutes off the server's (or its proxy's) waited what the
    difference with its own clock said: 10 minutes behind, a Retry-After 5 s past the
    answer's Date was a wait of 605 s (capped at MAX_RETRY_AFTER_S by the worker); ahead,
    no wait at all."""
    import datetime as dt
    import email.utils

    import httpx

    from pipetune.clients.sdk.errors import RetryLaterError
    from pipetune.clients.sdk.http import Http, retry_after_s

    for offset_s in (600.0, -600.0):  # the server's clock against this machine's
        server_now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)
        date = email.utils.format_datetime(server_now, usegmt=True)
        later = email.utils.format_datetime(server_now + dt.timedelta(seconds=5), usegmt=True)
        assert retry_after_s(later, date) == 5.0

        def answer(request: httpx.Request, date=date, later=later) -> httpx.Response:
            return httpx.Response(429, headers={"Retry-After": later, "Date": date})

        api = Http("http://fake", {}, transport=httpx.MockTransport(answer))
        with pytest.raises(RetryLaterError) as raised:
            api.request("GET", "/v1/tasks")
        assert raised.value.retry_after_s == 5.0
    assert retry_after_s(later, "not a date") is not None  # (this clock, as before)


def test_the_sdk_error_of_an_answer_carries_its_retry_after():
    import httpx

    from pipetune.clients.sdk.errors import RetryLaterError
    from pipetune.clients.sdk.http import Http

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "12"}, text="rate limited")

    api = Http("http://fake", {}, transport=httpx.MockTransport(answer))
    with pytest.raises(RetryLaterError) as raised:
        api.request("GET", "/v1/tasks")
    assert raised.value.retry_after_s == 12.0


def test_a_lease_and_its_retries_carry_one_request_id_and_the_next_lease_another():
    """The service answers a request sent again with its id with what the first one
    leased: the worker's retries after a lost answer must be that request again."""
    ids: list[str | None] = []
    retries: list[bool] = []

    class FlakyApi(RestartedApi):
        def lease(
            self,
            worker_id: int,
            max_jobs: int,
            wait_s: float,
            request_id: str | None = None,
            retry: bool = False,
        ) -> object:
            ids.append(request_id)
            retries.append(retry)
            return super().lease(worker_id, max_jobs, wait_s, request_id)

    api = FlakyApi()
    api.down = 2
    worker, _ = _worker(api)
    worker.worker_id = 2
    assert worker._lease(api, 1) == []  # type: ignore[arg-type]
    worker._lease(api, 1)  # type: ignore[arg-type]
    assert len(ids) == 4 and ids[0] is not None
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert retries == [False, True, True, False]
    assert re.fullmatch(REQUEST_ID_PATTERN, ids[3] or "")


def test_a_report_and_its_retries_carry_one_request_id():
    from pipetune.model.wire import JobResultAck, JobResultAcks

    job = _job()
    sent: list[str | None] = []
    retries: list[bool] = []

    class ReportApi(RestartedApi):
        def post_results_and_lease(
            self,
            worker_id: int,
            results: list,
            max_jobs: int = 0,
            request_id: str | None = None,
            retry: bool = False,
        ):
            sent.append(request_id)
            retries.append(retry)
            if len(sent) < 3:  # the answer lost on the way, twice
                raise ServiceUnavailableError("http://fake", "connection reset")
            ack = JobResultAck(job_id=1, status_code=200, accepted=True, job_state="done")
            return JobResultAcks(acks=[ack], jobs=[])

    api = ReportApi()
    _report_one(api, job, worker_id=2)
    assert len(sent) == 3 and sent[0] is not None and len(set(sent)) == 1
    assert retries == [False, True, True]
