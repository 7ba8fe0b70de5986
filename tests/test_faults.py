"""Faults survived, on loopback with real processes (`pipetune serve`, `pipetune worker`),
on the embedded SQLite file and on PostgreSQL. Every test ends with the database's own
audit (live_support.audit_task): the task is done with exactly its budget of trials, no job
was held by two workers at once, and every job's result counts once.

- a worker SIGKILLed while holding leases: the leases expire, another worker does the jobs;
- the service SIGKILLed and restarted mid-task: the task resumes where it was;
- PostgreSQL stopped (as in a crash) and restarted while workers poll: they back off and
  resume; the service answers 503 meanwhile, never a traceback;
- a trial whose measuring process crashes (SIGSEGV) or hangs: a failed trial, and the
  worker goes on measuring.

Double, late and foreign reports are in tests/test_report_faults.py (in-process client).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from live_support import (
    audit_task,
    events,
    leased_by,
    named,
    stable_port,
    start_service,
    start_worker,
    stop,
    wait_until,
)
from pg_instance import PostgresInstance

from pipetune.clients.sdk import Client
from pipetune.model.space import Schedule
from pipetune.model.workloads import parse_workload
from pipetune.service.migrate import upgrade
from pipetune.workers.runners.faults import FaultPlan

pytest_plugins = ["service_fixtures"]

RN50_FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
# Short leases and a quick sweep, so an orphaned lease comes back within seconds.
FAST_EXPIRY = {"PIPETUNE_LEASE_TTL_S": "3", "PIPETUNE_SWEEP_INTERVAL_S": "0.5"}


def simulated_worker(
    url: str, log: Path, name: str, *extra: str, gpu: str = "h100", time_scale: str = "0"
) -> subprocess.Popen[bytes]:
    return start_worker(
        url, log, "--runner", "simulated", "--gpu", gpu, "--name", name, *extra,
        time_scale=time_scale,
    )  # fmt: skip


@contextlib.contextmanager
def workers_stopped_at_exit(*procs: tuple[subprocess.Popen[bytes], Path]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                stop(proc, log)


def worker_id_of(client: Client, name: str) -> int:
    return next(w.id for w in client.workers() if w.name == name)


def test_a_worker_killed_holding_leases_loses_nothing(db_url: str, tmp_path: Path):
    svc = start_service(tmp_path, database_url=db_url, env=FAST_EXPIRY)
    doomed_log, rescuer_log = tmp_path / "doomed.log", tmp_path / "rescuer.log"
    try:
        # Time scale 1: each trial takes about a second, so the doomed worker holds leases.
        doomed = simulated_worker(
            svc.url, doomed_log, "doomed", "--concurrency", "3", time_scale="1"
        )
        with Client(svc.url) as c, workers_stopped_at_exit((doomed, doomed_log)):
            task = c.tune(RN50_FC, "h100", budget=10, seed=11)

            def two_held() -> list:
                held = leased_by(c.all_trials(task.id))
                return held if len(held) >= 2 else []

            wait_until(two_held, what="the doomed worker to hold leases")
            doomed.kill()
            doomed.wait()
            # What it held when it died (a result it posted just before is not among them).
            held = leased_by(c.all_trials(task.id))
            assert held, "the doomed worker held no lease when it was killed"
            rescuer = simulated_worker(svc.url, rescuer_log, "rescuer", "--concurrency", "2")
            with workers_stopped_at_exit((rescuer, rescuer_log)):
                done = c.wait(task.id, poll_s=0.2, timeout_s=90)
                rescuer_id = worker_id_of(c, "rescuer")
                doomed_id = worker_id_of(c, "doomed")
                trials = {t.trial: t for t in c.all_trials(task.id)}
                assert stop(rescuer, rescuer_log) == 0
    finally:
        print(f"--- serve.log\n{svc.log_tail(40)}")
        svc.stop()
    assert done.state == "done" and done.trials_done == 10
    audit = audit_task(db_url, task.id, budget=10)
    for t in held:
        # Held by the killed worker: its lease expired, the rescuer measured and reported.
        assert trials[t.trial].state == "done" and trials[t.trial].worker == "rescuer"
        outcomes = [(w, outcome) for w, _, _, outcome in audit.leases[t.trial]]
        assert outcomes[0] == (doomed_id, "expired") and outcomes[-1] == (rescuer_id, "result")
    assert named(events(rescuer_log), "stopped")[0]["accepted"] >= len(held)


def test_the_service_killed_and_restarted_mid_task_resumes(db_url: str, tmp_path: Path):
    port = stable_port()
    svc = start_service(tmp_path, port, database_url=db_url)
    log = tmp_path / "worker.log"
    proc = simulated_worker(svc.url, log, "survivor", "--concurrency", "2", time_scale="0.5")
    try:
        with Client(svc.url) as c:
            task = c.tune(RN50_FC, "h100", budget=16, seed=12)
            wait_until(
                lambda: c.task(task.id).trials_done >= 3 and leased_by(c.all_trials(task.id)),
                what="some trials done and some held",
            )
        svc.kill()  # no shutdown at all: in-flight requests and open transactions cut
        wait_until(
            lambda: named(events(log), "report_retry") or named(events(log), "lease_failed"),
            what="the worker to notice the service is gone",
        )
        svc = start_service(tmp_path, port, database_url=db_url)
        with Client(svc.url) as c:
            done = c.wait(task.id, poll_s=0.2, timeout_s=90)
        code = stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        print(f"--- serve.log\n{svc.log_tail(40)}")
        svc.stop()
    assert code == 0
    assert done.state == "done" and done.trials_done == 16
    audit_task(db_url, task.id, budget=16)
    (stopped,) = named(events(log), "stopped")
    assert "unreported" not in stopped and not named(events(log), "report_gave_up")


def test_postgresql_restarted_while_workers_poll(private_postgres: PostgresInstance, tmp_path):
    url = private_postgres.url
    upgrade(url)
    svc = start_service(tmp_path, database_url=url)
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    procs = [
        simulated_worker(svc.url, log, f"poller-{i}", "--concurrency", "2", time_scale="0.3")
        for i, log in enumerate(logs)
    ]
    try:
        with Client(svc.url) as c, workers_stopped_at_exit(*zip(procs, logs, strict=True)):
            task = c.tune(RN50_FC, "h100", budget=24, seed=13)
            wait_until(lambda: c.task(task.id).trials_done >= 4, what="some trials done")
            private_postgres.stop("immediate")  # as in a crash: every connection cut
            wait_until(
                lambda: any(
                    named(events(log), "lease_failed") or named(events(log), "report_retry")
                    for log in logs
                ),
                what="a worker to meet the outage",
            )
            time.sleep(2)  # down a while: several polls and retries fail
            private_postgres.start()
            done = c.wait(task.id, poll_s=0.3, timeout_s=120)
            codes = [stop(proc, log) for proc, log in zip(procs, logs, strict=True)]
    finally:
        print(f"--- serve.log\n{svc.log_tail(60)}")
        svc.stop()
    assert codes == [0, 0]
    assert done.state == "done" and done.trials_done == 24
    audit_task(url, task.id, budget=24)
    serve_log = (tmp_path / "serve.log").read_text()
    # The outage was answered with 503s (retried by the workers), never a 500 traceback.
    assert "database unavailable" in serve_log
    assert "Traceback" not in serve_log and " 500 " not in serve_log
    for log in logs:
        (stopped,) = named(events(log), "stopped")
        assert "unreported" not in stopped and not named(events(log), "report_gave_up")


def test_crashing_and_hanging_trials_are_failed_trials_and_the_worker_survives(
    tmp_path: Path,
):
    plan = "crash=0.25,hang=0.15,seed=5"
    svc = start_service(tmp_path)
    log = tmp_path / "worker.log"
    proc = simulated_worker(
        svc.url, log, "faulty", "--simulate-faults", plan, "--trial-timeout", "1.5"
    )
    try:
        with Client(svc.url) as c, workers_stopped_at_exit((proc, log)):
            first = c.tune(RN50_FC, "h100", budget=12, seed=14)
            first_done = c.wait(first.id, poll_s=0.2, timeout_s=120)
            # The same worker process goes on to a second task.
            second = c.tune({**RN50_FC, "m": 2048}, "h100", budget=6, seed=15)
            second_done = c.wait(second.id, poll_s=0.2, timeout_s=120)
            trials = [(RN50_FC, t) for t in c.all_trials(first.id)]
            trials += [({**RN50_FC, "m": 2048}, t) for t in c.all_trials(second.id)]
            pid_alive = proc.poll() is None
            code = stop(proc, log)
    finally:
        svc.stop()
    assert pid_alive and code == 0
    assert (first_done.state, first_done.trials_done) == ("done", 12)
    assert (second_done.state, second_done.trials_done) == ("done", 6)
    database = f"sqlite:///{tmp_path / 'pipetune.db'}"
    audit_task(database, first.id, budget=12)
    audit_task(database, second.id, budget=6)
    fault_plan = FaultPlan.parse(plan)
    expected = {"crash": "runtime_error", "hang": "timeout", None: "ok"}
    seen = set()
    for workload_doc, t in trials:
        workload = parse_workload(workload_doc)
        schedule = Schedule(**t.schedule.model_dump())
        fault = fault_plan.fault_of(workload.workload_hash, schedule.id)
        seen.add(fault)
        assert t.status == expected[fault], (t, fault)
        assert t.state == ("done" if fault is None else "failed")
    assert seen == {"crash", "hang", None}  # every path taken, else the test proves little
    failed = [t for _, t in trials if t.state == "failed"]
    assert first_done.trials_failed + second_done.trials_failed == len(failed)
    assert any("SIGSEGV" in (t.error or "") for t in failed)
