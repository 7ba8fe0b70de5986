"""The job queue: arch matching, concurrent leasing, expiry by the database clock, result
idempotency, stale and foreign results, cancellation. On SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from contextlib import contextmanager

from service_support import (
    GEMM,
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import func, select, update

from pipetune.model.wire import JobResult, WorkerRegister
from pipetune.service.orm import JobRow, LeaseRow, WorkerRow
from pipetune.service.queue import WorkerRef
from pipetune.service.settings import token_hash

pytest_plugins = ["service_fixtures"]


def _task_on(client, gpu: str, budget: int = 4) -> int:
    body = {"workload": GEMM, "gpu": gpu, "budget": budget, "strategy": "grid"}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_jobs_go_only_to_workers_of_the_task_gpu(client):
    tasks = {gpu: _task_on(client, gpu) for gpu in ("a100", "h100", "h200")}
    sim_a100 = register(client, "sim-a100", "a100")
    sim_h100 = register(client, "sim-h100", "h100")
    cupy_h100 = register(client, "cupy-h100", "h100", runner="cupy")
    cupy_h200 = register(client, "cupy-h200", "h200", runner="cupy")

    got_a100 = lease(client, sim_a100, max_jobs=64)
    assert {j["task_id"] for j in got_a100} == {tasks["a100"]} and len(got_a100) == 4
    assert all(j["gpu"] == "a100" for j in got_a100)
    # A real H200 leases first: an H100's jobs are not its own although the arch (sm_90) is
    # the same. (It took them once, and its timings were recorded as the H100's.)
    got_h200 = lease(client, cupy_h200, max_jobs=64)
    assert {j["task_id"] for j in got_h200} == {tasks["h200"]} and len(got_h200) == 4
    got_h100 = lease(client, cupy_h100, max_jobs=1)
    assert [j["task_id"] for j in got_h100] == [tasks["h100"]]
    # A simulated worker stands in for its GPU the same way.
    got_sim = lease(client, sim_h100, max_jobs=64)
    assert {j["task_id"] for j in got_sim} == {tasks["h100"]} and len(got_sim) == 3
    assert lease(client, sim_a100, max_jobs=64) == []
    assert lease(client, cupy_h200, max_jobs=64) == []
    first = got_a100[0]
    assert first["workload"]["op"] == "gemm" and set(first["schedule"]) >= {"chunk"}
    assert first["lease_token"] and first["lease_expires_at"]


def test_concurrent_leasers_never_get_the_same_job(db_url):
    with client_for(db_url) as c:
        for _ in range(3):
            # 3 x 16 queued jobs: random search proposes its second batch ahead
            create_task(c, budget=40, strategy="random")
        workers = [register(c, f"w{i}") for i in range(8)]
        service = service_of(c)
        got: list[int] = []
        lock = threading.Lock()
        start = threading.Barrier(len(workers))

        def leaser(worker_id: int) -> None:
            ref = WorkerRef(id=worker_id, gpu="h100", arch="sm_90", runner="simulated")
            start.wait()
            while jobs := service.queue.try_lease(ref, 2):
                with lock:
                    got.extend(j.job_id for j in jobs)

        threads = [threading.Thread(target=leaser, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 48 and len(set(got)) == 48
        with service.db.read() as s:
            per_job = Counter(s.scalars(select(LeaseRow.job_id)).all())
            states = set(s.scalars(select(JobRow.state)).all())
        assert set(per_job.values()) == {1} and len(per_job) == 48
        assert states == {"leased"}


def test_long_poll_waits_for_work_and_returns_empty_after_wait(client):
    worker = register(client)
    started = time.monotonic()
    assert lease(client, worker, wait_s=0.3) == []
    assert time.monotonic() - started >= 0.3
    create_task(client, budget=2, strategy="grid")
    assert len(lease(client, worker, max_jobs=4, wait_s=5)) == 2


def test_expired_leases_return_to_the_queue_then_are_lost(db_url):
    with client_for(db_url, lease_ttl_s=0.2, max_attempts=2) as c:
        task = create_task(c, budget=2, strategy="grid")
        worker = register(c)
        service = service_of(c)
        first = lease(c, worker, max_jobs=2)
        assert len(first) == 2
        assert service.queue.reclaim() == set()  # not expired yet by the database clock
        time.sleep(0.4)
        assert service.queue.reclaim() == set()  # back in the queue, nothing lost yet
        with service.db.read() as s:
            jobs = s.scalars(select(JobRow).order_by(JobRow.trial)).all()
        assert [(j.state, j.attempts, j.lease_owner) for j in jobs] == [("queued", 1, None)] * 2
        # A late result from the expired lease is applied: nobody leased its job since
        # (tests/test_service_queue_late.py).
        late = post_result(c, worker, first[0], ok(5.0))
        assert late.status_code == 200 and late.json()["accepted"] is True
        assert late.json()["job_state"] == "done"

        second = lease(c, worker, max_jobs=2)
        assert [j["job_id"] for j in second] == [first[1]["job_id"]]
        assert second[0]["lease_token"] != first[1]["lease_token"]
        # Leased again: the first lease's result is refused now.
        stale = post_result(c, worker, first[1], ok(7.0)).json()
        assert stale["accepted"] is False and stale["job_state"] == "leased"
        time.sleep(0.4)
        assert service.queue.reclaim() == {task["id"]}  # second expiry: lost
        with service.db.read() as s:
            states = {j.trial: (j.state, j.attempts) for j in s.scalars(select(JobRow))}
            outcomes = Counter(s.scalars(select(LeaseRow.outcome)).all())
        lost_trial = second[0]["trial"]
        assert states[lost_trial] == ("lost", 2)
        assert states[first[0]["trial"]] == ("done", 1)  # (its lease did expire once)
        assert outcomes == {"expired": 2, "result": 1}
        doc = c.get(f"/v1/tasks/{task['id']}").json()
        assert doc["trials_done"] == 2 and doc["trials_failed"] == 1
        trials = c.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
        assert trials[lost_trial]["state"] == "lost" and "lost" in trials[lost_trial]["error"]
        # The lost job completed the batch: the reclaim asked for the task to advance, and
        # its proposer did (here: budget reached, so the task is done).
        deadline = time.monotonic() + 10
        while c.get(f"/v1/tasks/{task['id']}").json()["state"] != "done":
            assert time.monotonic() < deadline, "the task did not advance after its loss"
            time.sleep(0.02)
        text = c.get("/metrics").text
        assert 'pipetune_lease_expiries_total{outcome="queued"} 2.0' in text
        assert 'pipetune_lease_expiries_total{outcome="lost"} 1.0' in text


def test_heartbeat_extends_live_leases(db_url):
    # Beats at a third of the TTL, over more than one TTL: a late beat on a loaded machine
    # (a 0.6 s TTL beaten every 0.25 s flaked under CI's load) still lands in time.
    with client_for(db_url, lease_ttl_s=1.5) as c:
        create_task(c, budget=1, strategy="grid")
        worker = register(c)
        service = service_of(c)
        (job,) = lease(c, worker)
        for _ in range(4):
            time.sleep(0.5)
            beat = c.post(f"/v1/workers/{worker}/heartbeat", json={}, headers=WORKER_HEADERS)
            assert beat.status_code == 200
            service.queue.reclaim()
        with service.db.read() as s:
            assert s.scalar(select(JobRow.state).where(JobRow.id == job["job_id"])) == "leased"
        assert post_result(c, worker, job, ok(3.0)).json()["accepted"] is True


def test_results_are_idempotent_per_lease(client):
    task = create_task(client, budget=2, strategy="grid")
    worker = register(client)
    jobs = lease(client, worker, max_jobs=2)
    first = post_result(client, worker, jobs[0], ok(12.0)).json()
    again = post_result(client, worker, jobs[0], ok(12.0)).json()
    assert first == {"accepted": True, "job_state": "done", "detail": None}
    assert again["accepted"] is True and again["job_state"] == "done"
    assert "duplicate" in again["detail"]
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["trials_done"] == 1 and doc["state"] == "running"


def test_a_worker_may_report_only_its_own_leases(client):
    create_task(client, budget=2, strategy="grid")
    owner = register(client, "owner")
    other = register(client, "other")
    (job,) = lease(client, owner)
    forged = post_result(client, other, job, ok(1.0))
    assert forged.status_code == 403
    bad_token = dict(job, lease_token="not-a-real-lease-token")
    refused = post_result(client, owner, bad_token, ok(1.0))
    # The job is the owner's: it is the token that no lease has (it once said "not leased
    # to worker", which sent its reader looking for the wrong mistake).
    assert refused.status_code == 403
    assert "no lease with this token" in refused.json()["detail"], refused.text
    missing = dict(job, job_id=987654)
    assert post_result(client, owner, missing, ok(1.0)).status_code == 404
    assert post_result(client, owner, job, ok(1.0)).json()["accepted"] is True


def test_an_ok_result_needs_a_latency(client):
    create_task(client, budget=1, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker)
    response = post_result(client, worker, job, {"status": "ok"})
    assert response.status_code == 422 and response.json()["field"] == "latency_us"
    assert post_result(client, worker, job, ok(2.0)).json()["accepted"] is True


def test_cancelling_a_task_cancels_its_jobs_and_refuses_their_results(client):
    task = create_task(client, budget=8, strategy="grid")
    worker = register(client)
    held = lease(client, worker, max_jobs=3)
    assert post_result(client, worker, held[0], ok(9.0)).json()["accepted"] is True
    assert client.delete(f"/v1/tasks/{task['id']}").json()["state"] == "cancelled"
    late = post_result(client, worker, held[1], ok(8.0)).json()
    assert late["accepted"] is False and late["job_state"] == "cancelled"
    assert lease(client, worker, max_jobs=8) == []
    states = Counter(
        t["state"] for t in client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    )
    assert states == {"done": 1, "cancelled": 7}
    service = service_of(client)
    assert service.driver.advance(task["id"]) is False  # a cancelled task proposes nothing
    with service.db.read() as s:
        assert s.scalar(select(func.count()).select_from(JobRow)) == 8
    finished = create_task(client, budget=1, strategy="grid")
    (job,) = lease(client, worker)
    post_result(client, worker, job, ok(1.0))
    assert client.get(f"/v1/tasks/{finished['id']}").json()["state"] == "done"
    assert client.delete(f"/v1/tasks/{finished['id']}").status_code == 409


def test_a_cancelled_task_counts_in_the_aggregate_every_trial_it_finished(client):
    """The stored curve (what GET /v1/curves reads) was written at batch boundaries only: a
    task cancelled 3 trials into its second batch counted to k=8 there, while its own curve
    showed 11 trials and a better best. A job cancelled with the task is no trial: the
    trials finished after it count on (both curves ended at it, leaving out trial 12's
    best, which the task's row counted)."""
    task = create_task(client, budget=16, strategy="grid", batch_size=8)
    worker = register(client)
    first = lease(client, worker, max_jobs=8)
    for job in first:
        assert post_result(client, worker, job, ok(10.0)).json()["accepted"] is True
    second = sorted(lease(client, worker, max_jobs=8), key=lambda j: j["trial"])
    assert [j["trial"] for j in second] == list(range(8, 16))
    # Trials 8 and 10 answered, 9 failed, 12 answered; 11, 13-15 cancelled (no trials).
    post_result(client, worker, second[0], ok(12.0))
    post_result(client, worker, second[1], {"status": "runtime_error", "error": "crash"})
    post_result(client, worker, second[2], ok(4.0))
    post_result(client, worker, second[4], ok(1.0))
    assert client.delete(f"/v1/tasks/{task['id']}").json()["state"] == "cancelled"
    points = client.get(f"/v1/tasks/{task['id']}/curve").json()["points"]
    assert [p["best_latency_us"] for p in points] == [10.0] * 10 + [4.0, 1.0]
    assert client.get(f"/v1/tasks/{task['id']}").json()["trials_done"] == len(points)
    from pipetune.service.orm import TaskRow

    with service_of(client).db.read() as s:
        stored = s.scalar(select(TaskRow.curve).where(TaskRow.id == task["id"]))
    # (its worker is simulated: the curve says so, for the aggregate view)
    assert stored == {"n": 12, "steps": [[0, 10.0], [10, 4.0], [11, 1.0]], "simulated": True}


def test_reregistering_a_name_with_another_token_is_refused(db_url):
    with client_for(db_url, worker_tokens=["token-a", "token-b"]) as c:
        body = {"name": "box", "gpu": "h100", "arch": "sm_90", "runner": "cupy"}
        a = c.post("/v1/workers", json=body, headers={"Authorization": "Bearer token-a"})
        assert a.status_code == 201
        b = c.post("/v1/workers", json=body, headers={"Authorization": "Bearer token-b"})
        assert b.status_code == 409
        worker_id = a.json()["id"]
        lease_body = {"worker_id": worker_id, "max_jobs": 1, "wait_s": 0}
        stolen = c.post("/v1/jobs/lease", json=lease_body, headers={"X-Worker-Token": "token-b"})
        assert stolen.status_code == 403


def test_a_name_moves_to_a_new_token_once_the_old_one_is_silent_or_rotated_out(db_url):
    """README's rotation (list both tokens, restart the workers on the new one): a worker
    with a fixed --name got 409 "registered with another token" at every start, for ever."""
    body = {"name": "box", "gpu": "h100", "arch": "sm_90", "runner": "cupy"}
    a_headers = {"Authorization": "Bearer token-a"}
    b_headers = {"Authorization": "Bearer token-b"}
    # A TTL of a minute, and silence set rather than slept for: under CI's load two requests
    # could be more than a 1 s TTL apart.
    with client_for(db_url, worker_tokens=["token-a", "token-b"], lease_ttl_s=60) as c:
        first = c.post("/v1/workers", json=body, headers=a_headers)
        assert first.status_code == 201
        refused = c.post("/v1/workers", json=body, headers=b_headers)
        assert refused.status_code == 409 and "silent for the lease TTL" in refused.text
        silent = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=120)  # the old process is gone
        with service_of(c).db.write() as s:
            s.execute(update(WorkerRow).values(last_heartbeat=silent))
        moved = c.post("/v1/workers", json=body, headers=b_headers)
        assert moved.status_code == 200 and moved.json()["id"] == first.json()["id"]
        lease_body = {"worker_id": first.json()["id"], "max_jobs": 1, "wait_s": 0}
        assert c.post("/v1/jobs/lease", json=lease_body, headers=a_headers).status_code == 403
        assert c.post("/v1/jobs/lease", json=lease_body, headers=b_headers).status_code == 200
    # Rotated out: token-b alone configured now, and token-a's registration moves at once.
    body["name"] = "box-2"
    with client_for(db_url, worker_tokens=["token-a", "token-b"]) as c:
        assert c.post("/v1/workers", json=body, headers=a_headers).status_code == 201
    with client_for(db_url, worker_tokens=["token-b"]) as c:
        assert c.post("/v1/workers", json=body, headers=b_headers).status_code == 200


