"""The worker daemon's reporter and lease-ahead, without a service (a fake API stands in):
results measured since the last report go in one request, an older service without the
batch route gets one request per result, a result refused as invalid is refused alone, and
the worker holds its slots plus the jobs it leases ahead."""

from __future__ import annotations

import datetime as dt
import io
import threading
import time
from types import SimpleNamespace

import pytest

from pipetune.clients.sdk import (
    ApiError,
    InvalidRequestError,
    NotFoundError,
    ProtocolError,
    RetryLaterError,
)
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobLease, JobResultAck, JobResultAcks, ResultAck, ScheduleDoc
from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import EXIT_UNREPORTED, LEASE_AHEAD_S, Worker

SCHEDULE = {
    "block_row_warps": 2,
    "block_col_warps": 2,
    "warp_row_tiles": 2,
    "warp_col_tiles": 2,
    "chunk": 2,
    "smem_stages": 3,
    "reg_stages": 2,
}


def _job(i: int) -> JobLease:
    """Job i (ids start at 1, as the service's rows do: the wire refuses 0)."""
    return JobLease(
        job_id=i,
        lease_token=f"token-{i:04d}",
        lease_expires_at=dt.datetime.now(dt.UTC),
        task_id=1,
        trial=i,
        workload={"op": "gemm", "m": 64, "n": 64, "k": 64},
        gpu="h100",
        schedule=ScheduleDoc(**SCHEDULE),
    )


OK = MeasureResult(status="ok", latency_us=5.0)


class FakeApi:
    base_url = "http://fake"

    def __init__(self, batch_error: Exception | None = None, queued: int = 0):
        self.batch_error = batch_error
        self.batches: list[list[int]] = []
        self.singles: list[int] = []
        self.queued = [_job(100 + i) for i in range(queued)]  # what a report may lease
        self.asked: list[int] = []  # max_jobs of each report

    def post_results_and_lease(
        self,
        worker_id: int,
        results: list,
        max_jobs: int = 0,
        request_id: str | None = None,
        retry: bool = False,
    ) -> JobResultAcks:
        acks = self.post_results(worker_id, results)
        self.asked.append(max_jobs)
        jobs, self.queued = self.queued[:max_jobs], self.queued[max_jobs:]
        return JobResultAcks(acks=acks, jobs=jobs)

    def post_results(self, worker_id: int, results: list) -> list[JobResultAck]:
        if self.batch_error is not None:
            raise self.batch_error
        self.batches.append([r.job_id for r in results])
        return [
            JobResultAck(job_id=r.job_id, status_code=200, accepted=True, job_state="done")
            for r in results
        ]

    def post_result(self, job_id: int, body: object) -> ResultAck:
        self.singles.append(job_id)
        return ResultAck(accepted=True, job_state="done")

    def close(self) -> None:
        pass


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
    worker.worker_id = 7
    return worker, log


def _report(worker: Worker, jobs: list[JobLease]) -> None:
    """Queue the results as the measuring threads do, then run the reporter to the end."""
    worker._busy = len(jobs)
    for job in jobs:
        worker._reports.put((job, OK))
    worker._reports.put(None)
    worker._reporter()


def test_the_results_in_hand_go_in_one_request():
    api = FakeApi()
    worker, _ = _worker(api)
    _report(worker, [_job(i) for i in range(1, 6)])
    assert api.batches == [[1, 2, 3, 4, 5]] and api.singles == []
    assert worker.counts["accepted"] == 5 and worker._busy == 0


def test_an_older_service_gets_one_request_per_result():
    api = FakeApi(NotFoundError(404, "Not Found"))
    worker, log = _worker(api)
    _report(worker, [_job(i) for i in range(1, 4)])
    assert api.singles == [1, 2, 3] and worker.counts["accepted"] == 3
    assert "batch_reports_unsupported" in log.getvalue()


@pytest.mark.parametrize("retry_s", [0.0, 600.0])
def test_the_batch_route_is_tried_again_a_while_after_a_404(monkeypatch, retry_s):
    """A 404 may come from one older replica of several, or a proxy: the worker reports one
    result a request and, BATCH_ROUTE_RETRY_S later, batches again (it did so never more,
    for the rest of its life)."""
    from pipetune.workers.daemon import worker as worker_module

    monkeypatch.setattr(worker_module, "BATCH_ROUTE_RETRY_S", retry_s)
    api = FakeApi(NotFoundError(404, "Not Found"))
    worker, _ = _worker(api)
    worker._busy = 4
    reporter = threading.Thread(target=worker._reporter)
    reporter.start()
    for group in ([1, 2], [3, 4]):
        for i in group:
            worker._reports.put((_job(i), OK))
        deadline = time.monotonic() + 10
        while worker._busy > 4 - group[-1]:  # until the group is reported
            assert time.monotonic() < deadline
            time.sleep(0.01)
        api.batch_error = None  # the upgrade is done: every replica has the route
    worker._reports.put(None)
    reporter.join(10)
    assert worker.counts["accepted"] == 4
    if retry_s == 0:
        assert api.singles == [1, 2] and api.batches == [[3, 4]]
    else:
        assert api.singles == [1, 2, 3, 4] and api.batches == []


