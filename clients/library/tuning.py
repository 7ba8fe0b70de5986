"""`pipetune.tune`: tune a workload in this process, without a service (as Optuna's
`study.optimize` or Kernel Tuner's `tune_kernel` do), recorded in the local database.

The task goes through the service's own code, not a copy of it: the task driver
(service.driver) writes the task and proposes its batches, the job queue (service.queue)
registers this process as a worker, leases it the task's jobs and records its results. So
the rows are exactly those a task run by `pipetune serve` and a worker leaves (task, jobs,
leases, worker), `pipetune schedule` answers from them afterwards, and a service started on
the same database shows the task on its dashboard.

>>> result = pipetune.tune({"op": "gemm", "m": 1024, "n": 64, "k": 2048}, "h100", budget=16,
...                        runner="simulated")
>>> result.best_schedule, result.best_latency_us, result.best_so_far()
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from pipetune.clients.library.inputs import (
    AnySchedule,
    WorkloadLike,
    as_gpu,
    as_schedule,
    as_workload,
)
from pipetune.clients.library.labels import (
    SIMULATED_LABEL,
    any_simulated,
    is_simulated,
    trials_of,
)
from pipetune.clients.library.store import (
    LocalDatabaseError,
    LocalStore,
    database_url,
    open_database,
)
from pipetune.clients.sdk.http import argument_error
from pipetune.model.errors import InvalidArgumentError, InvalidArgumentTypeError
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.plain_numbers import plain
from pipetune.model.states import ACTIVE_TASK_STATES, TaskState
from pipetune.model.trials import MeasureResult, RunnerKind
from pipetune.model.wire import (
    MAX_JOBS_PER_LEASE,
    CurvePoint,
    JobResult,
    TaskCreate,
    TaskDoc,
    TrialDoc,
    WorkerRegister,
)
from pipetune.model.workloads import WorkloadError
from pipetune.service.db import Database, DatabaseGoneError, unavailable_reason
from pipetune.service.driver import Driver
from pipetune.service.errors import InputError
from pipetune.service.metrics import Metrics
from pipetune.service.migrate import redact
from pipetune.service.orm import JobRow, LeaseRow, TaskRow, WorkerRow
from pipetune.service.queue import Queue, WorkerRef
from pipetune.service.settings import token_hash, validated_settings
from pipetune.workers.datasets import DatasetError
from pipetune.workers.runners import (
    RUNNER_NAMES,
    Runner,
    RunnerClosedError,
    RunnerUnavailableError,
    make_runner,
)
from pipetune.workers.runners.replay import DatasetMismatchError, ReplayRunner

# One definition: the defaults of a task created through the API.
DEFAULT_BUDGET: int = TaskCreate.model_fields["budget"].default
DEFAULT_STRATEGY: str = TaskCreate.model_fields["strategy"].default
IDLE_POLL_S = 0.2  # only when another process holds the task's jobs
IN_PROCESS_WORKER = "in-process-"  # the name of a tuning process's worker row starts so
log = logging.getLogger(__name__)

# progress(trials done, trials the task will have)
TuneProgress = Callable[[int, int], None]


@functools.cache
def _metrics() -> Metrics:
    # One per process: counters are process-wide, as in a service replica.
    return Metrics()


@functools.cache
def _worker_token() -> str:
    """This process's worker token (never stored: the worker row keeps its digest)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class TuneResult:
    """A finished (or failed) in-process tuning task, read back from the database as the
    service would report it."""

    task: TaskDoc
    trials: list[TrialDoc]  # in proposal order
    curve: list[CurvePoint]  # best-so-far after each trial
    runner: str
    database: str  # the database URL, without a password

    @property
    def task_id(self) -> int:
        return self.task.id

    @property
    def best_schedule(self) -> AnySchedule | None:
        """The best schedule measured (its family's schedule object), None before any."""
        return None if self.task.best is None else as_schedule(self.task.best.schedule)

    @property
    def best_latency_us(self) -> float | None:
        return None if self.task.best is None else self.task.best.latency_us

    @property
    def best_tflops(self) -> float | None:
        """The best throughput in TFLOP/s (the tensor-core GEMMs'; None for a family whose
        throughput is in another unit: see best_throughput)."""
        return None if self.task.best is None else self.task.best.tflops

    @property
    def best_throughput(self) -> tuple[float, str] | None:
        """The best throughput and its unit (TFLOP/s for GEMMs, GB/s for memory-intensive
        operators)."""
        best = self.task.best
        return None if best is None else (best.throughput, best.throughput_unit)

    @property
    def simulated(self) -> bool:
        """Whether the latencies come from the simulated runner (the model plus noise)."""
        return is_simulated(self.runner) or any_simulated(t.runner for t in self.trials)

    def best_so_far(self) -> list[float | None]:
        """Best latency (µs) found after each trial; None before the first success."""
        return [p.best_latency_us for p in self.curve]

    def __str__(self) -> str:
        t = self.task
        head = (
            f"task {t.id}: {as_workload(t.workload).label()} on {t.gpu}, {t.strategy}, "
            f"{trials_of(t)} trials ({t.trials_failed} failed), {t.state}"
        )
        if self.simulated:
            head += f" [{SIMULATED_LABEL}]"
        if self.best_schedule is None:
            return head + "; no successful trial"
        return f"{head}; best {self.best_schedule.id}: {self.best_latency_us:.2f} µs"


