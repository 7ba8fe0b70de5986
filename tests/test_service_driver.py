"""The task driver: exact budgets, reproducible proposals, any replica (or a restarted one)
driving any task, one batch per round under concurrent advances. SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from service_support import (
    GEMM,
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    drain,
    drain_rebuilding,
    fake_latency,
    lease,
    metric_value,
    ok,
    post_result,
    register,
    service_of,
    settle,
    two_replicas_on_a_task,
)
from sqlalchemy import func, select, update

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobResult
from pipetune.model.workloads import parse_workload
from pipetune.service.driver import first_seen_by
from pipetune.service.orm import JobRow, TaskRow
from pipetune.service.queue import WorkerRef
from pipetune.service.settings import token_hash
from pipetune.tuner.session import TuningSession

pytest_plugins = ["service_fixtures"]


def _result_of(job: dict) -> dict:
    # Every fifth trial fails to compile: failures must be observed like the tuner would.
    if job["trial"] % 5 == 4:
        return {"status": "compile_error", "error": "ptxas error"}
    return ok(fake_latency(job["schedule"]))


def _as_measure(doc: dict) -> MeasureResult:
    if doc["status"] == "ok":
        return MeasureResult(status="ok", latency_us=doc["latency_us"])
    return MeasureResult(status=doc["status"])


def _batches(client, task_id: int) -> list[list[dict]]:
    """The task's trials by batch, each with the batch whose proposal first saw its result
    (`seen_by`, None if none did yet)."""
    service = service_of(client)
    with service.db.read() as s:
        strategy = s.scalar(select(TaskRow.strategy).where(TaskRow.id == task_id))
        batches = s.scalar(select(TaskRow.batches).where(TaskRow.id == task_id))
        rows = s.execute(
            select(JobRow.batch, JobRow.trial, JobRow.seen_at).where(JobRow.task_id == task_id)
        ).all()
    by_batch = defaultdict(list)
    trials = {t["trial"]: t for t in client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]}
    for batch, trial, seen_at in sorted(rows):
        seen_by = first_seen_by(batch, seen_at, strategy)
        seen_by = seen_by if seen_by is not None and seen_by < batches else None
        by_batch[batch].append({**trials[trial], "seen_by": seen_by})
    return [by_batch[b] for b in sorted(by_batch)]


def _assert_reproduces_a_local_session(client, task_id, strategy, seed, budget, gpu="h100"):
    """The task's batches are exactly what a TuningSession proposes given the same results,
    each observed before the proposal that the record says saw it first."""
    session = TuningSession(parse_workload(GEMM), get_gpu(gpu), strategy, seed, budget)
    batches = _batches(client, task_id)
    batch_size = client.get(f"/v1/tasks/{task_id}").json()["batch_size"]
    every = sorted((t for b in batches for t in b), key=lambda t: t["trial"])
    for number, batch in enumerate(batches):
        seen = [t for t in every if t["seen_by"] == number]
        session.observe([(Schedule(**t["schedule"]), _as_measure(t)) for t in seen])
        proposed = session.propose(batch_size)  # (the whole batch, cut to the budget)
        assert proposed == [Schedule(**t["schedule"]) for t in batch]
    rest = [t for t in every if t["seen_by"] is None]
    session.observe([(Schedule(**t["schedule"]), _as_measure(t)) for t in rest])
    assert session.done


def _answer_leased(queue, ref: WorkerRef) -> None:
    """Lease what the queue holds for the worker and submit a result for each, directly (no
    HTTP route: the route's background advance stays out of the tests' way)."""
    for job in queue.try_lease(ref, 8):
        body = JobResult(
            worker_id=ref.id,
            lease_token=job.lease_token,
            result=ok(fake_latency(job.schedule.model_dump())),
        )
        queue.submit(job.job_id, token_hash(TOKEN), body)


@pytest.mark.parametrize("budget", [1, 8, 13, 20])
def test_a_task_ends_at_exactly_its_budget(db_url, budget):
    with client_for(db_url, batch_size=8) as c:
        task = create_task(c, budget=budget, strategy="random", seed=7)
        assert drain(c, register(c), _result_of) == budget
        doc = c.get(f"/v1/tasks/{task['id']}").json()
        assert doc["state"] == "done" and doc["trials_done"] == budget
        assert doc["trials_failed"] == budget // 5
        sizes = [len(b) for b in _batches(c, task["id"])]
        assert sizes == [8] * (budget // 8) + ([budget % 8] if budget % 8 else [])


def test_a_task_stops_when_its_space_is_exhausted(client):
    tiny = {"op": "gemm", "m": 16, "n": 16, "k": 16}  # two valid schedules on H100
    response = client.post("/v1/tasks", json={"workload": tiny, "gpu": "h100", "budget": 50})
    task_id = response.json()["id"]
    assert response.json()["trials_target"] == 2  # said from the start: all it will run
    assert drain(client, register(client)) == 2
    doc = client.get(f"/v1/tasks/{task_id}").json()
    assert doc["state"] == "done" and doc["trials_done"] == 2
    assert (doc["budget"], doc["trials_target"]) == (50, 2)  # (2 of 50 said nothing of why)
    from pipetune.clients.library.labels import trials_of
    from pipetune.model.wire import TaskDoc

    assert trials_of(TaskDoc(**doc)) == "2/2 (its whole space; budget 50)"
    assert trials_of(TaskDoc(**{**doc, "trials_target": 50, "trials_done": 7})) == "7/50"


@pytest.mark.parametrize("strategy", ["analytical+xgb", "xgb", "random"])
def test_proposals_are_those_of_the_tuner_session(db_url, strategy):
    with client_for(db_url, batch_size=6) as c:
        task = create_task(c, budget=20, strategy=strategy, seed=11)
        drain(c, register(c), _result_of, max_jobs=4)
        _assert_reproduces_a_local_session(c, task["id"], strategy, 11, 20)


@pytest.mark.parametrize("budget", [13, 21])
def test_a_rebuilt_xgb_session_replays_a_last_batch_cut_to_the_budget(db_url, budget):
    """A batch is asked of the strategy whole and cut to the budget, in the service as in a
    replay: the service asked for the cut batch while its replay asked for the whole one, and
    every xgb task whose budget is no multiple of its batch adopted its own last batch after
    a restart, warning of "another tuner version"."""
    with client_for(db_url, batch_size=8) as c:
        task = create_task(c, budget=budget, strategy="xgb", seed=2)
        drain_rebuilding(c, register(c), task["id"])
        assert c.get(f"/v1/tasks/{task['id']}").json()["state"] == "done"
        exposition = c.get("/metrics").text
        assert metric_value(exposition, "pipetune_batches_adopted_total") == 0
        _assert_reproduces_a_local_session(c, task["id"], "xgb", 2, budget)


def _drive_in_turn(replicas, task_id: int, worker: int, *, max_jobs: int, drop_every: int):
    """Lease from two replicas in turn and post the results to them in turn until the task is
    done, dropping the posting replica's cached sessions at every `drop_every`-th result: the
    replica that completes a batch advances it, with or without a session in its cache. Then
    every rebuilt session must have replayed the record exactly (no batch adopted)."""
    first, turn = replicas[0], 0
    # Long polls: the next batch may be proposed by the other replica (the session's holder,
    # asked over NOTIFY), after this replica's proposer has settled.
    while first.get(f"/v1/tasks/{task_id}").json()["state"] != "done":
        jobs = lease(replicas[turn % 2], worker, max_jobs=max_jobs, wait_s=10.0)
        if not jobs:  # (the holder of the session may have finished the task since)
            state = first.get(f"/v1/tasks/{task_id}").json()["state"]
            assert state == "done", "no batch within 10 s of the last result"
            break
        for job in jobs:
            replica = replicas[turn % 2]
            turn += 1
            if turn % drop_every == 0:
                service_of(replica).driver._live.clear()
            body = {"worker_id": worker, "lease_token": job["lease_token"]}
            body["result"] = _result_of(job)
            url = f"/v1/jobs/{job['job_id']}/result"
            r = replica.post(url, json=body, headers=WORKER_HEADERS)
            settle(replica)
            assert r.json()["accepted"] is True
    for replica in replicas:
        exposition = replica.get("/metrics").text
        assert metric_value(exposition, "pipetune_batches_adopted_total") == 0


@pytest.mark.parametrize("share", [0.0, 0.4])
def test_any_replica_and_a_restarted_one_drive_the_same_task(db_url, share):
    """Also with early proposals (two of five believed): whichever replica advances, with or
    without a session, the record replays into the same proposals."""
    with client_for(db_url, batch_size=5, propose_early=share) as a:
        task_id = create_task(a, budget=23, strategy="analytical+xgb", seed=5)["id"]
        worker = register(a)
        with client_for(db_url, batch_size=5, propose_early=share) as b:
            _drive_in_turn([a, b], task_id, worker, max_jobs=3, drop_every=3)
    # A new process (empty caches) sees the finished task as any replica does.
    with client_for(db_url, batch_size=5, propose_early=share) as fresh:
        doc = fresh.get(f"/v1/tasks/{task_id}").json()
        assert doc["state"] == "done" and doc["trials_done"] == 23
        _assert_reproduces_a_local_session(fresh, task_id, "analytical+xgb", 5, 23)


def test_a_tasks_own_batch_size_holds_on_replicas_whose_default_differs(db_url):
    """A task asked for batches of 3 on a replica whose default is 5, advanced in turn by one
    whose default is 7, sessions dropped now and then: every batch is of 3 (the last what is
    left), and the record replays into the same proposals (no batch adopted)."""
    with client_for(db_url, batch_size=5) as a, client_for(db_url, batch_size=7) as b:
        task = create_task(a, budget=11, strategy="bo", seed=4, batch_size=3)
        assert task["batch_size"] == 3
        worker = register(a)
        _drive_in_turn([a, b], task["id"], worker, max_jobs=8, drop_every=4)
        assert [len(batch) for batch in _batches(a, task["id"])] == [3, 3, 3, 2]
        _assert_reproduces_a_local_session(b, task["id"], "bo", 4, 11)


def test_a_restarted_service_continues_a_task_mid_way(db_url):
    with client_for(db_url, batch_size=4) as first:
        task_id = create_task(first, budget=12, strategy="xgb", seed=2)["id"]
        worker = register(first)
        jobs = lease(first, worker, max_jobs=4)
        service = service_of(first)
        for job in jobs:  # results recorded, but this replica stops before advancing
            body = JobResult(
                worker_id=worker, lease_token=job["lease_token"], result=_result_of(job)
            )
            service.queue.submit(job["job_id"], token_hash(TOKEN), body)
    with client_for(db_url, batch_size=4) as second:
        assert lease(second, worker) == []  # nothing queued until someone advances
        service_of(second).upkeep()  # the periodic upkeep finds the complete batch
        # (On PostgreSQL it first asks whether another replica holds the task's session;
        # none answers, and the proposer adopts it ADOPT_AFTER_S later.)
        settle(second)
        assert drain(second, worker, _result_of) == 8
        assert second.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
        _assert_reproduces_a_local_session(second, task_id, "xgb", 2, 12)


def test_concurrent_advances_enqueue_each_batch_once(db_url):
    with client_for(db_url, batch_size=4) as a, client_for(db_url, batch_size=4) as b:
        task_id = create_task(a, budget=16, strategy="analytical+xgb", seed=1)["id"]
        worker = register(a)
        ref = WorkerRef(id=worker, gpu="h100", arch="sm_90", runner="simulated")
        drivers = [service_of(a).driver, service_of(b).driver]
        queue = service_of(a).queue
        for _ in range(3):
            _answer_leased(queue, ref)
            barrier = threading.Barrier(4)
            outcomes: list[bool] = []

            def advance(driver, barrier=barrier, outcomes=outcomes) -> None:
                barrier.wait()
                outcomes.append(driver.advance(task_id))

            threads = [threading.Thread(target=advance, args=(d,)) for d in drivers * 2]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert outcomes.count(True) == 1
        with service_of(a).db.read() as s:
            batches = s.scalar(select(TaskRow.batches).where(TaskRow.id == task_id))
            jobs = s.scalar(select(func.count()).select_from(JobRow))
        assert batches == 4 and jobs == 16


@pytest.mark.parametrize("strategy", ["random", "xgb"])
def test_replicas_taking_turns_read_only_the_batches_they_missed(db_url, strategy):
    """Two replicas advancing a task in turn are each one batch behind the other: each
    rolls its session forward from the batches it has not observed, and reads the whole
    record only once, to build its session (found by the load benchmark: every advance read
    the task's whole history, so a replica's CPU per result grew with the budget)."""
    with client_for(db_url, batch_size=4) as a, client_for(db_url, batch_size=4) as b:
        task_id = create_task(a, budget=40, strategy=strategy, seed=4)["id"]
        worker = register(a)
        ref = WorkerRef(id=worker, gpu="h100", arch="sm_90", runner="simulated")
        drivers = [service_of(a).driver, service_of(b).driver]
        queue = service_of(a).queue
        reads: list[list[tuple[int, int]]] = [[], []]
        for driver, seen in zip(drivers, reads, strict=True):
            real = driver._read_jobs

            def spy(task, first, before, fam, real=real, seen=seen):
                seen.append((first, before))
                return real(task, first, before, fam)

            driver._read_jobs = spy  # type: ignore[method-assign]
        turn = 0
        while a.get(f"/v1/tasks/{task_id}").json()["state"] != "done":
            _answer_leased(queue, ref)
            assert drivers[turn % 2].advance(task_id) is True
            turn += 1
        assert turn >= 9
        for seen in reads:
            assert sum(first == 0 for first, _ in seen) <= 1
            assert all(before - first <= 3 for first, before in seen if first > 0)
        _assert_reproduces_a_local_session(a, task_id, strategy, 4, 40)


def test_a_replica_advancing_a_task_says_it_holds_it(db_url):
    """While an advance plans (its session taken out of the cache), the replica still holds
    the task: another replica asking for the holder at that moment gets an answer instead
    of adopting the task a second later and replaying it (found by counting adoptions in
    the load benchmark: each was a holder asked mid-advance)."""
    with client_for(db_url, batch_size=4) as c:
        task_id = create_task(c, budget=12, strategy="xgb", seed=6)["id"]
        worker = register(c)
        ref = WorkerRef(id=worker, gpu="h100", arch="sm_90", runner="simulated")
        driver = service_of(c).driver
        _answer_leased(service_of(c).queue, ref)
        held_while_planning: list[bool] = []
        real = driver._plan

        def plan(task, adopt=True):
            found = real(task, adopt)
            held_while_planning.append(driver.holds(task))
            return found

        driver._plan = plan  # type: ignore[method-assign]
        assert driver.advance(task_id) is True
        assert held_while_planning == [True]
        assert driver.holds(task_id)  # the session is back in the cache
        driver._plan = real  # type: ignore[method-assign]
        assert not driver.holds(task_id + 1000)  # a task it never advanced


def test_a_history_that_does_not_replay_is_adopted_not_failed(client, caplog):
    # A record the seed would not have made (another tuner version made it, or it was
    # edited): its measurements stand, the task goes on from them, and the log says so.
    task_id = create_task(client, budget=16, strategy="random", seed=3)["id"]
    worker = register(client)
    service = service_of(client)
    jobs = lease(client, worker, max_jobs=8)
    with service.db.write() as s:
        swapped = dict(jobs[0]["schedule"], reg_stages=3 - jobs[0]["schedule"]["reg_stages"])
        s.execute(update(JobRow).where(JobRow.id == jobs[0]["job_id"]).values(schedule=swapped))
    service.driver._live.clear()
    for job in jobs:
        body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=ok(10.0))
        service.queue.submit(job["job_id"], token_hash(TOKEN), body)
    with caplog.at_level("WARNING", logger="pipetune.service.driver"):
        service.driver.advance(task_id)  # rebuilds the session: nothing more to propose yet
    assert any("does not replay" in r.getMessage() for r in caplog.records)
    # Batch 0 was edited; batch 1 (proposed with it) then differs too: its seed's order
    # would have included the schedule the edit replaced.
    assert metric_value(client.get("/metrics").text, "pipetune_batches_adopted_total") == 2.0
    doc = client.get(f"/v1/tasks/{task_id}").json()
    assert doc["state"] == "running" and doc["error"] is None
    assert drain(client, worker) == 8  # the rest of the budget, then done
    doc = client.get(f"/v1/tasks/{task_id}").json()
    assert doc["state"] == "done" and doc["trials_done"] == 16
    trials = client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
    schedules = [tuple(sorted(t["schedule"].items())) for t in trials]
    assert len(set(schedules)) == 16 and tuple(sorted(swapped.items())) in schedules


@pytest.mark.parametrize("strategy", ["random", "bo"])
def test_a_task_made_by_an_older_tuner_continues_after_an_upgrade(db_url, strategy, monkeypatch):
    # The service restarts on a version whose strategy proposes otherwise: every rebuilt
    # session differs from the record from batch 0 on. The task runs to its budget, keeps
    # every recorded trial and never proposes one of them again.
    from pipetune.tuner import bo, strategies

    with client_for(db_url, batch_size=4) as old:
        task_id = create_task(old, budget=16, strategy=strategy, seed=1)["id"]
        worker = register(old)
        answered = 0
        while answered < 8:  # two batches measured by the old version
            jobs = lease(old, worker, max_jobs=min(4, 8 - answered))
            assert jobs
            for job in jobs:
                assert post_result(old, worker, job, ok(fake_latency(job["schedule"]))).json()[
                    "accepted"
                ]
                answered += 1
        before = {t["trial"]: t["schedule"] for t in _trials(old, task_id)}
    if strategy == "random":
        monkeypatch.setattr(
            strategies.RandomStrategy,
            "next_batch",
            lambda self, n, exclude, history: self._in_order(self._order[::-1], n, exclude),
        )
    else:
        real_design = bo.design_rows
        monkeypatch.setattr(bo, "design_rows", lambda *a, **k: real_design(*a, **k)[::-1])
    with client_for(db_url, batch_size=4) as new:
        service_of(new).upkeep()
        settle(new)
        drain(new, worker, max_jobs=4)
        doc = new.get(f"/v1/tasks/{task_id}").json()
        assert doc["state"] == "done" and doc["trials_done"] == 16, doc
        after = {t["trial"]: t["schedule"] for t in _trials(new, task_id)}
    assert {k: after[k] for k in before} == before
    assert len({tuple(sorted(v.items())) for v in after.values()}) == 16


def _trials(client, task_id: int) -> list[dict]:
    return client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]


def test_a_replica_that_loses_the_race_to_advance_logs_no_error(db_url, caplog):
    """Replica A reads the task (its batch complete), replica B advances it, then A reads
    the jobs to replay: A must see only the batches it planned from (found by the load
    benchmark: A replayed B's new, unmeasured batch and logged a ValidationError)."""
    with two_replicas_on_a_task(db_url, "random", budget=16, seed=2) as r:
        a, task_id, first, second = r.a, r.task_id, r.first, r.second
        _answer_leased(r.queue, r.ref)

        def the_other_replica_advances_first(task: int):
            assert second.advance(task)
            return None  # and this replica holds no live session: it must replay

        first._take_live = the_other_replica_advances_first  # type: ignore[method-assign]
        with caplog.at_level("ERROR", logger="pipetune.service.driver"):
            assert first.advance(task_id) is False  # lost the compare-and-set, quietly
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        doc = a.get(f"/v1/tasks/{task_id}").json()
        assert doc["state"] == "running"
        with service_of(a).db.read() as s:
            batches = s.scalar(select(TaskRow.batches).where(TaskRow.id == task_id))
            jobs = s.scalar(select(func.count()).select_from(JobRow))
        # Random search proposes ahead: two batches at creation, the other replica's third.
        assert batches == 3 and jobs == 12


def test_a_replica_that_loses_the_race_keeps_its_session(db_url):
    """The batch the other replica wrote is the one the loser proposed (a session is a
    function of its seed and history): the loser keeps its session and later rolls it
    forward from the batches it missed (found by the load benchmark: every lost race dropped
    the session, and the next advance read and replayed the task's whole record)."""
    with two_replicas_on_a_task(db_url, "random", budget=32, seed=5) as r:
        a, task_id, first, second, queue, ref = r.a, r.task_id, r.first, r.second, r.queue, r.ref
        _answer_leased(queue, ref)
        real_take = first._take_live

        def the_other_replica_advances_first(task: int):
            assert second.advance(task)
            return real_take(task)  # this replica's own session, made before the other's

        first._take_live = the_other_replica_advances_first  # type: ignore[method-assign]
        assert first.advance(task_id) is False  # lost the compare-and-set
        first._take_live = real_take  # type: ignore[method-assign]
        assert first.holds(task_id)  # the session stayed
        reads: list[tuple[int, int]] = []
        real_read = first._read_jobs

        def spy(task, start, before, fam):
            reads.append((start, before))
            return real_read(task, start, before, fam)

        first._read_jobs = spy  # type: ignore[method-assign]
        while a.get(f"/v1/tasks/{task_id}").json()["state"] != "done":
            _answer_leased(queue, ref)
            assert first.advance(task_id) is True
        assert reads and all(start > 0 for start, _ in reads)
        _assert_reproduces_a_local_session(a, task_id, "random", 5, 32)


def _wait(condition, timeout_s: float) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def test_the_replica_holding_a_session_advances_the_task_for_the_others(pg):
    """Two replicas on PostgreSQL: results of a task created on A arrive at B. B does not
    replay A's batches (each replay re-runs a proposal); it asks through NOTIFY who holds
    the task, A answers and advances it."""
    url = pg
    with client_for(url, batch_size=4) as a, client_for(url, batch_size=4) as b:
        task_id = create_task(a, budget=12, strategy="analytical+xgb", seed=3)["id"]
        worker = register(a)
        assert service_of(a).driver.holds(task_id) and not service_of(b).driver.holds(task_id)
        for _ in range(2):  # two rounds, every result posted to B
            jobs = lease(b, worker, max_jobs=4)
            assert jobs
            version = _version(a, task_id)
            for job in jobs:
                body = {"worker_id": worker, "lease_token": job["lease_token"]}
                body["result"] = _result_of(job)
                r = b.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS)
                assert r.json()["accepted"] is True
            # A answers B's question at once and advances the task; B never adopts it.
            _wait(lambda v=version: _version(a, task_id) > v, timeout_s=30)
            settle(b)
            assert not service_of(b).driver.holds(task_id)  # B proposed nothing
        settle(b)
        assert drain(a, worker, _result_of) > 0
        assert a.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
        _assert_reproduces_a_local_session(a, task_id, "analytical+xgb", 3, 12)


