"""`POST /v1/workers/{id}/exit`: a worker whose process ends cleanly says so, and the service
counts it live no more until it is heard from again. Before, a cleanly stopped worker counted as
live for a lease TTL after its last heartbeat: a restart on a rotated token was refused with
409 for that long (up to 120 s), and the live-worker gauge and a task's `no_worker` counted a
worker that was gone. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
from service_support import (
    GEMM,
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    drain,
    lease,
    live_server,
    metric_value,
    register,
    service_of,
)
from sqlalchemy import select
from worker_support import REGISTERED, run_in_thread, simulated_daemon, wait_until

from pipetune.clients.sdk import WorkerApi
from pipetune.service.migrate import upgrade
from pipetune.service.orm import WorkerRow

pytest_plugins = ["service_fixtures"]

BOX = {"name": "box", "gpu": "h100", "arch": "sm_90", "runner": "cupy"}
A_HEADERS = {"Authorization": "Bearer token-a"}
B_HEADERS = {"Authorization": "Bearer token-b"}


def _exit(client, worker_id: int, headers: dict = WORKER_HEADERS):
    return client.post(f"/v1/workers/{worker_id}/exit", headers=headers)


def _live(client, runner: str = "simulated") -> float | None:
    return metric_value(
        client.get("/metrics").text, "pipetune_workers_live", gpu="h100", runner=runner
    )


def _listed(client, worker_id: int) -> dict:
    workers = client.get("/v1/workers").json()["workers"]
    return next(w for w in workers if w["id"] == worker_id)


def test_an_exited_worker_s_name_moves_to_another_token_at_once(db_url):
    """The README's token rotation: workers restarted on the new token took their names
    only once the old token's process had been silent for the lease TTL."""
    with client_for(db_url, worker_tokens=["token-a", "token-b"], lease_ttl_s=600) as c:
        first = c.post("/v1/workers", json=BOX, headers=A_HEADERS)
        assert first.status_code == 201
        worker_id = first.json()["id"]
        assert c.post("/v1/workers", json=BOX, headers=B_HEADERS).status_code == 409
        assert _exit(c, worker_id, A_HEADERS).status_code == 204
        moved = c.post("/v1/workers", json=BOX, headers=B_HEADERS)
        assert moved.status_code == 200, moved.text
        assert moved.json()["id"] == worker_id and moved.json()["name_in_use"] is False
        assert moved.json()["exited_at"] is None  # registered again: not exited any more
        lease_body = {"worker_id": worker_id, "max_jobs": 1, "wait_s": 0}
        assert c.post("/v1/jobs/lease", json=lease_body, headers=A_HEADERS).status_code == 403
        assert c.post("/v1/jobs/lease", json=lease_body, headers=B_HEADERS).status_code == 200


def test_a_restart_on_the_same_token_after_an_exit_is_not_a_name_in_use(db_url):
    """`name_in_use` warns of two processes under one name; after an exit there is one."""
    with client_for(db_url, lease_ttl_s=600) as c:
        worker_id = register(c, "box")
        again = c.post("/v1/workers", json=BOX | {"runner": "simulated"}, headers=WORKER_HEADERS)
        assert again.json()["name_in_use"] is True  # (within the TTL, no exit: as before)
        assert _exit(c, worker_id).status_code == 204
        restarted = c.post(
            "/v1/workers", json=BOX | {"runner": "simulated"}, headers=WORKER_HEADERS
        )
        assert restarted.status_code == 200
        assert restarted.json()["name_in_use"] is False and restarted.json()["id"] == worker_id


def test_an_exited_worker_is_not_live_until_it_is_heard_from_again(db_url):
    with client_for(db_url, lease_ttl_s=600) as c:
        gone, other = register(c, "gone"), register(c, "other")
        assert _live(c) == 2.0
        assert _exit(c, gone).status_code == 204
        assert _live(c) == 1.0  # (registered still: 2)
        assert (
            metric_value(
                c.get("/metrics").text,
                "pipetune_workers_registered",
                gpu="h100",
                runner="simulated",
            )
            == 2.0
        )
        exited_at = _listed(c, gone)["exited_at"]
        assert exited_at is not None and _listed(c, other)["exited_at"] is None
        # Saying it twice is saying it once (a retried request).
        assert _exit(c, gone).status_code == 204
        # A heartbeat (the process was not gone after all, or another under its name).
        beat = c.post(
            f"/v1/workers/{gone}/heartbeat", json={"busy_jobs": 0}, headers=WORKER_HEADERS
        )
        assert beat.status_code == 200, beat.text
        assert _live(c) == 2.0 and _listed(c, gone)["exited_at"] is None


