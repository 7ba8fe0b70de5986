"""The periodic upkeep (Service.upkeep) is the safety net for a task nobody asked to advance:
it leaves alone the tasks the replica's proposer loop will advance anyway. At 400 tasks it
advanced, in the thread pool, the tasks the proposer had yet to reach, so each of those
advances was made twice (benchmarks/RESULTS.md, "heartbeats of a fleet")."""

from __future__ import annotations

from service_support import TOKEN, client_for, create_task, lease, register, service_of
from sqlalchemy import select

from pipetune.model.wire import JobResult
from pipetune.service.orm import TaskRow
from pipetune.service.settings import token_hash

pytest_plugins = ["service_fixtures"]


def _batches(client, task_id: int) -> int:
    with service_of(client).db.read() as s:
        return s.scalar(select(TaskRow.batches).where(TaskRow.id == task_id))


def test_upkeep_leaves_a_task_in_the_proposers_hand_to_it(db_url):
    with client_for(db_url, batch_size=4) as c:
        service = service_of(c)
        task_id = create_task(c, budget=12, strategy="xgb", seed=2)["id"]
        worker = register(c)
        service.proposer.stop()  # its requests stay queued: the advance is upkeep's or none
        for job in lease(c, worker, max_jobs=4):
            result = {"status": "ok", "latency_us": 10.0 + job["trial"]}
            body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=result)
            service.queue.submit(job["job_id"], token_hash(TOKEN), body)
        service.proposer.request(task_id)  # the last result asked for it (as its route does)
        assert service.proposer.has(task_id)
        service.upkeep()
        assert _batches(c, task_id) == 1  # left to the proposer
        service.proposer._asked.clear()  # the request lost (the replica stopped meanwhile)
        assert not service.proposer.has(task_id)
        service.upkeep()  # nobody will: upkeep does (this replica made the task's batch)
        assert _batches(c, task_id) == 2


def test_the_periodic_sweep_advances_only_a_task_it_found_ready_the_sweep_before(db_url):
    """A task that has just become ready is the proposer's of the replica that took the
    result completing its batch; the sweep of another replica advanced it as well. The
    periodic sweep (patient) waits to find it ready twice at the same batch."""
    with client_for(db_url, batch_size=4) as c:
        service = service_of(c)
        task_id = create_task(c, budget=12, strategy="xgb", seed=2)["id"]
        worker = register(c)
        service.proposer.stop()  # nobody else advances it
        for job in lease(c, worker, max_jobs=4):
            result = {"status": "ok", "latency_us": 10.0 + job["trial"]}
            body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=result)
            service.queue.submit(job["job_id"], token_hash(TOKEN), body)
        service.upkeep(patient=True)
        assert _batches(c, task_id) == 1  # ready for the first time: left to its proposer
        service.upkeep(patient=True)
        assert _batches(c, task_id) == 2  # still ready a sweep later: nobody did, upkeep does


def test_a_task_with_every_trial_enqueued_is_not_advanced_until_its_last_result():
    """Its last batches' results each asked for an advance (and each sweep planned it) that
    read the task and its jobs to find nothing to propose: 300 of 400 tasks at a time, with
    a thousand workers holding three jobs each."""
    from pipetune.service.queue import may_advance
    from pipetune.service.queue_types import TaskProgress

    def progress(done: int, enqueued: int, target: int = 16) -> TaskProgress:
        return TaskProgress(1, done, enqueued, "running", 8, "random", target)

    assert may_advance(progress(done=8, enqueued=16, target=24), 0.0)  # a batch to propose
    assert not may_advance(progress(done=8, enqueued=16), 0.0)  # all enqueued, 8 out
    assert not may_advance(progress(done=15, enqueued=16), 0.0)
    assert may_advance(progress(done=16, enqueued=16), 0.0)  # the last: it finishes the task


def test_upkeep_plans_no_task_with_every_trial_enqueued_and_some_out(db_url, monkeypatch):
    with client_for(db_url, batch_size=4) as c:
        service = service_of(c)
        task_id = create_task(c, budget=8, strategy="random", seed=1)["id"]  # two batches
        worker = register(c)
        service.proposer.stop()
        planned: list[int] = []
        plan = service.driver._plan
        monkeypatch.setattr(service.driver, "_plan", lambda t, *a: planned.append(t) or plan(t, *a))
        jobs = lease(c, worker, max_jobs=8)
        assert len(jobs) == 8
        for job in jobs[:7]:
            result = {"status": "ok", "latency_us": 10.0 + job["trial"]}
            body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=result)
            service.queue.submit(job["job_id"], token_hash(TOKEN), body)
        service.upkeep()
        assert planned == []  # nothing to propose while one trial is out
        last = jobs[7]
        body = JobResult(
            worker_id=worker,
            lease_token=last["lease_token"],
            result={"status": "ok", "latency_us": 3.0},
        )
        service.queue.submit(last["job_id"], token_hash(TOKEN), body)
        service.upkeep()  # every result in: the sweep finishes it
        assert planned == [task_id]
        assert c.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