def test_a_task_whose_holder_stopped_is_adopted_by_another_replica(pg):
    """The holder stops between batches: the replica that takes the batch's last result
    asks, nobody answers, and it adopts the task ADOPT_AFTER_S later (replaying its
    batches), so the task still finishes with the proposals of one tuner session."""
    url = pg
    with client_for(url, batch_size=4) as b:
        with client_for(url, batch_size=4) as a:
            task_id = create_task(a, budget=8, strategy="analytical+xgb", seed=4)["id"]
            worker = register(a)
        service_of(b).proposer.adopt_after_s = 0.5
        version = _version(b, task_id)
        for job in lease(b, worker, max_jobs=4):
            body = {"worker_id": worker, "lease_token": job["lease_token"]}
            body["result"] = _result_of(job)
            b.post(f"/v1/jobs/{job['job_id']}/result", json=body, headers=WORKER_HEADERS)
        took = _wait(lambda: _version(b, task_id) > version, timeout_s=20)
        assert took >= 0.4  # it waited for a holder first
        assert service_of(b).driver.holds(task_id)  # and now holds the session itself
        settle(b)
        assert drain(b, worker, _result_of) > 0
        assert b.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
        _assert_reproduces_a_local_session(b, task_id, "analytical+xgb", 4, 8)


