"""A task no live worker can take says why (TaskDoc.no_worker): its GPU has no worker, its
runner kind none, only replay workers of other workloads, or none heard from within the
lease TTL. It waited silently, "queued" with no result, for ever. On SQLite and PostgreSQL;
the CLI's progress line and task list show it too."""

from __future__ import annotations

import datetime as dt
import io

from rich.console import Console
from service_support import (
    GEMM,
    SMALL_GEMM,
    WORKER_HEADERS,
    client_for,
    lease,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import update
from typer.testing import CliRunner

from pipetune.clients.cli import client_cmds
from pipetune.clients.cli.client_cmds import wait_for_task
from pipetune.clients.cli.main import app
from pipetune.model.wire import TaskDoc
from pipetune.service.migrate import upgrade
from pipetune.service.orm import WorkerRow

pytest_plugins = ["service_fixtures"]


def _task(client, gpu: str = "h100", workload: dict = GEMM, **extra) -> dict:
    body = {"workload": workload, "gpu": gpu, "budget": 4, "strategy": "grid"} | extra
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def _why(client, task_id: int) -> str | None:
    response = client.get(f"/v1/tasks/{task_id}")
    assert response.status_code == 200, response.text
    return response.json()["no_worker"]


def _register_replay(client) -> None:
    """A replay worker of SMALL_GEMM's dataset on an H100: it takes no other workload."""
    body = {
        "name": "replay-h100", "gpu": "h100", "arch": "sm_90", "runner": "replay",
        "workload": SMALL_GEMM,
    }  # fmt: skip
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code == 201, response.text


def _silence(client, worker: int) -> float:
    """The worker silent for twice the lease TTL, by the database's clock; the TTL."""
    service = service_of(client)
    ttl = service.settings.lease_ttl_s
    with service.db.write() as s:
        s.execute(
            update(WorkerRow)
            .where(WorkerRow.id == worker)
            .values(last_heartbeat=service.db.now_plus(-2 * ttl))
        )
    return ttl


def _listed(client) -> dict[int, str | None]:
    return {t["id"]: t["no_worker"] for t in client.get("/v1/tasks").json()["tasks"]}


def test_a_task_for_a_gpu_no_worker_has_says_so_until_one_registers(client):
    created = _task(client, "a100")
    # Said at once, in the answer that created it, and in every read after.
    assert created["state"] == "queued"
    assert created["no_worker"] == "no a100 worker has registered"
    register(client, "sim-h100", "h100")  # (another GPU's worker changes nothing)
    assert _why(client, created["id"]) == "no a100 worker has registered"
    assert _listed(client) == {created["id"]: "no a100 worker has registered"}
    register(client, "sim-a100", "a100")
    assert _why(client, created["id"]) is None
    assert _listed(client) == {created["id"]: None}


def test_a_task_for_a_runner_kind_no_worker_has_names_the_kinds_there_are(client):
    task = _task(client, "h100", runner="cupy")
    register(client, "sim-h100", "h100")
    why = _why(client, task["id"])
    assert why is not None and why.startswith("no cupy worker for h100 has registered")
    assert "simulated" in why
    # And it is true: the simulated worker leases none of its jobs.
    assert lease(client, register(client, "sim-h100-2", "h100"), max_jobs=8) == []
    register(client, "cupy-h100", "h100", runner="cupy")
    assert _why(client, task["id"]) is None


def test_a_task_only_replay_workers_of_other_workloads_could_take_says_so(client):
    task = _task(client, "h100")
    _register_replay(client)
    why = _why(client, task["id"])
    assert why is not None and "replay other workloads' datasets" in why, why
    # A replay worker of its own workload takes it.
    _task(client, "h100", workload=SMALL_GEMM)
    own = _task(client, "h100", workload=SMALL_GEMM, seed=1)
    assert _why(client, own["id"]) is None


def test_a_task_whose_workers_went_silent_says_when_one_was_last_heard(client):
    task = _task(client, "h100")
    worker = register(client, "sim-h100", "h100")
    assert _why(client, task["id"]) is None
    ttl = _silence(client, worker)
    why = _why(client, task["id"])
    assert why is not None and why.startswith("no h100 worker is live"), why
    assert f"the last, {2 * ttl:.0f} s ago" in why
    # A heartbeat makes it live again.
    response = client.post(
        f"/v1/workers/{worker}/heartbeat", json={"busy_jobs": 0}, headers=WORKER_HEADERS
    )
    assert response.status_code == 200, response.text
    assert _why(client, task["id"]) is None


def test_a_task_whose_fitting_workers_went_silent_beside_live_replay_workers_says_both(client):
    """A live replay worker of another workload beside silent workers that could take the
    task: it read "no h100 worker is live" of a GPU whose fleet was working."""
    task = _task(client, "h100")
    silent = register(client, "sim-h100", "h100")
    _register_replay(client)
    ttl = _silence(client, silent)
    why = _why(client, task["id"])
    assert why is not None and why.startswith("no h100 worker that takes this workload is live")
    assert "the live ones replay other workloads' datasets" in why
    assert f"the last that could, {2 * ttl:.0f} s ago" in why


def test_an_ended_task_says_nothing_of_workers(client):
    task = _task(client, "a100", budget=1)
    assert task["no_worker"] is not None
    worker = register(client, "sim-a100", "a100")
    (job,) = lease(client, worker)
    assert post_result(client, worker, job, ok(10.0)).status_code == 200
    with service_of(client).db.write() as s:  # the worker gone since: the task is done
        s.execute(update(WorkerRow).values(last_heartbeat=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)))
    cancelled = _task(client, "a100", seed=1)
    assert client.delete(f"/v1/tasks/{cancelled['id']}").json()["no_worker"] is None
    docs = {t["id"]: t for t in client.get("/v1/tasks").json()["tasks"]}
    assert docs[task["id"]]["state"] == "done" and docs[task["id"]]["no_worker"] is None


