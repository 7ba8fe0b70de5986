"""The job queue: workers, leases, lease expiry and results.

A lease claims up to n queued jobs of the worker's kind; a report records any number of
results (`submit_many`; `submit` is one). On PostgreSQL each is one statement, one round
trip (service/queue_pg.py); on SQLite a few statements in one write transaction
(service/queue_sqlite.py). Both keep the guarantees: no job leased twice, a result recorded
only while nobody else may have the job (so a stale result is refused), each result counted
once (the lease token that delivered it is kept on the job, so a repeat is acknowledged, not
counted again), expiry by the database clock.

Which result is recorded: one whose lease is the job's current one, and one whose lease
expired (late) if the job has not been leased since, whether or not a reclaim has queued it
again meanwhile: its lease is the job's newest, and the job is still leased under it or
queued with no result. (It was recorded or thrown away, and the trial measured again,
depending only on whether the sweep had run yet.) Its lease then ends as `result`, and the
job and its task count it as an on-time result; the attempt its reclaim counted stays (the
lease did expire). Refused: a result of a job leased again since (even if that lease expired
too), finished, cancelled, or given up as `lost` (its failure is counted already).

A lease request that finds nothing waits for a wake-up (service/wakeup.py), not a poll.
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.to_thread
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import case, select, tuple_, update
from sqlalchemy import exc as sa_exc

from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.states import JobState, LeaseOutcome, TaskState, WorkerState
from pipetune.model.trials import RUNNER_PATTERN, MeasureResult, RunnerKind, is_simulated
from pipetune.model.wire import (
    ID_MAX,
    HeartbeatAck,
    HeldLease,
    JobLease,
    JobResult,
    JobResultAck,
    LeaseRequest,
    LeaseResponse,
    ResultAck,
    ScheduleDoc,
    WorkerDoc,
    WorkerRegister,
)
from pipetune.service.db import (
    BRIEF_LOCK_TIMEOUT_MS,
    LOOP_LOCK_TIMEOUT_MS,
    Database,
    is_lock_timeout,
    on_event_loop,
)
from pipetune.service.driver import all_enqueued_some_out, batches_ahead, outstanding_allowed
from pipetune.service.errors import ConflictError, ForbiddenError, InputError, NotFoundError
from pipetune.service.metrics import Metrics
from pipetune.service.orm import (
    JobRow,
    LeaseRow,
    TaskRow,
    WorkerRow,
    WorkloadRow,
)
from pipetune.service.queue_pg import PostgresQueueStore
from pipetune.service.queue_sqlite import SqliteQueueStore
from pipetune.service.queue_types import (
    LEASE_CLEARED,
    QueueStore,
    Report,
    Seen,
    TaskProgress,
    WorkerRef,
    recorded_runner,
    result_columns,
)
from pipetune.service.records import implausible_failure
from pipetune.service.settings import Settings
from pipetune.service.views import worker_doc
from pipetune.service.wakeup import (
    Wakeup,
    Woken,
    notify_replicas,
    notify_statement,
    service_channel,
)

_T = TypeVar("_T")
log = logging.getLogger(__name__)

__all__ = ["Queue", "Report", "WorkerRef", "check_storable"]

RECLAIM_EVERY_S = 1.0
# After a hot path's statement on the event loop gave up waiting for a lock held elsewhere,
# the loop's statements give up sooner this long (BRIEF_LOCK_TIMEOUT_MS), those that must wait
# doing so in threads, at most HOT_THREADS (and half the driver's connections) at once.
CONTENDED_S = 10.0
HOT_THREADS = 16
# A worker's arch, GPU and token change only when it re-registers. The replica it re-registers
# on forgets what it cached at once, the others when its NOTIFY arrives (service/wakeup.py):
# a replica that hears every message keeps a worker cached until then. One that may have missed
# one (its listener down, or reconnected since it checked) trusts what it cached for this long.
WORKER_CACHE_S = 30.0
MAX_CACHED_WORKERS = 10_000
WORKLOAD_CACHE_SIZE = 10_000


# How far a worker's latency may lie outside its timed repeats: rounding, not a measurement.
SAMPLE_RANGE_SLACK = 1e-9


def check_storable(r: MeasureResult, loc: list[str | int], *, from_worker: bool = True) -> None:
    """What the wire model allows but a trial row cannot hold; `loc` is where the result is
    in the request body. (Times and other numbers are bounded and finite by the model
    itself, model/trials.py.) `from_worker`: a worker's result, whose runner names one kind
    and whose latency is the median of its timed repeats; not an imported dataset's, which
    may name several runners, "cupy,simulated", or none, "unknown", and summarise its
    repeats its own way."""
    if r.ok and r.latency_us is None:
        raise InputError([*loc, "latency_us"], "required when status is ok")
    if from_worker and r.ok and r.latency_us is not None and r.samples_us:
        # The median of the repeats lies among them: a latency far below every repeat (0.001
        # us with repeats of 1e10) was stored as the schedule's best, 4,194 TFLOP/s on an
        # A100, and led the task's curve and every lookup of the workload's best.
        low, high = min(r.samples_us), max(r.samples_us)
        if not low * (1 - SAMPLE_RANGE_SLACK) <= r.latency_us <= high * (1 + SAMPLE_RANGE_SLACK):
            raise InputError(
                [*loc, "latency_us"],
                f"must lie within the timed repeats (samples_us, {low:g} to {high:g} us) as "
                f"their median, got {r.latency_us:g}",
            )
    # A trial row holds one story: a failure's timings (dropped or kept half) and an ok
    # result's error would contradict its status wherever it is shown.
    if not r.ok and r.latency_us is not None:
        raise InputError([*loc, "latency_us"], f"a {r.status} result has no latency")
    if not r.ok and r.samples_us:
        raise InputError([*loc, "samples_us"], f"a {r.status} result has no timed repeats")
    if r.ok and r.error is not None:
        raise InputError([*loc, "error"], "an ok result carries no error")
    for name in ("registers", "spill_bytes", "smem_bytes"):
        value = getattr(r, name)
        if value is not None and value > ID_MAX:
            raise InputError([*loc, name], f"must be at most {ID_MAX}")
    if r.runner is not None and not RUNNER_PATTERN.fullmatch(r.runner):
        raise InputError(
            [*loc, "runner"],
            "must be runner names (letters, digits, '_.+-') joined by ':' or ',', "
            f"got {r.runner!r}",
        )
    if from_worker and r.runner is not None and RunnerKind.of(r.runner) is None:
        kinds = ", ".join(k.value for k in RunnerKind)
        raise InputError(
            [*loc, "runner"],
            f"unknown runner {r.runner!r}: its kind (before any ':') is one of {kinds}",
        )


def check_runner(worker: WorkerRef, r: MeasureResult, loc: list[str | int]) -> None:
    """A result may name its runner (a replay says what it replays), but not another kind
    than its worker registered with: the kind decides whether a latency was measured on a
    GPU or simulated (a simulated trial never teaches a learned prior, and is labelled so
    wherever it is shown), so a simulated worker's result claiming `cupy` is refused."""
    kind = RunnerKind.of(r.runner)
    if kind is not None and kind != RunnerKind.of(worker.runner):
        raise InputError(
            [*loc, "runner"],
            f"a {kind.value} result from worker {worker.id}, which registered as {worker.runner}",
        )


