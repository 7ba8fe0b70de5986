"""A result that comes after its lease expired (a worker paused, a network slow, a service
outage longer than the TTL) is applied when nobody has leased the job since: its lease is
the job's newest, and the job is still leased under it (no reclaim yet) or queued again by
a reclaim with no result. It is refused once the job was leased again, finished, cancelled
or given up as `lost`. It was applied or thrown away (and measured again) depending only on
whether a reclaim had run yet. On SQLite and PostgreSQL; the sweep is off, so that only the
test reclaims."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter

import pytest
from service_support import (
    TOKEN,
    client_for,
    create_task,
    lease,
    metric_value,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import func, select, update

from pipetune.model.wire import JobResult
from pipetune.service.orm import JobRow, LeaseRow, TaskRow
from pipetune.service.queue import Report, WorkerRef
from pipetune.service.settings import token_hash

pytest_plugins = ["service_fixtures"]

FAILED = {"status": "runtime_error", "error": "boom"}


def _service(db_url: str, **overrides):
    # No sweep: a lease's expiry is only acted on where the test reclaims. The lease path's
    # own reclaim is kept out too (Queue.maybe_reclaim), except where a test asks for one.
    overrides = {"sweep_interval_s": 0, **overrides}
    return client_for(db_url, **overrides)


def _no_lease_path_reclaim(c) -> None:
    service_of(c).queue._reclaimed_at = time.monotonic() + 3600


def _expire(c, job_id: int) -> None:
    """The job's lease runs out (its expiry moved into the past: the database clock is what
    decides)."""
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with service_of(c).db.write() as s:
        s.execute(
            update(JobRow)
            .where(JobRow.id == job_id, JobRow.state == "leased")
            .values(lease_expires_at=past)
        )


def _job(c, job_id: int):
    with service_of(c).db.read() as s:
        return s.execute(
            select(
                JobRow.state,
                JobRow.attempts,
                JobRow.lease_token,
                JobRow.lease_owner,
                JobRow.result_token,
                JobRow.result_worker,
                JobRow.latency_us,
                JobRow.finished_at,
            ).where(JobRow.id == job_id)
        ).one()


def _leases(c, job_id: int) -> list[tuple[int, str, str | None, bool]]:
    """(worker, token, outcome, ended) of the job's lease rows, oldest first."""
    with service_of(c).db.read() as s:
        rows = s.execute(
            select(LeaseRow.worker_id, LeaseRow.token, LeaseRow.outcome, LeaseRow.ended_at)
            .where(LeaseRow.job_id == job_id)
            .order_by(LeaseRow.id)
        ).all()
    return [(r.worker_id, r.token, r.outcome, r.ended_at is not None) for r in rows]


def _counters(c, task_id: int) -> tuple[int, int]:
    doc = c.get(f"/v1/tasks/{task_id}").json()
    return doc["trials_done"], doc["trials_failed"]


def _audit(c, task_id: int) -> None:
    """The invariants of the queue: the task's counters are its final jobs, each recorded
    result is its job's one `result` lease (by the worker and token the job names), no job
    that is not leased has an open lease, and no job has two."""
    service = service_of(c)
    with service.db.read() as s:
        jobs = s.execute(
            select(JobRow.id, JobRow.state, JobRow.result_token, JobRow.result_worker).where(
                JobRow.task_id == task_id
            )
        ).all()
        leases = s.execute(
            select(LeaseRow.job_id, LeaseRow.worker_id, LeaseRow.token, LeaseRow.outcome)
            .join(JobRow, JobRow.id == LeaseRow.job_id)
            .where(JobRow.task_id == task_id)
        ).all()
        done, failed = s.execute(
            select(TaskRow.trials_done, TaskRow.trials_failed).where(TaskRow.id == task_id)
        ).one()
    final = [j for j in jobs if j.state in ("done", "failed", "lost")]
    assert done == len(final), (done, jobs)
    assert failed == sum(j.state in ("failed", "lost") for j in jobs), (failed, jobs)
    results = Counter(lease.job_id for lease in leases if lease.outcome == "result")
    open_ = Counter(lease.job_id for lease in leases if lease.outcome is None)
    for j in jobs:
        if j.state in ("done", "failed"):
            assert results[j.id] == 1, (j, leases)
            (mine,) = [x for x in leases if x.job_id == j.id and x.outcome == "result"]
            assert (mine.token, mine.worker_id) == (j.result_token, j.result_worker)
        else:
            assert results[j.id] == 0 and j.result_token is None, (j, leases)
        assert open_[j.id] == (1 if j.state == "leased" else 0), (j, leases)