def test_replicas_with_out_of_date_sessions_do_not_hold_a_task_between_them(pg):
    """A, then B, advanced the task and C made its newest batch, then C stopped: A and B
    each kept a session of a batch before. Asked who holds the task, each answered that it
    did (its out-of-date session), which cancelled the other's adoption, then found its
    session behind and asked in turn: NOTIFYs back and forth, a core's worth of CPU on
    both, and the task never advanced (found with three replicas and SIGSTOP). A session
    found behind is dropped, so the replicas stop answering for it and one adopts."""
    url = pg
    with client_for(url, batch_size=4) as a, client_for(url, batch_size=4) as b:
        for replica in (a, b):
            service_of(replica).proposer.adopt_after_s = 0.3
        with client_for(url, batch_size=4) as c:
            # The advances below are made by hand, in this order; the proposers stay out.
            proposers = [service_of(x).proposer for x in (a, b, c)]
            for proposer in proposers:
                proposer.stop()
            task_id = create_task(a, budget=40, strategy="analytical+xgb", seed=6)["id"]
            ref = WorkerRef(id=register(a), gpu="h100", arch="sm_90", runner="simulated")
            queue = service_of(a).queue
            for replica in (b, c):  # each adopts the task in turn: A's, then B's, go stale
                _answer_leased(queue, ref)
                assert service_of(replica).driver.advance(task_id) is True
            assert all(service_of(x).driver.holds(task_id) for x in (a, b, c))
            _answer_leased(queue, ref)
            version = _version(a, task_id)
        # C, which holds the only current session, is gone; A is asked to advance the task.
        for proposer in proposers[:2]:
            proposer.start()
        service_of(a).proposer.request(task_id)
        _wait(lambda: _version(a, task_id) > version, timeout_s=30)
        settle(a)
        settle(b)
        assert [service_of(x).driver.holds(task_id) for x in (a, b)].count(True) == 1


