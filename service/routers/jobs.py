"""Leases and results (worker token required)."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks

from pipetune.model.wire import JobResult, LeaseRequest, LeaseResponse, ResultAck
from pipetune.service.auth import WorkerToken
from pipetune.service.context import ServiceDep
from pipetune.service.routers.common import ERRORS, NOT_FOUND, RowId

router = APIRouter(tags=["jobs"])
FORBIDDEN = {403: {"description": "not this worker's lease or token"}}


@router.post("/v1/jobs/lease", response_model=LeaseResponse, responses=ERRORS | FORBIDDEN)
async def lease_jobs(
    service: ServiceDep,
    body: LeaseRequest,
    token: WorkerToken,
) -> LeaseResponse:
    """Long-poll for up to `max_jobs` jobs of the worker's arch (and GPU, for simulated
    and replay workers), waiting up to `wait_s` seconds; an empty list when none came."""
    return await service.queue.lease(body.worker_id, token, body)


@router.post(
    "/v1/jobs/{job_id}/result",
    response_model=ResultAck,
    responses=ERRORS | FORBIDDEN | NOT_FOUND,
)
def post_result(
    service: ServiceDep,
    job_id: RowId,
    body: JobResult,
    background: BackgroundTasks,
    token: WorkerToken,
) -> ResultAck:
    """Record a measurement. Idempotent per (job, lease token); a result of a lease that
    is no longer the job's current one (expired and re-leased, cancelled) is acknowledged
    with accepted=false and not recorded."""
    ack, complete_task = service.queue.submit(job_id, token, body)
    if complete_task is not None:
        # After the response: the worker need not wait for the next proposal round.
        background.add_task(service.driver.advance, complete_task)
    return ack
