"""What a replica caches of a worker (its GPU, arch, runner and workload, checked against its
token; service/queue.py): every lease and report needs it. A re-registration on another
replica reaches the others by NOTIFY, so a replica that hears every message keeps a worker
cached until then; one whose listener may have missed a message trusts its cache for
WORKER_CACHE_S only."""

from __future__ import annotations

import time

from service_support import (
    SMALL_GEMM,
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    register,
    service_of,
    wait_until_listening,
)

from pipetune.service import queue as queue_module
from pipetune.service.settings import token_hash
from pipetune.service.wakeup import Wakeup

pytest_plugins = ["service_fixtures"]

TOKEN_HASH = token_hash(TOKEN)
GEMM_BIG = {"op": "gemm", "m": 512, "n": 512, "k": 512, "dtype": "float16"}


def test_a_worker_re_registered_on_another_replica_is_forgotten_by_the_first_at_once(pg):
    """Replica B has cached a replay worker bound to one workload; the worker re-registers on
    replica A without one. B leases it any job right away: before the NOTIFY, B kept the
    old workload for up to WORKER_CACHE_S (30 s) and leased it nothing."""
    with client_for(pg) as a, client_for(pg) as b:
        wait_until_listening(a)
        wait_until_listening(b)
        body = {"name": "replay-1", "gpu": "h100", "arch": "sm_90", "runner": "replay"}
        bound = a.post("/v1/workers", json={**body, "workload": SMALL_GEMM}, headers=WORKER_HEADERS)
        assert bound.status_code == 201, bound.text
        worker = bound.json()["id"]
        other = create_task(b, budget=2, strategy="random", workload=GEMM_BIG)
        assert lease(b, worker, max_jobs=8) == []  # B caches the worker as bound
        again = a.post("/v1/workers", json=body, headers=WORKER_HEADERS)
        assert again.status_code == 200 and again.json()["workload_hash"] is None
        deadline = time.monotonic() + 5
        jobs: list = []
        while not jobs and time.monotonic() < deadline:
            jobs = lease(b, worker, max_jobs=8)
            time.sleep(0.02)
        assert [j["task_id"] for j in jobs] == [other["id"], other["id"]]


def test_a_cached_worker_is_trusted_past_the_ttl_only_while_every_message_is_heard(
    db_url, monkeypatch
):
    """With its listener connected (or on SQLite, alone) a replica does not look a worker up
    again; with the listener down, or reconnected since the check, it looks it up once the
    TTL is past."""
    monkeypatch.setattr(queue_module, "WORKER_CACHE_S", 0.0)
    with client_for(db_url) as c:
        service = service_of(c)
        if not service.db.is_sqlite:
            wait_until_listening(c)
        worker = register(c)
        queue = service.queue
        looked_up: list[int] = []
        read_conn = service.db.read_conn

        def counted():
            looked_up.append(1)
            return read_conn()

        queue.forget_worker(worker)
        monkeypatch.setattr(service.db, "read_conn", counted)
        queue.worker_ref(worker, TOKEN_HASH)
        queue.worker_ref(worker, TOKEN_HASH)
        assert len(looked_up) == 1  # trusted: no TTL applies
        if service.db.is_sqlite:
            return
        wakeup = service.wakeup
        monkeypatch.setattr(wakeup, "listening", False)  # a message may be missed now
        queue.worker_ref(worker, TOKEN_HASH)
        assert len(looked_up) == 2
        queue.worker_ref(worker, TOKEN_HASH)  # checked while deaf: the TTL applies (0 s)
        assert len(looked_up) == 3
        monkeypatch.setattr(wakeup, "listening", True)
        monkeypatch.setattr(wakeup, "epoch", wakeup.epoch + 1)  # reconnected since
        queue.worker_ref(worker, TOKEN_HASH)
        assert len(looked_up) == 4
        queue.worker_ref(worker, TOKEN_HASH)  # checked within this connection: trusted
        assert len(looked_up) == 4


def test_a_check_that_raced_a_re_registration_is_not_trusted_past_the_ttl(db_url, monkeypatch):
    """A look-up that read the worker's row before a re-registration and stored it after the
    message to forget it holds the old row: kept for WORKER_CACHE_S at most, never
    trusted."""
    monkeypatch.setattr(queue_module, "WORKER_CACHE_S", 0.0)
    with client_for(db_url) as c:
        service = service_of(c)
        worker = register(c)
        queue = service.queue
        queue.forget_worker(worker)
        read_conn = service.db.read_conn
        reads: list[int] = []

        def racing():
            reads.append(1)
            queue.forget_worker(worker)  # the NOTIFY arrives while the row is read
            return read_conn()

        monkeypatch.setattr(service.db, "read_conn", racing)
        queue.worker_ref(worker, TOKEN_HASH)
        monkeypatch.setattr(service.db, "read_conn", read_conn)
        assert reads == [1]
        assert queue.cached_worker_ref(worker, TOKEN_HASH) is None  # past the TTL: not trusted


def test_a_re_registration_message_reaches_the_hook():
    here, there = Wakeup(shared=True), Wakeup(shared=True)
    forgotten: list[int] = []
    here.on_worker = forgotten.append
    generation = here.generation
    here.deliver(there.worker_payload(17))
    assert forgotten == [17] and here.generation == generation
    here.deliver(here.worker_payload(18))  # its own: skipped
    assert forgotten == [17]


def test_a_worker_is_known_where_it_registered_until_the_ttl(db_url, monkeypatch):
    """Each worker's first lease on a replica read its row in the thread pool: where it
    registered, what was just written is its check (trusted for WORKER_CACHE_S, as a
    look-up that may have missed a message)."""
    with client_for(db_url) as c:
        service = service_of(c)
        queue = service.queue
        looked_up: list[int] = []
        worker_ref = queue.worker_ref

        def counted(worker_id: int, token: str):  # type: ignore[no-untyped-def]
            looked_up.append(worker_id)
            return worker_ref(worker_id, token)

        monkeypatch.setattr(queue, "worker_ref", counted)
        worker = register(c)
        ref = queue.cached_worker_ref(worker, TOKEN_HASH)
        assert ref is not None and (ref.id, ref.gpu, ref.arch) == (worker, "h100", "sm_90")
        create_task(c, budget=2, strategy="random")
        assert len(lease(c, worker, max_jobs=2)) == 2
        assert looked_up == []
        monkeypatch.setattr(queue_module, "WORKER_CACHE_S", 0.0)
        assert queue.cached_worker_ref(worker, TOKEN_HASH) is None
