"""Leases and results (worker token required).

The routes are async, their dependencies too (service/auth.py), and the database work of a
lease or a result runs on the event loop itself: each is one short transaction of one or two
statements that never waits on the loop, and handing it to a worker thread and back cost more
CPU than the statements (two cross-thread wake-ups per request: 2.1-2.4 against 1.6-1.9 ms of
service CPU per result with the single-job protocol, benchmarks/RESULTS.md "the hot routes'
database work on the event loop"). A slow database therefore slows this replica's requests
as a whole, which their answers would wait for anyway; long-polls still wait asynchronously.
On SQLite the work goes to a worker thread instead (Queue.hot): another program may hold the
file's lock for seconds, and the service is to go on answering meanwhile.
A result that may have completed what its task waits for asks the proposer loop for the next
batch (service/proposer.py): the worker's request never waits for a proposal.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from pipetune.model.wire import (
    JobResult,
    JobResultAcks,
    JobResults,
    LeaseRelease,
    LeaseRequest,
    LeaseResponse,
    ReleaseAck,
    ResultAck,
)
from pipetune.service.auth import WorkerToken
from pipetune.service.context import Service, ServiceDep
from pipetune.service.queue import Report, check_storable
from pipetune.service.routers.api_route import ApiRoute
from pipetune.service.routers.common import ERRORS, NOT_FOUND, RowId

router = APIRouter(route_class=ApiRoute, tags=["jobs"])
FORBIDDEN = {403: {"description": "not this worker's lease or token"}}


@router.post(
    "/v1/jobs/lease",
    response_model=LeaseResponse,
    responses=ERRORS | FORBIDDEN | {404: {"description": "the worker is not registered"}},
)
async def lease_jobs(
    service: ServiceDep,
    body: LeaseRequest,
    token: WorkerToken,
    request: Request,
) -> LeaseResponse:
    """Long-poll for up to `max_jobs` jobs of the worker's GPU (its own only, whatever
    other GPU shares its arch), waiting up to `wait_s` seconds; an empty list when none came.
    The request is answered as soon as such jobs are enqueued (it waits on a wake-up). Sent
    again with the same `request_id` and `retry`, it gets the jobs the first one leased,
    while they are still leased to the worker (an answer lost on the way is not a lease
    lost): those of the newest request under that id, and a 422 naming `max_jobs` where
    they are more than the retry's `max_jobs`."""
    return await service.queue.lease(body.worker_id, token, body, request.is_disconnected)


def _advance(service: Service, tasks: set[int]) -> None:
    for task_id in tasks:
        service.proposer.request(task_id)


@router.post(
    "/v1/jobs/{job_id}/result",
    response_model=ResultAck,
    responses=ERRORS | FORBIDDEN | NOT_FOUND,
)
async def post_result(
    service: ServiceDep,
    job_id: RowId,
    body: JobResult,
    token: WorkerToken,
) -> ResultAck:
    """Record a measurement. Idempotent per (job, lease token); a result of a lease that
    is no longer the job's current one (expired and re-leased, cancelled) is acknowledged
    with accepted=false and not recorded."""
    ack, ready = await service.queue.hot(service.queue.submit, job_id, token, body)
    if ready is not None:
        _advance(service, {ready})
    return ack


@router.post(
    "/v1/jobs/results",
    response_model=JobResultAcks,
    # A result the token may not report is answered in its own ack (403, 404), in a 200:
    # the others of the request are recorded. No request-level 403 or 404.
    responses=ERRORS
    | {200: {"description": "each result's ack in order (status_code 200, 403 or 404)"}},
)
async def post_results(
    service: ServiceDep,
    body: JobResults,
    token: WorkerToken,
) -> JobResultAcks:
    """Record many measurements in one request (one database transaction). Each result is
    judged as the single-job route judges it, and answered in order: `status_code` 200
    (`accepted` says whether it was recorded), 403 (not this worker's lease) or 404 (no
    such job). Idempotent per (job, lease token): the whole request may be sent again.

    With `max_jobs`, the worker's next lease comes back in the same answer (`jobs`): up to
    that many queued jobs, claimed after the results are recorded, without waiting. Sent
    again with the same `request_id` and `retry`, the request gets the jobs the first one
    leased (while they are still leased to the worker); without, it leases again, and the
    jobs of an answer that was lost return to the queue only when their lease expires."""
    for i, item in enumerate(body.results):
        check_storable(item.result, ["body", "results", i, "result"])
    reports = [Report(r.job_id, r.lease_token, r.result) for r in body.results]
    judged, ready = await service.queue.hot(
        service.queue.submit_many, body.worker_id, token, reports
    )
    _advance(service, ready)
    jobs = await service.queue.lease_after_report(
        body.worker_id, token, body.max_jobs, body.request_id, body.retry
    )
    return JobResultAcks(acks=[j.ack for j in judged], jobs=jobs)


# A rare request (a worker stopping): after the hot routes, which are matched first.
@router.post(
    "/v1/jobs/release",
    response_model=ReleaseAck,
    responses=ERRORS | FORBIDDEN | {404: {"description": "the worker is not registered"}},
)
async def release_jobs(service: ServiceDep, body: LeaseRelease, token: WorkerToken) -> ReleaseAck:
    """Hand back jobs leased to the worker that it will not measure (it is stopping; a
    lease request or a report answered after the stop brought them): queued again at once,
    no attempt counted, a waiting lease request woken, where they waited out their lease
    TTL and used up one of their attempts. Only jobs still leased to this worker under the
    lease named (`released` lists them)."""
    leases = [(lease.job_id, lease.lease_token) for lease in body.leases]
    released = await service.queue.hot(service.queue.release, body.worker_id, token, leases)
    return ReleaseAck(released=released)
