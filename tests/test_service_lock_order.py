"""Lock order on PostgreSQL: every statement that locks both a task's jobs and the task locks
the jobs first (in id order), as a result does (service/queue_pg.py). A statement that took
the task first and then waited for a job a result holds, while that result waited for the
task, was a deadlock: PostgreSQL aborted one of them after a second, and the worker got a
503 for its result (seen in tests/test_service_driver.py's two-replica test with early
proposals).

Each test holds a job's row lock as a result's statement does before it reaches the task,
starts the other statement in a thread, waits until that statement is waiting for the job,
and then locks the task as the result would next: the task must be free (the other statement
holds nothing yet), and the other statement must then complete without an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from service_support import client_for, create_task, lease, register, service_of
from sqlalchemy import create_engine, select, text

from pipetune.model.space import Schedule
from pipetune.service.driver import _Plan
from pipetune.service.orm import TaskRow

pytest_plugins = ["service_fixtures"]

# Well under PostgreSQL's deadlock_timeout (1 s): a task lock that waits longer was held by
# the statement under test.
FREE_LOCK_S = 0.5


def _waiting_for_a_lock(engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                )
            )
        )


def _while_a_result_holds_the_job(url: str, job_id: int, task_id: int, statement: Callable):
    """Run `statement` in a thread while another transaction holds the job, then lock the
    task in that transaction; returns how long the task lock took and what the statement
    returned or raised."""
    engine = create_engine(url)
    outcome: dict = {}
    try:
        with engine.connect() as result:
            tx = result.begin()
            result.execute(text("SELECT id FROM jobs WHERE id = :j FOR UPDATE"), {"j": job_id})

            def run():
                try:
                    outcome["returned"] = statement()
                except Exception as exc:  # reported by the test, not lost in the thread
                    outcome["raised"] = exc

            thread = threading.Thread(target=run)
            thread.start()
            deadline = time.monotonic() + 10
            while not _waiting_for_a_lock(engine):
                assert thread.is_alive(), f"the statement did not wait for the job: {outcome}"
                assert time.monotonic() < deadline, "the statement never waited for the job"
                time.sleep(0.01)
            result.execute(text("SET LOCAL lock_timeout = '5s'"))
            start = time.monotonic()
            result.execute(text("SELECT id FROM tasks WHERE id = :t FOR UPDATE"), {"t": task_id})
            took = time.monotonic() - start
            tx.commit()
            thread.join(10)
            assert not thread.is_alive()
    finally:
        engine.dispose()
    return took, outcome


def _a_leased_job(client, strategy: str = "analytical+xgb") -> tuple[int, dict]:
    task = create_task(client, budget=12, strategy=strategy, seed=1)
    jobs = lease(client, register(client), max_jobs=1)
    assert len(jobs) == 1
    return task["id"], jobs[0]


def _batch_of(client, task_id: int) -> tuple[int, int]:
    """The task's batch count (its version) and trials enqueued, as the driver reads them."""
    with service_of(client).db.read() as s:
        row = s.execute(
            select(TaskRow.batches, TaskRow.trials_enqueued).where(TaskRow.id == task_id)
        ).one()
    return row.batches, row.trials_enqueued


def _plan_of(client, task_id: int, batch: list, **fields) -> _Plan:
    """An advance's plan for the task as it stands: `batch` next, or `fields` (error=...)."""
    version, enqueued = _batch_of(client, task_id)
    predicted = [1.0] * len(batch)
    return _Plan(task_id, version, enqueued, batch, predicted, curve={}, **fields)


def _commit_while_a_result_holds_the_job(client, url: str, job: dict, plan: _Plan) -> None:
    driver = service_of(client).driver
    took, outcome = _while_a_result_holds_the_job(
        url, job["job_id"], plan.task_id, lambda: driver._commit(plan)
    )
    assert "raised" not in outcome, outcome
    assert outcome["returned"] is True
    assert took < FREE_LOCK_S


def test_a_new_batch_that_marks_a_leased_job_late_waits_for_it_before_the_task(pg):
    with client_for(pg, batch_size=4) as c:
        task_id, job = _a_leased_job(c)
        version, enqueued = _batch_of(c, task_id)
        plan = _plan_of(c, task_id, [Schedule(**job["schedule"])], late=[job["trial"]])
        _commit_while_a_result_holds_the_job(c, pg, job, plan)
        assert _batch_of(c, task_id) == (version + 1, enqueued + 1)


def _cancel_while_a_result_holds_the_job(pg: str) -> None:
    with client_for(pg, batch_size=4) as c:
        task_id, job = _a_leased_job(c)
        driver = service_of(c).driver
        took, outcome = _while_a_result_holds_the_job(
            pg, job["job_id"], task_id, lambda: driver.cancel(task_id)
        )
        assert "raised" not in outcome, outcome
        assert took < FREE_LOCK_S
        assert c.get(f"/v1/tasks/{task_id}").json()["state"] == "cancelled"
        trials = c.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
        assert trials and all(t["state"] == "cancelled" for t in trials)


def test_a_cancel_waits_for_the_jobs_before_the_task(pg):
    _cancel_while_a_result_holds_the_job(pg)


def test_a_failing_advance_waits_for_the_jobs_before_the_task(pg):
    with client_for(pg, batch_size=4) as c:
        task_id, job = _a_leased_job(c)
        plan = _plan_of(c, task_id, [], error="the tuner failed")
        _commit_while_a_result_holds_the_job(c, pg, job, plan)
        doc = c.get(f"/v1/tasks/{task_id}").json()
        assert doc["state"] == "failed"


def test_a_cancel_that_meets_a_job_enqueued_after_its_first_lock_starts_over(pg, monkeypatch):
    """The first jobs' lock of the cancel misses the job (as it misses one that an advance
    enqueues in the instant before the cancel locks the task); a result holds that job and
    then wants the task. The cancel must not hold the task while it waits for the job."""
    import pipetune.service.driver as driver_module

    real_lock = driver_module._lock_outstanding
    calls = []

    def first_lock_misses_the_job(conn, task_id, wait=True):
        calls.append(wait)
        if len(calls) > 1:
            real_lock(conn, task_id, wait=wait)

    monkeypatch.setattr(driver_module, "_lock_outstanding", first_lock_misses_the_job)
    _cancel_while_a_result_holds_the_job(pg)
    assert len(calls) >= 3  # missed, found held without waiting, then the start over
