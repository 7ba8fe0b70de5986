"""End to end: `pipetune serve` on loopback and simulated workers as separate processes
(`python -m pipetune.clients.cli worker ...`, the real worker command) tune a GEMM.

These tests need the worker command; when it is missing they fail (they do not skip).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from live_support import wait_until
from sqlalchemy import create_engine, select

from pipetune.model.states import JobState, TaskState
from pipetune.service.orm import JobRow, LeaseRow, WorkerRow

TOKEN = "e2e-worker-token"
WORKLOAD = {"op": "gemm", "m": 1024, "n": 1024, "k": 1024, "dtype": "float16"}
CLI = [sys.executable, "-m", "pipetune.clients.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    # Short lease long-polls: a stopping worker returns from its poll, then exits.
    env.update(PIPETUNE_WORKER_TOKENS=TOKEN, PIPETUNE_SIMULATED_TIME_SCALE="0.02")
    env.update(PIPETUNE_LEASE_WAIT_CAP_S="1", **extra)
    return env


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def _process(command: list[str], log: Path, env: dict[str, str]):
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _finished(client: httpx.Client, task_id: int, what: str) -> dict:
    """The task's document once its state is final (waits up to 120 s)."""
    return wait_until(
        lambda: (
            TaskState((t := client.get(f"/v1/tasks/{task_id}").json())["state"]).is_final() and t
        ),
        120,
        what,
    )


def _embedded_serve(tmp_path: Path) -> tuple[str, list[str], dict[str, str]]:
    """`serve` on the embedded defaults (no --db, no token) with a simulated local worker
    for every GPU: its URL, command and environment."""
    _worker_command_works()
    port = _free_port()
    env = _env(XDG_DATA_HOME=str(tmp_path / "data"))
    del env["PIPETUNE_WORKER_TOKENS"]
    command = [*CLI, "serve", "--port", str(port), "--local-workers", "3"]
    command += ["--runner", "simulated", "--log-level", "warning"]
    return f"http://127.0.0.1:{port}", command, env


def _worker_command_works() -> None:
    from pipetune.clients.cli.main import app

    commands = {c.name or getattr(c.callback, "__name__", "") for c in app.registered_commands}
    assert "worker" in commands, (
        "`pipetune worker` is not available: the end-to-end test needs the worker command"
    )


def _worker(url: str, name: str) -> list[str]:
    command = [*CLI, "worker", "--server", url, "--token", TOKEN, "--runner", "simulated"]
    return [*command, "--gpu", "h100", "--name", name]


def _assert_no_job_leased_twice_at_once(db: Path) -> dict[int, list]:
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        leases = conn.execute(
            select(LeaseRow.job_id, LeaseRow.leased_at, LeaseRow.ended_at, LeaseRow.outcome)
        ).all()
        jobs = conn.execute(select(JobRow.id, JobRow.state, JobRow.result_worker)).all()
        workers = dict(conn.execute(select(WorkerRow.id, WorkerRow.name)).all())
    engine.dispose()
    per_job: dict[int, list] = defaultdict(list)
    for job_id, leased_at, ended_at, outcome in leases:
        per_job[job_id].append((leased_at, ended_at, outcome))
    for job_id, held in per_job.items():
        held.sort(key=lambda lease: lease[0])
        for earlier, later in itertools.pairwise(held):
            # A job is leased again only after its previous lease ended.
            assert earlier[1] is not None and earlier[1] <= later[0], (job_id, held)
        assert sum(outcome == "result" for *_, outcome in held) <= 1
    assert set(per_job) == {job.id for job in jobs}
    return {"workers": workers, "jobs": jobs, "per_job": per_job}