def test_a_task_whose_workers_all_exited_says_so_at_once(db_url):
    """`no_worker` said nothing for a lease TTL after the fleet stopped cleanly."""
    with client_for(db_url, lease_ttl_s=600) as c:
        worker_id = register(c, "only")
        task = create_task(c, workload=GEMM, budget=4, strategy="grid")
        assert c.get(f"/v1/tasks/{task['id']}").json()["no_worker"] is None
        assert _exit(c, worker_id).status_code == 204
        why = c.get(f"/v1/tasks/{task['id']}").json()["no_worker"]
        assert why is not None and why.startswith("no h100 worker is live: those heard from")
        assert "have exited, the last 0 s ago" in why
        register(c, "only")  # restarted
        assert c.get(f"/v1/tasks/{task['id']}").json()["no_worker"] is None


def test_an_exited_worker_leases_nothing_until_it_registers_again(db_url):
    """As a stopping worker: a lease request under its id (a process that did not end, a
    request in flight) takes no job that nobody would measure."""
    with client_for(db_url, lease_ttl_s=600) as c:
        worker_id = register(c, "w")
        create_task(c, budget=2, strategy="grid")
        assert _exit(c, worker_id).status_code == 204
        assert lease(c, worker_id, max_jobs=2) == []
        register(c, "w")
        assert len(lease(c, worker_id, max_jobs=2)) == 2


def test_the_exit_of_an_unknown_or_another_token_s_worker_is_refused(db_url):
    with client_for(db_url, worker_tokens=[TOKEN, "token-b"]) as c:
        worker_id = register(c, "w")
        assert _exit(c, worker_id + 1000).status_code == 404
        assert _exit(c, worker_id, B_HEADERS).status_code == 403
        assert c.post(f"/v1/workers/{worker_id}/exit").status_code == 401
        assert _exit(c, 0).status_code == 422
        with service_of(c).db.read() as s:  # none of them wrote anything
            assert s.scalar(select(WorkerRow.exited_at).where(WorkerRow.id == worker_id)) is None


def test_the_sdk_says_the_exit(db_url):
    with client_for(db_url) as c:
        worker_id = register(c, "w")
        api = WorkerApi(str(c.base_url), TOKEN, transport=c._transport)
        api.exiting(worker_id, timeout_s=5)
        assert _listed(c, worker_id)["exited_at"] is not None


class _Recording:
    """A fake service for the daemon: registers, leases nothing (a short long-poll), and
    records each call by name, in order."""

    base_url = "http://fake"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def register(self, body: object) -> object:
        self.calls.append("register")
        return REGISTERED

    def lease(self, worker_id, max_jobs, wait_s, request_id=None, retry=False):  # type: ignore[no-untyped-def]
        self.calls.append("lease")
        time.sleep(0.05)
        return []

    def heartbeat(self, worker_id, busy_jobs=0, leases=None):  # type: ignore[no-untyped-def]
        self.calls.append("heartbeat")
        return SimpleNamespace(ok=True, gone=[])

    def stopping(self, worker_id, timeout_s=None):  # type: ignore[no-untyped-def]
        self.calls.append("stopping")

    def exiting(self, worker_id, timeout_s=None):  # type: ignore[no-untyped-def]
        assert worker_id == REGISTERED.id and timeout_s is not None and timeout_s <= 10
        self.calls.append("exiting")

    def close(self) -> None:
        self.calls.append("close")


class _LateLeaseClient(_Recording):
    """As _Recording, but the lease thread's client closes late: each of the daemon's threads
    has a client of its own, and the lease thread may close its after the exit is said (a
    loaded CI machine did; the test failed then, passing otherwise)."""

    def close(self) -> None:
        if threading.current_thread().name == "pipetune-lease":
            time.sleep(0.3)
        super().close()


