"""A worker stopping while its long-poll is in flight (`POST /v1/jobs/lease`, up to
--lease-wait): it does not wait for the poll, and the jobs the poll brings after the stop are
handed back to the service at once (`POST /v1/jobs/release`), not measured (a draining
worker measured them) nor left to their leases (one stopping after the current trial did:
each waited out its TTL and used up an attempt). No service: a fake API stands in for it,
whose lease request waits until the test answers it."""

from __future__ import annotations

import io
import json
import threading
import time
from types import SimpleNamespace

import pytest
from worker_support import OK, REGISTERED, leased_job, run_in_thread, wait_until

from pipetune.clients.sdk import NotFoundError, ServiceUnavailableError
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobLease, JobResultAck, JobResultAcks
from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import Worker, WorkerError
from pipetune.workers.runners.base import RunnerUnavailableError


class PollingService:
    """The first lease request waits until the test answers it (`answer`) with `jobs`;
    later ones wait until the test ends. Results are accepted, releases recorded."""

    base_url = "http://fake"

    def __init__(self, jobs: list[JobLease]) -> None:
        self.jobs = jobs
        self.polling = threading.Event()  # a lease request is in flight
        self.answer = threading.Event()
        self.ended = threading.Event()  # the test is over: every request answers
        self.leases = 0
        self.released: list[tuple[int, str]] = []
        self.release_calls = threading.Event()
        self.reported: list[int] = []
        self.hears_stop = False
        self.stop_notices = 0

    def register(self, body: object) -> object:
        return REGISTERED

    def lease(self, worker_id, max_jobs, wait_s, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        self.leases += 1
        first = self.leases == 1
        self.polling.set()
        (self.answer if first else self.ended).wait(10)
        return self.jobs if first else []

    def stopping(self, worker_id, timeout_s=None):  # type: ignore[no-untyped-def]
        """A service from before `POST /v1/workers/{id}/stopping` (404), unless the test
        says it hears it (`hears_stop`): then the poll in flight is answered at once."""
        assert worker_id == REGISTERED.id and timeout_s is not None and timeout_s <= 10
        self.stop_notices += 1
        if not self.hears_stop:
            raise NotFoundError(404, "Not Found", method="POST", path="/v1/workers/7/stopping")
        self.answer.set()

    def release(self, worker_id, leases, timeout_s=None):  # type: ignore[no-untyped-def]
        assert worker_id == REGISTERED.id and timeout_s is not None and timeout_s <= 10
        self.released += [(h.job_id, h.lease_token) for h in leases]
        self.release_calls.set()
        return [h.job_id for h in leases]

    def post_results_and_lease(self, worker_id, results, max_jobs=0, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        self.reported += [r.job_id for r in results]
        acks = [
            JobResultAck(job_id=r.job_id, status_code=200, accepted=True, job_state="done")
            for r in results
        ]
        return JobResultAcks(acks=acks, jobs=[])

    def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
        return SimpleNamespace(ok=True, gone=[])

    def close(self) -> None:
        pass


def _worker(api: PollingService, **config: object) -> tuple[Worker, list[int]]:
    """A worker (leasing up to 3 jobs) whose measurements are recorded, not run."""
    settings = {"server": "http://fake", "token": "t", "runner": "simulated", "gpu": "h100"}
    worker = Worker(
        WorkerConfig(
            **{**settings, "concurrency": 1, "lease_ahead": 2, "lease_wait_s": 30, **config}  # type: ignore[arg-type]
        ),
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=io.StringIO()),
        api_factory=lambda: api,  # type: ignore[arg-type,return-value]
    )
    measured: list[int] = []
    worker._measure_one = lambda workload, schedule: measured.append(1) or OK  # type: ignore[method-assign]
    return worker, measured


def _stopped_mid_poll(api: PollingService, join_s: float):  # type: ignore[no-untyped-def]
    """An idle worker (--lease-wait 30) stopped while its first poll waits, and up to
    `join_s` for run() to return: the worker, what it measured, its thread and status, and
    when the stop was asked for."""
    worker, measured = _worker(api, lease_wait_s=30)
    runner, status = run_in_thread(worker)
    assert api.polling.wait(5)
    started = time.monotonic()
    worker.request_stop()
    runner.join(join_s)
    return worker, measured, runner, status, started


def test_jobs_a_poll_brings_after_the_first_signal_are_handed_back_not_measured():
    """(a) Draining, the worker measured the jobs a poll in flight at the SIGTERM brought
    after it: a stop that kept taking work."""
    api = PollingService([leased_job(1), leased_job(2)])
    worker, measured = _worker(api)
    runner, status = run_in_thread(worker)
    try:
        assert api.polling.wait(5)
        worker.request_stop()
        assert wait_until(worker._stop.is_set)  # draining: the main thread saw the signal
        api.answer.set()  # the poll in flight answers after the stop
        api.release_calls.wait(3)
        runner.join(5)
        assert not runner.is_alive() and status == [0]
        assert measured == [] and api.reported == []
        assert sorted(api.released) == [(1, "token-0001"), (2, "token-0002")]
        assert worker.counts["released"] == 2 and worker.counts["handed_back"] == 2
        assert worker._busy == 0 and not worker._held
    finally:
        api.answer.set()
        api.ended.set()


def test_jobs_a_poll_brings_after_a_second_signal_are_handed_back_not_left_to_expire():
    """(b) After a second signal (or --parent-pid's parent gone, which counts as two) they
    were abandoned: held until their leases expired, an attempt used each."""
    api = PollingService([leased_job(1), leased_job(2)])
    worker, measured = _worker(api)
    runner, status = run_in_thread(worker)
    try:
        assert api.polling.wait(5)
        worker.request_stop()
        worker.request_stop()
        assert wait_until(worker._abort.is_set)
        api.answer.set()
        api.release_calls.wait(3)
        runner.join(5)
        assert not runner.is_alive() and status == [0]
        assert measured == []
        assert sorted(api.released) == [(1, "token-0001"), (2, "token-0002")]
        assert "abandoned" not in worker.counts
    finally:
        api.answer.set()
        api.ended.set()


def test_a_signal_the_lease_thread_sees_first_is_still_said_as_draining():
    """The lease thread turns a counted signal into a stop (`_stopping`) and the worker's
    serve loop then sets the stop itself, often before the main thread looks (every 0.2 s):
    the "draining" event was then never logged, though the worker drained (seen in CI: a
    SIGTERM 0.1 s after registering, jobs finished, no word of it)."""
    worker, _ = _worker(PollingService([]))
    stream = io.StringIO()
    worker.log = EventLog(json_lines=True, stream=stream)
    worker.request_stop()
    worker._stop.set()  # (as _serve's finally does once the lease loop ends)
    worker._handle_signals()
    worker._handle_signals()  # (the same signal: said once)
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["draining"]
    worker.request_stop()
    worker._handle_signals()
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["draining", "aborting"]


def test_an_idle_worker_stops_without_waiting_out_its_long_poll():
    """(c) A blocked read cannot be interrupted: an idle worker took up to --lease-wait
    (here 30 s) to exit after SIGTERM. It exits at once; the poll, should it answer before
    the process ends (or in a process that runs the worker in-process), has its jobs
    handed back."""
    api = PollingService([leased_job(3)])
    worker, measured, runner, status, started = _stopped_mid_poll(api, join_s=3)
    try:
        assert not runner.is_alive(), "still waiting for the long-poll to answer"
        assert status == [0] and time.monotonic() - started < 2
        assert api.leases == 1  # no lease request after the stop
        api.answer.set()  # the poll answers after run() returned
        assert api.release_calls.wait(3)
        assert api.released == [(3, "token-0003")] and measured == []
        assert wait_until(lambda: worker._busy == 0)
    finally:
        api.answer.set()
        api.ended.set()


def test_a_service_told_of_the_stop_answers_the_poll_and_its_jobs_go_back_before_the_exit():
    """(d) Told that the worker stops (`POST /v1/workers/{id}/stopping`), the service answers
    the poll in flight at once: the worker waits for that answer and hands back what it
    brought before run() returns. Before, it exited with the poll open, and the jobs the
    poll took as the process ended were never read (each waited out its lease TTL)."""
    api = PollingService([leased_job(4), leased_job(5)])
    api.hears_stop = True
    worker, measured, runner, status, started = _stopped_mid_poll(api, join_s=5)
    try:
        assert not runner.is_alive() and status == [0]
        assert time.monotonic() - started < 3
        assert api.stop_notices == 1 and api.leases == 1
        # Handed back before run() returned, not by a thread left behind.
        assert sorted(api.released) == [(4, "token-0004"), (5, "token-0005")]
        assert measured == [] and worker._busy == 0 and not worker._held
    finally:
        api.answer.set()
        api.ended.set()


def test_jobs_not_started_after_a_second_signal_are_handed_back():
    """A second signal stops after the current trial: the jobs waiting behind it were left
    to their leases. They are handed back in one request once the trial is over."""
    api = PollingService([leased_job(1), leased_job(2), leased_job(3)])
    api.answer.set()  # the first poll answers at once with three jobs
    worker, measured = _worker(api)
    inside, finish = threading.Event(), threading.Event()

    def slow(workload: object, schedule: object) -> MeasureResult:
        inside.set()
        assert finish.wait(10)
        measured.append(1)
        return OK

    worker._measure_one = slow  # type: ignore[method-assign]
    runner, status = run_in_thread(worker)
    try:
        assert inside.wait(5)  # job 1 is being measured, 2 and 3 wait
        worker.request_stop()
        worker.request_stop()
        assert wait_until(worker._abort.is_set)
        finish.set()
        runner.join(5)
        assert not runner.is_alive() and status == [0]
        assert measured == [1] and api.reported == [1]
        assert sorted(api.released) == [(2, "token-0002"), (3, "token-0003")]
        assert worker.counts["abandoned"] == 2 and worker.counts["released"] == 2
    finally:
        finish.set()
        api.ended.set()


def test_a_service_that_cannot_take_jobs_back_does_not_hold_up_the_stop():
    """An unreachable service (--parent-pid: the service that started the worker is gone)
    or one from before the route: one try, then the leases are left to expire, as before."""
    api = PollingService([leased_job(1)])
    tries: list[int] = []

    def unreachable(worker_id, leases, timeout_s=None):  # type: ignore[no-untyped-def]
        tries.append(len(leases))
        api.release_calls.set()
        raise ServiceUnavailableError("http://fake", "connection refused")

    api.release = unreachable  # type: ignore[method-assign]
    worker, measured = _worker(api)
    runner, _ = run_in_thread(worker)
    try:
        assert api.polling.wait(5)
        worker.request_stop()
        worker.request_stop()
        assert wait_until(worker._abort.is_set)
        api.answer.set()
        assert api.release_calls.wait(3)
        runner.join(5)
        assert not runner.is_alive() and tries == [1] and measured == []
        assert wait_until(lambda: worker._busy == 0) and "released" not in worker.counts
    finally:
        api.answer.set()
        api.ended.set()


def test_the_job_that_broke_the_runner_is_left_to_its_lease_and_the_others_handed_back():
    """The runner gone (a GPU fallen off the bus): the jobs not started go back at once; the
    one being measured may be what broke it, and is left to its lease, whose expiry counts
    an attempt (a job that breaks every worker is given up on after max_attempts)."""
    api = PollingService([leased_job(1), leased_job(2), leased_job(3)])
    api.answer.set()
    worker, _ = _worker(api)
    del worker._measure_one  # (the worker's own: it stops the worker on such an error)

    def measure(workload, schedules):  # type: ignore[no-untyped-def]
        raise RunnerUnavailableError("the device fell off the bus")

    worker.runner.measure = measure  # type: ignore[attr-defined]
    try:
        with pytest.raises(WorkerError, match="fell off the bus"):
            worker.run()
        assert sorted(api.released) == [(2, "token-0002"), (3, "token-0003")]
        assert worker.counts["abandoned"] == 3 and worker.counts["released"] == 2
        assert worker._busy == 0 and not worker._held
    finally:
        api.ended.set()