def test_a_new_worker_is_stamped_heard_from_to_the_millisecond(db_url):
    """A new worker's last heartbeat was the column's default, SQLite's CURRENT_TIMESTAMP,
    in whole seconds: it looked up to a second longer silent than it was (with a 1 s TTL,
    silent at once, and its name free to another token)."""
    with client_for(db_url) as c:
        for name in ("w-1", "w-2", "w-3"):
            body = {"name": name, "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
            assert c.post("/v1/workers", json=body, headers=WORKER_HEADERS).status_code == 201
        with service_of(c).db.read() as s:
            stamps = s.scalars(select(WorkerRow.last_heartbeat)).all()
    assert len(stamps) == 3
    # Whole seconds all three times is what the old default gave; to the millisecond, a
    # chance of one in a billion.
    assert any(stamp.microsecond for stamp in stamps)


def test_the_same_result_posted_concurrently_counts_once(db_url):

    with client_for(db_url) as c:
        task = create_task(c, budget=2, strategy="grid")
        worker = register(c)
        service = service_of(c)
        job = lease(c, worker)[0]
        body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=ok(4.0))
        barrier = threading.Barrier(6)
        acks = []

        def post() -> None:
            barrier.wait()
            acks.append(service.queue.submit(job["job_id"], token_hash(TOKEN), body)[0])

        threads = [threading.Thread(target=post) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [a.accepted for a in acks] == [True] * 6
        assert sum(a.detail is None for a in acks) == 1  # one applied, five duplicates
        doc = c.get(f"/v1/tasks/{task['id']}").json()
        assert doc["trials_done"] == 1


def test_nul_characters_are_refused_or_dropped_never_a_500(client):
    """Found by the schema fuzzer on PostgreSQL: a NUL in a lease token reached the database."""
    create_task(client, budget=1, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker)
    bad = {"worker_id": worker, "lease_token": "0000000\x00", "result": ok(10.0)}
    response = client.post(f"/v1/jobs/{job['job_id']}/result", json=bad, headers=WORKER_HEADERS)
    assert response.status_code == 422
    assert "lease_token" in response.text
    named = {"name": "w\x00", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    assert client.post("/v1/workers", json=named, headers=WORKER_HEADERS).status_code == 422
    failed = {"status": "compile_error", "error": "ptxas\x00log"}
    response = post_result(client, worker, job, failed)
    assert response.status_code == 200 and response.json()["accepted"] is True


def test_a_re_lease_is_stamped_after_the_expiry_it_follows(db_url):
    """A lease transaction that began before the reclaim of an expired lease, and claims the
    requeued job after it, must still be stamped after that lease ended: the audit table's
    intervals may never overlap for a legitimate re-lease. PostgreSQL's now() is the
    transaction's start, so the stamps are the statement's time (found under load by the
    load benchmark's audit). SQLite serialises writers, so only PostgreSQL can interleave."""
    if "sqlite" in db_url:
        return
    with client_for(db_url, lease_ttl_s=0.3) as c:
        create_task(c, budget=4, strategy="grid")
        quitter, rescuer = register(c, "quitter"), register(c, "rescuer")
        (abandoned,) = lease(c, quitter)
        time.sleep(0.5)  # expired by the database clock; not reclaimed yet
        queue, db = service_of(c).queue, service_of(c).db
        queue._reclaimed_at = time.monotonic() + 60  # the claim's own reclaim stays out
        began, reclaimed = threading.Event(), threading.Event()
        # The claim's statement (PostgreSQL's hot paths run on the driver's cursor, one
        # statement each, in autocommit), here inside a transaction that began earlier: the
        # stamps must not be the transaction's start whatever wraps the statement.
        driver_statement = db.driver_statement

        @contextmanager
        def paused_transaction():
            with driver_statement() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("SELECT 1")  # the transaction has begun
                began.set()
                reclaimed.wait(10)  # descheduled while another thread reclaims
                yield cursor
                cursor.execute("COMMIT")

        db.driver_statement = paused_transaction  # type: ignore[method-assign]
        got: list = []
        ref = WorkerRef(id=rescuer, gpu="h100", arch="sm_90", runner="simulated")
        claim = threading.Thread(target=lambda: got.extend(queue.try_lease(ref, 1)))
        claim.start()
        assert began.wait(10)
        time.sleep(0.05)
        queue.reclaim()
        reclaimed.set()
        claim.join(10)
        db.driver_statement = driver_statement  # type: ignore[method-assign]
        assert [job.job_id for job in got] == [abandoned["job_id"]]
        with db.read() as s:
            first, second = s.scalars(
                select(LeaseRow).where(LeaseRow.job_id == abandoned["job_id"]).order_by(LeaseRow.id)
            ).all()
    assert first.outcome == "expired" and second.worker_id == rescuer
    assert first.ended_at <= second.leased_at, (first.ended_at, second.leased_at)
    # The new lease runs its full TTL from when it was granted.
    assert got[0].lease_expires_at - second.leased_at >= dt.timedelta(seconds=0.29)


def _register_at_once(service, body: WorkerRegister, count: int) -> tuple[list, list]:
    """`count` registrations of `body` released together; their answers and errors."""
    start = threading.Barrier(count)
    answers: list = []
    errors: list = []

    def registrar() -> None:
        start.wait()
        try:
            answers.append(service.queue.register(token_hash(TOKEN), body))
        except Exception as exc:  # (the failure this test looks for)
            errors.append(exc)

    threads = [threading.Thread(target=registrar) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, errors


def test_concurrent_registrations_of_one_new_name_make_one_worker(db_url):
    # Workers restarted together register under their names at once: on PostgreSQL the
    # look-up and the insert of two such requests could interleave, and the loser's insert
    # broke the name's unique constraint (a 500). Each request must get the one worker.
    with client_for(db_url) as c:
        service = service_of(c)
        for round_ in range(12):
            body = WorkerRegister(
                name=f"restarted-{round_}", gpu="h100", arch="sm_90", runner="simulated"
            )
            answers, errors = _register_at_once(service, body, 6)
            assert errors == []
            assert len({doc.id for doc, _ in answers}) == 1
            assert sum(created for _, created in answers) == 1


def test_a_task_whose_last_awaited_job_is_lost_advances_at_once(db_url):
    """The reclaim that gave a job up as lost did not ask for its task to advance: with that
    job the last its batch waited for, the task stalled until the second periodic sweep."""
    with client_for(db_url, lease_ttl_s=0.2, max_attempts=1, batch_size=2) as c:
        create_task(c, budget=4, strategy="bo")  # (no batch proposed ahead)
        worker = register(c)
        done, _abandoned = lease(c, worker, max_jobs=2)
        assert post_result(c, worker, done, ok(5.0)).json()["accepted"] is True
        time.sleep(0.4)  # the other's lease expires; one attempt: lost at the reclaim
        deadline = time.monotonic() + 10
        nxt: list = []
        while not nxt and time.monotonic() < deadline:
            nxt = lease(c, worker, max_jobs=2, wait_s=0.5)  # no periodic sweep here
        assert len(nxt) == 2 and {j["trial"] for j in nxt} == {2, 3}, nxt


def test_a_replicas_caches_of_workers_and_workloads_stay_bounded(client, monkeypatch):
    """An entry per worker ever registered (workers restart under new names) and a parsed
    workload per workload ever tuned were kept for good; forgetting one worker scanned every
    entry (4.4 ms a registration at 100,000 workers)."""
    from pipetune.service import driver as driver_module
    from pipetune.service import queue as queue_module

    monkeypatch.setattr(queue_module, "MAX_CACHED_WORKERS", 3)
    monkeypatch.setattr(driver_module, "MAX_WORKLOADS", 2)
    service = service_of(client)
    ids = [register(client, f"w{i}") for i in range(7)]
    assert 1 <= len(service.queue._worker_refs) <= 3
    # What is cached still answers, and a forgotten worker is read again.
    kept = next(iter(service.queue._worker_refs))
    service.queue.forget_worker(kept)
    assert kept not in service.queue._worker_refs
    assert service.queue.worker_ref(kept, token_hash(TOKEN)).id == kept
    assert lease(client, ids[0]) == []  # (no task yet: nothing, but no error)
    for m in (256, 512, 768, 1024, 1280):
        create_task(client, budget=4, strategy="random", workload={**GEMM, "m": m})
    with service.db.read() as s:
        workload_ids = s.scalars(select(JobRow.workload_id).distinct()).all()
    assert len(workload_ids) == 5
    for workload_id in workload_ids:
        service.driver._workload(workload_id)
        assert len(service.driver._workloads) <= 2
