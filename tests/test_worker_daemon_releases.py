"""The worker daemon holds a job leased to it again under its new lease, not its old one.

A job's lease can expire while the worker still holds the job (a service outage longer than
the TTL, a slow network, a long pause): the service reclaims it, and the job, first in the
queue by its fair key, is often leased again by the same worker, its old copy still in the
worker's hands. The worker kept its leases by job id, so the old copy's report released the
new lease (no longer heartbeated, it expired, again and again, until the job was given up as
lost although measured), and a heartbeat's `gone` for the old lease dropped the new copy
unmeasured. Each copy is now known by its (job, lease token), and the old one is retired
when the new one comes. No service: a fake API stands in for it."""

from __future__ import annotations

import datetime as dt
import io
from types import SimpleNamespace

from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobLease, JobResultAck, JobResultAcks, ScheduleDoc
from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import Worker

OK = MeasureResult(status="ok", latency_us=5.0)
OLD, NEW = "token-of-the-expired-lease", "token-of-the-current-lease"


def _copy(token: str, job_id: int = 529) -> JobLease:
    """Job 529 as leased under `token` (the worker got it twice: two copies)."""
    return JobLease(
        job_id=job_id,
        lease_token=token,
        lease_expires_at=dt.datetime.now(dt.UTC),
        lease_ttl_s=3.0,
        task_id=54,
        trial=5,
        workload={"op": "gemm", "m": 64, "n": 64, "k": 64},
        gpu="h100",
        schedule=ScheduleDoc(
            block_row_warps=2,
            block_col_warps=2,
            warp_row_tiles=2,
            warp_col_tiles=2,
            chunk=2,
            smem_stages=3,
            reg_stages=2,
        ),
    )


class FakeService:
    """Answers as the service does: a result under the expired lease (not the job's current
    one any more) is refused as stale; a heartbeat names as `gone` the jobs in `gone`."""

    base_url = "http://fake"

    def __init__(self) -> None:
        self.beats: list[list[tuple[int, str]]] = []  # the leases each heartbeat listed
        self.gone: list[int] = []
        self.posted: list[tuple[int, str]] = []

    def post_results_and_lease(self, worker_id, results, max_jobs=0, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        acks = []
        for r in results:
            self.posted.append((r.job_id, r.lease_token))
            current = r.lease_token != OLD
            acks.append(
                JobResultAck(
                    job_id=r.job_id,
                    status_code=200,
                    accepted=current,
                    job_state="done" if current else "leased",
                    detail=None if current else "stale lease: not recorded",
                )
            )
        return JobResultAcks(acks=acks, jobs=[])

    def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
        self.beats.append([(h.job_id, h.lease_token) for h in leases or ()])
        return SimpleNamespace(ok=True, gone=list(self.gone))

    def close(self) -> None:
        pass


class Wakeups:
    """A heartbeat thread's stop event that wakes it `n` times, then stops it."""

    def __init__(self, n: int) -> None:
        self.n, self.k = n, 0

    def wait(self, timeout: float) -> bool:
        self.k += 1
        return self.k > self.n


def _worker(api: FakeService) -> tuple[Worker, list[str]]:
    """A worker (concurrency 1, leasing ahead) whose measurements are recorded, not run."""
    settings = {"server": "http://fake", "token": "t", "runner": "simulated", "gpu": "h100"}
    worker = Worker(
        WorkerConfig(**settings, concurrency=1, lease_ahead=6, heartbeat_s=0.5),  # type: ignore[arg-type]
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=io.StringIO()),
        api_factory=lambda: api,  # type: ignore[arg-type,return-value]
    )
    worker.worker_id = 20
    measured: list[str] = []
    worker._measure_one = lambda workload, schedule: measured.append("trial") or OK  # type: ignore[method-assign]
    return worker, measured


def _lease(worker: Worker, *jobs: JobLease) -> None:
    """Jobs leased (as the control thread or a report holds them)."""
    with worker._slots:
        worker._hold(list(jobs))


def _report_all(worker: Worker) -> None:
    """Run the reporter over the results measured so far, to the end."""
    worker._reports.put(None)
    worker._reporter()


def _beat(worker: Worker, api: FakeService) -> list[tuple[int, str]]:
    """One heartbeat (its lease is due: every held lease is listed); what it listed."""
    before = len(api.beats)
    with worker._slots:
        for term in worker._held.values():
            term.renew_at = 0.0  # due now
    worker._heartbeat(Wakeups(1))  # type: ignore[arg-type]
    assert len(api.beats) == before + 1
    return api.beats[-1]


