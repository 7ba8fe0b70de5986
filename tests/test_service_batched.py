"""The fleet-sized queue: many results in one request (POST /v1/jobs/results), lease
requests woken when jobs are enqueued instead of polling (in one replica, and across
replicas by PostgreSQL NOTIFY), idle requests that cost no database work, proposals off the
request path. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

from service_support import (
    GEMM,
    WORKER_HEADERS,
    client_for,
    create_task,
    fake_latency,
    lease,
    ok,
    register,
    service_of,
    settle,
    wait_until_listening,
)
from sqlalchemy import func, select

from pipetune.model.wire import TaskCreate
from pipetune.service.orm import JobRow, LeaseRow

pytest_plugins = ["service_fixtures"]


def _item(job: dict, result: dict) -> dict:
    return {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": result}


def post_results(client, worker_id: int, items: list[dict]):
    body = {"worker_id": worker_id, "results": items}
    response = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
    settle(client)
    return response


def test_many_results_in_one_request_each_judged_as_the_single_route_would(client):
    task = create_task(client, budget=6, strategy="grid")
    owner, other = register(client, "owner"), register(client, "other")
    jobs = lease(client, owner, max_jobs=6)
    foreign = lease(client, other, max_jobs=1)
    assert len(jobs) == 6 and foreign == []
    forged = dict(jobs[3], lease_token="not-the-lease-token")
    missing = dict(jobs[4], job_id=987654)
    items = [
        _item(jobs[0], ok(30.0)),
        _item(jobs[1], {"status": "compile_error", "error": "ptxas"}),
        _item(jobs[0], ok(30.0)),  # the same result again, in the same request
        _item(forged, ok(1.0)),
        _item(missing, ok(1.0)),
        _item(jobs[2], ok(20.0)),
    ]
    response = post_results(client, owner, items)
    assert response.status_code == 200, response.text
    acks = response.json()["acks"]
    assert [a["job_id"] for a in acks] == [i["job_id"] for i in items]
    assert [a["status_code"] for a in acks] == [200, 200, 200, 403, 404, 200]
    assert [a["accepted"] for a in acks] == [True, True, True, False, False, True]
    assert [a["job_state"] for a in acks] == ["done", "failed", "done", None, None, "done"]
    assert acks[0]["detail"] is None and "duplicate" in acks[2]["detail"]
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["trials_done"] == 3 and doc["trials_failed"] == 1
    assert doc["best"]["latency_us"] == 20.0

    # The whole request again (a worker that never saw the answer): nothing counts twice.
    again = post_results(client, owner, items).json()["acks"]
    assert [a["status_code"] for a in again] == [200, 200, 200, 403, 404, 200]
    assert all("duplicate" in a["detail"] for a in again if a["status_code"] == 200)
    assert client.get(f"/v1/tasks/{task['id']}").json()["trials_done"] == 3

    # Another worker reporting on these leases is refused, item by item.
    stolen = post_results(client, other, [_item(jobs[5], ok(5.0))]).json()["acks"]
    assert stolen[0]["status_code"] == 403 and stolen[0]["accepted"] is False
    # The rest of the batch, then the task is done at exactly its budget.
    rest = post_results(client, owner, [_item(j, ok(40.0 + i)) for i, j in enumerate(jobs[3:])])
    assert [a["accepted"] for a in rest.json()["acks"]] == [True] * 3
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["state"] == "done" and doc["trials_done"] == 6
    service = service_of(client)
    with service.db.read() as s:
        results = s.scalar(
            select(func.count()).select_from(LeaseRow).where(LeaseRow.outcome == "result")
        )
    assert results == 6


def test_a_tie_in_one_request_is_broken_by_trial_on_both_databases(client):
    """Results of equal latency in one request: the task's best is the lowest trial, on
    PostgreSQL as on SQLite (PostgreSQL took the first in the request's order, SQLite the
    lowest trial: the best schedule depended on the database)."""
    task = create_task(client, budget=4, strategy="grid", batch_size=4)
    worker = register(client)
    jobs = lease(client, worker, max_jobs=4)
    assert len(jobs) == 4
    response = post_results(client, worker, [_item(j, ok(30.0)) for j in reversed(jobs)])
    assert response.status_code == 200, response.text
    best = client.get(f"/v1/tasks/{task['id']}").json()["best"]
    assert best["trial"] == min(j["trial"] for j in jobs) and best["latency_us"] == 30.0


def test_a_stale_result_in_a_batch_is_refused_and_the_rest_recorded(db_url):
    with client_for(db_url, lease_ttl_s=0.2) as c:
        create_task(c, budget=2, strategy="grid")
        worker = register(c)
        first = lease(c, worker, max_jobs=2)
        time.sleep(0.4)
        service_of(c).queue.reclaim()  # expired by the database clock: back in the queue
        second = lease(c, worker, max_jobs=2)
        by_id = {j["job_id"]: j for j in second}
        items = [_item(first[0], ok(9.0)), _item(by_id[first[0]["job_id"]], ok(8.0))]
        acks = post_results(c, worker, items).json()["acks"]
        assert [a["accepted"] for a in acks] == [False, True]
        assert "stale lease" in acks[0]["detail"]


def test_a_stale_report_beside_its_jobs_result_in_one_request_says_the_job_is_done(db_url):
    """A stale lease's result and the current lease's of the same job in one request: the
    stale one is refused saying what the job holds now (done), wherever it stands in the
    request, on both databases (each answered `leased` for one of the orders: PostgreSQL
    the statement's snapshot, SQLite the job before the request's own result)."""
    with client_for(db_url, lease_ttl_s=0.2) as c:
        create_task(c, budget=1, strategy="grid")
        worker = register(c)
        (first,) = lease(c, worker)
        time.sleep(0.4)
        service_of(c).queue.reclaim()
        (second,) = lease(c, worker)
        items = [_item(first, ok(9.0)), _item(second, ok(8.0)), _item(first, ok(9.0))]
        acks = post_results(c, worker, items).json()["acks"]
        assert [a["accepted"] for a in acks] == [False, True, False]
        assert [a["job_state"] for a in acks] == ["done"] * 3
        assert "stale lease" in acks[0]["detail"] and "stale lease" in acks[2]["detail"]


def test_another_workers_lease_named_in_a_batch_beside_an_old_one_of_the_job_is_refused(db_url):
    """A worker that once leased a job (expired, leased again to another) and reports the
    job under its old lease and under the other worker's lease in one request: the second
    is that worker's lease, refused (403) and not applied. On PostgreSQL the request's old
    lease of the job let every report of the job through to the update: the other worker's
    lease ended with this one's result, and its own result was answered "duplicate"."""
    with client_for(db_url, lease_ttl_s=0.2) as c:
        create_task(c, budget=1, strategy="grid")
        first, second = register(c, "first"), register(c, "second")
        (old,) = lease(c, first)
        time.sleep(0.4)
        service_of(c).queue.reclaim()
        (current,) = lease(c, second)
        assert current["job_id"] == old["job_id"]
        items = [_item(old, ok(1.0)), _item(current, ok(1.0))]
        acks = post_results(c, first, items).json()["acks"]
        assert [(a["status_code"], a["accepted"]) for a in acks] == [(200, False), (403, False)]
        with service_of(c).db.write() as s:
            job = s.get(JobRow, current["job_id"])
            assert (job.state, job.result_token) == ("leased", None)
        (ack,) = post_results(c, second, [_item(current, ok(50.0))]).json()["acks"]
        assert (ack["accepted"], ack["detail"]) == (True, None)
        with service_of(c).db.write() as s:
            job = s.get(JobRow, current["job_id"])
            assert (job.state, job.latency_us, job.result_worker) == ("done", 50.0, second)


