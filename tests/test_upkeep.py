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
