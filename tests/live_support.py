"""Helpers of the tests that run `pipetune serve` and `pipetune worker` as processes on
loopback (tests/test_worker_live.py, tests/test_faults.py)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, select

from pipetune.clients.local_service import LocalService, free_port
from pipetune.clients.sdk import Client
from pipetune.model.states import JobState
from pipetune.model.wire import TrialDoc, WorkerDoc
from pipetune.service.orm import JobRow, LeaseRow, TaskRow

TOKEN = "worker-token-for-tests"


def start_service(
    directory: Path,
    port: int | None = None,
    *,
    database_url: str | None = None,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> LocalService:
    """`pipetune serve` on a SQLite file in `directory` (or `database_url`)."""
    return LocalService(
        database_url or f"sqlite:///{directory / 'pipetune.db'}",
        directory / "serve.log",
        port=port,
        extra_args=extra_args,
        env={"PIPETUNE_WORKER_TOKENS": TOKEN, **(env or {})},
    ).start(timeout_s=60)


def start_worker(
    server: str,
    log: Path,
    *args: str,
    time_scale: str = "0",
    token: str | None = TOKEN,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`pipetune worker` with JSON logs; `token=None` leaves it to the environment."""
    command = [sys.executable, "-m", "pipetune.clients.cli", "worker", "--server", server]
    if token is not None:
        command += ["--token", token]
    command += ["--heartbeat", "0.5", "--lease-wait", "1", "--json-logs"]
    env = {**os.environ, "PIPETUNE_SIMULATED_TIME_SCALE": time_scale, **(env or {})}
    with log.open("wb") as out:
        return subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT, env=env)


def events(log: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in log.read_text(encoding="utf-8").splitlines()
        if line.startswith("{")
    ]


def named(events_: list[dict], name: str) -> list[dict]:
    return [e for e in events_ if e["event"] == name]


def wait_until(predicate, timeout_s: float = 30.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def worker_named(client: Client, name: str) -> WorkerDoc | None:
    return next((w for w in client.workers() if w.name == name), None)


def stop(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> int | None:
    """SIGTERM and the exit status; a worker that does not stop in time is killed (None),
    and its log is printed for the failure report."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    finally:
        print(f"--- {log.name}\n{log.read_text(encoding='utf-8')[-8000:]}")


def leased_by(trials: list[TrialDoc]) -> list[TrialDoc]:
    return [t for t in trials if t.state == "leased"]


def stable_port() -> int:
    """A free port below Linux's ephemeral range (32768+): while the service is down, no
    outgoing connection (the worker's own retries included) can be given it as its source
    port, so the restarted service finds it free."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


@dataclass(frozen=True)
class Audit:
    """What the database says happened to one task's jobs."""

    trials: list[int]
    states: Counter[str]
    leases: dict[int, list[tuple]]  # trial -> [(worker, leased_at, ended_at, outcome)]
    result_workers: dict[int, int | None]  # trial -> the worker whose result counts


def audit_task(database_url: str, task_id: int, budget: int) -> Audit:
    """Nothing lost, nothing duplicated, exactly the budget: asserts, from the database,

    - the task is done with exactly `budget` trials, numbered 0..budget-1, each finished;
    - no job was ever leased to two workers at once (a lease ends before the next begins);
    - each job has exactly one lease that ended in its result, held by the worker whose
      result was recorded, and no job counts twice.
    """
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            task = conn.execute(
                select(TaskRow.state, TaskRow.trials_done, TaskRow.budget).where(
                    TaskRow.id == task_id
                )
            ).one()
            jobs = conn.execute(
                select(JobRow.id, JobRow.trial, JobRow.state, JobRow.result_worker).where(
                    JobRow.task_id == task_id
                )
            ).all()
            lease_rows = conn.execute(
                select(
                    LeaseRow.job_id,
                    LeaseRow.worker_id,
                    LeaseRow.leased_at,
                    LeaseRow.ended_at,
                    LeaseRow.outcome,
                ).where(LeaseRow.job_id.in_([job.id for job in jobs]))
            ).all()
    finally:
        engine.dispose()
    assert (task.state, task.trials_done, task.budget) == ("done", budget, budget), task
    trials = sorted(job.trial for job in jobs)
    assert trials == list(range(budget)), trials
    states = Counter(job.state for job in jobs)
    assert set(states) <= {JobState.DONE, JobState.FAILED}, states
    trial_of = {job.id: job.trial for job in jobs}
    leases: dict[int, list[tuple]] = defaultdict(list)
    for job_id, worker, leased_at, ended_at, outcome in lease_rows:
        leases[trial_of[job_id]].append((worker, leased_at, ended_at, outcome))
    result_workers = {job.trial: job.result_worker for job in jobs}
    for trial, held in leases.items():
        held.sort(key=lambda lease: lease[1])
        for earlier, later in itertools.pairwise(held):
            assert earlier[2] is not None and earlier[2] <= later[1], (trial, held)
        results = [lease for lease in held if lease[3] == "result"]
        assert len(results) == 1, (trial, held)
        assert results[0][0] == result_workers[trial], (trial, held, result_workers[trial])
    assert set(leases) == set(result_workers), "a job was finished without a lease"
    return Audit(trials, states, dict(leases), result_workers)