def _task_body(
    workload: Any, gpu: str, budget: int, strategy: str, seed: int, **prior: Any
) -> TaskCreate:
    body = {"workload": workload, "gpu": gpu, "budget": budget, "strategy": strategy}
    try:
        # NumPy numbers (a budget computed with NumPy) as the Python ones they hold.
        return TaskCreate.model_validate(plain({**body, "seed": seed, **prior}))
    except ValidationError as exc:
        raise argument_error(exc) from None


class DatasetArgumentError(DatasetError, InvalidArgumentError):
    """A replay `dataset` that does not read, or records another workload or GPU: a
    DatasetError, as the file layer's refusals are, and an InvalidArgumentError naming the
    argument (its messages named the file, not the argument)."""

    def __init__(self, reason: str):
        InvalidArgumentError.__init__(self, "dataset", reason)


def _make_runner(
    runner: str | Runner, gpu: str, dataset: str | Path | None, workload: Any = None
) -> Runner:
    if runner == "simulated":
        return make_runner("simulated", gpu=gpu)
    if runner == "cupy":
        return make_runner("cupy", gpu=gpu)
    if runner == "replay":
        if dataset is None:
            raise InvalidArgumentError(
                "dataset", "the replay runner answers from a recorded dataset file"
            )
        if not isinstance(dataset, str | os.PathLike):
            # (5, [path] and b"path" were bare TypeErrors from the file layer)
            raise InvalidArgumentTypeError(
                "dataset",
                f"expected a dataset file's path (str or Path), got {type(dataset).__name__}",
            )
        if not str(dataset):  # ("" read the current folder: ".: cannot read (Is a directory)")
            raise InvalidArgumentError("dataset", "empty: give the recorded dataset's file")
        # With the workload: a dataset of another shape is refused here (a ValueError), not
        # answered trial by trial with failures that spend the budget. A file that does not
        # read, or records another workload or GPU, is the argument's fault: named.
        try:
            return make_runner("replay", dataset=dataset, gpu=gpu, workload=workload)
        except (DatasetError, DatasetMismatchError) as exc:
            raise DatasetArgumentError(str(exc)) from None
    known = ", ".join(RUNNER_NAMES)
    raise InvalidArgumentError("runner", f"must be one of {known} or a Runner, got {runner!r}")


