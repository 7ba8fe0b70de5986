"""Workload rows and the best-schedule lookups behind POST /v1/schedules."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from pipetune.model.family import family_for_op, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.wire import ScheduleDoc, ScheduleResponse
from pipetune.model.workloads import WorkloadError
from pipetune.service.orm import JobRow, ReferenceOptimumRow, WorkloadRow

if TYPE_CHECKING:
    from pipetune.service.priors import LearnedPick


def workload_row(session: Session, workload: Any) -> WorkloadRow:
    """The row of a workload, created if it is new (safe against a concurrent insert).
    Its ``flops`` column holds the work of one run in the family's unit (FLOPs for the
    tensor-core GEMMs, compulsory bytes for the memory-intensive operators): the column
    predates the second family, and throughput is that work over a latency."""
    digest = workload.workload_hash
    found = session.scalars(select(WorkloadRow).where(WorkloadRow.hash == digest)).one_or_none()
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
    session.execute(insert(WorkloadRow).values(**values).on_conflict_do_nothing())
    return session.scalars(select(WorkloadRow).where(WorkloadRow.hash == digest)).one()


def best_measured(session: Session, workload_hash: str, gpu: str) -> JobRow | None:
    """The fastest successful trial of this workload on this GPU, over every task."""
    return session.scalars(
        select(JobRow)
        .join(WorkloadRow, JobRow.workload_id == WorkloadRow.id)
        .where(WorkloadRow.hash == workload_hash, JobRow.gpu == gpu, JobRow.status == "ok")
        .order_by(JobRow.latency_us, JobRow.id)
        .limit(1)
    ).first()


@dataclass(frozen=True)
class ModelPick:
    schedule: Any  # the family's schedule type
    predicted_us: float


@lru_cache(maxsize=1024)
def model_pick(workload: Any, gpu: str) -> ModelPick:
    """The analytical model's best schedule (cached: it depends only on its arguments)."""
    fam = family_of(workload)
    _, _, ranked = fam.rank(workload, get_gpu(gpu), top=1)
    if not ranked:
        raise WorkloadError("workload", fam.no_schedule_reason(workload, get_gpu(gpu)))
    best = ranked[0]
    return ModelPick(
        schedule=fam.parse_schedule(best.schedule),
        predicted_us=best.terms["predicted_us"],
    )


def throughput(op: str, work: float, latency_us: float) -> dict[str, Any]:
    """The wire's throughput fields of ``work`` (a workload row's) done in ``latency_us``:
    the value in the op's family's unit and the unit."""
    fam = family_for_op(op)
    return {"throughput": fam.rate(work, latency_us), "throughput_unit": fam.throughput_unit}


def schedule_response(
    workload: Any, gpu: str, job: JobRow | None, learned: LearnedPick | None = None
) -> ScheduleResponse:
    """POST /v1/schedules' answer: the best measured trial `job` (best_measured's), else the
    pick of a learned prior (`learned`, where there is one: priors.learned_pick), else the
    analytical model's pick. Raises WorkloadError when no schedule of the family is valid on
    the GPU."""
    fam = family_of(workload)
    if job is not None and job.latency_us is not None:
        schedule = fam.parse_schedule(job.schedule)
        predicted = job.predicted_us
        if predicted is None:
            predicted = model_pick(workload, gpu).predicted_us
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
        )
    if learned is not None:
        schedule, predicted = learned.schedule, learned.predicted_us
        learned_from: list[int] | None = list(learned.learned_from)
    else:
        pick = model_pick(workload, gpu)
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
    )


def set_reference_optimum(
    session: Session,
    workload: Any,
    gpu: str,
    best_latency_us: float,
    configurations: int,
    source: str,
) -> None:
    """Record (or replace) the exhaustive-search optimum of a workload on a GPU."""
    row = workload_row(session, workload)
    existing = session.get(ReferenceOptimumRow, (row.id, gpu))
    if existing is None:
        session.add(
            ReferenceOptimumRow(
                workload_id=row.id,
                gpu=gpu,
                best_latency_us=best_latency_us,
                configurations=configurations,
                source=source[:512],
            )
        )
    else:
        existing.best_latency_us = best_latency_us
        existing.configurations = configurations
        existing.source = source[:512]