def test_an_older_answer_without_the_field_still_reads():
    """The field is optional: an SDK reads an answer of a service from before it."""
    doc = {
        "id": 1, "state": "queued", "workload": GEMM, "gpu": "h100", "strategy": "grid",
        "budget": 4, "seed": 0, "trials_done": 0, "trials_failed": 0,
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    assert TaskDoc.model_validate(doc).no_worker is None


def test_the_cli_says_why_a_task_waits(tmp_path, monkeypatch):
    """`pipetune tasks` (here on the local database, as the service answers) names the
    reason under its table, and `tune --wait`'s progress line carries it."""
    url = f"sqlite:///{tmp_path / 'pipetune.db'}"
    upgrade(url)
    with client_for(url) as client:
        task = _task(client, "a100")
    result = CliRunner().invoke(app, ["tasks", "--db", url])
    assert result.exit_code == 0, result.output
    assert f"task {task['id']} waits: no a100 worker has registered" in result.output
    # (Its times are UTC, as `pipetune workers` says of its own: unlabelled, they read as
    # hours old or ahead in any other zone.)
    assert "(UTC)" in result.output

    doc = TaskDoc.model_validate(task)

    shown = _progress_of(doc, monkeypatch)
    assert "waiting: no a100 worker has registered" in shown
    # Into a log (no bar there): the reason as a warning line, and a progress line.
    logged = _progress_of(doc, monkeypatch, terminal=False).splitlines()
    assert logged == [
        f"warning: task {task['id']} waits: no a100 worker has registered",
        f"task {task['id']} queued, 0/4 trials",
    ]


def test_the_tune_progress_bar_counts_the_trials_the_task_runs(monkeypatch):
    """A task whose space is smaller than its budget runs its whole space: `tune --wait`'s
    bar stood at 1/50 for a space of two schedules (and jumped to 2/2 when it ended)."""
    doc = TaskDoc.model_validate(
        {
            "id": 1, "state": "running", "workload": {"op": "gemm", "m": 16, "n": 16, "k": 16},
            "gpu": "h100", "strategy": "auto", "budget": 50, "seed": 0, "trials_done": 1,
            "trials_failed": 0, "trials_target": 2,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        }
    )  # fmt: skip

    shown = _progress_of(doc, monkeypatch)
    assert "1/2" in shown and "1/50" not in shown


def _progress_of(doc: TaskDoc, monkeypatch, terminal: bool = True) -> str:
    """What `tune --wait`'s progress bar shows (on stderr, a terminal) of a wait that sees
    `doc` once; with `terminal` False, what it prints into a log instead."""

    class Waiting:  # the SDK's Client.wait, as far as the progress bar reads it
        def wait(self, task_id, progress, poll_s):
            progress(doc)
            return doc

    err = io.StringIO()
    # A console of its own for the bar, not the shared one's `file` set: undone, that left
    # the shared console writing to the stderr of the moment (pytest's capture) for good,
    # and every later CLI test of the process read an empty stderr from CliRunner.
    console = Console(file=err, markup=False, force_terminal=terminal, width=200, no_color=True)
    monkeypatch.setattr(client_cmds, "stderr_console", console)
    wait_for_task(Waiting(), doc, show=True, poll_s=0.1)
    return err.getvalue()