def _check_covers(replay: ReplayRunner, workload: Any, gpu: str) -> None:
    """A replayed dataset must hold every schedule the search may propose: one it lacks was
    a failed trial (runtime_error, "not in dataset"), spending the budget and recorded as a
    failure on the GPU (29 of 30 trials of a 20-schedule sweep). A partial recording (a sweep
    with --limit, a task's export) is refused, naming how many it holds."""
    space = family_of(workload).enumerate(workload, get_gpu(gpu))
    recorded = replay.dataset
    lacking = sum(recorded.lookup(s.as_dict()) is None for s in space)
    if lacking:
        raise InvalidArgumentError(
            "dataset",
            f"{recorded.name} holds {len(space) - lacking} of the {len(space)} schedules of "
            f"{workload.label()} on {gpu}: the replay runner answers from an exhaustive sweep "
            "(`pipetune sweep` without --limit), and each schedule it lacks would be a failed "
            "trial",
        )


def _host_prefix() -> str:
    """How the in-process workers of this host are named (then the pid, runner and GPU)."""
    return f"{IN_PROCESS_WORKER}{socket.gethostname()}-"


def _process_gone(worker_name: str) -> bool:
    """Whether the in-process worker of this host named so is a process that no longer
    exists (False where its name does not say, or the process is another user's)."""
    pid_text = worker_name.removeprefix(_host_prefix()).split("-", 1)[0]
    if not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)  # signal 0: only whether it exists
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists
        return False
    return False


def _register(queue: Queue, runner: Runner, gpu: str) -> WorkerRef:
    """This process as a worker of the queue (one row per process, runner and GPU)."""
    spec = get_gpu(gpu)
    name = f"{_host_prefix()}{os.getpid()}-{runner.name}-{gpu}"[:128]
    try:
        body = WorkerRegister.model_validate(
            {
                "gpu": gpu,
                "name": name,
                "arch": getattr(runner, "arch", None) or spec.arch,
                "runner": runner.name,
                "device_name": (runner.device_name or f"{runner.name}: {spec.name}")[:256],
                "sm_count": spec.sm_count,
            }
        )
    except ValidationError:
        # (A Runner subclass that kept the base class's name was told only the list.)
        raise InvalidArgumentError(
            "runner", f"its .name must be one of {', '.join(RUNNER_NAMES)}, got {runner.name!r}"
        ) from None
    doc, _ = queue.register(token_hash(_worker_token()), body)
    return WorkerRef(id=doc.id, gpu=doc.gpu, arch=doc.arch, runner=doc.runner)


def _measure_one(runner: Runner, workload: Any, schedule: Any) -> MeasureResult:
    """One trial, as a worker measures it: a runner that cannot answer for this schedule
    makes a failed trial; a runner that is gone ends the tuning."""
    try:
        return runner.measure(workload, [schedule])[0]
    except (RunnerClosedError, RunnerUnavailableError):
        raise
    except Exception as exc:
        error = f"{runner.name} runner: {type(exc).__name__}: {exc}"[:2000]
        return MeasureResult(status="runtime_error", error=error, runner=runner.name)