def _version(client, task_id: int) -> int:
    with service_of(client).db.read() as s:
        return int(s.execute(select(TaskRow.batches).where(TaskRow.id == task_id)).scalar_one())


@pytest.mark.parametrize(("share", "before_next"), [(0.25, 6), (0.0, 8)])
def test_a_model_guided_task_proposes_its_next_batch_before_the_last_is_complete(
    db_url, share, before_next
):
    """With PIPETUNE_PROPOSE_EARLY a quarter, once the first batch is in, each next batch
    comes when six of eight results of the one before are in (the other two believed); each
    result is recorded as seen by the proposal that first saw it, and the task is what a
    local session replays from that record."""
    with client_for(db_url, batch_size=8, propose_early=share) as c:
        task_id = create_task(c, budget=32, strategy="analytical+xgb", seed=3)["id"]
        worker = register(c)

        def answer(jobs):
            for job in jobs:
                post_result(c, worker, job, ok(fake_latency(job["schedule"])))

        first = lease(c, worker, max_jobs=8)
        answer(first[:7])
        assert lease(c, worker, max_jobs=8) == []  # the first batch is always waited for
        answer(first[7:])
        second = lease(c, worker, max_jobs=8)
        assert [j["trial"] for j in second] == list(range(8, 16))
        answer(second[: before_next - 1])
        assert lease(c, worker, max_jobs=8) == []  # one result short of the next batch
        answer(second[before_next - 1 : before_next])
        third = lease(c, worker, max_jobs=8)
        assert [j["trial"] for j in third] == list(range(16, 24))
        seen = {t["trial"]: t["seen_by"] for b in _batches(c, task_id) for t in b}
        assert [seen[t] for t in range(16)] == [1] * 8 + [2] * before_next + [None] * (
            8 - before_next
        )
        answer(second[before_next:] + third)
        assert drain(c, worker) == 8
        assert c.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
        # The last batch came once six of the third were in: its late two no proposal saw.
        seen = {t["trial"]: t["seen_by"] for b in _batches(c, task_id) for t in b}
        late = 8 - before_next
        assert [seen[t] for t in range(8 + before_next, 24)] == [3] * 8 + [None] * late
        _assert_reproduces_a_local_session(c, task_id, "analytical+xgb", 3, 32)
        with service_of(c).db.read() as s:
            written = s.scalars(select(JobRow.seen_at).where(JobRow.seen_at.is_not(None)))
            # Whole batches are the rule: only what early proposals changed is written.
            assert len(list(written)) == 2 * (8 - before_next)  # two batches left two late


