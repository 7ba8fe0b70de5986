"""The load benchmark's correctness audit, read-only over the database after a run (the
services stopped) and the workers' tally. Used by benchmarks/bench_load.py and by
tests/test_load_small.py.

* Duplicates (`find_duplicates`): jobs that two leases held at once (the lease audit
  table's intervals overlap; a lease that expired and was re-granted later is not one), jobs
  with two recorded results, and jobs two live workers held at once by their own clocks (a
  dead worker holds nothing).
* Lost jobs (`find_lost`): jobs given up as `lost`, jobs still leased (granted, never
  answered), leases a live worker received whose result was not recorded, abandoned leases
  whose job was not finished by a later lease, accepted results the database does not hold,
  and tasks whose trial counts disagree with their jobs (a finished task must have exactly
  its target number of trials, 0..target-1, each once). Not lost: a job of a task the run
  ended before (its --seconds ran out) whose last lease was a dead worker's, still running
  at the end or expired and queued again (`unfinished`): the service would have leased it
  again, the run did not wait.
* Churn (`find_churn`): leases abandoned, leases expired (audit table; abandoned ones must
  all end `expired`), re-leases (a lease granted after the job's previous lease expired),
  and whether every re-leased job holds exactly one result.

Rows are any objects with the columns `read_tables` selects (SQLAlchemy rows, or simple
namespaces in the tests).
"""

from __future__ import annotations

import collections
import datetime as dt
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, select

from benchmarks.load_driver import Held, Tally
from pipetune.model.states import JobState, LeaseOutcome, TaskState
from pipetune.service.orm import JobRow, LeaseRow, TaskRow

FOREVER = dt.datetime.max.replace(tzinfo=dt.UTC)  # the end of a live lease


@dataclass(frozen=True)
class Duplicates:
    """Jobs held twice, by each way of seeing it (sets of job ids)."""

    overlapping: frozenset[int]  # two leases' intervals overlap (audit table)
    two_results: frozenset[int]  # two leases ended with a result
    held_twice: frozenset[int]  # two live workers held it at once by their clocks

    @property
    def jobs(self) -> frozenset[int]:
        return self.overlapping | self.two_results | self.held_twice

    @property
    def count(self) -> int:
        return len(self.jobs)

    def breakdown(self) -> dict[str, int]:
        return {
            "overlapping leases (audit table)": len(self.overlapping),
            "jobs with two results": len(self.two_results),
            "held twice at once (live workers' clocks)": len(self.held_twice),
        }


@dataclass(frozen=True)
class Lost:
    """Jobs lost, by each way of losing one (sets of job ids), and tasks miscounted."""

    state_lost: frozenset[int]  # given up as lost by the service
    still_leased: frozenset[int]
    unanswered: frozenset[int]  # a live worker's answer never delivered
    refused: frozenset[int]  # a live worker's result refused and never recorded
    abandoned_unfinished: frozenset[int]  # abandoned, not finished by a later lease
    not_in_db: frozenset[int]  # accepted, not in the database
    unmatched: frozenset[int]  # recorded without its lease's result
    bad_tasks: tuple[int, ...]  # tasks whose counts disagree with their jobs
    # Not lost: a task the run ended before, its job's last lease a dead worker's (not counted)
    unfinished: frozenset[int] = frozenset()

    @property
    def jobs(self) -> frozenset[int]:
        return (
            self.state_lost
            | self.still_leased
            | self.unanswered
            | self.refused
            | self.abandoned_unfinished
            | self.not_in_db
            | self.unmatched
        )

    @property
    def count(self) -> int:
        return len(self.jobs) + len(self.bad_tasks)

    def breakdown(self) -> dict[str, int]:
        return {
            "state lost": len(self.state_lost),
            "still leased": len(self.still_leased),
            "answer never delivered": len(self.unanswered),
            "result refused, never recorded": len(self.refused),
            "abandoned, not finished by a later lease": len(self.abandoned_unfinished),
            "accepted, not in the database": len(self.not_in_db),
            "recorded without its lease's result": len(self.unmatched),
            "tasks whose counts disagree": len(self.bad_tasks),
        }