class _InProcessTask:
    """One task measured by this process through the service's driver and queue."""

    def __init__(self, database: Database, runner: Runner, gpu: str):
        settings = validated_settings(database_url=database.url)
        self.database = database
        self.runner = runner
        self.queue = Queue(database, settings, _metrics())
        self.driver = Driver(database, settings, _metrics())
        self.token_hash = token_hash(_worker_token())
        self.lease_ttl_s = settings.lease_ttl_s
        self.worker = _register(self.queue, runner, gpu)
        self._cancel_orphans()

    def _cancel_orphans(self) -> None:
        """Cancel the tasks of tunings of this host killed outright (SIGKILL, which no
        handler sees): tasks still active whose trials an in-process worker of this host
        leased, where that worker's process is gone and has not been heard of for a lease
        TTL (its leases would have expired; a process of the same name in another pid
        namespace is not taken for dead while it reports). Their trials are kept."""
        quiet_since = self.database.now_plus(-self.lease_ttl_s)
        with self.database.read() as s:
            workers = s.execute(
                select(WorkerRow.id, WorkerRow.name).where(
                    WorkerRow.name.startswith(_host_prefix(), autoescape=True),
                    WorkerRow.last_heartbeat < quiet_since,
                )
            ).all()
            gone = [w.id for w in workers if _process_gone(w.name)]
            if not gone:
                return
            orphans = s.scalars(
                select(JobRow.task_id)
                .join(LeaseRow, LeaseRow.job_id == JobRow.id)
                .join(TaskRow, TaskRow.id == JobRow.task_id)
                .where(LeaseRow.worker_id.in_(gone), TaskRow.state.in_(ACTIVE_TASK_STATES))
                .distinct()
                .order_by(JobRow.task_id)
            ).all()
        for task_id in orphans:
            log.warning("task %d: its tuning process ended without a word; cancelled", task_id)
            self.cancel(task_id)

    def create(self, body: TaskCreate) -> int:
        try:
            return self.driver.create(body)
        except InputError as exc:  # the field it names: workload, a prior's or strategy
            raise WorkloadError(str(exc.loc[-1]), exc.reason) from None

    def _state(self, task_id: int) -> tuple[str, int, int]:
        with self.database.read() as s:
            row = s.execute(
                select(TaskRow.state, TaskRow.trials_done, TaskRow.trials_target).where(
                    TaskRow.id == task_id
                )
            ).one()
        return row.state, row.trials_done, row.trials_target

    def run(self, task_id: int, workload: Any, progress: TuneProgress | None) -> None:
        """Lease the task's jobs, measure them, report them, until the task ends."""
        while True:
            jobs = self.queue.try_lease(self.worker, MAX_JOBS_PER_LEASE, task_id=task_id)
            if not jobs:
                state, _, _ = self._state(task_id)
                if TaskState(state).is_final():
                    return
                # Jobs held elsewhere (a worker of a service on this database) or a batch
                # completed by another process: advance if ready, else wait for them.
                self.driver.advance(task_id)
                time.sleep(IDLE_POLL_S)
                continue
            schedules = [job.schedule.to_schedule() for job in jobs]
            if len(jobs) > 1:
                with contextlib.suppress(Exception):  # measure() reports what did not build
                    self.runner.prepare(workload, schedules)  # the cupy runner compiles here
            for left, (job, schedule) in enumerate(zip(jobs, schedules, strict=True), 1):
                result = _measure_one(self.runner, workload, schedule)
                report = JobResult(
                    worker_id=self.worker.id, lease_token=job.lease_token, result=result
                )
                _, ready = self.queue.submit(job.job_id, self.token_hash, report)
                # As a worker's heartbeat: the leases still in hand stay ours.
                self.queue.heartbeat(self.worker.id, self.token_hash, len(jobs) - left)
                if ready is not None:
                    self.driver.advance(ready)
                if progress is not None:
                    _, done, target = self._state(task_id)
                    progress(done, target)

    def cancel(self, task_id: int) -> None:
        with contextlib.suppress(Exception):  # already finished: nothing to cancel
            self.driver.cancel(task_id)

    def exit(self) -> None:
        """This process's worker stops measuring, as a worker daemon says it on a clean stop
        (`pipetune workers` lists it as exited, not live for a lease TTL, until this process
        tunes again). Best effort: the tuning's own outcome stands whatever this answers."""
        with contextlib.suppress(Exception):
            self.queue.worker_exited(self.worker.id, self.token_hash)


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """While it runs, SIGTERM raises SystemExit(143) (128 + 15, a shell's status for it), so
    a tuning stopped by `kill`, `timeout` or a batch scheduler cancels its task as Ctrl-C
    does: SIGTERM's default action ended the process at once, its task `running` for good
    with its trials leased. Only from the main thread (the only one Python runs signal
    handlers in) and where SIGTERM has its default action: a handler the caller installed
    is the caller's."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def tune(
    workload: WorkloadLike,
    gpu: str,
    budget: int = DEFAULT_BUDGET,
    strategy: str = DEFAULT_STRATEGY,
    runner: str | Runner = "cupy",
    *,
    seed: int = 0,
    db: str | None = None,
    dataset: str | Path | None = None,
    progress: TuneProgress | None = None,
    prior_task: int | None = None,
    prior_gpu: str | None = None,
    learned_prior: bool | None = None,
    batch_size: int | None = None,
) -> TuneResult:
    """Tune `workload` on `gpu` in this process; returns the finished task's result.

    budget: trials to measure (1..5000); strategy: a name of model.wire.StrategyName
    (default: the service's default strategy); runner: "cupy" (this machine's GPU),
    "simulated" (the analytical model plus noise: for demos and tests, never measurements),
    "replay" (answers from `dataset`, a recorded exhaustive sweep), or a Runner you built
    (you close it). db: the database URL (default: the one `pipetune serve` uses).
    prior_task: a finished task of the same workload on another GPU (or of its twin in the other
    element type, float16 or bfloat16, on any GPU), in that database, whose trials warm-start the
    search; prior_gpu: instead, such a task on that GPU (one of the newest generator
    revision, the most successful trials of those); learned_prior: instead, a cost model of every
    finished task of the kernel family measured on a GPU in that database (None, the default: the
    family's choice, tensor-core GEMMs and memory-intensive operators learning where such tasks of 8
    or more shapes exist; False: never). batch_size: trials per proposal round (None: the
    service's default, 8; a batch's kernels compile together, one trial at a time each proposal
    sees every result before it).
    progress(done, total) is called after each trial. An interrupted tuning (an exception,
    Ctrl-C, SIGTERM) cancels its task: nothing is left half-run.
    """
    w, key = as_workload(workload), as_gpu(gpu)
    body = _task_body(
        w,
        key,
        budget,
        strategy,
        seed,
        prior_task=prior_task,
        prior_gpu=prior_gpu,
        learned_prior=learned_prior,
        batch_size=batch_size,
    )
    if progress is not None and not callable(progress):
        # Found only when the first trial had been measured (a bare TypeError, the task
        # cancelled): refused before anything is written.
        raise InvalidArgumentTypeError(
            "progress", f"must be a callable progress(done, total), not {type(progress).__name__}"
        )
    if dataset is not None and runner != "replay":  # (it was ignored without a word)
        named = runner.name if isinstance(runner, Runner) else runner
        raise InvalidArgumentError(
            "dataset", f"only the replay runner reads a dataset, not {named!r}"
        )
    measurer = runner if isinstance(runner, Runner) else _make_runner(runner, key, dataset, w)
    if isinstance(measurer, ReplayRunner):  # (a Runner object of the user's too)
        _check_covers(measurer, w, key)
    measured_gpu = getattr(getattr(measurer, "gpu", None), "key", key)
    if measured_gpu != key:  # a Runner built for another GPU would answer for the wrong one
        raise InvalidArgumentError("runner", f"measures {measured_gpu}, the task is for {key}")
    # Measured by this runner's kind only: a service's workers on the same database (its
    # `--local-workers`, simulated ones say) would otherwise take some of the trials.
    body = body.model_copy(update={"runner": RunnerKind.of(measurer.name)})
    try:
        url = database_url(db)
        database = open_database(url, create=True, write=True)
        try:
            task = _InProcessTask(database, measurer, key)
            task_id = task.create(body)
            try:
                with _terminated_as_exit():
                    task.run(task_id, w, progress)
            except BaseException as exc:
                try:
                    task.cancel(task_id)
                except SQLAlchemyError:
                    if not isinstance(exc, SQLAlchemyError):
                        raise
                    # (The database that failed the run refuses the cancel too: its error
                    # is the one to report.)
                raise
            finally:
                task.exit()
        except (SQLAlchemyError, DatabaseGoneError) as exc:
            # A lock held past the busy timeout by another process, a disk that filled, the
            # file deleted or replaced: said as the database's failure, without the SQL and
            # its parameters.
            raise LocalDatabaseError(
                f"the database {redact(url)} failed during the tuning: {unavailable_reason(exc)}"
            ) from None
        finally:
            database.dispose()
        with LocalStore(url) as store:
            return TuneResult(
                task=store.task(task_id),
                trials=store.all_trials(task_id),
                curve=store.curve(task_id).points,
                runner=measurer.name,
                database=redact(url),
            )
    finally:
        if measurer is not runner:
            measurer.close()