def test_the_daemon_says_its_exit_once_last_of_all():
    api = _LateLeaseClient()
    others = set(threading.enumerate())
    worker = simulated_daemon("http://fake", api, lease_wait_s=1)
    runner, status = run_in_thread(worker)
    assert wait_until(lambda: "lease" in api.calls)
    worker.request_stop()
    runner.join(10)
    assert not runner.is_alive() and status == [0]
    for thread in set(threading.enumerate()) - others:
        if thread.name == "pipetune-lease":
            thread.join(5)  # its client's close recorded
    # After its last heartbeat (a heartbeat after the exit made it live again) and report:
    # after it, clients are closed and nothing else is asked.
    assert api.calls.count("exiting") == 1
    after = api.calls[api.calls.index("exiting") + 1 :]
    assert after and set(after) == {"close"}, api.calls


def test_a_daemon_stopped_over_http_frees_its_name_at_once(db_url):
    """End to end: `pipetune worker --name box` stopped with SIGTERM (request_stop here), then
    started again on a rotated token, registers at once (it was refused with 409 for the
    lease TTL)."""
    upgrade(db_url)
    with live_server(db_url, worker_tokens=[TOKEN, "token-b"], lease_ttl_s=600) as base:
        worker = simulated_daemon(base, lease_wait_s=1, name="box")
        runner, status = run_in_thread(worker)
        with httpx.Client(base_url=base, timeout=30) as client:

            def box() -> dict | None:
                workers = client.get("/v1/workers").json()["workers"]
                return next((w for w in workers if w["name"] == "box"), None)

            assert wait_until(lambda: box() is not None, timeout_s=10)
            worker.request_stop()
            runner.join(10)
            assert not runner.is_alive() and status == [0]
            stopped = box()
            assert stopped is not None and stopped["exited_at"] is not None
            body = {"name": "box", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
            moved = client.post("/v1/workers", json=body, headers=B_HEADERS)
            assert moved.status_code == 200, moved.text
            assert moved.json()["id"] == stopped["id"]


def test_a_name_taken_over_by_another_gpu_leaves_the_trials_it_measured_their_device(db_url):
    """A trial named its device through its worker's row, which a re-registration under the
    same name as another GPU rewrote: after an A100 worker exited and an H200 took its name,
    the A100's trials, its best schedule's answer and its exports said H200."""
    a100 = BOX | {"gpu": "a100", "arch": "sm_80", "runner": "simulated", "device_name": "A100"}
    with client_for(db_url, lease_ttl_s=600) as c:
        created = c.post("/v1/workers", json=a100, headers=WORKER_HEADERS)
        worker_id = created.json()["id"]
        task = create_task(c, budget=2, gpu="a100", batch_size=2)
        assert drain(c, worker_id) == 2
        assert _exit(c, worker_id).status_code == 204
        h200 = a100 | {"gpu": "h200", "arch": "sm_90", "device_name": "H200"}
        moved = c.post("/v1/workers", json=h200, headers=WORKER_HEADERS)
        assert moved.status_code == 200 and moved.json()["id"] == worker_id, moved.text
        trials = c.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
        assert [t["worker_device"] for t in trials] == ["A100", "A100"], trials
        best = c.post("/v1/schedules", json={"workload": GEMM, "gpu": "a100"}).json()
        assert best["source"] == "measured" and best["device_name"] == "A100", best
        # Its trials from now on are the H200's; a second take-over keeps each one's own.
        h200_task = create_task(c, budget=2, gpu="h200", batch_size=2)
        assert drain(c, worker_id) == 2
        assert _exit(c, worker_id).status_code == 204
        unnamed = h200 | {"gpu": "a100", "arch": "sm_80", "device_name": None}
        assert c.post("/v1/workers", json=unnamed, headers=WORKER_HEADERS).status_code == 200
        trials = c.get(f"/v1/tasks/{h200_task['id']}/trials").json()["trials"]
        assert [t["worker_device"] for t in trials] == ["H200", "H200"], trials
        trials = c.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
        assert [t["worker_device"] for t in trials] == ["A100", "A100"], trials
        # Trials measured under a registration that named no device stay unnamed.
        unnamed_task = create_task(c, budget=2, gpu="a100", batch_size=2)
        assert drain(c, worker_id) == 2
        assert _exit(c, worker_id).status_code == 204
        assert c.post("/v1/workers", json=a100, headers=WORKER_HEADERS).status_code == 200
        trials = c.get(f"/v1/tasks/{unnamed_task['id']}/trials").json()["trials"]
        assert [t["worker_device"] for t in trials] == [None, None], trials
