"""Workload rows and the best-schedule lookups behind POST /v1/schedules."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, bindparam, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from pipetune.model.family import FIRST_REVISION, family_for_op, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.trials import (
    FAILED_STATUSES,
    MEASURED_RUNNERS,
    REHEARSED_STATUSES,
    SIMULATED_RUNNERS,
    MeasureResult,
    is_simulated,
)
from pipetune.model.wire import ScheduleDoc, ScheduleResponse
from pipetune.model.workloads import WorkloadError
from pipetune.service.orm import (
    LATENCY_FLOOR_PEAK_FACTOR,
    JobRow,
    ReferenceOptimumRow,
    TaskRow,
    WorkerRow,
    WorkloadRow,
)

if TYPE_CHECKING:
    from pipetune.service.priors import LearnedPick


# Built once: a task's creation asks it, and building a statement costs more than running it.
_WORKLOAD_ID = select(WorkloadRow.id).where(WorkloadRow.hash == bindparam("digest"))


def workload_id(session: Session, workload: Any) -> int:
    """The id of a workload's row, created if it is new (safe against a concurrent insert).
    Its ``flops`` column holds the work of one run in the family's unit (FLOPs for the
    tensor-core GEMMs, compulsory bytes for the memory-intensive operators): the column
    predates the second family, and throughput is that work over a latency."""
    digest = workload.workload_hash
    found = session.execute(_WORKLOAD_ID, {"digest": digest}).scalar_one_or_none()
    if found is not None:
        return found
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    values = {
        "hash": digest,
        "op": workload.op,
        "canonical": workload.canonical(),
        "label": workload.label(),
        "flops": int(family_of(workload).work(workload)),
    }
    made = session.execute(
        insert(WorkloadRow).values(**values).on_conflict_do_nothing().returning(WorkloadRow.id)
    ).scalar_one_or_none()
    if made is not None:
        return made
    # Another transaction inserted it first (and committed: the insert waited for it).
    return session.execute(_WORKLOAD_ID, {"digest": digest}).scalar_one()


def below_latency_floor(result: MeasureResult, floor_us: float | None) -> bool:
    """Whether a result is an ok latency below its task's floor (TaskRow.latency_floor_us,
    None: no bound), which no GPU can reach: no measurement, and never a best. A worker's is
    judged so as it is recorded (service/queue_sqlite.py; on PostgreSQL the same comparison
    in the results statement, service/queue_pg.py), an imported dataset's record as it is
    read (service/imports.py); either is then recorded as implausible_failure says."""
    latency = result.latency_us  # (an ok result's is never None: check_storable)
    return floor_us is not None and result.ok and latency is not None and latency < floor_us


def implausible_failure(result: MeasureResult, floor_us: float) -> MeasureResult:
    """What an ok result whose latency is below its task's floor (TaskRow.latency_floor_us)
    is recorded as: a failed trial that says why, `runtime_error` (its measurement failed,
    as a worker's own failures to measure are recorded), its timings quoted in its error
    and dropped from its columns (a failure holds none: check_storable). The same result
    gives the same failure, so that a repeat of it is answered a duplicate (and an import
    of the same file finds the task it became)."""
    samples = ""
    if result.samples_us:
        low, high = min(result.samples_us), max(result.samples_us)
        samples = f" (samples_us {low:g} to {high:g})"
    error = (
        f"implausible latency: latency_us {result.latency_us:g}{samples} is below "
        f"{floor_us:.4g} us, the least this task's workload can take on its GPU (its FLOPs "
        f"at {LATENCY_FLOOR_PEAK_FACTOR:g}x the GPU's peak tensor throughput): no "
        "measurement, recorded as failed"
    )
    changes: dict[str, Any] = {
        "status": "runtime_error",
        "latency_us": None,
        "samples_us": [],
        "spread": None,
    }
    return MeasureResult.model_validate({**result.model_dump(), **changes, "error": error})


def _failed_schedules(workload_id: int, gpu: str, *where: Any) -> Any:
    """The schedule ids of the failed trials of this workload on this GPU, over every task
    (a compile error, a wrong result, a timeout: a runner's failure status), in SQL, less a
    simulated runner's rehearsed faults (REHEARSED_STATUSES: a rehearsed crash excluded the
    schedule another simulated task had timed fastest); `where` narrows the trials (to a GPU's
    measurements)."""
    rehearsed = and_(
        JobRow.runner.in_(SIMULATED_RUNNERS), JobRow.status.in_(sorted(REHEARSED_STATUSES))
    )
    return select(JobRow.schedule_id).where(
        JobRow.workload_id == workload_id,
        JobRow.gpu == gpu,
        JobRow.status.in_(sorted(FAILED_STATUSES)),
        or_(JobRow.runner.is_(None), ~rehearsed),
        *where,
    )


def best_measured(session: Session, workload_id: int, gpu: str) -> JobRow | None:
    """The fastest successful trial of this workload on this GPU, over every task: of those
    measured on a GPU where there are any, of a schedule that no GPU trial saw fail there. A
    simulated latency is the model's, not a time to compare with one: an imported simulated
    sweep's 4.5 us hid the 11.8 us a GPU measured, and `pipetune export` wrote the simulated
    pick. A schedule timed fastest in one task and giving a wrong result (or failing to
    launch, or timing out) in another was answered as the one to run; a failure seen on the
    GPU outweighs a success there (a race that corrupts its output only sometimes), while a
    simulated failure, the model's guess, does not. Without a GPU's measurement (or where
    each schedule a GPU timed also failed there), the fastest of any runner (labelled as its
    runner says) whose schedule never failed on the GPU: a simulated success is the model's
    guess, and the lookup answered a schedule whose GPU trial had given a wrong result
    because the simulated runner had timed it fastest.

    By the workload's id, not through a join with the workloads table: the join hid the id
    from PostgreSQL's planner, which then read every successful trial of the workload to
    answer one (benchmarks/bench_lookup.py), where ix_jobs_best walks them fastest first."""

    def fastest(*where: Any) -> JobRow | None:
        return session.scalars(
            select(JobRow)
            .where(JobRow.workload_id == workload_id, JobRow.gpu == gpu, JobRow.status == "ok")
            .where(*where)
            .order_by(JobRow.latency_us, JobRow.id)
            .limit(1)
        ).first()

    on_gpu = JobRow.runner.in_(MEASURED_RUNNERS)
    return fastest(
        on_gpu, JobRow.schedule_id.not_in(_failed_schedules(workload_id, gpu, on_gpu))
    ) or fastest(JobRow.schedule_id.not_in(_failed_schedules(workload_id, gpu)))


@dataclass(frozen=True)
class FailedTrials:
    """The trials of a workload on a GPU that failed, for a workload with no successful one:
    a pick made without measurements must not be a schedule already seen to fail there."""

    trials: int
    schedule_ids: frozenset[str]


NO_FAILURES = FailedTrials(0, frozenset())


def failed_trials(session: Session, workload_id: int, gpu: str) -> FailedTrials:
    """The failed trials of this workload on this GPU, over every task (a compile error, a
    wrong result, a timeout: a runner's failure status)."""
    ids = list(session.execute(_failed_schedules(workload_id, gpu)).scalars())
    return FailedTrials(len(ids), frozenset(ids)) if ids else NO_FAILURES


def measured_or_failures(
    session: Session, workload_hash: str, gpu: str
) -> tuple[JobRow | None, FailedTrials]:
    """What a schedule lookup reads: the best measured trial (best_measured's) and, where
    there is none, the failed trials whose schedules a pick must skip (failed_trials')."""
    found = session.execute(_WORKLOAD_ID, {"digest": workload_hash}).scalar_one_or_none()
    if found is None:  # never tuned anywhere
        return None, NO_FAILURES
    job = best_measured(session, found, gpu)
    if job is not None:
        return job, NO_FAILURES
    return None, failed_trials(session, found, gpu)


@dataclass(frozen=True)
class ModelPick:
    schedule: Any  # the family's schedule type
    predicted_us: float


@lru_cache(maxsize=1024)
def model_pick(workload: Any, gpu: str, excluding: frozenset[str] = frozenset()) -> ModelPick:
    """The analytical model's best schedule other than those of `excluding` (schedule ids
    seen to fail); cached: it depends only on its arguments. Raises WorkloadError when no
    schedule is valid on the GPU, or every valid one is excluded."""
    fam = family_of(workload)
    # The model's order, fastest first: one more than the excluded ids holds a pick if the
    # space has one.
    _, _, ranked = fam.rank(workload, get_gpu(gpu), top=len(excluding) + 1)
    if not ranked:
        raise WorkloadError("workload", fam.no_schedule_reason(workload, get_gpu(gpu)))
    untried = [r for r in ranked if r.schedule_id not in excluding]
    if not untried:
        raise WorkloadError("workload", every_schedule_failed(gpu, len(ranked)))
    best = untried[0]
    return ModelPick(
        schedule=fam.parse_schedule(best.schedule),
        predicted_us=best.terms["predicted_us"],
    )


def every_schedule_failed(gpu: str, schedules: int) -> str:
    return (
        f"every one of its {schedules} valid schedules failed on {gpu} (see its tasks' "
        "trials for the errors); no schedule is known to run there"
    )


def throughput(op: str, work: float, latency_us: float) -> dict[str, Any]:
    """The wire's throughput fields of ``work`` (a workload row's) done in ``latency_us``:
    the value in the op's family's unit and the unit."""
    fam = family_for_op(op)
    return {"throughput": fam.rate(work, latency_us), "throughput_unit": fam.throughput_unit}


def measured_device_name(kept: str | None, worker_device: str | None) -> str | None:
    """The device a worker's trial was measured on: the one kept with the trial (its worker
    has registered another since; "" where it had named none), else the worker's own."""
    if kept is not None:
        return kept or None
    return worker_device


def measuring_device(session: Session, job: JobRow | None) -> str | None:
    """The device that measured a trial: its worker's, as registered when it measured (see
    measured_device_name), else its task's imported dataset's (an imported trial has no
    worker); None where neither says."""
    if job is None:
        return None
    if job.result_worker is not None:
        name = measured_device_name(
            job.result_device_name,
            session.scalar(select(WorkerRow.device_name).where(WorkerRow.id == job.result_worker)),
        )
        if name:
            return name
    return session.scalar(select(TaskRow.imported_device_name).where(TaskRow.id == job.task_id))


def schedule_response(
    workload: Any,
    gpu: str,
    job: JobRow | None,
    learned: LearnedPick | None = None,
    failed: FailedTrials = NO_FAILURES,
    device_name: str | None = None,
) -> ScheduleResponse:
    """POST /v1/schedules' answer: the best measured trial `job` (best_measured's), else the
    pick of a learned prior (`learned`, where there is one: priors.learned_pick), else the
    analytical model's pick; either pick skips the schedules of `failed` (failed_trials',
    the learned pick already did). Raises WorkloadError when no schedule of the family is
    valid on the GPU, or every valid one failed."""
    fam = family_of(workload)
    if job is not None and job.latency_us is not None:
        schedule = fam.parse_schedule(job.schedule)
        predicted = job.predicted_us
        if predicted is None:
            predicted = model_pick(workload, gpu).predicted_us
        measured = now = None
        if not is_simulated(job.runner):  # (the model's figure: no kernel was timed)
            measured = job.generator_revision or FIRST_REVISION
            now = fam.generator_revision(workload).revision
        return ScheduleResponse(
            source="measured",
            workload=workload.canonical(),
            gpu=gpu,
            schedule=ScheduleDoc.of(schedule),
            schedule_id=schedule.id,
            latency_us=job.latency_us,
            runner=job.runner,
            predicted_us=predicted,
            throughput=fam.throughput_of(workload, job.latency_us),
            throughput_unit=fam.throughput_unit,
            measured_generator_revision=measured,
            generator_revision=now,
            device_name=device_name,
        )
    if learned is not None:
        schedule, predicted = learned.schedule, learned.predicted_us
        learned_from: list[int] | None = list(learned.learned_from)
    else:
        pick = model_pick(workload, gpu, failed.schedule_ids)
        schedule, predicted, learned_from = pick.schedule, pick.predicted_us, None
    return ScheduleResponse(
        source="model",
        workload=workload.canonical(),
        gpu=gpu,
        schedule=ScheduleDoc.of(schedule),
        schedule_id=schedule.id,
        predicted_us=predicted,
        throughput=fam.throughput_of(workload, predicted),
        throughput_unit=fam.throughput_unit,
        learned_from=learned_from,
        failed_trials=failed.trials,
    )


def set_reference_optimum(
    session: Session,
    workload: Any,
    gpu: str,
    best_latency_us: float,
    configurations: int,
    source: str,
    runner: str | None = None,
) -> None:
    """Record (or replace) the exhaustive-search optimum of a workload on a GPU, and the
    runner that measured it (None: not known)."""
    row = workload_id(session, workload)
    optimum = session.get(ReferenceOptimumRow, (row, gpu))
    if optimum is None:
        optimum = ReferenceOptimumRow(workload_id=row, gpu=gpu)
        session.add(optimum)
    optimum.best_latency_us = best_latency_us
    optimum.configurations = configurations
    optimum.source = source[:512]
    optimum.runner = None if runner is None else runner[:64]