def test_a_result_refused_as_invalid_is_sent_again_alone():
    api = FakeApi(ApiError(422, "results.1.result.latency_us: required"))
    worker, _ = _worker(api)
    _report(worker, [_job(i) for i in range(1, 4)])
    assert api.singles == [1, 2, 3] and worker._busy == 0


@pytest.mark.parametrize("status", [413, 431])
def test_a_batch_refused_for_its_size_is_sent_one_result_a_request(status):
    """A 413 or 431 is about the request, not the results: they were all counted refused and
    dropped (measured again once their leases expired). The next batch goes whole again."""
    api = FakeApi(ApiError(status, "too large"))
    worker, log = _worker(api)
    _report(worker, [_job(i) for i in range(1, 4)])
    assert api.singles == [1, 2, 3] and worker.counts["accepted"] == 3
    assert worker.counts["refused"] == 0 and worker._busy == 0
    assert "report_too_large" in log.getvalue()
    api.batch_error = None
    _report(worker, [_job(i) for i in range(4, 6)])
    assert api.batches == [[4, 5]] and api.singles == [1, 2, 3]


def test_a_refused_result_in_a_batch_is_counted_refused():
    api = FakeApi()
    worker, log = _worker(api)

    def some_refused(worker_id: int, results: list) -> list[JobResultAck]:
        return [
            JobResultAck(job_id=r.job_id, status_code=403, accepted=False, detail="not yours")
            if r.job_id == 1
            else JobResultAck(job_id=r.job_id, status_code=200, accepted=True, job_state="done")
            for r in results
        ]

    api.post_results = some_refused  # type: ignore[method-assign]
    _report(worker, [_job(i) for i in range(1, 4)])
    assert worker.counts["accepted"] == 2 and worker.counts["refused"] == 1
    assert "report_refused" in log.getvalue()


def test_a_worker_holds_its_slots_plus_the_jobs_it_leases_ahead():
    worker, _ = _worker(FakeApi(), concurrency=2, lease_ahead=3)
    assert worker._capacity() == 5
    # Slow trials: only as many ahead as two slots finish within LEASE_AHEAD_S.
    worker._trial_s = LEASE_AHEAD_S
    assert worker._capacity() == 2 + 2
    worker._trial_s = LEASE_AHEAD_S * 4  # longer still: none ahead
    assert worker._capacity() == 2
    worker._busy = 1
    assert worker._free_slots().jobs == 1  # the free slot (the jobs ahead: once it is busy)
    none_ahead, _ = _worker(FakeApi(), lease_ahead=0)
    assert none_ahead._capacity() == 1


def test_an_idle_worker_asks_for_its_slots_only_and_leases_ahead_once_it_has_work():
    """An idle worker asked for its slots plus its lease-ahead: the first of a fleet's idle
    workers that the service woke took a whole batch (8 jobs on 3 of 8 workers, the batch
    2-3x slower) while the others waited. Idle, it asks for its slots; holding work, for the
    jobs ahead too; and a report that leaves it holding nothing asks for its slots only."""
    worker, _ = _worker(FakeApi(), concurrency=2, lease_ahead=3)
    assert worker._free_slots().jobs == 2  # idle: its slots
    worker._asking, worker._busy = 0, 2
    assert worker._free_slots().jobs == 1  # working: a job ahead (one a request)
    api = FakeApi(queued=10)
    worker, _ = _worker(api, concurrency=2, lease_ahead=3)
    worker._pool = FakePool()  # type: ignore[assignment]
    worker._busy = 3
    for job in (_job(1), _job(2), _job(3)):  # every job it held, reported at once
        worker._reports.put((job, OK))
    worker._reports.put(None)
    worker._reporter()
    assert api.asked == [2]  # its slots, not the 3 it reported


class FakePool:
    def __init__(self) -> None:
        self.units: list[list[int]] = []

    def submit(self, fn: object, unit: list[JobLease]) -> None:
        self.units.append([job.job_id for job in unit])


def test_a_report_leases_what_the_slots_it_frees_can_take():
    api = FakeApi(queued=10)
    worker, _ = _worker(api, concurrency=2, lease_ahead=3)
    pool = FakePool()
    worker._pool = pool  # type: ignore[assignment]
    # Five held (the capacity): two are reported, so the report may lease two.
    worker._busy = 5
    for job in (_job(1), _job(2)):
        worker._reports.put((job, OK))
    worker._reports.put(None)
    worker._reporter()
    assert api.asked == [2]
    assert pool.units == [[100], [101]]  # one job per unit for the simulated runner
    assert worker._busy == 5  # three still held, two new