def test_a_task_proposing_early_replays_on_a_replica_that_never_held_it(db_url):
    """A replica with no session rebuilds the task from the record, observing each result
    where the record says it was first seen, and proposes the batch the holder would have."""
    with client_for(db_url, batch_size=8, propose_early=0.25) as a:
        task_id = create_task(a, budget=40, strategy="auto", seed=4)["id"]
        worker = register(a)

        def answer(jobs):
            for job in jobs:
                post_result(a, worker, job, ok(fake_latency(job["schedule"])))

        answer(lease(a, worker, max_jobs=8))
        jobs = lease(a, worker, max_jobs=8)
        answer(jobs[:6])
        jobs = jobs[6:] + lease(a, worker, max_jobs=8)
        assert len(jobs) == 10
        answer(jobs[:8])  # batch 1's last two and six of batch 2
        held = lease(a, worker, max_jobs=8)
        assert [j["trial"] for j in held] == list(range(24, 32))
        adopted = "pipetune_batches_adopted_total"
        before = metric_value(a.get("/metrics").text, adopted)
        service_of(a).driver._live.clear()  # the next advance rebuilds the session
        answer(jobs[8:] + held[:6])
        last = lease(a, worker, max_jobs=8)
        assert [j["trial"] for j in last] == list(range(32, 40))
        assert metric_value(a.get("/metrics").text, adopted) == before  # it replayed
        answer(held[6:] + last)
        assert a.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
        _assert_reproduces_a_local_session(a, task_id, "auto", 4, 40)


