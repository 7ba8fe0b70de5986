"""The worker daemon's lease requests and its lease-ahead, without a service (a fake API
stands in): a request for a free slot long-polls for the free slots only; a request for jobs
ahead (every slot busy) asks for one, takes only what is queued, never waits, and goes out a
moment after the lease that brought the worker its work, so that the idle workers woken by
the same batch claim theirs first and the busy ones take the rest in turns; one that found
nothing is not repeated until what the worker holds changes (or AHEAD_RECHECK_S)."""

from __future__ import annotations

import threading
import time

import pytest
from worker_support import leased_job, simulated_daemon, wait_until

from pipetune.model.wire import JobLease
from pipetune.workers.daemon.worker import AHEAD_DEFER_S, AHEAD_RECHECK_S, LeaseAsk, Worker

LEASE_WAIT_S = 10.0


class QueueApi:
    """Answers lease requests from a queue of jobs and records each (max_jobs, wait_s, when it
    came). A long-poll that finds nothing answers empty after a short wait, as a service whose
    poll ran out would (the test stops the worker before that matters)."""

    base_url = "http://fake"

    def __init__(self, queued: list[JobLease]) -> None:
        self.queued = list(queued)
        self.requests: list[tuple[int, float, float]] = []
        self.lock = threading.Lock()

    def lease(self, worker_id, max_jobs, wait_s, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        with self.lock:
            self.requests.append((max_jobs, wait_s, time.monotonic()))
            jobs, self.queued = self.queued[:max_jobs], self.queued[max_jobs:]
        if not jobs and wait_s > 0:
            time.sleep(0.05)
        return jobs

    def release(self, worker_id, leases, timeout_s=None):  # type: ignore[no-untyped-def]
        return [lease.job_id for lease in leases]

    def close(self) -> None:
        pass


class HoldingPool:
    """A measuring pool that measures nothing: the jobs handed to it stay held until the test
    releases them (Worker._release), as trials still running would."""

    def __init__(self) -> None:
        self.jobs: list[int] = []

    def submit(self, fn: object, unit: list[JobLease]) -> None:
        self.jobs.extend(job.job_id for job in unit)


def _worker(api: QueueApi, **config: object) -> Worker:
    worker = simulated_daemon("http://fake", api, lease_wait_s=LEASE_WAIT_S, **config)
    worker.worker_id = 7
    worker._pool = HoldingPool()  # type: ignore[assignment]
    return worker


def _lease_in_thread(worker: Worker, api: QueueApi) -> threading.Thread:
    thread = threading.Thread(target=worker._lease_loop, args=(api,), daemon=True)
    thread.start()
    return thread


def _stop(worker: Worker, thread: threading.Thread) -> None:
    worker._stop.set()
    with worker._slots:
        worker._slots.notify_all()
    thread.join(10)
    assert not thread.is_alive()


def test_a_busy_worker_asks_ahead_without_waiting_and_after_the_idle_workers():
    """Its request for jobs ahead was a long-poll sized while it measured and sent the moment
    its lease came back: it waited through the end of a batch and took three of the next
    batch's eight jobs (the worker idle by then), or it reached the service before the idle
    workers woken with it. 8 workers, lease-ahead 2, a model-guided task: each batch measured
    on 5-6 of them, the task 1.9x slower than without leasing ahead."""
    api = QueueApi([leased_job(1)])
    worker = _worker(api, concurrency=1, lease_ahead=2)
    thread = _lease_in_thread(worker, api)
    try:
        assert wait_until(lambda: len(api.requests) >= 2)
        (first_jobs, first_wait, first_at), (ahead_jobs, ahead_wait, ahead_at) = api.requests[:2]
        assert (first_jobs, first_wait) == (1, LEASE_WAIT_S)  # idle: its slot, long-polled
        assert (ahead_jobs, ahead_wait) == (1, 0.0)  # busy: a job ahead, a queued one only
        assert ahead_at - first_at >= AHEAD_DEFER_S * 0.9  # (the answer came back at once)
        # It found none: it does not ask again while it holds what it held.
        time.sleep(0.5)
        assert len(api.requests) == 2
        # Its trial reported: idle again, it long-polls for its slot.
        worker._release([leased_job(1)])
        assert wait_until(lambda: len(api.requests) >= 3)
        assert api.requests[2][:2] == (1, LEASE_WAIT_S)
    finally:
        _stop(worker, thread)


def test_a_free_slot_is_long_polled_for_alone_and_the_jobs_ahead_asked_for_after():
    """Two slots, one busy: the long-poll asks for the free slot only (it asked for the free
    slot plus the jobs ahead, and took them whenever it was answered); with both busy, the
    jobs ahead, without waiting."""
    api = QueueApi([leased_job(i) for i in range(1, 6)])
    worker = _worker(api, concurrency=2, lease_ahead=3)
    with worker._slots:
        worker._hold([leased_job(99)])
    ask = worker._free_slots()
    assert ask == LeaseAsk(jobs=1, wait=True, holding=1)
    worker._asking = 0
    with worker._slots:
        worker._hold([leased_job(98)])
    started = time.monotonic()
    ask = worker._free_slots()  # (after AHEAD_DEFER_S: it just leased)
    assert ask == LeaseAsk(jobs=1, wait=False, holding=2)
    assert time.monotonic() - started >= AHEAD_DEFER_S * 0.9


def test_jobs_ahead_come_one_a_request_until_the_worker_holds_its_capacity():
    """Its request for jobs ahead asked for all of them (`lease_ahead`): the first busy worker
    to ask took them while the one beside it got none, and the batch waited on the first (4
    workers, batches of 8: 12.3 s a task, 8.4 s without leasing ahead). One a request, the
    busy workers take the jobs left in turns."""
    api = QueueApi([leased_job(i) for i in range(1, 10)])
    worker = _worker(api, concurrency=1, lease_ahead=2)  # capacity 3
    thread = _lease_in_thread(worker, api)
    try:
        assert wait_until(lambda: len(api.requests) >= 3)
        time.sleep(AHEAD_DEFER_S * 2)  # (no fourth: it holds its capacity)
        asked = [(jobs, wait_s) for jobs, wait_s, _ in api.requests]
        assert asked == [(1, LEASE_WAIT_S), (1, 0.0), (1, 0.0)]
        gaps = [b[2] - a[2] for a, b in zip(api.requests, api.requests[1:], strict=False)]
        assert all(gap >= AHEAD_DEFER_S * 0.9 for gap in gaps)
        assert worker._busy == 3 and worker._pool.jobs == [1, 2, 3]  # type: ignore[union-attr]
    finally:
        _stop(worker, thread)


@pytest.mark.parametrize("trial_s", [None, 0.1, 10.0])
def test_the_jobs_ahead_wait_a_moment_after_a_lease_half_a_short_trial_at_most(trial_s):
    """Where trials are shorter than twice AHEAD_DEFER_S the worker asks ahead half a trial
    after its lease: it would otherwise finish its trial before asking."""
    worker = _worker(QueueApi([]), concurrency=1, lease_ahead=2)
    worker._trial_s = trial_s
    with worker._slots:
        worker._hold([leased_job(1)])
        wait_s = worker._ahead_wait_s(1)
    expected = AHEAD_DEFER_S if trial_s is None else min(AHEAD_DEFER_S, trial_s / 2)
    assert expected * 0.9 <= wait_s <= expected
    with worker._slots:
        assert worker._ahead_wait_s(0) == 0.0  # a free slot's request goes at once


def test_an_empty_answer_ahead_holds_until_what_the_worker_holds_changes():
    worker = _worker(QueueApi([]), concurrency=1, lease_ahead=2)
    with worker._slots:
        worker._hold([leased_job(1), leased_job(2)])
        worker._leased_at = -float("inf")  # (long ago)
        assert worker._ahead_wait_s(2) <= 0
        worker._found_none_ahead = (2, time.monotonic())
        assert AHEAD_RECHECK_S * 0.9 <= worker._ahead_wait_s(2) <= AHEAD_RECHECK_S
        worker._found_none_ahead = (2, time.monotonic() - AHEAD_RECHECK_S)
        assert worker._ahead_wait_s(2) <= 0  # asked long enough ago: again
        worker._found_none_ahead = (2, time.monotonic())
    worker._release([leased_job(2)])  # one trial reported: it holds one
    with worker._slots:
        assert worker._found_none_ahead is None and worker._ahead_wait_s(1) <= 0


def test_a_stop_while_a_request_ahead_waits_its_turn_asks_for_nothing():
    worker = _worker(QueueApi([]), concurrency=1, lease_ahead=2)
    worker._trial_s = 100.0  # (AHEAD_DEFER_S, not shortened)
    with worker._slots:
        worker._hold([leased_job(1)])
        worker._found_none_ahead = (1, time.monotonic())  # (and AHEAD_RECHECK_S on top)
    asked: list[LeaseAsk] = []
    control = threading.Thread(target=lambda: asked.append(worker._free_slots()), daemon=True)
    control.start()
    time.sleep(0.1)
    assert control.is_alive()  # waiting for its turn to ask ahead
    started = time.monotonic()
    worker._stop.set()
    with worker._slots:
        worker._slots.notify_all()
    control.join(5)
    assert not control.is_alive() and time.monotonic() - started < 1.0
    assert asked == [LeaseAsk(jobs=0, wait=True, holding=1)] and worker._asking == 0
