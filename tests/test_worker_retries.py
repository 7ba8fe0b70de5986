"""The worker's retry loops (tenacity, workers/daemon/reporting.py): registering and leasing
go on with backoff through an unreachable or failing service, give up or stop as told, and
log what they wait for. No service: a fake API stands in for it."""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import pytest

from pipetune.clients.sdk import (
    ProtocolError,
    RetryLaterError,
    ServerError,
    ServiceUnavailableError,
)
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

    def lease(self, worker_id: int, max_jobs: int, wait_s: float) -> object:
        return self._call("lease", [])


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