def test_a_replica_keeps_nothing_of_a_task_that_ended_elsewhere_or_was_cancelled(db_url):
    """A replica's lock and session of a task go when the task ends, however it ended: a
    replica that advanced a task another replica then finished, or one that cancelled it,
    kept a lock per task for good (a replica's memory grew with every task of a fleet)."""
    with two_replicas_on_a_task(db_url, "xgb", budget=8, seed=2) as r:
        _answer_leased(r.queue, r.ref)
        assert r.first.advance(r.task_id) is True  # the first replica holds the task now
        assert r.first.holds(r.task_id) and r.task_id in r.first._task_locks
        _answer_leased(r.queue, r.ref)
        assert r.second.advance(r.task_id) is True  # the second one finishes it
        assert r.a.get(f"/v1/tasks/{r.task_id}").json()["state"] == "done"
        assert r.second._task_locks.keys() == set() and not r.second.holds(r.task_id)
        assert r.first.advance(r.task_id) is False  # (an advance asked late, as a sweep's)
        assert r.first._task_locks.keys() == set() and not r.first.holds(r.task_id)

        cancelled = create_task(r.a, budget=20, strategy="xgb", seed=3)["id"]
        _answer_leased(r.queue, r.ref)
        assert r.first.advance(cancelled) is True
        assert r.a.delete(f"/v1/tasks/{cancelled}").status_code == 200
        assert r.first._task_locks.keys() == set() and not r.first.holds(cancelled)


