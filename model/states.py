"""The states of tasks, jobs and workers: the one definition the service, the clients, the wire
schema and the benchmarks derive from.

On the wire the states are lower-case strings. A task is "queued", then "running", and ends
"done", "failed" or "cancelled". A job (a trial, as users see it) is "queued", then
"leased" to a worker, and ends with a result, given up as "lost" after too many expired
leases, or cancelled with its task. Each lease of a job (the audit trail) ends one way: with
the job's result, expired, cancelled with its task, or released before its worker got it.

`is_final()` follows Optuna's `TrialState.is_finished()`: a final state never changes
again. The members are `StrEnum`s, so they compare equal to their strings and land in
database columns and JSON as those strings.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def is_final(self) -> bool:
        """Done, failed or cancelled: the task proposes and counts nothing more."""
        return self not in _ACTIVE_TASK


class JobState(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"

    def is_final(self) -> bool:
        """No worker holds it or will: it has its outcome or was cancelled."""
        return self not in _OUTSTANDING_JOB

    def is_trial(self) -> bool:
        """A final state that counts as one trial of the task's budget: a recorded result
        (done, failed) or a job given up as lost (the tuner sees a timeout). A cancelled
        job is final but was never a trial."""
        return self.is_final() and self is not JobState.CANCELLED

    def has_result(self) -> bool:
        """A worker's result is recorded (ok or a failure status)."""
        return self in (JobState.DONE, JobState.FAILED)


class LeaseOutcome(StrEnum):
    """How a lease ended (the `leases` table's `outcome`; NULL while the lease is live)."""

    RESULT = "result"  # its worker's result was recorded
    EXPIRED = "expired"  # its TTL ran out: the job was queued again (or given up as lost)
    CANCELLED = "cancelled"  # its task ended (cancelled or failed)
    RELEASED = "released"  # the service could not hand the jobs over: queued again at once


class WorkerState(StrEnum):
    """A registered worker as the service sees it, by the database's clock: "live" (heard
    from within the lease TTL: its leases hold), "silent" (not for longer: its process died
    or its host is cut off, and its leases expire) or "exited" (it said its process ended,
    POST /v1/workers/{id}/exit). A worker heard from again, by a heartbeat or a
    registration, is live again."""

    LIVE = "live"
    SILENT = "silent"
    EXITED = "exited"


# Module constants, not members: an Enum would turn a class attribute into a member.
_ACTIVE_TASK = frozenset({TaskState.QUEUED, TaskState.RUNNING})
_OUTSTANDING_JOB = frozenset({JobState.QUEUED, JobState.LEASED})

ACTIVE_TASK_STATES: tuple[TaskState, ...] = tuple(s for s in TaskState if not s.is_final())
FINAL_TASK_STATES: tuple[TaskState, ...] = tuple(s for s in TaskState if s.is_final())
OUTSTANDING_JOB_STATES: tuple[JobState, ...] = tuple(s for s in JobState if not s.is_final())
TRIAL_JOB_STATES: tuple[JobState, ...] = tuple(s for s in JobState if s.is_trial())
