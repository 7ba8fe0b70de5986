"""Jobs a worker holds ahead of a task cancelled while it measures are not measured: before a
held job starts, a worker that has not heard of its task lately (CONFIRM_AFTER_S) waits for
word of it, the answer to the report of the trial that just ended (a result refused as "task
cancelled" names the task's held jobs gone), or else a heartbeat asked for then (its `gone`).
Before, the first job held was started the moment the trial before it ended, measured for
nothing, and its result refused as well."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from service_support import live_server
from worker_support import OK, leased_job, run_in_thread, simulated_daemon, wait_until

from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobLease
from pipetune.service.migrate import upgrade
from pipetune.workers.daemon import worker as worker_module
from pipetune.workers.daemon.worker import Worker

SMALL = {"op": "gemm", "m": 64, "n": 64, "k": 64}


@pytest.fixture
def ask_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every held job asks about its task before it starts (not only those that waited past
    CONFIRM_AFTER_S), and waits for the answer as long as it takes: what a trial longer than
    CONFIRM_AFTER_S gets, without a test that takes that long or depends on the clock."""
    monkeypatch.setattr(worker_module, "CONFIRM_AFTER_S", 0.0)
    monkeypatch.setattr(worker_module, "CONFIRM_WAIT_S", 30.0)


class GatedTrials:
    """The worker's trials: the first waits for `release`, the others answer at once; the
    jobs whose results were handed to the reporter, in order."""

    def __init__(self, worker: Worker) -> None:
        self.gate = threading.Event()
        self.started = 0
        self.finished: list[int] = []
        plain = worker._finish

        def measure_one(workload: object, schedule: object) -> MeasureResult:
            self.started += 1
            if self.started == 1:
                self.gate.wait(30)
            return OK

        def finish(job: JobLease, result: MeasureResult) -> None:
            self.finished.append(job.job_id)
            plain(job, result)

        worker._measure_one = measure_one  # type: ignore[method-assign]
        worker._finish = finish  # type: ignore[method-assign]


@contextmanager
def daemon_on_a_service(tmp_path: Path) -> Iterator[tuple[Worker, GatedTrials, httpx.Client]]:
    url = f"sqlite:///{tmp_path / 'cancel.db'}"
    upgrade(url)
    with live_server(url) as base, httpx.Client(base_url=base, timeout=30) as client:
        worker = simulated_daemon(base, lease_wait_s=1, lease_ahead=2)
        trials = GatedTrials(worker)
        thread, status = run_in_thread(worker)
        try:
            yield worker, trials, client
        finally:
            trials.gate.set()
            worker.request_stop()
            thread.join(15)
        assert not thread.is_alive() and status == [0]


def _task(client: httpx.Client, budget: int) -> int:
    body = {"workload": SMALL, "gpu": "h100", "budget": budget, "strategy": "grid"}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_jobs_held_of_the_task_cancelled_during_a_trial_are_dropped_unmeasured(
    tmp_path: Path, ask_always: None
):
    """The answer to the report of the trial that ended tells: its task was cancelled."""
    with daemon_on_a_service(tmp_path) as (worker, trials, client):
        task = _task(client, budget=3)
        # One job measured (held at the gate), two held ahead.
        assert wait_until(lambda: trials.started == 1 and len(worker._held) == 3, timeout_s=10)
        assert client.delete(f"/v1/tasks/{task}").status_code == 200
        trials.gate.set()
        assert wait_until(lambda: worker._busy == 0, timeout_s=10)
    assert trials.started == 1 and trials.finished == [1]  # the held two were not measured
    assert worker.counts["dropped"] == 2 and worker.counts["stale"] == 1


def test_a_job_held_of_another_task_cancelled_meanwhile_is_dropped_unmeasured(
    tmp_path: Path, ask_always: None, monkeypatch: pytest.MonkeyPatch
):
    """The trial that ended is another task's: its report says nothing of the held job's
    task, so a heartbeat is sent, whose `gone` names the held jobs."""
    monkeypatch.setattr(worker_module, "AHEAD_RECHECK_S", 0.05)  # (the jobs ahead come sooner)
    with daemon_on_a_service(tmp_path) as (worker, trials, client):
        measured = _task(client, budget=1)
        assert wait_until(lambda: trials.started == 1, timeout_s=10)
        cancelled = _task(client, budget=2)
        assert wait_until(lambda: len(worker._held) == 3, timeout_s=10)  # its two held ahead
        assert client.delete(f"/v1/tasks/{cancelled}").status_code == 200
        trials.gate.set()
        assert wait_until(lambda: worker._busy == 0, timeout_s=10)
        # The other task's trial was recorded (the task ends once the service has seen it).
        done = wait_until(lambda: client.get(f"/v1/tasks/{measured}").json()["state"] == "done")
    assert trials.started == 1 and len(trials.finished) == 1
    assert worker.counts["dropped"] == 2 and worker.counts["accepted"] == 1 and done


def test_a_job_whose_task_was_heard_of_lately_starts_without_asking(
    monkeypatch: pytest.MonkeyPatch,
):
    """Trials shorter than CONFIRM_AFTER_S are not held up: a held job whose task was heard
    of within it (its lease, a result accepted, a heartbeat) starts at once, no heartbeat
    asked for; one heard of longer ago asks for one (where a heartbeat thread runs)."""
    clock = [1000.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    worker = simulated_daemon("http://fake", object())
    rings: list[int] = []

    def ring() -> None:
        rings.append(1)
        with worker._slots:  # (as the heartbeat thread answers an ask whose beat failed)
            worker._asked_beats += 1

    worker._ring_heartbeat = ring
    job = leased_job(1)
    with worker._slots:
        worker._hold([job])
    clock[0] += worker_module.CONFIRM_AFTER_S
    worker._await_word_of_task(job)
    assert rings == [] and not worker._beat_asked
    clock[0] += 0.01
    worker._await_word_of_task(job)
    assert rings == [1]