def test_a_cancel_during_an_advance_leaves_no_session_behind(db_url):
    """A cancel that landed while an advance had the task's session out (planning the next
    batch) found nothing to drop; the advance's commit then lost its compare-and-set and put
    the session back, where it stayed until 512 sessions pushed it out: 0.6 MB per task
    cancelled mid-advance, 300-480 MB in a replica that had seen many."""
    with client_for(db_url, batch_size=4) as c:
        driver = service_of(c).driver
        task_id = create_task(c, budget=20, strategy="xgb", seed=5)["id"]
        ref = WorkerRef(id=register(c), gpu="h100", arch="sm_90", runner="simulated")
        _answer_leased(service_of(c).queue, ref)
        real_commit = driver._commit

        def cancelled_meanwhile(plan):  # type: ignore[no-untyped-def]
            assert driver.holds(task_id) and task_id not in driver._live  # (out, planning)
            driver.cancel(task_id)
            return real_commit(plan)

        driver._commit = cancelled_meanwhile
        assert driver.advance(task_id) is False  # its batch was not written
        assert c.get(f"/v1/tasks/{task_id}").json()["state"] == "cancelled"
        assert task_id not in driver._live and not driver.holds(task_id)
        assert driver._ended == set()


def _bo_raises_once_measured(monkeypatch, error: Exception) -> None:
    """The BO strategy raises `error` when it proposes with any trial measured."""
    from pipetune.tuner.bo import BayesianStrategy

    propose = BayesianStrategy.next_batch

    def raises_once_measured(self, n, exclude, history):  # type: ignore[no-untyped-def]
        if history:
            raise error
        return propose(self, n, exclude, history)

    monkeypatch.setattr(BayesianStrategy, "next_batch", raises_once_measured)