def test_a_result_the_database_cannot_hold_refuses_the_request_naming_it(client):
    create_task(client, budget=2, strategy="grid")
    worker = register(client)
    jobs = lease(client, worker, max_jobs=2)
    items = [_item(jobs[0], ok(3.0)), _item(jobs[1], {"status": "ok"})]
    response = post_results(client, worker, items)
    assert response.status_code == 422
    assert response.json()["field"] == "latency_us"
    assert response.json()["detail"][0]["loc"] == ["body", "results", 1, "result", "latency_us"]
    assert lease(client, worker) == []  # nothing was recorded: both still leased
    with service_of(client).db.read() as s:
        assert set(s.scalars(select(JobRow.state))) == {"leased"}


def test_a_waiting_lease_is_woken_when_jobs_are_enqueued_not_by_polling(db_url):
    # A fallback poll far longer than the test: only a wake-up can answer in time.
    with client_for(db_url, lease_poll_s=60) as c:
        worker = register(c)
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(lease(c, worker, 2, wait_s=20)))
        started = time.monotonic()
        waiting.start()
        time.sleep(0.5)  # the request is waiting
        create_task(c, budget=2, strategy="grid")
        waiting.join(20)
        assert len(got[0]) == 2 and time.monotonic() - started < 5


def test_jobs_a_woken_request_failed_to_claim_wake_the_next_request_waiting(db_url):
    """Two lease requests wait for one GPU's jobs; a task's two jobs wake the first (it asks
    for both), whose claim then fails on the database (a 503). The signal was used up: the
    second request, the jobs queued, waited out its fallback poll (here its whole 10 s
    wait). A request that leaves before it claims passes on the jobs it was woken for."""
    from sqlalchemy import exc as sa_exc

    with client_for(db_url, lease_poll_s=60) as c:
        service = service_of(c)
        first, second = register(c, "first"), register(c, "second")
        claim, failing = service.queue.store.claim, threading.Event()

        def fails_for_the_first(worker, *args, **kwargs):
            if worker.id == first and failing.is_set():
                raise sa_exc.OperationalError("claim", {}, Exception("connection lost"))
            return claim(worker, *args, **kwargs)

        service.queue.store.claim = fails_for_the_first  # type: ignore[method-assign]
        body = {"worker_id": first, "max_jobs": 2, "wait_s": 10}
        statuses: list[int] = []
        failed = threading.Thread(
            target=lambda: statuses.append(
                c.post("/v1/jobs/lease", json=body, headers=WORKER_HEADERS).status_code
            )
        )
        failed.start()
        while service.wakeup.waiting < 1:
            time.sleep(0.01)
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(lease(c, second, 2, wait_s=10)))
        waiting.start()
        while service.wakeup.waiting < 2:
            time.sleep(0.01)
        failing.set()
        started = time.monotonic()
        create_task(c, budget=2, strategy="grid")
        failed.join(15)
        waiting.join(15)
        assert statuses == [503]
        assert len(got[0]) == 2 and time.monotonic() - started < 3