# ---- (a) no reclaim yet -------------------------------------------------------------------


def test_a_late_result_before_any_reclaim_is_applied(db_url):
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=2, strategy="grid")
        worker = register(c)
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        answer = post_result(c, worker, job, ok(5.0))
        assert answer.json() == {"accepted": True, "job_state": "done", "detail": None}
        row = _job(c, job["job_id"])
        assert (row.state, row.attempts, row.result_token, row.latency_us) == (
            "done", 0, job["lease_token"], 5.0,
        )  # fmt: skip
        assert _leases(c, job["job_id"]) == [(worker, job["lease_token"], "result", True)]
        assert _counters(c, task["id"]) == (1, 0)
        # The reclaim after it finds nothing to requeue.
        service_of(c).queue.reclaim()
        assert _job(c, job["job_id"]).state == "done"
        _audit(c, task["id"])


# ---- (b) requeued by a reclaim, leased by nobody since ---------------------------------------


@pytest.mark.parametrize("result", [ok(5.0), FAILED], ids=["ok", "failed"])
def test_a_late_result_after_its_job_was_requeued_and_not_leased_since_is_applied(db_url, result):
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=2, strategy="grid")
        worker, other = register(c, "late"), register(c, "other")
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        assert service_of(c).queue.reclaim() == set()
        requeued = _job(c, job["job_id"])
        assert (requeued.state, requeued.attempts, requeued.lease_token) == ("queued", 1, None)
        assert _leases(c, job["job_id"]) == [(worker, job["lease_token"], "expired", True)]

        answer = post_result(c, worker, job, result)
        state = "done" if result["status"] == "ok" else "failed"
        assert answer.json() == {"accepted": True, "job_state": state, "detail": None}
        row = _job(c, job["job_id"])
        assert (row.state, row.result_token, row.result_worker, row.lease_owner) == (
            state, job["lease_token"], worker, None,
        )  # fmt: skip
        assert row.finished_at is not None
        # Its lease row ends as the result's (no longer `expired`); the expiry stays counted
        # as an attempt (the lease did expire).
        assert row.attempts == 1
        assert _leases(c, job["job_id"]) == [(worker, job["lease_token"], "result", True)]
        # Counted once, as an on-time result is.
        assert _counters(c, task["id"]) == ((1, 0) if state == "done" else (1, 1))
        text = c.get("/metrics").text
        recorded = {
            "status": result["status"], "accepted": "true", "recorded": "true", "simulated": "true",
        }  # fmt: skip
        assert metric_value(text, "pipetune_results_total", **recorded) == 1.0

        # Posted again: a duplicate, not counted again.
        again = post_result(c, worker, job, result).json()
        assert again["accepted"] is True and again["detail"] == "duplicate: already recorded"
        assert _counters(c, task["id"]) == ((1, 0) if state == "done" else (1, 1))

        # (e) The job is no longer in the queue: a lease right after gets the other job only.
        got = lease(c, other, max_jobs=4)
        assert [j["job_id"] for j in got] != [] and job["job_id"] not in {j["job_id"] for j in got}
        assert len(got) == 1
        assert post_result(c, other, got[0], ok(6.0)).json()["accepted"] is True
        assert _counters(c, task["id"])[0] == 2
        _audit(c, task["id"])