def _repeated(
    worker: WorkerRef | None, worker_id: int, report: Report, seen: Seen, settled: dict
) -> bool:
    """Whether a report not recorded now was sent under the lease whose result the job
    holds (a repeat: the same result, or a conflicting one), by the worker that holds it."""
    if not seen.found or seen.applied or worker is None or seen.lease_worker != worker_id:
        return False
    token = settled.get(report.job_id, (seen.job_state, seen.result_token))[1]
    return token is not None and hmac.compare_digest(token, report.lease_token)


def _differences(result: MeasureResult, worker: WorkerRef | None, row: dict[str, Any]) -> list[str]:
    """The result columns in which a repeated result differs from the recorded one (`row`,
    QueueStore.recorded). Not `state` (its status says it), nor the runner where the result
    names none (then its worker's registration says it, not the result)."""
    sent = {**result_columns(result), "runner": recorded_runner(result, worker)}
    skip = {"state"} if result.runner is not None else {"state", "runner"}
    return [name for name, value in sent.items() if name not in skip and row.get(name) != value]


def _described(columns: dict[str, Any]) -> str:
    """A result in a few words: its status, and its latency where it has one."""
    latency = columns.get("latency_us")
    return str(columns["status"]) if latency is None else f"{columns['status']} {latency:g} us"


def _another_kind(worker: Any, values: dict[str, Any]) -> bool:
    """Whether a re-registration (`values`, as WorkerRegister gives them) makes the worker
    row another kind of measurer: another GPU or architecture, or another runner kind
    (simulated, replay, GPU), which a result under an earlier lease would be recorded as.
    Not another workload it answers: that says which jobs it leases next, not what its
    results are (its leases of the old workload stay its own)."""
    return (
        worker.gpu != values["gpu"]
        or worker.arch != values["arch"]
        or RunnerKind.of(worker.runner) != RunnerKind.of(values["runner"])
    )


@functools.lru_cache(maxsize=256)
def _no_schedule_reason(workload: Any, gpu: str) -> str | None:
    """Why no schedule of the workload is valid on the GPU, None when some is (what task
    creation refuses). Cached: a fleet registers with few workloads, each worker again at
    every restart, and a space takes milliseconds to enumerate."""
    family, spec = family_of(workload), get_gpu(gpu)
    if len(family.enumerate(workload, spec)):
        return None
    return family.no_schedule_reason(workload, spec)


@dataclass(frozen=True)
class Judged:
    """One report's answer: the ack, or the HTTP error the single-job route raises."""

    ack: JobResultAck
    error: NotFoundError | ForbiddenError | None = None


def may_advance(task: TaskProgress, early_share: float) -> bool:
    """Whether this result may have made the task ready for its next batch: all its batches
    are complete, or (for a task proposing ahead) all but the newest, or (proposing early)
    all but a few jobs. A hint: the driver checks exactly."""
    if all_enqueued_some_out(task.trials_enqueued, task.trials_target, task.trials_done):
        return False
    outstanding = task.trials_enqueued - task.trials_done
    allowed = batches_ahead(task.strategy) * task.batch_size
    # (As if past its first batch: a hint may say yes where the driver then says no.)
    allowed += outstanding_allowed(task.strategy, task.batch_size, early_share, batches=2)
    return task.state == TaskState.RUNNING and outstanding <= allowed


def retry_safe_token(worker_id: int, request_id: str) -> str:
    """The lease token of a request with an id (LeaseRequest.request_id): the same for its
    retries, so that they find what it leased, and distinct per worker. Derived rather than
    random, which is safe because a lease token alone grants nothing: a result or a
    heartbeat is applied only for the worker the lease was granted to, by that worker's
    own token (the token only tells that worker's leases of one job apart)."""
    digest = hashlib.sha256(f"{worker_id}:{request_id}".encode()).digest()
    return base64.urlsafe_b64encode(digest[:24]).decode()


def _refuse_fewer_than_repeated(body: LeaseRequest, repeated: int) -> NoReturn:
    """Refuse a retry asking for fewer jobs than the request it repeats leased (`repeated`,
    what its claim found again, leasing nothing): answered all of them it held more than
    its max_jobs; answered some, the others stayed leased to a worker that never got them
    until their TTL. A 422 naming max_jobs, not request_id: a client takes a request_id
    refused as a service that knows no request ids, and leases anew without one."""
    raise InputError(
        ["body", "max_jobs"],
        f"{body.max_jobs} is fewer than the {repeated} jobs that the request this retry "
        f"repeats (request_id {body.request_id!r}) leased: a retry repeats its request, "
        f"max_jobs included (send max_jobs {repeated} to get them; a new request takes a "
        "new request_id)",
    )