def test_jobs_enqueued_while_a_lease_request_claims_are_not_left_to_its_poll(db_url):
    """A task enqueued while a lease request's claim runs, after the claim looked: the
    request was not waiting, so the signal found nobody to wake (on SQLite the claim runs
    off the event loop, and the signal is handled meanwhile). It claims again rather than
    wait out its fallback poll with the jobs queued and the worker idle."""
    with client_for(db_url, lease_poll_s=60) as c:
        worker = register(c)
        service = service_of(c)
        claim, claims = service.queue.store.claim, []

        def enqueue_after_the_first(*args, **kwargs):
            found = claim(*args, **kwargs)
            claims.append(len(found))
            if len(claims) == 1:  # the queue read empty: the jobs come now, and say so
                body = {"workload": GEMM, "gpu": "h100", "budget": 2, "strategy": "grid"}
                service.driver.create(TaskCreate.model_validate(body))
            return found

        service.queue.store.claim = enqueue_after_the_first  # type: ignore[method-assign]
        started = time.monotonic()
        jobs = lease(c, worker, 2, wait_s=10)
        assert len(jobs) == 2 and claims == [0, 2]
        assert time.monotonic() - started < 5  # (it waited the whole 10 s)


def test_another_replicas_jobs_wake_a_waiting_lease_through_notify(pg_url):
    # Replica A holds the waiting request; the task is created on replica B.
    from service_fixtures import _truncate

    _truncate(pg_url)
    with client_for(pg_url, lease_poll_s=60) as a, client_for(pg_url, lease_poll_s=60) as b:
        wait_until_listening(a)
        worker = register(a)
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(lease(a, worker, 2, wait_s=20)))
        started = time.monotonic()
        waiting.start()
        time.sleep(0.5)
        create_task(b, budget=2, strategy="grid")
        waiting.join(20)
        assert len(got[0]) == 2 and time.monotonic() - started < 5


def test_jobs_enqueued_while_the_listener_was_down_wake_a_waiting_lease_when_it_is_back(
    pg_url, monkeypatch
):
    """Replica A's LISTEN connection dropped (a PostgreSQL restart; here its backend is
    terminated) while a lease request waited on A, and replica B enqueued jobs before A
    listened again: their NOTIFY never reached A. A listened again within a second, but the
    request slept on until its fallback poll (20 s here, 5 s by default) before it claimed."""
    from service_fixtures import _truncate
    from sqlalchemy import create_engine, text

    from pipetune.service import wakeup as wakeup_module

    _truncate(pg_url)
    with client_for(pg_url, lease_poll_s=60) as a, client_for(pg_url, lease_poll_s=60) as b:
        wait_until_listening(a)
        wakeup = service_of(a).wakeup
        worker = register(a)
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(lease(a, worker, 2, wait_s=20)))
        waiting.start()
        while wakeup.waiting == 0:
            time.sleep(0.01)
        # The listeners reconnect only once B has enqueued (not a race with the reconnect).
        enqueued = threading.Event()
        connect = wakeup_module.deadline_connect

        def after_the_jobs(*args, **kwargs):
            enqueued.wait(20)
            return connect(*args, **kwargs)

        monkeypatch.setattr(wakeup_module, "deadline_connect", after_the_jobs)
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query = :listen"
                ),
                {"listen": wakeup_module.listen_statement(wakeup_module.CHANNEL).as_string()},
            )
        admin.dispose()
        while wakeup.listening:
            time.sleep(0.01)
        started = time.monotonic()
        create_task(b, budget=2, strategy="grid")
        enqueued.set()
        waiting.join(25)
        assert len(got[0]) == 2 and time.monotonic() - started < 5