def test_a_late_result_in_a_batch_is_applied_beside_on_time_ones(db_url):
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=3, batch_size=3, strategy="grid")
        worker = register(c)
        late, on_time = lease(c, worker), lease(c, worker, max_jobs=2)
        _expire(c, late[0]["job_id"])
        service_of(c).queue.reclaim()
        items = [
            {"job_id": j["job_id"], "lease_token": j["lease_token"], "result": ok(7.0 + i)}
            for i, j in enumerate(late + on_time)
        ]
        answer = c.post(
            "/v1/jobs/results",
            json={"worker_id": worker, "results": items + items[:1]},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert answer.status_code == 200, answer.text
        acks = answer.json()["acks"]
        assert [a["accepted"] for a in acks] == [True] * 4
        assert [a["detail"] for a in acks[:3]] == [None] * 3
        assert acks[3]["detail"] == "duplicate: already recorded"
        assert _counters(c, task["id"]) == (3, 0)
        _audit(c, task["id"])


# ---- (c) leased again, (d) lost, finished, cancelled: refused ------------------------------


def test_a_late_result_after_the_job_was_leased_again_is_refused(db_url):
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=1, strategy="grid")
        worker, other = register(c, "late"), register(c, "other")
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        service_of(c).queue.reclaim()
        (again,) = lease(c, other)
        assert again["job_id"] == job["job_id"]
        answer = post_result(c, worker, job, ok(5.0)).json()
        assert answer["accepted"] is False and answer["job_state"] == "leased"
        assert "stale lease" in answer["detail"]
        assert _counters(c, task["id"]) == (0, 0)
        # The new holder's result is the one recorded, once.
        assert post_result(c, other, again, ok(6.0)).json()["accepted"] is True
        assert _counters(c, task["id"]) == (1, 0)
        assert _job(c, job["job_id"]).result_worker == other
        late = post_result(c, worker, job, ok(5.0)).json()
        assert late["accepted"] is False and late["job_state"] == "done"
        _audit(c, task["id"])


def test_a_late_result_after_the_job_was_leased_again_and_requeued_again_is_refused(db_url):
    """Leased since, even if that lease expired too: the presented lease is not the job's
    newest (the other worker may be measuring it, and its result is the one that counts)."""
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=1, strategy="grid")
        worker, other = register(c, "late"), register(c, "other")
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        service_of(c).queue.reclaim()
        (again,) = lease(c, other)
        _expire(c, job["job_id"])
        service_of(c).queue.reclaim()
        assert _job(c, job["job_id"]).state == "queued"
        answer = post_result(c, worker, job, ok(5.0)).json()
        assert answer["accepted"] is False and "stale lease" in answer["detail"]
        # The newest lease's result is applied (late, not leased since).
        assert post_result(c, other, again, ok(6.0)).json()["accepted"] is True
        assert _counters(c, task["id"]) == (1, 0)
        assert [x[2] for x in _leases(c, job["job_id"])] == ["expired", "result"]
        _audit(c, task["id"])


def test_a_late_result_of_a_lost_job_is_refused(db_url):
    # The job's failure was counted when it was given up: its result must not count it again.
    with _service(db_url, max_attempts=1) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=1, strategy="grid")
        worker = register(c)
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        assert service_of(c).queue.reclaim() == {task["id"]}
        assert _job(c, job["job_id"]).state == "lost"
        assert _counters(c, task["id"]) == (1, 1)
        answer = post_result(c, worker, job, ok(5.0)).json()
        assert answer["accepted"] is False and answer["job_state"] == "lost"
        assert _counters(c, task["id"]) == (1, 1)
        assert _leases(c, job["job_id"]) == [(worker, job["lease_token"], "expired", True)]
        _audit(c, task["id"])


def test_a_late_result_of_a_cancelled_task_is_refused(db_url):
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=2, strategy="grid")
        worker = register(c)
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        service_of(c).queue.reclaim()
        assert c.delete(f"/v1/tasks/{task['id']}").json()["state"] == "cancelled"
        answer = post_result(c, worker, job, ok(5.0)).json()
        assert answer["accepted"] is False and answer["job_state"] == "cancelled"
        assert _counters(c, task["id"])[0] == 0