class Queue:
    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics,
        wakeup: Wakeup | None = None,
    ):
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.wakeup = wakeup or Wakeup(shared=not db.is_sqlite, channel=service_channel(db))
        self.store: QueueStore = SqliteQueueStore(db) if db.is_sqlite else PostgresQueueStore(db)
        self._reclaimed_at = 0.0
        self._reclaim_lock = threading.Lock()
        self._workloads: dict[int, dict] = {}
        # worker -> token hash -> the worker, when it was checked, and the listener's
        # connection it is trusted within (None: for WORKER_CACHE_S only). By worker first:
        # forgetting one scanned every entry; and cleared when MAX_CACHED_WORKERS hold one
        # (it kept an entry for every worker the replica had ever seen).
        self._worker_refs: dict[int, dict[str, tuple[WorkerRef, float, int | None]]] = {}
        self._contended_until = 0.0  # (monotonic: Queue.hot)
        self._hot_limiter: anyio.CapacityLimiter | None = None  # made on the event loop
        self._worker_forgets = 0  # forget_worker calls so far (a check racing one is not kept)
        self.wakeup.on_worker = self.forget_worker
        # Told of each task that lost a job at reclaim (the service's proposer.request).
        self.on_lost: Callable[[int], None] | None = None

    def stop_polling(self) -> None:
        """Answer pending and later lease long-polls at once (the service is stopping: a
        draining worker should not wait out its poll)."""
        self.wakeup.close()

    # ---- workers -------------------------------------------------------------------

    def register(self, token_hash: str, body: WorkerRegister) -> tuple[WorkerDoc, bool]:
        """Register (or re-register, by name) a worker; returns the doc and whether new."""
        expected = get_gpu(body.gpu).arch
        if body.arch != expected:  # (the wire model reads sm_90a as sm_90)
            raise InputError(["body", "arch"], f"{body.gpu} is {expected}, got {body.arch}")
        if body.workload is not None:
            # A workload with no valid schedule on the GPU has no task there ever (task
            # creation refuses it): its worker long-polled for ever, and nothing said why.
            problem = _no_schedule_reason(body.workload, body.gpu)
            if problem is not None:
                raise InputError(["body", "workload"], problem)
        try:
            doc, created, requeued = self._register(token_hash, body)
        except sa_exc.IntegrityError:
            # Another request registered the same new name between this one's look-up and
            # its insert (on PostgreSQL the name's unique constraint decides; SQLite's write
            # transactions take the lock first, so they never meet). The name is taken now:
            # register again, as a re-registration (or a conflict with another token).
            doc, created, requeued = self._register(token_hash, body)
        self._signal_requeued(requeued)
        self.forget_worker(doc.id)
        # Its first lease usually comes here: checked from what was just written, it needs no
        # read and no thread hand-off (each worker's first lease took both, a tenth of the
        # service's CPU in a short load run). Trusted for WORKER_CACHE_S only, as a look-up
        # made while a re-registration may go unheard (worker_ref).
        ref = WorkerRef(
            id=doc.id, gpu=doc.gpu, arch=doc.arch, runner=doc.runner,
            workload_hash=doc.workload_hash,
        )  # fmt: skip
        self._cache_worker(doc.id, token_hash, (ref, time.monotonic(), None))
        return doc, created

    def _cache_worker(
        self, worker_id: int, token_hash: str, entry: tuple[WorkerRef, float, int | None]
    ) -> None:
        if worker_id not in self._worker_refs and len(self._worker_refs) >= MAX_CACHED_WORKERS:
            self._worker_refs.clear()  # (each worker's next request reads it again)
        self._worker_refs.setdefault(worker_id, {})[token_hash] = entry

    def forget_worker(self, worker_id: int) -> None:
        """Drop what is cached of the worker, under any token (it re-registered), and that it
        said it stops: a restart under its name leases again."""
        self._worker_forgets += 1
        self._worker_refs.pop(worker_id, None)
        self.wakeup.forget_stopping(worker_id)

    async def worker_stopping(self, worker_id: int, token_hash: str) -> None:
        """The worker stops (POST /v1/workers/{id}/stopping): its waiting lease requests, on
        every replica, are answered empty now, and its later ones at once (Wakeup.stop_worker)
        until it registers again. Without it a job enqueued while a stopped worker's process
        ended was leased into its open long-poll, never read, and waited out its TTL."""
        if self.cached_worker_ref(worker_id, token_hash) is None:
            await run_in_threadpool(self.worker_ref, worker_id, token_hash)  # (404, 403)
        await self.hot(
            notify_replicas, self.db, self.wakeup.channel, self.wakeup.stopping_payload(worker_id)
        )
        self.wakeup.stop_worker(worker_id)

    def worker_exited(self, worker_id: int, token_hash: str) -> None:
        """The worker's process ends (POST /v1/workers/{id}/exit): it is not live from now on
        (`orm.in_state`), so its name is free to another token's worker at once and no
        count of live workers includes it, until it is heard from again. Its lease requests
        are answered as a stopping worker's are (`worker_stopping`), on every replica. Its
        leases are left as they are: the worker hands back what it will not measure first
        (POST /v1/jobs/release), and what it could not report expires. 404 for a worker not
        registered, 403 another token's."""
        self.worker_ref(worker_id, token_hash)
        with self.db.write() as s:
            s.execute(
                update(WorkerRow)
                .where(WorkerRow.id == worker_id)
                .values(exited_at=self.db.now(), busy_jobs=0)
            )
            if not self.db.is_sqlite:  # (delivered when the exit commits)
                s.execute(
                    notify_statement(self.wakeup.channel, self.wakeup.stopping_payload(worker_id))
                )
        self.wakeup.stop_worker(worker_id)

    def _register(
        self, token_hash: str, body: WorkerRegister
    ) -> tuple[WorkerDoc, bool, collections.Counter]:
        values = body.model_dump(exclude={"name", "workload"})
        # Set on every registration: a name re-registered without one answers any workload.
        values["workload_hash"] = body.workload.workload_hash if body.workload else None
        requeued: collections.Counter = collections.Counter()
        with self.db.write() as s:
            worker = s.scalars(select(WorkerRow).where(WorkerRow.name == body.name)).first()
            created = worker is None
            in_use: bool | None = None  # (said of a re-registration only)
            if worker is None:
                # Stamped by the database's clock to the millisecond: the column's default
                # is SQLite's CURRENT_TIMESTAMP, whole seconds, which made a worker look up
                # to a second longer silent than it was.
                worker = WorkerRow(
                    name=body.name, token_hash=token_hash, last_heartbeat=self.db.now(), **values
                )
                s.add(worker)
            else:
                now = s.scalar(select(self.db.now()))
                # A restart re-registers after its heartbeats stopped; within a lease TTL of
                # the last one, another process may be running under the name.
                # A worker that said it exited is not running under it (whatever the TTL).
                since = (now - worker.last_heartbeat).total_seconds()
                ttl = self.settings.lease_ttl_s
                in_use = worker.state(now, ttl) is WorkerState.LIVE
                if not hmac.compare_digest(worker.token_hash, token_hash):
                    # Another token's name: refused while that token is still configured and
                    # the name may be in use. Past that (a token rotated out, or a worker
                    # restarted on the new token after a rotation) the name moves to this
                    # token; a worker with a fixed --name could never register on it before.
                    if in_use and worker.token_hash in self.settings.worker_token_hashes:
                        raise ConflictError(
                            f"worker name {body.name!r} is registered with another token and "
                            f"was heard from {since:.0f} s ago: the name moves to this token "
                            f"once it has been silent for the lease TTL ({ttl:.0f} s), or at "
                            "once when its worker stops cleanly (it says it exited)"
                        )
                    worker.token_hash = token_hash
                    in_use = False
                if in_use and _another_kind(worker, values):
                    # Another process may be running under the name as the kind the row
                    # says: re-kinded under it, that process leased the new kind's jobs and
                    # its results were recorded as the new kind's (an H100's timings as an
                    # A100's). A restart as another kind waits for the name to fall silent,
                    # or registers after its last process said it exited.
                    raise ConflictError(
                        f"worker name {body.name!r} is live, registered for gpu {worker.gpu} "
                        f"and runner {worker.runner} (heard from {since:.0f} s ago): it "
                        f"registers for gpu {values['gpu']} and runner {values['runner']} "
                        "once it has been silent "
                        f"for the lease TTL ({ttl:.0f} s), or at once after its worker stops "
                        "cleanly; give each worker its own --name"
                    )
                if _another_kind(worker, values) or worker.device_name != values["device_name"]:
                    # Its leases were granted to the worker it was (that GPU, that kind of
                    # runner, that device): a result under one would be recorded as the
                    # worker it is now (a simulated lease's result as a GPU measurement, an
                    # H100 job's as the A100's, a PCIe card's as the SXM's that took the name).
                    # Handed back, so such a result is refused as stale and the jobs go to
                    # workers of their kind at once.
                    requeued = self._hand_back_leases(s, worker.id)
                if worker.device_name != values["device_name"]:
                    # Its trials named their device through this row, which is about to
                    # name another: each keeps the one that measured it ("" for none named;
                    # an A100's trials read as the H200's that took the name over).
                    s.execute(
                        update(JobRow)
                        .where(
                            JobRow.result_worker == worker.id,
                            JobRow.result_device_name.is_(None),
                        )
                        .values(result_device_name=worker.device_name or "")
                    )
                for key, value in values.items():
                    setattr(worker, key, value)
                worker.last_heartbeat = now
                worker.exited_at = None
                if not self.db.is_sqlite:  # the other replicas forget it when this commits
                    s.execute(
                        notify_statement(self.wakeup.channel, self.wakeup.worker_payload(worker.id))
                    )
            s.flush()
            s.refresh(worker)
            doc = worker_doc(worker, WorkerState.LIVE)  # (heard from just now)
            doc.name_in_use = in_use
            doc.lease_ttl_s = self.settings.lease_ttl_s
            return doc, created, requeued

    def _hand_back_leases(self, s: Any, worker_id: int) -> collections.Counter:
        """Queue again, in the transaction `s`, every job leased to the worker (it
        re-registers as another kind), their leases ended as released; what was queued again,
        per kind of worker (to signal after the commit)."""
        held = s.execute(
            select(JobRow.id, JobRow.lease_token)
            .where(JobRow.lease_owner == worker_id, JobRow.state == JobState.LEASED)
            .order_by(JobRow.id)
            .with_for_update()
        ).all()
        return self._requeue(s, [(r.id, r.lease_token) for r in held])[1]

    def _requeue(
        self, s: Any, leases: list[tuple[int, str]]
    ) -> tuple[list[int], collections.Counter]:
        """Queue again, in the transaction `s`, the jobs of these current leases (job id,
        lease token, read under the rows' lock), no attempt counted, and end each lease's
        record as released (not a stale token's). The ids queued again, and how many per kind
        of worker (announced to the other replicas by `s`; to signal after the commit)."""
        if not leases:
            return [], collections.Counter()
        rows = s.execute(
            update(JobRow)
            .where(JobRow.id.in_([job_id for job_id, _ in leases]))
            .values(state=JobState.QUEUED, **LEASE_CLEARED)
            .returning(JobRow.id, JobRow.arch, JobRow.gpu, JobRow.only_runner)
            .execution_options(synchronize_session=False)
        ).all()
        if rows:
            s.execute(
                update(LeaseRow)
                .where(
                    tuple_(LeaseRow.job_id, LeaseRow.token).in_(leases),
                    LeaseRow.outcome.is_(None),
                )
                .values(outcome=LeaseOutcome.RELEASED, ended_at=self.db.now())
                .execution_options(synchronize_session=False)
            )
        return [r.id for r in rows], self._notify_requeued(s, rows)

    def heartbeat(
        self,
        worker_id: int,
        token_hash: str,
        busy_jobs: int,
        leases: list[HeldLease] | None = None,
    ) -> HeartbeatAck:
        """Record the heartbeat and extend by one TTL the worker's live leases, of them only
        those it says it holds where it says (wire.Heartbeat says why)."""
        self.worker_ref(worker_id, token_hash)
        held = None if leases is None else [(h.job_id, h.lease_token) for h in leases]
        now, gone = self.store.heartbeat(worker_id, busy_jobs, self.settings.lease_ttl_s, held)
        return HeartbeatAck(ok=True, server_time=now, gone=gone)

    def cached_worker_ref(self, worker_id: int, token_hash: str) -> WorkerRef | None:
        """The worker, if checked against this token since this replica last heard every
        message (no re-registration could have passed it unheard), or less than
        WORKER_CACHE_S ago."""
        cached = self._worker_refs.get(worker_id, {}).get(token_hash)
        if cached is None:
            return None
        ref, checked_at, epoch = cached
        wakeup = self.wakeup
        if epoch is not None and epoch == wakeup.epoch and wakeup.hears_all:
            return ref
        if time.monotonic() - checked_at < WORKER_CACHE_S:
            return ref
        return None

    def worker_ref(self, worker_id: int, token_hash: str) -> WorkerRef:
        """The worker's GPU and arch, checked against its token (404 unknown, 403 another
        token's). Cached for WORKER_CACHE_S: every lease and report needs it."""
        ref = self.cached_worker_ref(worker_id, token_hash)
        if ref is not None:
            return ref
        # Read before the look-up: a re-registration heard during it may be one it missed.
        forgets, epoch, hears_all = self._worker_forgets, self.wakeup.epoch, self.wakeup.hears_all
        w = None
        if 0 < worker_id <= ID_MAX:
            with self.db.read_conn() as conn:
                w = conn.execute(
                    select(
                        WorkerRow.id,
                        WorkerRow.gpu,
                        WorkerRow.arch,
                        WorkerRow.runner,
                        WorkerRow.workload_hash,
                        WorkerRow.token_hash,
                    ).where(WorkerRow.id == worker_id)
                ).first()
        if w is None:
            raise NotFoundError(f"worker {worker_id} is not registered")
        if not hmac.compare_digest(w.token_hash, token_hash):
            raise ForbiddenError(f"worker {worker_id} belongs to another token")
        ref = WorkerRef(
            id=w.id, gpu=w.gpu, arch=w.arch, runner=w.runner, workload_hash=w.workload_hash
        )
        trusted = hears_all and forgets == self._worker_forgets
        self._cache_worker(
            worker_id, token_hash, (ref, time.monotonic(), epoch if trusted else None)
        )
        return ref

    # ---- leases --------------------------------------------------------------------

    def try_lease(
        self,
        worker: WorkerRef,
        max_jobs: int,
        task_id: int | None = None,
        request_id: str | None = None,
        retry: bool = False,
    ) -> list[JobLease]:
        """Claim up to max_jobs queued jobs for the worker (none: an empty list); with
        task_id, only that task's (`pipetune.tune` measures its own task in process). Under
        a request id's token (LeaseRequest.request_id); a `retry` gets the jobs the request
        it repeats leased, while they are still leased to the worker, if there are any
        (with max_jobs 0 it only looks for those: a report retried by a worker that will
        register again first, JobResults)."""
        self.maybe_reclaim()
        if request_id is None:
            token = secrets.token_urlsafe(24)
        else:
            token = retry_safe_token(worker.id, request_id)
        claimed = self.store.claim(
            worker,
            max_jobs,
            task_id,
            token,
            self.settings.lease_ttl_s,
            again=retry and request_id is not None,
        )
        if not claimed:
            return []
        try:
            canonical = self._canonical({c.workload_id for c in claimed})
            leases = [
                JobLease(
                    job_id=c.id,
                    lease_token=token,
                    lease_expires_at=c.lease_expires_at,
                    lease_ttl_s=self.settings.lease_ttl_s,
                    task_id=c.task_id,
                    trial=c.trial,
                    workload=canonical[c.workload_id],
                    gpu=c.gpu,
                    schedule=ScheduleDoc.model_construct(**c.schedule),  # stored validated
                )
                for c in claimed
            ]
        except BaseException:
            # The claim committed, the answer cannot be made: the worker will not get these.
            # (Jobs found again for a retry stay the worker's: its next retry may get them.)
            self._release([(c.id, token) for c in claimed if not c.earlier])
            raise
        for c in claimed:
            if not c.earlier:  # (counted when they were claimed)
                self.metrics.leases.labels(c.gpu).inc()
        return leases

    async def hot(self, work: Callable[..., _T], *args: Any) -> _T:
        """Run a lease's claim or a result's record from the event loop. On PostgreSQL on the
        loop itself: one short transaction, cheaper than a thread hand-off (routers/jobs.py).
        On SQLite in a worker thread: another program (a `sqlite3` shell, a backup tool) may
        hold the file's write lock, and the statement then waits up to the busy timeout
        (30 s); on the loop that wait stopped every request of the service, /healthz too.
        On PostgreSQL in a worker thread too while the database is stalled (a statement
        missed its deadline, Database.stalled): the probe then waits up to a deadline, and
        must not hold the loop meanwhile."""
        if self.db.is_sqlite or self.db.stalled:
            return await run_in_threadpool(work, *args)
        contended = time.monotonic() < self._contended_until
        done: list[int] = []
        wait_ms = BRIEF_LOCK_TIMEOUT_MS if contended else LOOP_LOCK_TIMEOUT_MS
        try:
            with on_event_loop(wait_ms) as done:  # (a lock wait bounded: wait_ms)
                return work(*args)
        except sa_exc.DBAPIError as exc:
            if not is_lock_timeout(exc):
                raise
            # Another session holds a lock this work waits for (an open transaction, CREATE
            # INDEX, a migration): on the loop the wait stopped every request of the replica,
            # /healthz and the dashboard's page too. This work waits in a thread; for a while
            # the loop's statements give up on a lock sooner, and the loop answers the rest.
            if not contended:
                log.warning("a lock held elsewhere: the hot paths that need it wait in threads")
            self._contended_until = time.monotonic() + CONTENDED_S
            if done:
                # Part of the work finished (a result recorded, a claim committed): run again,
                # it would answer as another request (a duplicate, new jobs). The client's
                # retry is answered as a retry is (per lease, per request id).
                raise
        # Threads of their own (at most half the driver's connections, HOT_THREADS at most):
        # waiting there, they must not take every thread of the pool that /healthz and the
        # other routes run in, nor every connection that /healthz, the proposer and the upkeep
        # need (/healthz waited out the lock with 10 results waiting on it).
        if self._hot_limiter is None:
            self._hot_limiter = anyio.CapacityLimiter(
                max(1, min(HOT_THREADS, self.db.pool_size // 2))
            )
        return await anyio.to_thread.run_sync(
            functools.partial(work, *args), limiter=self._hot_limiter
        )

    async def lease_now(
        self,
        worker: WorkerRef,
        max_jobs: int,
        new: bool = True,
        signalled: bool = False,
        request_id: str | None = None,
        retry: bool = False,
    ) -> list[JobLease]:
        """One look at the queue for the worker, without waiting: what a lease request does
        each time it is woken (`signalled`) or polls. No statement is run while the queue is
        known to hold nothing for this kind of worker or, for a `new` request, while other
        requests of its kind wait (the next jobs' signal wakes them first), unless it is a
        `retry`, which looks for the jobs the request it repeats leased (not in the queue)."""
        generation = self.wakeup.generation
        if (
            not signalled
            and not retry
            and self.wakeup.known_empty(worker.kind, self.settings.lease_poll_s, new)
        ):
            return []
        jobs = await self.hot(self.try_lease, worker, max_jobs, None, request_id, retry)
        if not jobs and max_jobs > 0:
            # Only a claim that looked for new jobs learns that the queue holds none. A retry
            # asking for none (a report retried by a worker that will register again first)
            # only looked for the jobs its lost answer held: remembered as "empty", it made
            # every lease request of its kind on this replica skip its claim and wait for the
            # fallback poll with jobs queued.
            self.wakeup.found_empty(worker.kind, generation)
        return jobs

    async def lease_after_report(
        self,
        worker_id: int,
        token_hash: str,
        max_jobs: int,
        request_id: str | None = None,
        retry: bool = False,
    ) -> list[JobLease]:
        """The jobs a results request leases for its worker (JobResults.max_jobs): one look
        at the queue, no waiting; none for a worker the token does not own (its results were
        refused item by item, 404 or 403). It claims even while lease requests of its kind
        wait (not `new`): a woken one that finds the jobs taken costs a claim statement and
        waits on, where leaving them to it would cost this worker a lease request (measured:
        benchmarks/RESULTS.md, "a report leases the next jobs")."""
        # A retry looks for the jobs of the report it repeats even with max_jobs 0 (a worker
        # that will register again first asks for none new: try_lease).
        if self.wakeup.stopping(worker_id):
            # Its worker said it stops (or exited): nothing new is leased to it, here as on
            # the lease route; a retry still gets back what the report it repeats leased,
            # for the worker to hand back.
            max_jobs = 0
        asks = max_jobs > 0 or (retry and request_id is not None)
        worker = self._authorised(worker_id, token_hash) if asks else None
        if worker is None:
            return []
        return await self.lease_now(worker, max_jobs, new=False, request_id=request_id, retry=retry)

    def _canonical(self, ids: set[int]) -> dict[int, dict]:
        """Workload documents by id (rows never change, so they are cached)."""
        missing = ids - self._workloads.keys()
        if missing and len(self._workloads) > WORKLOAD_CACHE_SIZE:
            self._workloads.clear()
        if missing:
            with self.db.read_conn() as conn:
                found = conn.execute(
                    select(WorkloadRow.id, WorkloadRow.canonical).where(WorkloadRow.id.in_(missing))
                )
                self._workloads.update(dict(found.all()))
        return {i: self._workloads[i] for i in ids}

    async def lease(
        self,
        worker_id: int,
        token_hash: str,
        body: LeaseRequest,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> LeaseResponse:
        """Long-poll: return as soon as jobs are claimed, or empty after wait_s. Between
        claims the request waits for a wake-up (jobs of its kind enqueued), or at most
        lease_poll_s (the fallback should a signal be missed). `gone()`: whether the client
        went away while the request waited (a worker killed mid-poll); it claims nothing
        then, where it took the jobs its wake-up announced for a dead worker, and they waited
        out a lease TTL and used up one of their attempts."""
        worker = self.cached_worker_ref(worker_id, token_hash)
        if worker is None:
            worker = await run_in_threadpool(self.worker_ref, worker_id, token_hash)
        kind = worker.kind
        deadline = time.monotonic() + min(body.wait_s, self.settings.lease_wait_cap_s)
        signalled, new = False, True
        retry = body.retry  # its first look only: later ones claim (under the same token)
        # The wake-up whose jobs its claim has not looked for yet. A request that leaves
        # before (its worker gone; its claim's database error, a 503) passes them on: the
        # signal woke no other request for them, which waited out its poll (5 s) with the
        # jobs queued.
        unclaimed: Woken | None = None
        try:
            while True:
                if self.wakeup.stopping(worker.id):
                    # Its worker said it stops: nothing is leased into a poll it won't read.
                    return LeaseResponse(jobs=[])
                mark = self.wakeup.wakes
                jobs = await self.lease_now(
                    worker,
                    body.max_jobs,
                    new=new,
                    signalled=signalled,
                    request_id=body.request_id,
                    retry=retry,
                )
                unclaimed, retry = None, False
                if len(jobs) > body.max_jobs:
                    _refuse_fewer_than_repeated(body, len(jobs))
                left = deadline - time.monotonic()
                if jobs or left <= 0 or self.wakeup.closed:
                    return LeaseResponse(jobs=jobs)
                if self.wakeup.missed(kind, mark):
                    # Jobs of its kind were announced while it claimed (off the event loop,
                    # on SQLite), when it was not waiting to hear it: its claim may have
                    # looked before they were there. It looks again rather than wait out its
                    # poll.
                    signalled, new = True, False
                    continue
                if self.wakeup.stopping(worker.id):
                    # Said while it claimed (off the loop): the notice's wake-up found no
                    # request of its waiting, and this one would wait out its whole poll.
                    # (From here to its waiter's registration nothing yields to the loop.)
                    return LeaseResponse(jobs=[])
                wait_s = min(self.settings.lease_poll_s, left)
                unclaimed = await self.wakeup.woken(kind, wait_s, body.max_jobs, worker.id)
                signalled, new = unclaimed is not None, False
                if gone is not None and await gone():
                    return LeaseResponse(jobs=[])
        finally:
            if unclaimed is not None and unclaimed.count > 0:
                # For the runner they were announced for (a cupy-only task's, passed on to
                # any runner, woke a simulated worker, which found nothing, and the GPU
                # worker waiting behind it waited out its poll).
                self.wakeup.signal(kind.arch, kind.gpu, unclaimed.count, unclaimed.runner)

    # ---- expiry --------------------------------------------------------------------

    def maybe_reclaim(self) -> set[int]:
        """reclaim(), at most once a second per process (it runs on the lease path)."""
        with self._reclaim_lock:
            if time.monotonic() - self._reclaimed_at < RECLAIM_EVERY_S:
                return set()
            self._reclaimed_at = time.monotonic()
        return self.reclaim()

    def reclaim(self) -> set[int]:
        """Requeue jobs whose lease expired (by the database clock); give up on a job as
        `lost` after max_attempts expiries. Returns the tasks that lost a job (their batch
        may be complete now)."""
        now = self.db.now()
        give_up = JobRow.attempts + 1 >= self.settings.max_attempts
        # Locked in id order, skipping rows another statement holds (a result being
        # recorded): the order every multi-row statement of the queue locks in.
        expired = (
            select(JobRow.id)
            .where(JobRow.state == JobState.LEASED, JobRow.lease_expires_at < now)
            .order_by(JobRow.id)
            .with_for_update(skip_locked=True)
        )
        with self.db.write() as s:
            rows = s.execute(
                update(JobRow)
                .where(JobRow.id.in_(expired.scalar_subquery()))
                .values(
                    state=case((give_up, JobState.LOST), else_=JobState.QUEUED),
                    attempts=JobRow.attempts + 1,
                    **LEASE_CLEARED,
                    finished_at=case((give_up, now), else_=None),
                    error=case(
                        (give_up, f"lost: {self.settings.max_attempts} leases expired"),
                        else_=JobRow.error,
                    ),
                )
                .returning(
                    JobRow.id,
                    JobRow.task_id,
                    JobRow.state,
                    JobRow.arch,
                    JobRow.gpu,
                    JobRow.only_runner,
                )
                .execution_options(synchronize_session=False)
            ).all()
            if not rows:
                return set()
            s.execute(
                update(LeaseRow)
                .where(LeaseRow.job_id.in_([r.id for r in rows]), LeaseRow.outcome.is_(None))
                .values(outcome=LeaseOutcome.EXPIRED, ended_at=now)
                .execution_options(synchronize_session=False)
            )
            lost = collections.Counter(r.task_id for r in rows if r.state == JobState.LOST)
            for task_id, n in sorted(lost.items()):
                s.execute(
                    update(TaskRow)
                    .where(TaskRow.id == task_id)
                    .values(
                        trials_done=TaskRow.trials_done + n,
                        trials_failed=TaskRow.trials_failed + n,
                        updated_at=now,
                    )
                    .execution_options(synchronize_session=False)
                )
            requeued = self._notify_requeued(s, [r for r in rows if r.state == JobState.QUEUED])
        self._signal_requeued(requeued)
        for r in rows:
            self.metrics.lease_expiries.labels(r.state).inc()
        expired = collections.Counter(r.state for r in rows)
        log.info(
            "leases expired: %d job(s) queued again, %d given up as lost (%s)",
            expired[JobState.QUEUED],
            expired[JobState.LOST],
            ", ".join(f"task {t}: {n}" for t, n in sorted(lost.items())) or "none lost",
        )
        # A lost job may have been the last its batch waited for: advanced now, not at the
        # second periodic sweep after (2-4 s of a stalled task with nothing to lease).
        if self.on_lost is not None:
            for task_id in sorted(lost):
                self.on_lost(task_id)
        return set(lost)

    def _notify_requeued(self, s: Any, rows: list[Any]) -> collections.Counter:
        """Jobs queued again (rows with arch, gpu, only_runner) per kind of worker; on
        PostgreSQL announced to the other replicas by the transaction `s` that queued them."""
        requeued = collections.Counter((r.arch, r.gpu, r.only_runner) for r in rows)
        if not self.db.is_sqlite:
            for (arch, gpu, runner), n in requeued.items():
                s.execute(
                    notify_statement(self.wakeup.channel, self.wakeup.payload(arch, gpu, n, runner))
                )
        return requeued

    def _signal_requeued(self, requeued: collections.Counter) -> None:
        """Wake this replica's lease requests for jobs queued again (after the commit)."""
        for (arch, gpu, runner), n in requeued.items():
            self.wakeup.signal(arch, gpu, n, runner)

    def release(self, worker_id: int, token_hash: str, leases: list[tuple[int, str]]) -> list[int]:
        """Queue again, at once, jobs the worker hands back unmeasured (it is stopping:
        POST /v1/jobs/release), as `_release` does; only those still leased to this worker
        under the lease given (one since expired, re-leased or finished is left as it is).
        The ids of the jobs released; 404 for a worker not registered, 403 another token's."""
        worker = self.worker_ref(worker_id, token_hash)
        # One transaction for them all, however many leases: one per lease token took 2.2 s
        # for 4,096 of them on SQLite (a write transaction each), on PostgreSQL as many round
        # trips on the event loop the hot routes run on.
        return sorted(self._release(sorted(set(leases)), owner=worker.id))

    def _release(self, leases: list[tuple[int, str]], owner: int | None = None) -> list[int]:
        """Queue again, at once, jobs this replica claimed under a lease token and then could
        not hand over (the answer failed after the claim had committed): their worker never
        got them, so they are not left leased to it until the TTL, no attempt is counted, and
        a request waiting for them is woken. `leases`: (job id, lease token) pairs, each job
        released only if still leased under its token. With `owner`, only jobs leased to that
        worker (a worker handing jobs back: `release`). Best effort: should the database
        refuse this too, or be stalled (a probe would hold the event loop, where
        PostgreSQL's claims run), the leases expire as before. The ids of the jobs queued
        again."""
        if not leases:
            return []
        job_ids = sorted({job_id for job_id, _ in leases})
        if self.db.stalled:
            log.warning("jobs %s stay leased until their TTL: the database is stalled", job_ids)
            return []
        conditions = [
            tuple_(JobRow.id, JobRow.lease_token).in_(leases),
            JobRow.state == JobState.LEASED,
        ]
        if owner is not None:
            conditions.append(JobRow.lease_owner == owner)
        locked = (
            select(JobRow.id, JobRow.lease_token)
            .where(*conditions)
            .order_by(JobRow.id)
            .with_for_update()
        )
        try:
            with self.db.write() as s:
                # The leases that still hold (a job's current token), read under the lock.
                ended = [(r.id, r.lease_token) for r in s.execute(locked).all()]
                released, requeued = self._requeue(s, ended)
        except sa_exc.SQLAlchemyError as exc:
            if is_lock_timeout(exc):  # (on the event loop: Queue.hot runs it again)
                raise
            log.warning(
                "jobs %s stay leased until their TTL: releasing them failed: %s", job_ids, exc
            )
            return []
        self._signal_requeued(requeued)
        return released

    # ---- results -------------------------------------------------------------------

    def submit(self, job_id: int, token_hash: str, body: JobResult) -> tuple[ResultAck, int | None]:
        """Apply one result; returns the ack and, when it may have completed what its task
        waits for, the task to advance. Raises 404 for a job that does not exist and 403
        for a lease that is not the worker's (as the single-job route answers)."""
        check_storable(body.result, ["body", "result"])
        report = Report(job_id, body.lease_token, body.result)
        (judged,), ready = self.submit_many(
            body.worker_id, token_hash, [report], where=lambda _: ["body", "result"]
        )
        if judged.error is not None:
            raise judged.error
        ack = ResultAck(
            accepted=judged.ack.accepted, job_state=judged.ack.job_state, detail=judged.ack.detail
        )
        return ack, next(iter(ready), None)

    def submit_many(
        self,
        worker_id: int,
        token_hash: str,
        reports: list[Report],
        where: Callable[[int], list[str | int]] = lambda i: ["body", "results", i, "result"],
    ) -> tuple[list[Judged], set[int]]:
        """Record many results in one transaction (each judged on its own, as `submit`
        judges one); returns the answers in order and the tasks that may advance. The
        results must have passed check_storable; a result whose runner contradicts its
        worker's refuses the whole request (`where(i)`: the i-th result's place in the
        body), before anything is written."""
        worker = self._authorised(worker_id, token_hash)
        if worker is not None:
            for i, report in enumerate(reports):
                check_runner(worker, report.result, where(i))
        sent = [r.result for r in reports]  # (as the worker sent them, for the answers)
        seen = self.store.record(worker, reports)
        reports, seen = self._record_implausible(worker, reports, seen)
        raced = [
            r.job_id
            for r, s in zip(reports, seen, strict=True)
            if not s.applied
            and worker is not None
            and s.lease_worker == worker.id
            and (
                (s.job_state == JobState.LEASED and s.lease_token == r.lease_token)
                or (s.job_state == JobState.QUEUED and s.result_token is None)
            )
        ]
        # A report whose lease was current when the statement began, or that might have been
        # applied late (its job queued, with no result), and that still was not applied may
        # have lost a race (to the same result posted twice at once, to an expiry, to a
        # lease of the job): look at what was committed since.
        settled = self.store.settled(raced) if raced else {}
        # A job this request recorded, reported again in it under another (stale) lease: that
        # report is answered with what the job holds now, as SQLite's store sees it (on
        # PostgreSQL the statement's snapshot still said `leased`).
        for r, s in zip(reports, seen, strict=True):
            if s.applied:
                state = JobState.DONE if r.result.ok else JobState.FAILED
                settled.setdefault(r.job_id, (state, r.lease_token))
        # A repeat of a recorded result (the lease that delivered it): compared with what
        # was recorded, read only now (the common report is no repeat and reads nothing).
        repeats = sorted(
            {
                r.job_id
                for r, s in zip(reports, seen, strict=True)
                if _repeated(worker, worker_id, r, s, settled)
            }
        )
        recorded = self.store.recorded(repeats) if repeats else {}
        judged = [
            self._judge(worker, worker_id, r, s, settled, recorded, sent[i])
            for i, (r, s) in enumerate(zip(reports, seen, strict=True))
        ]
        ready = {
            s.task.id
            for s in seen
            if s.task is not None and may_advance(s.task, self.settings.propose_early)
        }
        return judged, ready

    def _record_implausible(
        self, worker: WorkerRef | None, reports: list[Report], seen: list[Seen]
    ) -> tuple[list[Report], list[Seen]]:
        """The reports whose ok latency is below their task's floor (not recorded by the
        store) recorded as failed trials under their lease, in a second transaction (a rare
        report's: the common request has none and runs no statement more); the reports as
        judged and what the store saw of each. Recorded rather than refused: refused, the
        job stayed leased until its lease expired, was measured again (by the same worker,
        perhaps, as wrongly) and given up as `lost` with no word of why; recorded, the trial
        is finished with its reason, the task goes on, and the worker is answered accepted
        (it neither retries nor measures again). Its repeat is recorded the same way, so
        that a worker sending it again is answered a duplicate."""
        again = [
            i
            for i, s in enumerate(seen)
            if s.below_floor_us is not None and worker is not None and s.lease_worker == worker.id
        ]
        if not again:
            return reports, seen
        assert worker is not None
        reports, seen = list(reports), list(seen)
        floors = {i: seen[i].below_floor_us for i in again}
        for i, floor in floors.items():
            assert floor is not None
            reports[i] = replace(reports[i], result=implausible_failure(reports[i].result, floor))
            log.warning(
                "job %d: worker %d sent %s",
                reports[i].job_id,
                worker.id,
                reports[i].result.error,
            )
        for i, s in zip(again, self.store.record(worker, [reports[i] for i in again]), strict=True):
            seen[i] = replace(s, below_floor_us=floors[i])  # (what its answer says)
            if s.applied:  # (not a repeat's, nor a stale lease's: recorded as failed now)
                self.metrics.results_implausible.inc()
        return reports, seen

    def _authorised(self, worker_id: int, token_hash: str) -> WorkerRef | None:
        """The worker, if it exists and the token is its own (else no report applies)."""
        if not 0 < worker_id <= ID_MAX:
            return None
        try:
            return self.worker_ref(worker_id, token_hash)
        except (NotFoundError, ForbiddenError):
            return None

    def _judge(
        self,
        worker: WorkerRef | None,
        worker_id: int,
        report: Report,
        seen: Seen,
        settled: dict,
        recorded: dict[int, dict[str, Any]],
        sent: MeasureResult,
    ) -> Judged:
        """The answer to one report (`sent`: its result as the worker sent it, which
        `report` holds as recorded: another where its latency is implausible)."""
        job_id, status = report.job_id, report.result.status
        simulated = is_simulated(recorded_runner(report.result, worker))
        if not seen.found:
            return self._refused(
                job_id, NotFoundError(f"job {job_id} does not exist"), "no_such_job"
            )
        if worker is None or seen.lease_worker != worker_id:
            return self._refused(
                # (No lease of the job has this token, or its lease is another worker's.)
                job_id,
                ForbiddenError(f"job {job_id} has no lease with this token for worker {worker_id}"),
                "not_its_lease",
            )
        if seen.applied:
            state = JobState.DONE if report.result.ok else JobState.FAILED
            # (An implausible latency's failure says why: the worker sent an ok result.)
            note = report.result.error if seen.below_floor_us is not None else None
            return self._answer(job_id, status, True, state, note, simulated, recorded=True)
        if _repeated(worker, worker_id, report, seen, settled):
            state = settled.get(job_id, (seen.job_state,))[0]
            row = recorded.get(job_id)
            differ = [] if row is None else _differences(report.result, worker, row)
            if not differ:
                return self._answer(
                    job_id, status, True, state, "duplicate: already recorded", simulated
                )
            # The same lease's result, not the same result: the first one stays (never two
            # stories of one trial, nor one counted twice), and the sender is told plainly.
            # accepted=false: this result was not recorded (a worker logs it, and neither
            # retries nor measures again: workers/daemon/worker.py, _acknowledged).
            assert row is not None
            detail = (
                "conflict: a different result is already recorded for this lease (recorded "
                f"{_described(row)}, sent {_described(result_columns(sent))}; they "
                f"differ in {', '.join(differ)}): not recorded"
            )
            log.warning("job %d: worker %d %s", job_id, worker_id, detail)
            self.metrics.results_conflicting.inc()
            return self._answer(job_id, status, False, state, detail, simulated)
        state = settled.get(job_id, (seen.job_state,))[0]
        why = "task cancelled" if state == JobState.CANCELLED else "stale lease"
        return self._answer(job_id, status, False, state, f"{why}: not recorded", simulated)

    def _answer(
        self,
        job_id: int,
        status: str,
        accepted: bool,
        job_state: str,
        detail: str | None,
        simulated: bool,
        recorded: bool = False,
    ) -> Judged:
        # `recorded`: this report wrote the trial (a repeat is accepted, not recorded): the
        # recorded ones add up to the database's results.
        labels = (
            status,
            "true" if accepted else "false",
            "true" if recorded else "false",
            "true" if simulated else "false",
        )
        self.metrics.results.labels(*labels).inc()
        ack = JobResultAck(
            job_id=job_id,
            status_code=200,
            accepted=accepted,
            job_state=JobState(job_state),
            detail=detail,
        )
        return Judged(ack)

    def _refused(self, job_id: int, error: NotFoundError | ForbiddenError, reason: str) -> Judged:
        self.metrics.results_refused.labels(reason).inc()
        ack = JobResultAck(
            job_id=job_id, status_code=error.status_code, accepted=False, detail=error.detail
        )
        return Judged(ack, error)