def test_the_listener_connects_as_the_engine_does_with_spaces_in_the_url(pg_url):
    """A password (percent-encoded in the URL) and a query value with spaces: the listener's
    conninfo was the URL rendered again, which libpq refused ("unexpected spaces found"),
    killing the listener thread with the password in its traceback; %20 in a query value
    came back as + (another connection setting than the engine's)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import make_url

    url = make_url(pg_url).set(password="MY SECRET PW")
    url = url.update_query_dict({"application_name": "pipetune replica 1"})
    with client_for(url.render_as_string(hide_password=False)) as c:
        service = service_of(c)
        listener = conninfo_to_dict(service.db.listener_conninfo())
        assert listener["password"] == "MY SECRET PW"
        assert listener["application_name"] == "pipetune replica 1"
        wait_until_listening(c)


def test_a_message_to_the_other_replicas_reaches_their_hook(pg_url):
    """An advance request (or a holder's answer) is one NOTIFY statement in autocommit
    (Driver.notify_replicas): the other replica's listener hands it to its hook."""
    from service_fixtures import _truncate

    _truncate(pg_url)
    with client_for(pg_url) as a, client_for(pg_url) as b:
        wait_until_listening(a)
        asked: list[int] = []
        service_of(a).wakeup.on_advance = asked.append
        sender = service_of(b)
        sender.driver.notify_replicas(sender.wakeup.advance_payload(4242))
        deadline = time.monotonic() + 5
        while not asked and time.monotonic() < deadline:
            time.sleep(0.02)
        assert asked == [4242]


def test_idle_lease_requests_cost_no_claim_until_something_is_enqueued(db_url):
    with client_for(db_url, lease_poll_s=60) as c:
        if not service_of(c).db.is_sqlite:
            wait_until_listening(c)
        worker = register(c)
        queue = service_of(c).queue
        claims = []
        claim = queue.store.claim

        def counted(*args, **kwargs):
            claims.append(1)
            return claim(*args, **kwargs)

        queue.store.claim = counted  # type: ignore[method-assign]
        for _ in range(20):
            assert lease(c, worker, wait_s=0) == []
        assert len(claims) == 1  # the first found the queue empty; no signal since
        create_task(c, budget=1, strategy="grid")  # a signal: the next request claims
        assert len(lease(c, worker, wait_s=0)) == 1
        assert len(claims) == 2


def test_random_search_keeps_its_next_batch_enqueued_ahead(client):
    task = create_task(client, budget=24, strategy="random", seed=4)
    worker = register(client)
    first = lease(client, worker, max_jobs=8)
    assert [j["trial"] for j in first] == list(range(8))
    # The second batch is there before the first is measured ...
    second = lease(client, worker, max_jobs=8)
    assert [j["trial"] for j in second] == list(range(8, 16))
    for job in first:
        body = {"worker_id": worker, "lease_token": job["lease_token"]}
        body["result"] = ok(fake_latency(job["schedule"]))
        client.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS)
    settle(client)
    # ... and once the first is complete the third joins it, while the second is measured.
    third = lease(client, worker, max_jobs=8)
    assert [j["trial"] for j in third] == list(range(16, 24))
    assert client.get(f"/v1/tasks/{task['id']}").json()["state"] == "running"


def test_a_job_id_beyond_the_database_s_range_is_a_422_not_a_500(client):
    """Found by the schema fuzzer on PostgreSQL: a 2**31 job id reached the database."""
    worker = register(client)
    item = {"job_id": 2**31, "lease_token": "0123456789abcdef", "result": ok(1.0)}
    response = post_results(client, worker, [item])
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "results", 0, "job_id"]


