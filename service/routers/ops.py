"""Health and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select, text

from pipetune.model.wire import Health
from pipetune.service.context import ServiceDep
from pipetune.service.metrics import gauge_lines
from pipetune.service.orm import JobRow, TaskRow, WorkerRow

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
def healthz(service: ServiceDep) -> Health:
    with service.db.read() as s:
        s.execute(text("SELECT 1"))
    return Health(status="ok", database=service.db.dialect, schema_revision=service.schema_revision)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(service: ServiceDep) -> PlainTextResponse:
    """Prometheus text format: queue depth, leases, results, expiries, request latency."""
    db = service.db
    with db.read() as s:
        jobs = s.execute(
            select(JobRow.state, JobRow.gpu, func.count())
            .where(JobRow.state.in_(("queued", "leased")))
            .group_by(JobRow.state, JobRow.gpu)
        ).all()
        tasks = s.execute(select(TaskRow.state, func.count()).group_by(TaskRow.state)).all()
        workers = s.execute(select(WorkerRow.gpu, func.count()).group_by(WorkerRow.gpu)).all()
    queued = [(gpu, n) for state, gpu, n in jobs if state == "queued"]
    leased = [(gpu, n) for state, gpu, n in jobs if state == "leased"]
    gauges = [
        *gauge_lines("pipetune_queue_depth", "Jobs waiting for a worker", ["gpu"], queued),
        *gauge_lines("pipetune_leases_active", "Jobs leased to a worker", ["gpu"], leased),
        *gauge_lines("pipetune_tasks", "Tasks by state", ["state"], tasks),
        *gauge_lines("pipetune_workers_registered", "Registered workers", ["gpu"], workers),
    ]
    return PlainTextResponse(service.metrics.render(gauges), media_type="text/plain; version=0.0.4")