def test_a_report_leaves_to_the_lease_in_flight_what_it_asks_for():
    api = FakeApi(queued=10)
    worker, _ = _worker(api, concurrency=1, lease_ahead=3)  # capacity 4
    worker._pool = FakePool()  # type: ignore[assignment]
    worker._busy, worker._asking = 2, 2  # a lease request waits for two more
    for job in (_job(1), _job(2)):
        worker._reports.put((job, OK))
    worker._reports.put(None)
    worker._reporter()
    assert api.asked == [2]  # the two the results free; the lease asks for the other two
    stopping, _ = _worker(api := FakeApi(queued=10))
    stopping._stop.set()
    _report(stopping, [_job(1)])
    assert api.asked == [0] and stopping._busy == 0


def test_jobs_a_report_leases_after_the_pool_closed_are_handed_back_not_lost():
    """They were abandoned: left to their leases, which expired (an attempt used each)."""
    api = FakeApi(queued=10)
    released: list[list[tuple[int, str]]] = []
    api.release = lambda worker_id, leases, timeout_s=None: (
        released.append(  # type: ignore[attr-defined]
            [(h.job_id, h.lease_token) for h in leases]
        )
        or [h.job_id for h in leases]
    )
    worker, log = _worker(api, concurrency=2, lease_ahead=1)
    assert worker._pool is None  # the worker stopped measuring meanwhile
    _report(worker, [_job(1)])
    assert api.asked == [2] and worker.counts["handed_back"] == 2
    assert released == [[(100, "token-0100"), (101, "token-0101")]]
    assert worker.counts["released"] == 2 and "abandoned" not in worker.counts
    assert worker._busy == 0 and not worker._held and "handed_back" in log.getvalue()
    # A service that cannot take them back (unreachable, or from before the route): their
    # leases expire, as before, and that is said.
    api = FakeApi(queued=10)
    worker, log = _worker(api, concurrency=2, lease_ahead=1)
    _report(worker, [_job(1)])  # (FakeApi has no release: AttributeError)
    assert worker.counts["handed_back"] == 2 and "released" not in worker.counts
    assert worker._busy == 0 and "release_failed" in log.getvalue()


def test_a_service_from_before_reports_leased_gets_reports_without_max_jobs():
    api = FakeApi(queued=10)
    plain = api.post_results_and_lease

    def refusing(
        worker_id: int,
        results: list,
        max_jobs: int = 0,
        request_id: str | None = None,
        retry: bool = False,
    ) -> JobResultAcks:
        if max_jobs:  # as a service whose JobResults forbids the unknown field
            raise ApiError(422, "Extra inputs are not permitted", field="max_jobs")
        return plain(worker_id, results, max_jobs)

    api.post_results_and_lease = refusing  # type: ignore[method-assign]
    worker, log = _worker(api, concurrency=1, lease_ahead=2)
    worker._pool = FakePool()  # type: ignore[assignment]
    _report(worker, [_job(1), _job(2)])
    # The same batch again without the field, once; then never asked for again.
    assert api.batches == [[1, 2]] and api.singles == [] and api.asked == [0]
    assert worker.counts["accepted"] == 2 and "report_leases_unsupported" in log.getvalue()
    assert worker._lease_with_report(1) == 0


@pytest.mark.parametrize(
    "error",
    [RetryLaterError(429, "rate limited"), ProtocolError("the answer is not a JobResultAcks")],
)
def test_a_report_answered_429_or_garbled_is_sent_again(error):
    """Both were final: the results were dropped (`report_refused` / `report_failed`), and
    the jobs' leases, still extended by every heartbeat, never came back to the queue."""
    api = FakeApi()
    plain = api.post_results
    failures = [error]

    def flaky(worker_id: int, results: list) -> list[JobResultAck]:
        if failures:
            raise failures.pop()
        return plain(worker_id, results)

    api.post_results = flaky  # type: ignore[method-assign]
    worker, _ = _worker(api)
    _report(worker, [_job(1), _job(2)])
    assert api.batches == [[1, 2]] and worker.counts["accepted"] == 2
    assert worker.counts["refused"] == worker.counts["unreported"] == 0


def test_the_worker_holds_the_leases_it_has_not_reported_and_only_those():
    api = FakeApi(queued=2)
    worker, _ = _worker(api, concurrency=2, lease_ahead=2)
    worker._pool = FakePool()  # type: ignore[assignment]
    with worker._slots:
        worker._hold([_job(1), _job(2), _job(3)])
    worker._abandon(_job(3))  # given up: its lease must be left to expire
    worker._reports.put((_job(1), OK))
    worker._reports.put(None)
    worker._reporter()  # job 1 reported; the report leased jobs 100 and 101
    held = {h.job_id: h.lease_token for h in worker._held_leases()}
    assert held == {2: "token-0002", 100: "token-0100", 101: "token-0101"}
    assert worker._busy == 3