def test_a_late_result_is_refused_to_another_worker(db_url):
    """The late path checks the lease's worker as the on-time one does (403)."""
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=1, strategy="grid")
        worker, other = register(c, "late"), register(c, "other")
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        service_of(c).queue.reclaim()
        assert post_result(c, other, job, ok(5.0)).status_code == 403
        assert _job(c, job["job_id"]).state == "queued"
        assert _counters(c, task["id"]) == (0, 0)


# ---- (e) races: the late result against a lease of the requeued job ---------------------------


def test_a_late_result_racing_a_lease_of_its_requeued_job_counts_once(db_url):
    """The late result and another worker's lease at the same instant: either the result is
    applied and the lease does not get the job, or the lease gets it and the result is
    refused; the other worker's result then counts only if it got the job."""
    rounds = 8
    with _service(db_url) as c:
        _no_lease_path_reclaim(c)
        service = service_of(c)
        queue = service.queue
        task = create_task(c, budget=2 * rounds, batch_size=2 * rounds, strategy="grid")
        worker, other = register(c, "late"), register(c, "other")
        ref = WorkerRef(id=other, gpu="h100", arch="sm_90", runner="simulated")
        applied = 0
        for n in range(rounds):
            # At the same instant, or one a little behind the other (each way): whichever
            # comes first, the two never both take the job.
            post_after, take_after = [(0, 0), (0, 0.05), (0.05, 0)][n % 3]
            (job,) = lease(c, worker)
            _expire(c, job["job_id"])
            queue.reclaim()
            barrier = threading.Barrier(2)
            out: dict = {}
            body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=ok(5.0))

            def post(job=job, body=body, barrier=barrier, out=out, after=post_after) -> None:
                barrier.wait()
                time.sleep(after)
                out["ack"] = queue.submit(job["job_id"], token_hash(TOKEN), body)[0]

            def take(barrier=barrier, out=out, after=take_after) -> None:
                barrier.wait()
                time.sleep(after)
                out["got"] = queue.try_lease(ref, 1)

            threads = [threading.Thread(target=post), threading.Thread(target=take)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            got = [j for j in out["got"] if j.job_id == job["job_id"]]
            assert out["ack"].accepted != bool(got), (out["ack"], out["got"])
            applied += out["ack"].accepted
            for j in out["got"]:  # the other worker reports what it got
                report = Report(j.job_id, j.lease_token, JobResult(
                    worker_id=other, lease_token=j.lease_token, result=ok(6.0)
                ).result)  # fmt: skip
                (judged,), _ = queue.submit_many(other, token_hash(TOKEN), [report])
                assert judged.ack.accepted and judged.ack.detail is None
            _audit(c, task["id"])
        with service.db.read() as s:
            results = s.scalar(
                select(func.count()).select_from(LeaseRow).where(LeaseRow.outcome == "result")
            )
        done, _ = _counters(c, task["id"])
        assert results == done
        print(f"late results applied in {applied} of {rounds} rounds")


def test_a_late_result_while_the_reclaim_of_its_lease_commits_is_applied(pg):
    """PostgreSQL: the result's statement reads the job still leased under its token, then
    waits for the row a reclaim holds; the reclaim commits (the job queued again, its lease
    `expired`): the result is applied on the row as committed, and its lease row ends as the
    result's (it read it open; it is `expired` now)."""
    with _service(pg) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=1, strategy="grid")
        worker = register(c)
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])
        outcome = _while_the_job_is_locked(c, job, worker, lambda s: _reclaim_in(s, job))
        assert outcome.accepted is True and outcome.job_state == "done", outcome
        row = _job(c, job["job_id"])
        assert (row.state, row.attempts, row.result_token) == ("done", 1, job["lease_token"])
        assert _leases(c, job["job_id"]) == [(worker, job["lease_token"], "result", True)]
        assert _counters(c, task["id"]) == (1, 0)
        _audit(c, task["id"])


