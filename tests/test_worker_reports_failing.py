"""A worker whose results route fails while its leases go through (a proxy that refuses
`POST /v1/jobs/results`, a database that takes no writes): it leased, measured and dropped
job after job, every result lost past --result-retry and every job's lease left to expire.
Leasing now waits while reports fail; the reporter sends a result again every
REPORT_PROBE_S to learn when the route is back, and leasing resumes then. No service: a
fake API stands in for it."""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import pytest
from worker_support import OK, REGISTERED, leased_job, run_in_thread, wait_until

from pipetune.clients.sdk import AuthError, ServerError
from pipetune.model.wire import JobResultAck, JobResultAcks
from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import EXIT_UNREPORTED, Worker


class ResultsDown:
    """Leases what a request asks for, up to `limit` in all (then none, after a short wait:
    a long-poll that found nothing); results fail with a 503 while `down`, and are recorded
    once up (a result sent again is answered as recorded: idempotent)."""

    base_url = "http://fake"

    def __init__(self, down: bool, limit: int = 1000) -> None:
        self.down = down
        self.limit = limit
        self.leased: list[int] = []
        self.posted: list[list[int]] = []  # the job ids of each report that got through
        self.failed: list[list[int]] = []  # ... and of each that did not
        self.lease_asks_with_reports: list[int] = []  # max_jobs of each that got through
        self.exits = 0  # POST /v1/workers/{id}/exit

    def register(self, body: object) -> object:
        return REGISTERED

    def lease(self, worker_id, max_jobs, wait_s, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        if len(self.leased) >= self.limit:
            time.sleep(0.3)
            return []
        first = len(self.leased) + 1
        self.leased += list(range(first, min(first + max_jobs, self.limit + 1)))
        return [leased_job(i) for i in range(first, len(self.leased) + 1)]

    def post_results_and_lease(self, worker_id, results, max_jobs=0, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        ids = [r.job_id for r in results]
        if not self.down:
            self.lease_asks_with_reports.append(max_jobs)
        if self.down:
            self.failed.append(ids)
            raise ServerError(503, "results route down")
        self.posted.append(ids)
        acks = [
            JobResultAck(job_id=i, status_code=200, accepted=True, job_state="done") for i in ids
        ]
        return JobResultAcks(acks=acks, jobs=[])

    def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
        return SimpleNamespace(ok=True, gone=[])

    def release(self, worker_id, leases, timeout_s=None):  # type: ignore[no-untyped-def]
        return [h.job_id for h in leases]

    def exiting(self, worker_id, timeout_s=None):  # type: ignore[no-untyped-def]
        self.exits += 1

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _quick_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipetune.workers.daemon.worker as worker_module

    monkeypatch.setattr(worker_module, "REPORT_PROBE_S", 0.05)


def _worker(api: ResultsDown, concurrency: int = 1) -> tuple[Worker, io.StringIO]:
    """One slot (or `concurrency`), nothing leased ahead; a result is given up on at its
    first failure (--result-retry 0); trials recorded, not run."""
    settings = {"server": "http://fake", "token": "t", "runner": "simulated", "gpu": "h100"}
    log = io.StringIO()
    worker = Worker(
        WorkerConfig(
            **settings, concurrency=concurrency, lease_ahead=0, result_retry_s=0, heartbeat_s=60
        ),  # type: ignore[arg-type]
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=log),
        api_factory=lambda: api,  # type: ignore[arg-type,return-value]
    )
    worker._measure_one = lambda workload, schedule: OK  # type: ignore[method-assign]
    return worker, log


def _stop(worker: Worker, runner: threading.Thread) -> None:
    worker.request_stop()
    runner.join(5)
    assert not runner.is_alive(), "the worker did not stop"


def test_leasing_waits_while_reports_fail_and_resumes_when_one_gets_through():
    api = ResultsDown(down=True)
    worker, log = _worker(api)
    runner, status = run_in_thread(worker)
    try:
        assert wait_until(lambda: worker.counts["unreported"] >= 1)
        assert wait_until(lambda: len(api.failed) >= 3)  # the report, then probes
        time.sleep(0.2)  # (time for more leases)
        assert api.leased == [1], "leased on while its results were lost"
        assert worker._reports_failing_since is not None and "leasing_paused" in log.getvalue()
        assert set(map(tuple, api.failed)) == {(1,)}  # (the result given up on, again)
        api.down = False  # the route is back: the next probe gets through
        assert wait_until(lambda: worker.counts["accepted"] >= 4)
        assert "leasing_resumed" in log.getvalue() and len(api.leased) >= 4
    finally:
        _stop(worker, runner)
    # The result given up on, sent again by the probe, was recorded after all.
    assert api.posted[0] == [1] and "result_delivered_late" in log.getvalue()
    assert "unreported" not in worker.counts and status == [0]


def test_a_probe_sends_again_the_last_result_the_service_acknowledged():
    """Sent again, a recorded result is answered as already recorded: the probe cannot fail
    because of a result (one the service cannot take, which would end no outage)."""
    api = ResultsDown(down=False, limit=1)
    worker, log = _worker(api)
    runner, status = run_in_thread(worker)
    try:
        assert wait_until(lambda: worker.counts["accepted"] == 1)
        api.down, api.limit = True, 2
        assert wait_until(lambda: worker.counts["unreported"] == 1)  # job 2's
        assert wait_until(lambda: len(api.failed) >= 3)  # then probes
        assert api.leased == [1, 2]
        assert api.failed[0] == [2] and {tuple(f) for f in api.failed[1:]} == {(1,)}
        api.down = False
        assert wait_until(lambda: "leasing_resumed" in log.getvalue())
        assert wait_until(lambda: len(api.posted) >= 3)
        assert api.posted[1] == [1]  # the probe
    finally:
        _stop(worker, runner)
    # Job 2's result, given up on in the outage, is sent again once reports get through (it
    # was left to its lease, which used up an attempt of its job).
    assert api.posted[2] == [2] and "resending" in log.getvalue()
    assert "unreported" not in worker.counts and status == [0]


def test_results_given_up_on_are_sent_again_when_reports_get_through():
    # Three jobs measured and their results given up on while the route is down (the
    # worker holds three slots); one probe brings the route back, and the three are sent
    # again in one report that leases nothing (they free no slot).
    api = ResultsDown(down=True, limit=3)
    worker, _ = _worker(api, concurrency=3)
    runner, status = run_in_thread(worker)
    try:
        assert wait_until(lambda: worker.counts["unreported"] == 3)
        api.down = False
        assert wait_until(lambda: sorted(i for ids in api.posted for i in ids) == [1, 2, 3])
        assert wait_until(lambda: worker.counts["accepted"] == 3)
    finally:
        _stop(worker, runner)
    assert api.lease_asks_with_reports == [0] * len(api.posted)
    assert "unreported" not in worker.counts and status == [0] and api.leased == [1, 2, 3]


def test_a_worker_waiting_for_its_reports_stops_when_told():
    api = ResultsDown(down=True)
    worker, log = _worker(api)
    runner, status = run_in_thread(worker)
    assert wait_until(lambda: worker.counts["unreported"] >= 1)
    started = time.monotonic()
    _stop(worker, runner)
    assert time.monotonic() - started < 2
    assert status == [EXIT_UNREPORTED] and api.leased == [1]
    # Nor does it say its exit to a service whose results route does not answer (one more
    # request that would fail; the worker stays live for a TTL there, as before).
    assert api.exits == 0
    # Its line says that the results are retried, and that a second signal stops without
    # them (a supervisor's kill came first, without a word of why it had not stopped).
    assert "a second signal stops without them" in log.getvalue()


def test_a_worker_whose_token_a_report_finds_refused_stops_with_the_refusal():
    """The service came back without the worker's token: the 401 on a report read as "a
    report got through", leasing resumed and the worker measured another trial before its
    next lease was refused. It now stops leasing at once, and run() raises the refusal (the
    CLI says which credential was refused, exit 1)."""
    api = ResultsDown(down=True)
    worker, log = _worker(api)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except AuthError as exc:
            raised.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    assert wait_until(lambda: len(api.failed) >= 2)  # reports fail: leasing waits

    def refused(*args: object, **kwargs: object) -> None:
        raise AuthError(401, "a valid worker token required")

    api.post_results_and_lease = refused  # type: ignore[method-assign]
    runner.join(5)
    assert not runner.is_alive(), "the worker did not stop"
    assert len(raised) == 1 and raised[0].status_code == 401  # type: ignore[attr-defined]
    assert "token_refused" in log.getvalue() and "leasing_resumed" not in log.getvalue()
    assert api.leased == [1]  # nothing leased after the refusal