class BeatingApi(FakeApi):
    def __init__(self, refuse_leases: bool = False) -> None:
        super().__init__()
        self.beats: list[list[int] | None] = []
        self.refuse_leases = refuse_leases

    def heartbeat(self, worker_id: int, busy_jobs: int = 0, leases: list | None = None) -> None:
        if leases is not None and self.refuse_leases:
            raise InvalidRequestError(422, "Extra inputs are not permitted", field="leases")
        self.beats.append(None if leases is None else [h.job_id for h in leases])


def _beat(worker: Worker, beats: int, api: BeatingApi) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=worker._heartbeat, args=(stop,))
    thread.start()
    deadline = time.monotonic() + 10
    while len(api.beats) < beats and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join()


def test_heartbeats_list_the_leases_held():
    api = BeatingApi()
    worker, _ = _worker(api, heartbeat_s=0.01)
    with worker._slots:
        worker._hold([_job(4), _job(5)])
    _beat(worker, 2, api)
    assert api.beats[:2] == [[4, 5], [4, 5]]


def test_jobs_the_heartbeat_says_are_gone_are_not_measured():
    """Jobs leased ahead of a task cancelled meanwhile (or whose leases moved) were measured
    for nothing, their results refused: the heartbeat's answer names them (`gone`), and the
    worker drops those it has not started, freeing their slots."""

    class GoneApi(BeatingApi):
        def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
            super().heartbeat(worker_id, busy_jobs, leases)
            return SimpleNamespace(ok=True, gone=[5, 99])  # (99: not held, nothing to drop)

    api = GoneApi()
    worker, log = _worker(api, heartbeat_s=0.01)
    measured: list[int] = []
    worker._measure_one = lambda workload, schedule: measured.append(1) or OK  # type: ignore[method-assign]
    with worker._slots:
        worker._hold([_job(4), _job(5)])
    _beat(worker, 1, api)
    assert worker._gone == {(5, "token-0005")}  # (leases are known by job and token)
    worker._measure_unit([_job(4)])
    worker._measure_unit([_job(5)])
    assert len(measured) == 1 and worker.counts["dropped"] == 1
    # 5's slot is free, 4 awaits its report
    assert worker._busy == 1 and set(worker._held) == {(4, "token-0004")}
    assert worker._gone == set() and "dropped" in log.getvalue()


def test_a_result_refused_for_a_cancelled_task_drops_its_other_jobs_held_ahead():
    """A busy worker heartbeats about every 30 s, so the heartbeat's `gone` came late for
    jobs leased ahead of a task cancelled meanwhile: they were measured for nothing. The
    first result refused as cancelled names the task; its other held jobs are dropped at
    once, another task's are kept."""

    class CancellingApi(FakeApi):
        def post_results(self, worker_id: int, results: list) -> list[JobResultAck]:
            self.batches.append([r.job_id for r in results])
            return [
                JobResultAck(
                    job_id=r.job_id,
                    status_code=200,
                    accepted=False,
                    job_state="cancelled",
                    detail="task cancelled: not recorded",
                )
                for r in results
            ]

    worker, _ = _worker(CancellingApi())
    other_task = _job(9).model_copy(update={"task_id": 2})
    measured: list[int] = []
    worker._measure_one = lambda workload, schedule: measured.append(1) or OK  # type: ignore[method-assign]
    with worker._slots:
        worker._hold([_job(1), _job(2), _job(3), other_task])
    worker._reports.put((_job(1), OK))
    worker._reports.put(None)
    worker._reporter()
    assert worker.counts["stale"] == 1
    # Task 1's jobs held ahead; task 2's job 9 is not gone.
    assert worker._gone == {(2, "token-0002"), (3, "token-0003")}
    worker._measure_unit([_job(2), _job(3)])
    worker._measure_unit([other_task])
    assert len(measured) == 1 and worker.counts["dropped"] == 2


def test_a_service_from_before_heartbeats_listed_leases_gets_heartbeats_without():
    api = BeatingApi(refuse_leases=True)
    worker, log = _worker(api, heartbeat_s=0.01)
    with worker._slots:
        worker._hold([_job(4)])
    _beat(worker, 2, api)
    assert api.beats[:2] == [None, None]
    assert log.getvalue().count("heartbeat_leases_unsupported") == 1


class Wakeups:
    """A heartbeat thread's stop event that wakes it `n` times, running `at[k]` before the
    k-th wake-up (1-based), then stops it: wake-ups counted, not timed."""

    def __init__(self, n: int, at: dict | None = None) -> None:
        self.n, self.at, self.k = n, at or {}, 0

    def wait(self, timeout: float) -> bool:
        self.k += 1
        if self.k in self.at:
            self.at[self.k]()
        return self.k > self.n