@pytest.mark.parametrize("requeued_again", [False, True])
def test_a_late_result_while_the_job_is_leased_again_is_refused(pg, requeued_again):
    """PostgreSQL: as above, but the transaction the result waits for also leased the job to
    another worker (and, `requeued_again`, that lease expired and was reclaimed too, so the
    job reads `queued` with no result once more): the result is refused."""
    with _service(pg) as c:
        _no_lease_path_reclaim(c)
        task = create_task(c, budget=1, strategy="grid")
        worker, other = register(c, "late"), register(c, "other")
        (job,) = lease(c, worker)
        _expire(c, job["job_id"])

        def reclaim_and_lease(s) -> None:
            _reclaim_in(s, job)
            s.exec_driver_sql(
                "UPDATE jobs SET state = 'leased', lease_owner = %(w)s, lease_token = 'other-1',"
                " lease_expires_at = statement_timestamp() + interval '1 hour' WHERE id = %(j)s",
                {"w": other, "j": job["job_id"]},
            )
            s.exec_driver_sql(
                "INSERT INTO leases (job_id, worker_id, token, leased_at)"
                " VALUES (%(j)s, %(w)s, 'other-1', statement_timestamp())",
                {"w": other, "j": job["job_id"]},
            )
            if requeued_again:
                _reclaim_in(s, job)

        outcome = _while_the_job_is_locked(c, job, worker, reclaim_and_lease)
        assert outcome.accepted is False and "stale lease" in outcome.detail, outcome
        assert outcome.job_state == ("queued" if requeued_again else "leased")
        row = _job(c, job["job_id"])
        assert row.result_token is None
        assert row.state == ("queued" if requeued_again else "leased")
        assert row.attempts == (2 if requeued_again else 1)
        assert [x[2] for x in _leases(c, job["job_id"])] == [
            "expired", "expired" if requeued_again else None,
        ]  # fmt: skip
        assert _counters(c, task["id"]) == (0, 0)
        _audit(c, task["id"])


def _reclaim_in(s, job: dict) -> None:
    """What Queue.reclaim does to one expired job, in the caller's transaction."""
    s.exec_driver_sql(
        "UPDATE jobs SET state = 'queued', attempts = attempts + 1, lease_owner = NULL,"
        " lease_token = NULL, lease_expires_at = NULL WHERE id = %(j)s",
        {"j": job["job_id"]},
    )
    s.exec_driver_sql(
        "UPDATE leases SET outcome = 'expired', ended_at = statement_timestamp()"
        " WHERE job_id = %(j)s AND outcome IS NULL",
        {"j": job["job_id"]},
    )


def _while_the_job_is_locked(c, job: dict, worker: int, change):
    """Post the job's result while another transaction holds the job's row; that transaction
    makes `change` and commits once the result's statement waits for the row."""
    service = service_of(c)
    queue = service.queue
    body = JobResult(worker_id=worker, lease_token=job["lease_token"], result=ok(5.0))
    out: dict = {}
    with service.db.engine.connect() as conn, conn.begin():
        conn.exec_driver_sql(
            "SELECT id FROM jobs WHERE id = %(j)s FOR UPDATE", {"j": job["job_id"]}
        )
        blocker = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        poster = threading.Thread(
            target=lambda: out.update(ack=queue.submit(job["job_id"], token_hash(TOKEN), body)[0])
        )
        poster.start()
        deadline = time.monotonic() + 20
        with service.db.engine.connect() as watch:
            while True:
                waiting = watch.exec_driver_sql(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %(b)s"
                    " AND locktype IN ('transactionid', 'tuple')",
                    {"b": blocker},
                ).scalar()
                watch.rollback()
                if waiting:
                    break
                assert time.monotonic() < deadline, "the result's statement never waited"
                assert poster.is_alive(), out
                time.sleep(0.01)
        change(conn)
    poster.join(20)
    return out["ack"]