@dataclass(frozen=True)
class Churn:
    """What became of the leases dying workers abandoned, and of the expired ones."""

    abandoned: int  # leases abandoned by dying workers
    abandoned_expired: int  # ... that ended `expired` in the audit table
    leases_expired: int
    live_leases_expired: int  # expired leases a live worker held
    re_leases: int  # leases granted after the job's previous lease expired
    re_leased_jobs: int
    re_leased_one_result: int  # re-leased jobs holding exactly one result


def read_tables(url: str) -> tuple[list, list, list]:
    """The jobs, leases and tasks columns the audit needs, in one read-only transaction."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            jobs = conn.execute(
                select(
                    JobRow.id,
                    JobRow.task_id,
                    JobRow.trial,
                    JobRow.state,
                    JobRow.lease_token,
                    JobRow.lease_expires_at,
                    JobRow.result_token,
                )
            ).all()
            leases = conn.execute(
                select(
                    LeaseRow.id,
                    LeaseRow.job_id,
                    LeaseRow.token,
                    LeaseRow.leased_at,
                    LeaseRow.outcome,
                    LeaseRow.ended_at,
                )
            ).all()
            tasks = conn.execute(
                select(
                    TaskRow.id,
                    TaskRow.state,
                    TaskRow.trials_target,
                    TaskRow.trials_enqueued,
                    TaskRow.trials_done,
                )
            ).all()
            conn.rollback()
    finally:
        engine.dispose()
    return jobs, leases, tasks


def _leases_by_job(leases: Sequence) -> dict[int, list]:
    by_job: dict[int, list] = collections.defaultdict(list)
    for lease in sorted(leases, key=lambda r: r.id):
        by_job[lease.job_id].append(lease)
    return by_job


def _recorded(jobs: Sequence) -> set[int]:
    """Jobs whose result is recorded."""
    return {j.id for j in jobs if JobState(j.state).has_result()}


def find_duplicates(leases: Sequence, held: Sequence[Held]) -> Duplicates:
    # By the lease audit table: two leases of a job whose intervals overlap (a live lease
    # has no end). An expired lease ends when it is reclaimed, before the job can be leased
    # again, so a re-lease after expiry never overlaps its predecessor: the service stamps
    # both with the statement's time (service.db.Database.now), and the claim can only see
    # the job once the reclaim committed.
    overlapping: set[int] = set()
    two_results: set[int] = set()
    for job_id, rows in _leases_by_job(leases).items():
        for i, a in enumerate(rows):
            for b in rows[i + 1 :]:
                if b.leased_at < (a.ended_at or FOREVER) and a.leased_at < (b.ended_at or FOREVER):
                    overlapping.add(job_id)
        if sum(r.outcome == LeaseOutcome.RESULT for r in rows) > 1:
            two_results.add(job_id)
    # By the workers' clocks: one job held by two live workers at once. A worker that died
    # holding a job (churn) holds nothing: its lease must expire before the job goes to
    # another, which the audit table's intervals check.
    held_by_job: dict[int, list[Held]] = collections.defaultdict(list)
    for h in held:
        if not h.abandoned:
            held_by_job[h.job_id].append(h)
    held_twice: set[int] = set()
    for job_id, hs in held_by_job.items():
        hs.sort(key=lambda h: h.received)
        for a, b in itertools.pairwise(hs):
            if a.answered is None or b.received < a.answered:
                held_twice.add(job_id)
    return Duplicates(frozenset(overlapping), frozenset(two_results), frozenset(held_twice))


def find_lost(
    jobs: Sequence,
    leases: Sequence,
    tasks: Sequence,
    held: Sequence[Held],
    grace: dt.timedelta = dt.timedelta(0),
) -> Lost:
    # Given up, stranded, or answered without the result being recorded (unless a later
    # lease of the job recorded one: then the job is not lost, the lease expired). An
    # abandoned lease is no loss if a later lease (another token) recorded the job's result;
    # otherwise its job is lost, whatever state it was left in.
    job_by_id = {j.id: j for j in jobs}
    recorded = _recorded(jobs)
    live = [h for h in held if not h.abandoned]
    abandoned = [h for h in held if h.abandoned]
    # The run ended (its time limit) before these tasks did: a job whose last lease a dead
    # worker abandoned waited for that lease to expire, or, expired and queued again, for a
    # worker; the service would have given it out again had the run gone on (with churn, a
    # third of the batched leases are abandoned, and a model-guided task waits out each
    # one's TTL before its next batch). Only near the run's end (its last lease granted or
    # ended), within `grace` (the lease TTL): a dead worker's lease expired long before and
    # still held, or a job queued long before and never leased again, is a service that
    # does not reclaim or hand out jobs, and lost. A job a live worker held is still lost.
    running = {t.id for t in tasks if not TaskState(t.state).is_final()}
    dead = {(h.job_id, h.token) for h in abandoned}
    stamps = [r.leased_at for r in leases] + [r.ended_at for r in leases if r.ended_at]
    recent = max(stamps) - grace if stamps else None
    requeued = {  # jobs whose last lease was a dead worker's and expired: when it did
        r.job_id: r.ended_at
        for r in sorted(leases, key=lambda r: r.leased_at)
        if r.outcome == LeaseOutcome.EXPIRED
        and (r.job_id, r.token) in dead
        and r.ended_at is not None
    }

    def cut_off(j: Any) -> bool:
        if j.task_id not in running or recent is None:
            return False
        if j.state == JobState.LEASED and (j.id, j.lease_token) in dead:
            return j.lease_expires_at is not None and j.lease_expires_at >= recent
        if j.state == JobState.QUEUED and j.id in requeued:
            return requeued[j.id] >= recent
        return False

    unfinished = frozenset(j.id for j in jobs if cut_off(j))
    accepted = [h for h in held if h.accepted]
    result_leases = {(r.job_id, r.token) for r in leases if r.outcome == LeaseOutcome.RESULT}
    by_task: dict[int, list] = collections.defaultdict(list)
    for j in jobs:
        by_task[j.task_id].append(j)
    bad_tasks = []
    for t in tasks:
        mine = by_task[t.id]
        trials = sum(JobState(j.state).is_trial() for j in mine)
        ok = t.trials_done == trials and t.trials_enqueued == len(mine)
        if t.state == TaskState.DONE:
            ok = ok and t.trials_done == t.trials_target
            ok = ok and sorted(j.trial for j in mine) == list(range(t.trials_target))
        if not ok:
            bad_tasks.append(t.id)
    return Lost(
        state_lost=frozenset(j.id for j in jobs if j.state == JobState.LOST),
        still_leased=frozenset(j.id for j in jobs if j.state == JobState.LEASED) - unfinished,
        unanswered=frozenset({h.job_id for h in live if h.accepted is None} - recorded),
        refused=frozenset({h.job_id for h in live if h.accepted is False} - recorded),
        abandoned_unfinished=frozenset(
            h.job_id
            for h in abandoned
            if h.job_id not in recorded or job_by_id[h.job_id].result_token == h.token
        )
        - unfinished,
        not_in_db=frozenset(
            h.job_id
            for h in accepted
            if (j := job_by_id.get(h.job_id)) is None
            or not JobState(j.state).has_result()
            or j.result_token != h.token
        ),
        unmatched=frozenset(
            j.id for j in jobs if j.id in recorded and (j.id, j.result_token) not in result_leases
        ),
        bad_tasks=tuple(bad_tasks),
        unfinished=unfinished,
    )


def find_churn(jobs: Sequence, leases: Sequence, held: Sequence[Held]) -> Churn:
    job_by_id = {j.id: j for j in jobs}
    recorded = _recorded(jobs)
    lease_by_key = {(r.job_id, r.token): r for r in leases}
    abandoned_keys = {(h.job_id, h.token) for h in held if h.abandoned}
    expired = [r for r in leases if r.outcome == LeaseOutcome.EXPIRED]
    re_leased = [rows for rows in _leases_by_job(leases).values() if len(rows) > 1]
    return Churn(
        abandoned=len(abandoned_keys),
        abandoned_expired=sum(
            (r := lease_by_key.get(k)) is not None and r.outcome == LeaseOutcome.EXPIRED
            for k in abandoned_keys
        ),
        leases_expired=len(expired),
        live_leases_expired=sum((r.job_id, r.token) not in abandoned_keys for r in expired),
        re_leases=sum(
            sum(a.outcome == LeaseOutcome.EXPIRED for a in rows[:-1]) for rows in re_leased
        ),
        re_leased_jobs=len(re_leased),
        re_leased_one_result=sum(
            rows[0].job_id in recorded
            and sum(r.outcome == LeaseOutcome.RESULT for r in rows) == 1
            and any(
                r.outcome == LeaseOutcome.RESULT and r.token == job_by_id[r.job_id].result_token
                for r in rows
            )
            for rows in re_leased
            if rows[0].job_id in job_by_id
        ),
    )


def audit(url: str, tally: Tally, grace: dt.timedelta = dt.timedelta(0)) -> dict[str, Any]:
    """Read-only checks of the database after the run (the services are stopped); `grace`:
    see find_lost (the lease TTL)."""
    jobs, leases, tasks = read_tables(url)
    return audit_rows(jobs, leases, tasks, tally, grace)


def audit_rows(
    jobs: Sequence,
    leases: Sequence,
    tasks: Sequence,
    tally: Tally,
    grace: dt.timedelta = dt.timedelta(0),
) -> dict[str, Any]:
    """The audit as the report's figures (flat, JSON-ready)."""
    duplicates = find_duplicates(leases, tally.held)
    lost = find_lost(jobs, leases, tasks, tally.held, grace)
    churn = find_churn(jobs, leases, tally.held)
    recorded = _recorded(jobs)
    live = [h for h in tally.held if not h.abandoned]
    accepted = [h for h in tally.held if h.accepted]
    accepted_once = len({(h.job_id, h.token) for h in accepted})
    tokens_by_job: dict[int, set[str]] = collections.defaultdict(set)
    for h in tally.held:
        tokens_by_job[h.job_id].add(h.token)
    trials_done = sum(t.trials_done for t in tasks)
    return {
        "tasks_done": sum(t.state == TaskState.DONE for t in tasks),
        "tasks_failed": sum(t.state == TaskState.FAILED for t in tasks),
        "tasks": len(tasks),
        "trials_done_db": trials_done,
        "results_db": len(recorded),
        "results_accepted": accepted_once,
        "job_states": dict(collections.Counter(str(j.state) for j in jobs)),
        "lease_rows": len(leases),
        "jobs_leased": len(_leases_by_job(leases)),
        "duplicate_leases": duplicates.count,
        "duplicates": duplicates.breakdown(),
        "jobs_received_twice": sum(len(tokens) > 1 for tokens in tokens_by_job.values()),
        "results_refused": sum(h.accepted is False for h in live),
        "results_unanswered": sum(h.accepted is None for h in live),
        "abandoned": churn.abandoned,
        "abandoned_expired": churn.abandoned_expired,
        "leases_expired": churn.leases_expired,
        "live_leases_expired": churn.live_leases_expired,
        "re_leases": churn.re_leases,
        "re_leased_jobs": churn.re_leased_jobs,
        "re_leased_one_result": churn.re_leased_one_result,
        "lost_jobs": lost.count,
        "lost": lost.breakdown(),
        "unfinished_jobs": len(lost.unfinished),
        "results_counted_once": accepted_once
        == len(accepted)
        == len(recorded)
        == trials_done - len(lost.state_lost),
    }