def test_serve_and_two_simulated_workers_tune_a_gemm_with_budget_24(tmp_path):
    _worker_command_works()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    db = tmp_path / "e2e.db"
    env = _env()
    serve = [*CLI, "serve", "--db", f"sqlite:///{db}", "--port", str(port)]
    with _process([*serve, "--log-level", "warning"], tmp_path / "serve.log", env) as server:
        # The workers start with the service: they keep trying to register until it answers.
        names = ["e2e-h100-a", "e2e-h100-b"]
        workers = [_worker(url, name) for name in names]
        with (
            _process(workers[0], tmp_path / "worker-a.log", env) as worker_a,
            _process(workers[1], tmp_path / "worker-b.log", env) as worker_b,
        ):
            wait_until(lambda: _healthy(url), 60, "the service to answer /healthz")
            client = httpx.Client(base_url=url, timeout=30)
            wait_until(
                lambda: (
                    {w["name"] for w in client.get("/v1/workers").json()["workers"]} >= set(names)
                ),
                60,
                "both workers to register",
            )
            body = {"workload": WORKLOAD, "gpu": "h100", "budget": 24, "seed": 4}
            created = client.post("/v1/tasks", json=body)
            assert created.status_code == 201, created.text
            task_id = created.json()["id"]
            task = _finished(client, task_id, "the task to finish")
            assert task["state"] == "done", task
            assert task["trials_done"] == 24 and task["best"] is not None

            trials = client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
            assert [t["trial"] for t in trials] == list(range(24))
            assert {t["state"] for t in trials} <= {JobState.DONE, JobState.FAILED}
            assert len({tuple(t["schedule"].values()) for t in trials}) == 24
            assert {t["worker"] for t in trials} <= set(names)

            points = client.get(f"/v1/tasks/{task_id}/curve").json()["points"]
            assert [p["trial"] for p in points] == list(range(24))
            best = [p["best_latency_us"] for p in points if p["best_latency_us"] is not None]
            assert best and all(a >= b for a, b in itertools.pairwise(best))
            assert best[-1] == task["best"]["latency_us"]

            measured = client.post("/v1/schedules", json={"workload": WORKLOAD, "gpu": "h100"})
            assert measured.json()["source"] == "measured"
            client.close()

            for worker in (worker_a, worker_b):
                worker.send_signal(signal.SIGTERM)
            assert worker_a.wait(timeout=30) == 0 and worker_b.wait(timeout=30) == 0
        record = _assert_no_job_leased_twice_at_once(db)
        assert len(record["jobs"]) == 24
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("gpu", ["a100"])
def test_serve_embedded_with_local_workers_for_every_gpu(tmp_path, gpu):
    """No --db and no token: the embedded SQLite file under the user data dir is built on
    the spot, a worker token is generated, and --local-workers 3 gives every GPU a worker
    that serve stops when it stops."""
    url, command, env = _embedded_serve(tmp_path)
    log = tmp_path / "serve.log"
    with _process(command, log, env) as server:
        wait_until(lambda: _healthy(url), 60, "the service to answer /healthz")
        assert (tmp_path / "data" / "pipetune" / "pipetune.db").exists()
        token_file = tmp_path / "data" / "pipetune" / "worker-token"
        assert f"worker token: generated, in {token_file}" in log.read_text()
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32 and token not in log.read_text()
        client = httpx.Client(base_url=url, timeout=30)
        registered = wait_until(
            lambda: (ws := client.get("/v1/workers").json()["workers"]) and len(ws) == 3 and ws,
            60,
            "three local workers",
        )
        assert {w["gpu"] for w in registered} == {"a100", "h100", "h200"}
        workers = _children(server.pid)
        assert len(workers) == 3
        for pid in workers:  # the token is in no worker's command line
            assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        body = {"workload": WORKLOAD, "gpu": gpu, "budget": 8, "strategy": "analytical"}
        task_id = client.post("/v1/tasks", json=body).json()["id"]
        done = wait_until(
            lambda: (t := client.get(f"/v1/tasks/{task_id}").json())["state"] == "done" and t,
            60,
            "the task to finish",
        )
        assert done["trials_done"] == 8
        trials = client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
        assert {t["worker"] for t in trials} == {w["name"] for w in registered if w["gpu"] == gpu}
        client.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    assert not [pid for pid in workers if _alive(pid)]  # serve stopped its workers


def test_serve_with_local_workers_tunes_a_softmax_to_its_budget(tmp_path):
    """The memory-intensive family end to end: `serve --local-workers` (simulated worker
    processes) tunes a softmax task with the default strategy to exactly its budget."""
    url, command, env = _embedded_serve(tmp_path)
    with _process(command, tmp_path / "serve.log", env) as server:
        wait_until(lambda: _healthy(url), 60, "the service to answer /healthz")
        client = httpx.Client(base_url=url, timeout=30)
        workload = {"op": "softmax", "rows": 4096, "cols": 768}
        created = client.post("/v1/tasks", json={"workload": workload, "gpu": "h100", "budget": 16})
        assert created.status_code == 201, created.text
        assert created.json()["strategy"] == "auto"
        task_id = created.json()["id"]
        task = _finished(client, task_id, "the softmax task to finish")
        assert task["state"] == "done" and task["trials_done"] == 16, task
        assert task["best"]["throughput_unit"] == "GB/s" and task["best"]["runner"] == "simulated"
        trials = client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
        assert [t["trial"] for t in trials] == list(range(16))
        assert all("rows_per_block" in t["schedule"] for t in trials)
        assert len({tuple(t["schedule"].values()) for t in trials}) == 16
        curve = client.get(f"/v1/tasks/{task_id}/curve").json()
        assert curve["throughput_unit"] == "GB/s"
        best = [p["best_throughput"] for p in curve["points"]]
        assert len(best) == 16 and all(a <= b for a, b in itertools.pairwise(best))
        client.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