def test_a_lease_and_its_results_are_recorded_without_a_thread_hand_off(client, monkeypatch):
    """On PostgreSQL the claim and the records run on the event loop: handing each to a
    worker thread and back cost more CPU than the statements (benchmarks/RESULTS.md, "the
    hot routes' database work on the event loop"). On SQLite they are handed to a thread,
    where a lock held by another program does not stop the service (test_sqlite_locked.py).
    Every function the app hands to a thread is named here."""
    import functools

    import anyio.to_thread

    create_task(client, budget=4, strategy="grid")
    worker = register(client)
    lease(client, worker, max_jobs=1)  # (the worker's lookup is cached from here on)
    handed = []
    run_sync = anyio.to_thread.run_sync

    async def counting(func, *args, **kwargs):
        inner = func.func if isinstance(func, functools.partial) else func
        handed.append(getattr(inner, "__name__", repr(inner)))
        return await run_sync(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    jobs = lease(client, worker, max_jobs=3)
    assert len(jobs) == 3
    acks = post_results(client, worker, [_item(j, ok(10.0 + i)) for i, j in enumerate(jobs)])
    assert [a["accepted"] for a in acks.json()["acks"]] == [True] * 3
    single = client.post(
        f"/v1/jobs/{jobs[0]['job_id']}/result",
        json={"worker_id": worker, "lease_token": jobs[0]["lease_token"], "result": ok(10.0)},
        headers=WORKER_HEADERS,
    )
    assert single.status_code == 200, single.text
    hot = {"try_lease", "submit", "submit_many"}
    if service_of(client).db.is_sqlite:
        assert hot <= set(handed), handed
    else:
        assert not hot & set(handed), handed


def test_a_report_leases_the_workers_next_jobs_in_the_same_request(client):
    task = create_task(client, budget=20, strategy="grid")
    owner, foreign = register(client, "owner"), register(client, "foreign", gpu="a100")
    first = lease(client, owner, max_jobs=4)
    assert len(first) == 4
    # Without max_jobs (every worker before the field existed): no lease, no `jobs` to read.
    plain = post_results(client, owner, [_item(first[0], ok(30.0))]).json()
    assert plain["jobs"] == []
    body = {
        "worker_id": owner,
        "results": [_item(j, ok(31.0 + i)) for i, j in enumerate(first[1:])],
        "max_jobs": 3,
    }
    response = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [a["accepted"] for a in answer["acks"]] == [True] * 3
    leased = answer["jobs"]
    assert len(leased) == 3
    assert {j["job_id"] for j in leased}.isdisjoint(j["job_id"] for j in first)
    assert all(j["task_id"] == task["id"] and j["gpu"] == "h100" for j in leased)
    # They are this worker's leases as the lease route's are: reported, they count.
    settle(client)
    acks = post_results(client, owner, [_item(j, ok(20.0)) for j in leased]).json()["acks"]
    assert [a["accepted"] for a in acks] == [True] * 3
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["trials_done"] == 7
    # A worker of another GPU gets none of this task's jobs (its report on another's lease is
    # refused item by item, and it is still a worker that may lease); an unknown worker gets
    # none at all.
    theirs = lease(client, owner, max_jobs=1)
    refused = {
        "worker_id": foreign,
        "results": [_item(theirs[0], ok(5.0))],
        "max_jobs": 8,
    }
    answer = client.post("/v1/jobs/results", json=refused, headers=WORKER_HEADERS).json()
    assert answer["acks"][0]["status_code"] == 403 and answer["jobs"] == []
    unknown = dict(refused, worker_id=987654)
    answer = client.post("/v1/jobs/results", json=unknown, headers=WORKER_HEADERS).json()
    assert answer["acks"][0]["status_code"] == 403 and answer["jobs"] == []
    with service_of(client).db.read_conn() as conn:
        held = conn.scalar(
            select(func.count()).select_from(JobRow).where(JobRow.lease_owner == foreign)
        )
    assert held == 0


def test_a_report_asking_for_too_many_jobs_is_a_422_naming_max_jobs(client):
    create_task(client, budget=4, strategy="grid")
    owner = register(client, "owner")
    (job,) = lease(client, owner, max_jobs=1)
    for bad in (65, -1, "2", True):
        body = {"worker_id": owner, "results": [_item(job, ok(30.0))], "max_jobs": bad}
        response = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
        assert response.status_code == 422, (bad, response.text)
        assert response.json()["field"] == "max_jobs", response.text
    # Nothing was recorded by the refused requests.
    assert post_results(client, owner, [_item(job, ok(30.0))]).json()["acks"][0]["detail"] is None