def test_an_idle_worker_heartbeats_once_then_every_sixth_wake_up():
    """Idle, a fleet of a thousand daemons sent two hundred heartbeats a second, each about
    as dear to the service as a result; with nothing to extend, one every IDLE_EVERY
    wake-ups says it lives."""
    from pipetune.workers.daemon.heartbeats import IDLE_EVERY

    api = BeatingApi()
    worker, _ = _worker(api)
    worker._heartbeat(Wakeups(2 * IDLE_EVERY + 1))  # type: ignore[arg-type]
    assert len(api.beats) == 3  # the first wake-up (nothing said yet), the 7th, the 13th


def test_an_idle_worker_is_heard_from_within_half_of_a_short_lease_ttl():
    """With the service's lease TTL at 10 s, an idle worker heartbeating every sixth wake-up
    (30 s) was listed silent, and `tune` said no worker was live. The registration answer
    gives the TTL: the wake-ups come every quarter of it, an idle word every other one."""
    from pipetune.workers.daemon.heartbeats import IDLE_EVERY, idle_every

    api = BeatingApi()
    worker, _ = _worker(api, heartbeat_s=5.0)
    doc = SimpleNamespace(
        id=7, name="w", gpu="h100", arch="sm_90", runner="simulated", name_in_use=None
    )
    worker._registered(doc, worker._registration(), api)  # type: ignore[arg-type]
    assert worker._heartbeat_interval_s() == 5.0  # a service that says no TTL: as before
    worker._registered(  # type: ignore[arg-type]
        SimpleNamespace(**vars(doc), lease_ttl_s=10.0), worker._registration(), api
    )
    interval = worker._heartbeat_interval_s()
    assert interval == 2.5 and idle_every(interval, 10.0) == 2
    worker._heartbeat(Wakeups(9))  # type: ignore[arg-type]
    assert len(api.beats) == 5  # wake-ups 1, 3, 5, 7, 9: 5 s apart, half the TTL
    # The default TTL (120 s) keeps the fleet's rate: a word every 30 s.
    assert idle_every(5.0, 120.0) == IDLE_EVERY and idle_every(5.0, None) == IDLE_EVERY
    assert idle_every(5.0, 1.0) == 1


def _granted(i: int, ttl_s: float | None) -> JobLease:
    return _job(i).model_copy(update={"lease_ttl_s": ttl_s})


def test_a_worker_extends_a_lease_once_it_has_lived_half_its_ttl(monkeypatch):
    """Busy, a daemon sent a heartbeat at every wake-up (5 s) though its leases had a TTL of
    120 s: as many heartbeats as results for trials of a few seconds. Now a lease is extended
    once half its TTL has passed, and the heartbeat that extends it renews that."""
    from pipetune.workers.daemon import worker as worker_module

    clock = [1000.0]
    api = BeatingApi()
    worker, _ = _worker(api)
    jobs = [_granted(4, 60.0), _granted(5, 60.0)]

    def at(t: float):
        return lambda: clock.__setitem__(0, 1000.0 + t)

    def hold() -> None:
        with worker._slots:
            worker._hold(jobs)

    # Wake-ups 5 s apart; the leases are granted just before the 2nd.
    times = {k: at(5.0 * k) for k in range(1, 16)}
    times[2] = lambda: (clock.__setitem__(0, 1009.0), hold(), clock.__setitem__(0, 1010.0))
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    worker._heartbeat(Wakeups(15, at=times))  # type: ignore[arg-type]
    # 1: the first word (idle); 2: busy now; 8 (40 s, 31 s after the grant): the IDLE_EVERY
    # word, which extends them too; 13 (65 s): the last wake-up before their half TTL since
    # the 8th.
    assert api.beats == [[], [4, 5], [4, 5], [4, 5]]


def test_a_lease_is_extended_before_it_expires_whatever_the_interval(monkeypatch):
    """A lease was extended at the first wake-up after half its TTL: with wake-ups 5 s apart
    and an 8 s TTL, one granted just after its half fell between two wake-ups expired before
    the next (the old rule, a heartbeat at every wake-up, was safe at any interval below the
    TTL). It is now extended at the last wake-up before its half."""
    from pipetune.workers.daemon import worker as worker_module

    clock = [1000.0]
    api = BeatingApi()
    worker, _ = _worker(api, heartbeat_s=5.0)
    beats_at: list[tuple[float, list[int] | None]] = []
    plain = api.heartbeat

    def timed(worker_id: int, busy_jobs: int = 0, leases: list | None = None) -> None:
        plain(worker_id, busy_jobs, leases)
        beats_at.append((clock[0], api.beats[-1]))

    api.heartbeat = timed  # type: ignore[method-assign]
    long_lease, short_lease = _granted(4, 600.0), _granted(5, 8.0)

    def hold(job: JobLease, granted: float, then: float):
        def run() -> None:
            clock[0] = granted
            with worker._slots:
                worker._hold([job])
            clock[0] = then

        return run

    # Wake-ups at 1005, 1010, ...: busy from the 2nd (a long lease); the short one granted at
    # 1011.1, its half at 1015.1, just after the 3rd wake-up; it expires at 1019.1.
    times = {k: (lambda t=1000.0 + 5.0 * k: clock.__setitem__(0, t)) for k in range(1, 6)}
    times[2] = hold(long_lease, 1010.0, 1010.0)
    times[3] = hold(short_lease, 1011.1, 1015.0)
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    worker._heartbeat(Wakeups(5, at=times))  # type: ignore[arg-type]
    extended = [at for at, leases in beats_at if leases and 5 in leases]
    assert extended and extended[0] < 1011.1 + 8.0
    assert extended[0] == 1015.0  # the wake-up before its half, not one sooner