def test_the_current_lease_stays_listed_after_the_old_copy_is_reported():
    """(a) The old copy was being measured when the job was leased again: it finishes and
    its result goes to the service (refused: stale); the new lease is still listed and
    extended until its own copy is reported."""
    api = FakeService()
    worker, _ = _worker(api)
    _lease(worker, _copy(OLD))
    # The old copy is measured; meanwhile (its lease expired over an outage) the job comes
    # back to this worker in a report's answer.
    worker._measure_one = lambda workload, schedule: (_lease(worker, _copy(NEW)), OK)[1]  # type: ignore[method-assign]
    worker._measure_unit([_copy(OLD)])
    _report_all(worker)
    assert api.posted == [(529, OLD)] and worker.counts["stale"] == 1
    assert worker._busy == 1  # the new copy, waiting for its turn
    assert _beat(worker, api) == [(529, NEW)]
    assert [(h.job_id, h.lease_token) for h in worker._held_leases()] == [(529, NEW)]


def test_a_gone_answer_for_the_old_lease_does_not_drop_the_new_copy():
    """(b) A heartbeat listed the old lease and the service answered `gone` (it expired and
    was reclaimed); the job then came back to this worker: its new copy is measured and
    reported, and only the old one is dropped."""
    api = FakeService()
    worker, measured = _worker(api)
    _lease(worker, _copy(OLD))
    api.gone = [529]
    assert _beat(worker, api) == [(529, OLD)]
    api.gone = []
    _lease(worker, _copy(NEW))
    worker._measure_unit([_copy(NEW)])  # (with concurrency > 1, before the old copy's turn)
    worker._measure_unit([_copy(OLD)])
    _report_all(worker)
    assert measured == ["trial"] and api.posted == [(529, NEW)]
    assert worker.counts["accepted"] == 1 and worker.counts["stale"] == 0
    assert worker._busy == 0 and not worker._held and not worker._gone


def test_an_unmeasured_old_copy_is_retired_when_the_new_lease_comes():
    """(c) Both copies wait in the pool: the old one cannot be current any more, so it is
    not measured (one measurement, not two); only the new lease is listed meanwhile (the
    service's `gone` names jobs, not leases, and would name the job for the old one)."""
    api = FakeService()
    worker, measured = _worker(api)
    other = _copy("token-of-another-job", job_id=530)
    _lease(worker, _copy(OLD), other)
    _lease(worker, _copy(NEW))
    assert sorted(_beat(worker, api)) == [(529, NEW), (530, "token-of-another-job")]
    worker._measure_unit([_copy(OLD)])
    assert measured == [] and worker.counts["superseded"] == 1
    assert worker._busy == 2  # its slot is free
    worker._measure_unit([other])
    worker._measure_unit([_copy(NEW)])
    _report_all(worker)
    assert measured == ["trial", "trial"]
    assert api.posted == [(530, "token-of-another-job"), (529, NEW)]
    assert worker._busy == 0 and not worker._held and not worker._task_of


class FailingBeats(FakeService):
    """A service whose heartbeat route fails (a proxy's 503 on it, say)."""

    def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
        self.beats.append([(h.job_id, h.lease_token) for h in leases or ()])
        raise RuntimeError("heartbeat refused")


def test_a_job_whose_lease_expired_while_it_waited_is_not_measured():
    """Heartbeats failing, a job held ahead outlived its lease in the worker's queue: it was
    measured anyway (refused as stale) and came back to the worker, again and again, until
    the service gave it up as lost. It is let go unmeasured, and while no heartbeat gets
    through the worker leases no job ahead."""
    api = FailingBeats()
    worker, measured = _worker(api)
    job = _copy(NEW)
    _lease(worker, job)
    assert worker._capacity() > worker.config.concurrency  # (leasing ahead)
    _beat(worker, api)  # fails
    assert worker._capacity() == worker.config.concurrency
    with worker._slots:
        term = worker._held[(job.job_id, job.lease_token)]
        term.last_at -= 2 * (term.ttl_s or 0) + 10  # its TTL and more since it was extended
    worker._measure_unit([job])
    assert measured == [] and worker.counts["expired"] == 1
    assert worker._busy == 0 and not worker._held


def test_a_lease_within_its_ttl_is_measured_though_heartbeats_fail():
    api = FailingBeats()
    worker, measured = _worker(api)
    job = _copy(NEW)
    _lease(worker, job)
    _beat(worker, api)  # fails; the lease was granted just now
    worker._measure_unit([job])
    assert measured == ["trial"] and worker.counts["expired"] == 0
