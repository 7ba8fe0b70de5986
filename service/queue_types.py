"""What the queue's two stores (service/queue_pg.py, service/queue_sqlite.py) take and give
back: jobs claimed by a lease, results reported, and what the database held for each."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Protocol

from pipetune.model.states import JobState
from pipetune.model.trials import MeasureResult, RunnerKind
from pipetune.service.wakeup import WorkerKind

# The leases a heartbeat names, as (job id, lease token) pairs; None: all of the worker's.
Held = list[tuple[int, str]] | None


def result_columns(r: MeasureResult) -> dict[str, Any]:
    """A measurement as the columns of its job row (its final state included): the one
    mapping every writer of results uses (both queue stores, imported datasets)."""
    return {
        "state": (JobState.DONE if r.ok else JobState.FAILED).value,
        "status": r.status,
        "latency_us": r.ok_latency_us,
        "samples_us": list(r.samples_us),
        "spread": r.spread,
        "registers": r.registers,
        "spill_bytes": r.spill_bytes,
        "smem_bytes": r.smem_bytes,
        "compile_ms": r.compile_ms,
        "max_abs_error": r.max_abs_error,
        "error": r.error,
        "runner": r.runner,
        "generator_revision": r.generator_revision,
    }


# The job columns a result writes, in result_columns' order (what a repeat is compared on).
RESULT_COLUMNS: tuple[str, ...] = tuple(result_columns(MeasureResult(status="ok", latency_us=1.0)))


def recorded_runner(r: MeasureResult, worker: WorkerRef | None) -> str | None:
    """The runner a result is recorded as: its own, or, where it does not say, its worker's
    (the one rule of both stores and of the answer's `simulated`)."""
    return r.runner or (worker.runner if worker is not None else None)


@dataclass(frozen=True)
class WorkerRef:
    id: int
    gpu: str
    arch: str
    runner: str
    # The one workload it answers (WorkerRegister.workload); None: any.
    workload_hash: str | None = None

    @property
    def runner_kind(self) -> str | None:
        """Its runner's kind, as a task's only_runner names it (a plain string: a driver may
        write an enum member by its name)."""
        kind = RunnerKind.of(self.runner)
        return None if kind is None else kind.value

    @property
    def kind(self) -> WorkerKind:
        """Which jobs it may take (what wakes its waiting lease requests)."""
        return WorkerKind(self.arch, self.gpu, self.workload_hash, self.runner_kind)


@dataclass(frozen=True)
class Claimed:
    """A job a lease claimed."""

    id: int
    task_id: int
    trial: int
    workload_id: int
    gpu: str
    schedule: dict[str, Any]
    lease_expires_at: dt.datetime
    # Leased by the request a retry repeats (found again, not claimed now).
    earlier: bool = False


# The job columns a claim returns, in Claimed's order (both stores build their statements
# from it).
CLAIMED_COLUMNS: tuple[str, ...] = (
    "id",
    "task_id",
    "trial",
    "workload_id",
    "gpu",
    "schedule",
    "lease_expires_at",
)
# What a job's row holds of a lease it no longer has (requeued: released or expired).
LEASE_CLEARED: dict[str, None] = {
    "lease_owner": None,
    "lease_token": None,
    "lease_expires_at": None,
}


@dataclass(frozen=True)
class Report:
    """One result a worker reports on one lease."""

    job_id: int
    lease_token: str
    result: MeasureResult


@dataclass(frozen=True)
class TaskProgress:
    """A task's counters right after results were recorded."""

    id: int
    trials_done: int
    trials_enqueued: int
    state: str
    batch_size: int
    strategy: str
    trials_target: int  # what it will enqueue in all (its budget, or its whole space)


@dataclass(frozen=True)
class Seen:
    """What the database held for one report when it was recorded, and what became of it."""

    found: bool  # the job exists
    job_state: str | None
    lease_token: str | None  # the job's current lease
    result_token: str | None  # the lease whose result the job holds
    lease_worker: int | None  # the worker the presented lease was granted to
    applied: bool  # this report's result was recorded now
    task: TaskProgress | None = None  # when applied
    # Its task's latency floor (TaskRow.latency_floor_us), where the report's ok latency is
    # below it: then it was not recorded as sent (Queue.submit_many records it as failed).
    below_floor_us: float | None = None


class QueueStore(Protocol):
    """The hot paths of one database dialect."""

    def claim(
        self,
        worker: WorkerRef,
        n: int,
        task_id: int | None,
        token: str,
        ttl_s: float,
        again: bool = False,
    ) -> list[Claimed]:
        """Lease up to n queued jobs the worker may take: claim, lease audit rows, tasks
        started, in one transaction. `again`: the request may have been made before under
        this token (a retried request's, Queue.try_lease): the jobs still leased to the
        worker under it are the answer, if there are any, and nothing is claimed."""
        ...

    def record(self, worker: WorkerRef | None, reports: list[Report]) -> list[Seen]:
        """Record the results whose lease was granted to `worker` (None: an unauthorised
        worker, nothing is recorded) and is current, or expired with the job leased by
        nobody since (the rule: service/queue.py), end their leases and count them on their
        tasks, in one transaction; what the database held for each report, in order. An ok
        result whose latency is below its task's floor is not recorded (Seen.below_floor_us),
        nor does it keep a later report of the same lease in the request from being."""
        ...

    def settled(self, job_ids: list[int]) -> dict[int, tuple[str, str | None]]:
        """(state, result_token) of jobs as committed now."""
        ...

    def recorded(self, job_ids: list[int]) -> dict[int, dict[str, Any]]:
        """The result columns (RESULT_COLUMNS) of jobs as committed now, by job id: what
        a repeat of a recorded result is compared with."""
        ...

    def heartbeat(
        self, worker_id: int, busy_jobs: int, ttl_s: float, held: Held = None
    ) -> tuple[dt.datetime, list[int]]:
        """Record the heartbeat, extend the worker's live leases by ttl_s (of them only the
        `held` ones, (job id, lease token) pairs, where given); the database time, and the
        held leases that are no longer the worker's (no leased job of that id has that token
        and owner), in id order."""
        ...