def test_a_lease_ttl_no_longer_than_the_heartbeat_interval_makes_the_heartbeat_wake_sooner():
    """It was only warned of: with --heartbeat 30 and a 10 s TTL, a trial measured well three
    times was recorded lost, its lease expired each time between two wake-ups. The
    heartbeat now wakes every quarter of the shortest TTL granted where that is sooner."""
    api = BeatingApi()
    worker, log = _worker(api, heartbeat_s=10.0)
    with worker._slots:
        worker._hold([_granted(4, 60.0)])
    assert "lease_ttl_below_heartbeat" not in log.getvalue()
    assert worker._heartbeat_interval_s() == 10.0
    with worker._slots:
        worker._hold([_granted(5, 8.0)])
        worker._hold([_granted(6, 8.0)])
    assert log.getvalue().count("WARNING lease_ttl_below_heartbeat") == 1
    assert "--heartbeat 10 s" in log.getvalue() and "wakes every 2 s" in log.getvalue()
    assert worker._heartbeat_interval_s() == 2.0


def test_a_lease_of_a_service_that_says_no_ttl_is_extended_at_every_wake_up_and_idle_said_once():
    api = BeatingApi()
    worker, _ = _worker(api)
    jobs = [_job(4), _job(5)]  # lease_ttl_s None: a service from before the field

    def hold() -> None:
        with worker._slots:
            worker._hold(jobs)

    worker._heartbeat(Wakeups(8, at={2: hold, 6: lambda: worker._release(jobs)}))  # type: ignore[arg-type]
    # Wake-ups 1 (the first word), 2-5 (holding), 6 (idle now: its busy count drops), not 7-8.
    assert api.beats == [[], [4, 5], [4, 5], [4, 5], [4, 5], []]


def test_a_heartbeat_the_service_did_not_take_is_sent_again_at_the_next_wake_up():
    api = BeatingApi()
    failures = [ConnectionError("refused")]
    plain = api.heartbeat

    def flaky(worker_id: int, busy_jobs: int = 0, leases: list | None = None) -> None:
        if failures:
            raise failures.pop()
        plain(worker_id, busy_jobs, leases)

    api.heartbeat = flaky  # type: ignore[method-assign]
    worker, _ = _worker(api)
    worker._heartbeat(Wakeups(3))  # type: ignore[arg-type]
    assert api.beats == [[]]  # the first failed, the second was taken, the third not due


def test_a_worker_that_could_not_report_exits_3():
    worker, log = _worker(FakeApi())
    worker._control = lambda: worker._count("unreported", 2)  # type: ignore[method-assign]
    assert worker.run() == EXIT_UNREPORTED == 3
    assert "unreported=2" in log.getvalue()
    clean, _ = _worker(FakeApi())
    clean._control = lambda: None  # type: ignore[method-assign]
    assert clean.run() == 0


def test_a_replay_worker_registers_its_workload_and_refuses_a_service_without_the_field():
    """A replay worker answers one workload: it registers with it (the service then leases it
    no other). A service from before the field refuses it (422 on `workload`): registered
    without it the worker would lease other tasks' jobs and fail them, so it stops, saying
    why."""
    from pipetune.model.workloads import gemm
    from pipetune.workers.daemon.worker import WorkerError

    workload = gemm(64, 64, 64)
    bodies: list = []

    class Registering(FakeApi):
        def __init__(self, refuse: bool) -> None:
            super().__init__()
            self.refuse = refuse

        def register(self, body):  # type: ignore[no-untyped-def]
            bodies.append(body)
            if self.refuse:
                raise InvalidRequestError(422, "Extra inputs are not permitted", field="workload")
            doc = {"id": 3, "name": body.name, "gpu": "h100", "arch": "sm_90"}
            return SimpleNamespace(**doc, runner="replay", name_in_use=None)

    def replay_worker(api: FakeApi) -> Worker:
        worker = Worker(
            WorkerConfig(server="http://fake", token="t", runner="simulated", gpu="h100"),
            SimpleNamespace(name="replay", only_workload=workload),  # type: ignore[arg-type]
            describe_model_gpu("h100", "replay"),
            EventLog(stream=io.StringIO()),
            api_factory=lambda: api,  # type: ignore[arg-type,return-value]
        )
        return worker

    api = Registering(refuse=False)
    assert replay_worker(api)._register(api)  # type: ignore[arg-type]
    assert bodies[-1].workload == workload
    old = Registering(refuse=True)
    with pytest.raises(WorkerError, match="does not take the one workload a replay worker"):
        replay_worker(old)._register(old)  # type: ignore[arg-type]