@pytest.mark.parametrize("error", [RuntimeError, IndexError])
def test_a_task_whose_strategy_raises_fails_with_the_reason(db_url, error, monkeypatch):
    """A strategy that raised anything but a ValueError while proposing (a bug of its own,
    say) left its task running with nothing queued: the advance raised, and so did every
    sweep after it (the other tasks it would have advanced next waited on the proposer)."""
    _bo_raises_once_measured(monkeypatch, error("the strategy broke"))
    with client_for(db_url, batch_size=4) as c:
        worker = register(c)
        task_id = create_task(c, budget=12, strategy="analytical+xgb")["id"]
        assert drain(c, worker) == 4
        task = c.get(f"/v1/tasks/{task_id}").json()
        assert task["state"] == "failed" and "the strategy broke" in task["error"]
        assert task["trials_done"] == 4 and lease(c, worker, max_jobs=8) == []
        assert service_of(c).driver.advance_ready() == 0


def test_a_failed_tasks_error_says_what_failed(client, monkeypatch):
    """A proposal that raised in the session this replica held said "cannot rebuild the
    tuning session", of a session nobody rebuilt, and without the error's class ("list
    index out of range" and nothing else); a record that does not replay still says so."""
    _bo_raises_once_measured(monkeypatch, IndexError("list index out of range"))
    worker = register(client)
    task_id = create_task(client, budget=12, strategy="analytical+xgb", batch_size=4)["id"]
    drain(client, worker)
    error = client.get(f"/v1/tasks/{task_id}").json()["error"]
    assert error == "cannot propose the next batch: IndexError: list index out of range"

    monkeypatch.undo()
    task_id = create_task(client, budget=12, strategy="analytical+xgb", batch_size=4)["id"]
    driver = service_of(client).driver
    driver._live.pop(task_id)  # the next advance rebuilds the session
    monkeypatch.setattr(
        "pipetune.service.driver.TuningSession.propose",
        lambda self, n: (_ for _ in ()).throw(ValueError("no replay")),
    )
    drain(client, worker)
    error = client.get(f"/v1/tasks/{task_id}").json()["error"]
    assert error == "cannot rebuild the tuning session: ValueError: no replay"
