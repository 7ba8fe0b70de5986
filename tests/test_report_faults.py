"""Workers that misbehave when they report: twice, late (after their lease expired: applied
while nobody has leased the job since, refused once someone has), or on a job they never
leased. Any interleaving of such reports
with honest work must end with every trial counted exactly once, with the honest answer, and
the task at exactly its budget. On SQLite and PostgreSQL, through the HTTP API in-process.

The test keeps its own ledger of what the service must have accepted and compares it with
the database at the end.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import client_for, create_task, lease, ok, post_result, register, service_of
from sqlalchemy import func, select, update

from pipetune.service.orm import JobRow, LeaseRow

pytest_plugins = ["service_fixtures"]

BUDGET = 6
WORKERS = 3
ACTIONS = ("lease", "report", "report_twice", "foreign", "forged_token", "expire")


@pytest.fixture
def client(db_url: str):
    # Batches of 3: the task driver proposes again mid-script, as in a real run. Expiries
    # never make a job `lost` here (that is another test's subject).
    with client_for(db_url, batch_size=3, max_attempts=1000) as c:
        yield c


@dataclass
class Held:
    job: dict
    stale: bool = False  # its lease was expired by the test: any report of it is late

    @property
    def token(self) -> str:
        return self.job["lease_token"]


@dataclass
class Ledger:
    """What the service must have recorded: job id -> (worker, latency) of the one result."""

    accepted: dict[int, tuple[int, float]] = field(default_factory=dict)
    accepted_token: dict[int, str] = field(default_factory=dict)  # the lease it came on
    newest: dict[int, str] = field(default_factory=dict)  # job id -> its newest lease's token
    held: dict[int, list[Held]] = field(default_factory=dict)
    refused: int = 0
    ignored: int = 0


def _report(client, ledger: Ledger, worker: int, held: Held, latency: float) -> None:
    response = post_result(client, worker, held.job, ok(latency))
    assert response.status_code == 200, response.text
    ack = response.json()
    job_id = held.job["job_id"]
    if job_id in ledger.accepted and ledger.accepted_token[job_id] == held.token:
        if ledger.accepted[job_id][1] == latency:
            # The same result again on its lease: acknowledged as a duplicate, not applied.
            assert ack["accepted"] is True and "duplicate" in (ack["detail"] or ""), ack
        else:
            # Another result on the recorded one's lease: a conflict, not applied.
            assert ack["accepted"] is False, ack
            assert (ack["detail"] or "").startswith("conflict: "), ack
            ledger.ignored += 1
    elif held.stale and (job_id in ledger.accepted or ledger.newest[job_id] != held.token):
        # A late report on a job finished or leased again since: never applied.
        assert ack["accepted"] is False, ack
        ledger.ignored += 1
    else:
        # On time, or late on a job nobody has leased since (its lease is the newest).
        assert ack == {"accepted": True, "job_state": "done", "detail": None}, ack
        ledger.accepted[job_id] = (worker, latency)
        ledger.accepted_token[job_id] = held.token


def _step(client, ledger: Ledger, workers: list[int], action: str, who: int, pick: int) -> None:
    worker = workers[who]
    mine = [h for h in ledger.held[worker] if h.job["job_id"] not in ledger.accepted or h.stale]
    if action == "lease":
        for job in lease(client, worker):
            ledger.held[worker].append(Held(job))
            ledger.newest[job["job_id"]] = job["lease_token"]
    elif action in ("report", "report_twice") and mine:
        held = mine[pick % len(mine)]
        for _ in range(2 if action == "report_twice" else 1):
            _report(client, ledger, worker, held, 10.0 + pick % 90)
    elif action == "foreign":
        # Another worker's job, with that worker's own (valid) lease token.
        others = [h for w in workers if w != worker for h in ledger.held[w]]
        if others:
            response = post_result(client, worker, others[pick % len(others)].job, ok(1.0))
            assert response.status_code == 403, response.text
            ledger.refused += 1
    elif action == "forged_token" and mine:
        forged = dict(mine[pick % len(mine)].job, lease_token=uuid.uuid4().hex)
        response = post_result(client, worker, forged, ok(1.0))
        assert response.status_code == 403, response.text
        ledger.refused += 1
    elif action == "expire":
        # The worker went quiet: its leases run out (the database clock is moved past them
        # by moving their expiry back) and the sweep puts the jobs back in the queue.
        service = service_of(client)
        past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
        with service.db.write() as session:
            session.execute(
                update(JobRow)
                .where(JobRow.lease_owner == worker, JobRow.state == "leased")
                .values(lease_expires_at=past)
            )
        service.queue.reclaim()
        for held in ledger.held[worker]:
            if held.job["job_id"] not in ledger.accepted:
                held.stale = True


def _drain(client, ledger: Ledger, workers: list[int], task_id: int) -> None:
    """The scripted workers go quiet (their open leases expire); an honest worker finishes
    whatever is left."""
    for who in range(len(workers)):
        _step(client, ledger, workers, "expire", who, 0)
    honest = register(client, f"honest-{uuid.uuid4().hex[:8]}")
    ledger.held[honest] = []
    service = service_of(client)
    for _ in range(10 * BUDGET):
        service.upkeep()
        if client.get(f"/v1/tasks/{task_id}").json()["state"] == "done":
            return
        for job in lease(client, honest, max_jobs=BUDGET):
            ledger.newest[job["job_id"]] = job["lease_token"]
            held = Held(job)
            ledger.held[honest].append(held)
            _report(client, ledger, honest, held, 500.0)
    raise AssertionError("the task did not finish")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    script=st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, WORKERS - 1), st.integers(0, 10**6)),
        min_size=5,
        max_size=40,
    )
)
def test_no_interleaving_of_double_late_or_foreign_reports_counts_a_trial_twice(client, script):
    task = create_task(client, budget=BUDGET, strategy="grid")
    workers = [register(client, f"w{i}-{uuid.uuid4().hex[:8]}") for i in range(WORKERS)]
    ledger = Ledger(held={w: [] for w in workers})
    for action, who, pick in script:
        _step(client, ledger, workers, action, who, pick)
    _drain(client, ledger, workers, task["id"])

    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["state"] == "done" and doc["trials_done"] == BUDGET, doc
    service = service_of(client)
    with service.db.read() as session:
        jobs = session.execute(
            select(JobRow.id, JobRow.result_worker, JobRow.latency_us, JobRow.state).where(
                JobRow.task_id == task["id"]
            )
        ).all()
        results = session.scalar(
            select(func.count())
            .select_from(LeaseRow)
            .join(JobRow, JobRow.id == LeaseRow.job_id)
            .where(JobRow.task_id == task["id"], LeaseRow.outcome == "result")
        )
    assert len(jobs) == BUDGET and results == BUDGET
    recorded = {job.id: (job.result_worker, job.latency_us) for job in jobs}
    assert recorded == ledger.accepted
    assert {job.state for job in jobs} == {"done"}
    trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    assert sorted(t["trial"] for t in trials) == list(range(BUDGET))
    assert len(client.get(f"/v1/tasks/{task['id']}/curve").json()["points"]) == BUDGET