def test_a_name_in_use_is_warned_of():
    class Twin(FakeApi):
        def register(self, body):  # type: ignore[no-untyped-def]
            doc = {"id": 3, "name": body.name, "gpu": "h100", "arch": "sm_90"}
            return SimpleNamespace(**doc, runner="simulated", name_in_use=True)

    api = Twin()
    worker, log = _worker(api)
    worker.runner = SimpleNamespace(name="simulated", only_workload=None)  # type: ignore[assignment]
    assert worker._register(api)  # type: ignore[arg-type]
    assert "WARNING name_in_use" in log.getvalue() and "its own --name" in log.getvalue()


def test_a_log_that_cannot_be_written_does_not_stop_the_work():
    """A closed pipe (`pipetune worker | head`): the failed write raised in the measuring
    thread, the result was never queued, the slot never freed, and the heartbeats kept the
    other leases alive for ever."""

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    log = EventLog(stream=ClosedPipe())
    log.info("trial", job=1)
    log.error("unit_failed", msg="x")
    assert log.lost == 2
    api = FakeApi()
    worker, _ = _worker(api)
    worker.log = log
    _report(worker, [_job(i) for i in range(1, 4)])
    assert api.batches == [[1, 2, 3]] and worker._busy == 0


def test_result_retry_counts_from_the_start_of_the_outage_for_every_report():
    """Draining through an outage, each batch of results got its own --result-retry (900 s):
    a worker stopped with several batches in hand took a multiple of it to exit. The outage
    now has one clock: a batch reported after the others gave up tries once."""
    from pipetune.clients.sdk import ServiceUnavailableError

    class Down(FakeApi):
        def __init__(self) -> None:
            super().__init__()
            self.attempts = 0

        def post_results_and_lease(
            self, worker_id, results, max_jobs=0, request_id=None, retry=False
        ):  # type: ignore[no-untyped-def]
            self.attempts += 1
            raise ServiceUnavailableError("http://fake", "connection refused")

    api = Down()
    worker, _ = _worker(api, result_retry_s=0.3)
    worker._report_batch(api, [(_job(1), OK)])  # type: ignore[arg-type]
    first = api.attempts
    assert first >= 2 and worker.counts["unreported"] == 1  # retried, then gave up
    worker._report_batch(api, [(_job(2), OK)])  # type: ignore[arg-type]
    assert api.attempts == first + 1 and worker.counts["unreported"] == 2
    # A report that goes through ends the outage: the next one has the whole time again.
    worker._report_batch(FakeApi(), [(_job(3), OK)])  # type: ignore[arg-type]
    assert worker._reports_failing_since is None
    worker._report_batch(api, [(_job(4), OK)])  # type: ignore[arg-type]
    assert api.attempts >= first + 3


class LeasingApi(FakeApi):
    """A FakeApi that also answers lease requests, from the same queue as reports."""

    def lease(
        self,
        worker_id: int,
        max_jobs: int,
        wait_s: float,
        request_id: str | None = None,
        retry: bool = False,
    ) -> list[JobLease]:
        jobs, self.queued = self.queued[:max_jobs], self.queued[max_jobs:]
        return jobs


def test_a_report_does_not_lease_the_slots_the_control_thread_has_just_found_free():
    """_free_slots() returned the free slots, and only then did _lease() count them as asked
    for: a report in between leased them too, and the worker held more than its capacity."""
    api = LeasingApi(queued=10)
    worker, _ = _worker(api, concurrency=1, lease_ahead=3)  # capacity 4
    worker._pool = FakePool()  # type: ignore[assignment]
    worker._busy = 2
    free = worker._free_slots().jobs
    assert free == 1  # a job ahead (one a request)
    # The reporter reports one result before the lease request goes out.
    worker._reports.put((_job(1), OK))
    worker._reports.put(None)
    worker._reporter()
    worker._lease(api, free)  # type: ignore[arg-type]
    assert worker._busy <= worker._capacity() == 4
    assert api.asked == [2]  # the slot its result frees and the room not reserved, not more


