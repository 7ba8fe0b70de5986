"""The worker daemon against a live service on loopback (`pipetune serve` in a child
process): registration, leases, results, heartbeats, SIGTERM drain, a service restart in
the middle of a task, a replay worker, and its startup failures.

Every worker here is a real `python -m pipetune.clients.cli worker` process, as deployments run it.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import pytest
from live_support import (
    events,
    leased_by,
    named,
    stable_port,
    start_service,
    start_worker,
    stop,
    wait_until,
    worker_named,
)

from pipetune.clients.local_service import LocalService
from pipetune.clients.sdk import Client
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule, Space
from pipetune.model.wire import WorkerDoc
from pipetune.model.workloads import gemm
from pipetune.workers.datasets import write_t4
from pipetune.workers.runners import SimulatedRunner
from pipetune.workers.runners.sweep import sweep

RN50_FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
SMALL = {"op": "gemm", "m": 64, "n": 64, "k": 64}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    svc = start_service(tmp_path_factory.mktemp("service"))
    yield svc
    svc.stop()


def test_worker_registers_leases_reports_and_heartbeats(service: LocalService, tmp_path: Path):
    log = tmp_path / "worker.log"
    with Client(service.url) as c:
        task = c.tune(RN50_FC, "h100", budget=6, seed=1)
        proc = start_worker(
            service.url,
            log,
            "--runner",
            "simulated",
            "--gpu",
            "h100",
            "--concurrency",
            "2",
            "--name",
            "live-h100",
            "--heartbeat",  # idle, it beats every sixth: within the wait below
            "1",
        )
        try:
            done = c.wait(task.id, poll_s=0.2, timeout_s=60)
            first = wait_until(lambda: worker_named(c, "live-h100"), what="registration")

            def beat() -> WorkerDoc | None:
                now = worker_named(c, "live-h100")
                return now if now and now.last_heartbeat > first.last_heartbeat else None

            later = wait_until(beat, timeout_s=10, what="a heartbeat")
            trials = c.all_trials(task.id)
        finally:
            code = stop(proc, log)
    assert code == 0
    assert done.state == "done" and done.trials_done == 6 and done.trials_failed == 0
    assert (later.gpu, later.arch, later.runner) == ("h100", "sm_90", "simulated")
    assert [t.trial for t in trials] == list(range(6))
    assert all(t.state == "done" and t.status == "ok" and t.worker == "live-h100" for t in trials)

    log_events = events(log)
    (registered,) = named(log_events, "registered")
    assert registered["gpu"] == "h100" and registered["arch"] == "sm_90"
    # One log line per trial, naming task, trial, schedule, status and latency.
    lines = {(e["task"], e["trial"]): e for e in named(log_events, "trial")}
    assert set(lines) == {(task.id, t.trial) for t in trials}
    for t in trials:
        line = lines[(task.id, t.trial)]
        assert line["schedule"] == Schedule(**t.schedule.model_dump()).id
        assert line["status"] == "ok" and line["runner"] == "simulated"
        assert line["latency_us"] == pytest.approx(t.latency_us)
    (stopped,) = named(log_events, "stopped")
    assert stopped["measured"] == stopped["accepted"] == 6


def test_a_worker_leases_its_next_jobs_with_its_reports(service: LocalService, tmp_path: Path):
    # A `random` task keeps its next batch queued: the worker's reports find jobs to lease,
    # so after its first lease request most jobs come back with the results it posts.
    log = tmp_path / "worker.log"
    with Client(service.url) as c:
        task = c.tune(RN50_FC, "h200", budget=48, strategy="random", seed=3)
        proc = start_worker(
            service.url, log, "--runner", "simulated", "--gpu", "h200", "--name", "live-reports"
        )
        try:
            done = c.wait(task.id, poll_s=0.2, timeout_s=60)
        finally:
            code = stop(proc, log)
    assert code == 0
    assert done.state == "done" and done.trials_done == 48
    (stopped,) = named(events(log), "stopped")
    assert stopped["measured"] == stopped["accepted"] == 48
    assert stopped["leased"] + stopped["leased_with_reports"] == 48
    assert stopped["leased_with_reports"] > stopped["leased"]


def test_sigterm_drains_the_jobs_in_hand_then_exits_0(service: LocalService, tmp_path: Path):
    log = tmp_path / "worker.log"
    with Client(service.url) as c:
        task = c.tune(RN50_FC, "a100", budget=12, seed=2)
        # Time scale 1: a simulated trial takes about a second, like a real compile + run.
        proc = start_worker(
            service.url,
            log,
            "--runner",
            "simulated",
            "--gpu",
            "a100",
            "--concurrency",
            "3",
            "--name",
            "live-drain",
            time_scale="1",
        )
        try:
            in_hand = wait_until(
                lambda: leased_by(c.all_trials(task.id)), timeout_s=30, what="leased trials"
            )
            code = stop(proc, log)
        finally:
            if proc.poll() is None:
                proc.kill()
        after = {t.trial: t for t in c.all_trials(task.id)}
        c.cancel(task.id)  # leave no queued jobs for the other tests' workers
    assert code == 0
    # Every job the worker held when SIGTERM came was measured and reported.
    for t in in_hand:
        assert after[t.trial].state == "done" and after[t.trial].worker == "live-drain"
    assert not [t for t in after.values() if t.state == "leased"]
    log_events = events(log)
    assert named(log_events, "draining") and not named(log_events, "abandoned")
    (stopped,) = named(log_events, "stopped")
    reported = [t for t in after.values() if t.worker == "live-drain"]
    assert stopped["measured"] == stopped["accepted"] == len(reported) >= len(in_hand)


def test_a_service_restart_mid_task_loses_no_result(tmp_path: Path):
    port = stable_port()
    svc = start_service(tmp_path, port)
    log = tmp_path / "worker.log"
    proc = start_worker(
        svc.url,
        log,
        "--runner",
        "simulated",
        "--gpu",
        "h200",
        "--concurrency",
        "2",
        "--name",
        "live-restart",
        time_scale="1",
    )
    try:
        with Client(svc.url) as c:
            task = c.tune(RN50_FC, "h200", budget=8, seed=3)
            wait_until(lambda: leased_by(c.all_trials(task.id)), what="leased trials")
        # Down while the worker measures what it holds: its results must wait, not vanish.
        svc.stop()
        wait_until(lambda: named(events(log), "report_retry"), what="a result retried")
        svc = start_service(tmp_path, port)
        with Client(svc.url) as c:
            done = c.wait(task.id, poll_s=0.2, timeout_s=60)
            trials = c.all_trials(task.id)
    finally:
        try:
            code = stop(proc, log)
        finally:
            print(f"--- serve.log\n{svc.log_tail(60)}")
            svc.stop()
    assert code == 0
    assert done.state == "done" and done.trials_done == 8 and done.trials_failed == 0
    assert all(t.state == "done" and t.status == "ok" for t in trials)
    log_events = events(log)
    (stopped,) = named(log_events, "stopped")
    assert stopped["accepted"] == stopped["measured"] == 8
    assert "unreported" not in stopped and not named(log_events, "report_gave_up")


def test_a_replay_worker_answers_from_its_dataset(service: LocalService, tmp_path: Path):
    workload = gemm(64, 64, 64)
    spec = get_gpu("a100")
    with SimulatedRunner(spec, time_scale=0) as runner:
        dataset = sweep(runner, workload, spec, list(Space.enumerate(workload, spec)))
    path = tmp_path / "small.t4.json.gz"
    write_t4(dataset, path)
    log = tmp_path / "worker.log"
    proc = start_worker(
        service.url,
        log,
        "--runner",
        "replay",
        "--gpu",
        "a100",
        "--dataset",
        str(path),
        "--name",
        "live-replay",
    )
    try:
        with Client(service.url) as c:
            # Another workload's task on its GPU: the replay worker cannot answer it and
            # took its jobs all the same, failing them ("not in the dataset").
            other = c.tune(RN50_FC, "a100", budget=4, seed=4)
            task = c.tune(SMALL, "a100", budget=4, seed=4)
            done = c.wait(task.id, poll_s=0.2, timeout_s=60)
            worker = worker_named(c, "live-replay")
            trials = c.all_trials(task.id)
            untouched = c.task(other.id)
            c.cancel(other.id)
    finally:
        code = stop(proc, log)
    assert code == 0 and done.state == "done" and done.trials_done == 4
    assert worker is not None and worker.runner == "replay"
    assert worker.workload_hash == workload.workload_hash
    assert (untouched.trials_done, untouched.trials_failed) == (0, 0)
    for t in trials:
        record = dataset.lookup(t.schedule.model_dump())
        assert record is not None and t.latency_us == pytest.approx(record.time_ms * 1e3)
    assert {e["runner"] for e in named(events(log), "trial")} == {"replay:simulated"}


def test_a_refused_token_is_one_line_and_exit_1(service: LocalService, tmp_path: Path):
    log = tmp_path / "worker.log"
    proc = start_worker(
        service.url, log, "--runner", "simulated", "--gpu", "h100", token="not-a-token"
    )
    assert proc.wait(30) == 1
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "HTTP 401" in lines[0] or "HTTP 403" in lines[0]


def test_an_idle_connection_outlives_the_clients_keep_alive(service: LocalService):
    """httpx keeps an idle connection 5 s; the service must keep it longer, or a request
    sent as the client reuses it can meet the server's close (seen in the load benchmark)."""
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        local = conn.sock.getsockname()
        time.sleep(6.0)  # past httpx's (and uvicorn's default) 5 s
        conn.request("GET", "/healthz")  # on the same connection (raises if it was closed)
        again = conn.getresponse()
        assert again.status == 200 and again.read()
        assert conn.sock.getsockname() == local
    finally:
        conn.close()