def test_the_control_thread_does_not_lease_what_a_report_in_flight_asks_for():
    """A report that leases asks for the slots its results free; while it is in flight the
    control thread found them free as well (and leased them: one job over capacity)."""
    api = LeasingApi(queued=10)
    inside, answer = threading.Event(), threading.Event()
    plain = api.post_results_and_lease

    def slow(
        worker_id: int,
        results: list,
        max_jobs: int = 0,
        request_id: str | None = None,
        retry: bool = False,
    ) -> JobResultAcks:
        inside.set()
        assert answer.wait(10)
        return plain(worker_id, results, max_jobs)

    api.post_results_and_lease = slow  # type: ignore[method-assign]
    worker, _ = _worker(api, concurrency=1, lease_ahead=3)  # capacity 4
    worker._pool = FakePool()  # type: ignore[assignment]
    worker._busy = 3
    worker._reports.put((_job(1), OK))
    worker._reports.put(None)
    reporter = threading.Thread(target=worker._reporter)
    reporter.start()
    assert inside.wait(10)
    found: list[int] = []
    control = threading.Thread(target=lambda: found.append(worker._free_slots().jobs))
    control.start()
    control.join(0.3)
    answer.set()
    reporter.join(10)
    control.join(1.0)
    if control.is_alive():  # still waiting for a free slot: none was (right)
        worker._stop.set()
        control.join(10)
    assert api.asked == [2]
    held = worker._busy + (found[0] if found else 0)
    assert held <= worker._capacity() == 4


def test_a_worker_that_must_give_up_leases_nothing_with_the_reports_of_its_last_jobs():
    """A lease refused for good (WorkerError) ended the lease loop without stopping the
    worker: the reports of the jobs in hand, measured while the pool closed, still leased
    jobs, which were abandoned at once (their leases left to expire, an attempt used)."""
    from pipetune.workers.daemon.worker import WorkerError

    class Refusing(LeasingApi):
        def __init__(self) -> None:
            super().__init__(queued=10)
            self.leases = 0

        def lease(
            self,
            worker_id: int,
            max_jobs: int,
            wait_s: float,
            request_id: str | None = None,
            retry: bool = False,
        ) -> list[JobLease]:
            self.leases += 1
            if self.leases == 1:
                return [_job(1)]
            raise ApiError(405, "Method Not Allowed")

        def heartbeat(self, *args: object, **kw: object) -> None:
            pass

    api = Refusing()
    worker, _ = _worker(api, concurrency=2, lease_ahead=0)  # the 2nd lease comes at once

    def slow(workload: object, schedule: object) -> MeasureResult:
        time.sleep(0.3)  # still measuring when the lease loop gives up
        return OK

    worker._measure_one = slow  # type: ignore[method-assign]
    with pytest.raises(WorkerError, match="refused to lease"):
        worker._serve(api)  # type: ignore[arg-type]
    assert api.batches == [[1]] and worker.counts["accepted"] == 1
    assert api.asked == [0] and worker.counts["abandoned"] == 0


def test_a_gone_lease_does_not_drop_the_job_leased_again_meanwhile():
    """The heartbeat's `gone` names jobs by id: a job whose listed lease was gone, released
    and leased again (a new token) while the heartbeat was in flight was dropped unmeasured,
    its new lease left to expire."""

    class GoneApi(BeatingApi):
        def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
            super().heartbeat(worker_id, busy_jobs, leases)
            if len(self.beats) > 1:  # (the test looks at the first)
                return SimpleNamespace(ok=True, gone=[])
            # Meanwhile job 5's result came back stale, and a lease got it again.
            worker._release([_job(5)])
            with worker._slots:
                worker._hold([_job(5).model_copy(update={"lease_token": "token-new"})])
            return SimpleNamespace(ok=True, gone=[4, 5])

    api = GoneApi()
    worker, _ = _worker(api, heartbeat_s=0.01)
    with worker._slots:
        worker._hold([_job(4), _job(5)])
    _beat(worker, 1, api)
    # 4's lease is gone; 5 is held under a lease that is not.
    assert worker._gone == {(4, "token-0004")}


def test_a_runner_that_cannot_build_here_reports_nothing_and_stops_the_worker():
    """The runner's own failure (here: its compiled kernels cannot be written, a full disk)
    is not a trial's: nothing is reported for the job it was measuring or for those after
    it (their leases expire and the jobs go back to the queue), and the worker stops,
    saying why."""
    from pipetune.workers.runners.base import RunnerUnavailableError

    worker, log = _worker(FakeApi())

    def measure(workload, schedules):  # type: ignore[no-untyped-def]
        raise RunnerUnavailableError("cannot write compiled kernels to /tmp/x: No space left")

    worker.runner.measure = measure  # type: ignore[attr-defined]
    with worker._slots:
        worker._hold([_job(1), _job(2)])
    worker._measure_unit([_job(1), _job(2)])
    assert worker._reports.empty()
    assert worker.counts["abandoned"] == 2 and worker._busy == 0
    assert worker._stop.is_set() and "No space left" in str(worker._fatal)
    assert "abandoned" in log.getvalue()
