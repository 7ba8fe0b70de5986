"""Worker registration and heartbeats (worker token required), and the worker list."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from pipetune.model.states import WorkerState
from pipetune.model.wire import (
    MAX_WORKER_PAGE,
    WORKER_PAGE,
    Heartbeat,
    HeartbeatAck,
    WorkerDoc,
    WorkerList,
    WorkerRegister,
)
from pipetune.service.auth import WorkerToken, user_access
from pipetune.service.context import ServiceDep
from pipetune.service.routers.api_route import ApiRoute
from pipetune.service.routers.common import ERRORS, NOT_FOUND, QUERY_INT, RowId
from pipetune.service.views import list_worker_docs

router = APIRouter(route_class=ApiRoute, tags=["workers"])


@router.post(
    "/v1/workers",
    status_code=201,
    response_model=WorkerDoc,
    responses=ERRORS
    | {
        200: {"model": WorkerDoc, "description": "re-registered"},
        409: {
            "description": "the name is registered with another token and was heard from "
            "within the lease TTL (and has not said it exited since)"
        },
    },
)
def register_worker(
    service: ServiceDep,
    body: WorkerRegister,
    response: Response,
    token: WorkerToken,
) -> WorkerDoc:
    """Register a worker (201), or update one registered before under the same name
    with the same token (200). Jobs go to workers of the task's GPU (its model, not only its
    arch: an H100 worker takes no H200 task's jobs)."""
    doc, created = service.queue.register(token, body)
    if not created:
        response.status_code = 200
    return doc


@router.post(
    "/v1/workers/{worker_id}/heartbeat",
    response_model=HeartbeatAck,
    responses=NOT_FOUND | {403: {"description": "not this token's worker"}},
)
async def heartbeat(
    service: ServiceDep,
    worker_id: RowId,
    body: Heartbeat,
    token: WorkerToken,
) -> HeartbeatAck:
    """Liveness; also extends by one lease TTL the worker's unexpired leases: those listed in
    `leases` where the worker lists them (the others are left to expire), else all.

    The answer's `gone` names the listed leases that are no longer the worker's (a cancelled
    task's, say): the worker drops those of its jobs it has not started."""
    # One statement on the event loop, as a lease or a result is (service/routers/jobs.py
    # says why): a fleet's daemons send one every few seconds each, and the thread hand-off
    # cost more than the statement; on SQLite in a worker thread (Queue.hot).
    queue = service.queue
    return await queue.hot(queue.heartbeat, worker_id, token, body.busy_jobs, body.leases)


# A rare request (a worker stopping): after the hot routes, which are matched first.
@router.post(
    "/v1/workers/{worker_id}/stopping",
    status_code=204,
    response_class=Response,
    responses=NOT_FOUND | {403: {"description": "not this token's worker"}},
)
async def worker_stopping(service: ServiceDep, worker_id: RowId, token: WorkerToken) -> None:
    """The worker is stopping: it leases nothing more. Its lease requests waiting on any
    replica are answered empty now, and later ones at once, until it registers again (or for
    a minute): a job enqueued while the worker's process ends is not leased into a poll
    that nobody will read (it waited out its lease TTL and used up an attempt). Jobs it
    already holds and will not measure go back with `POST /v1/jobs/release`."""
    await service.queue.worker_stopping(worker_id, token)


# As rare: once per worker process.
@router.post(
    "/v1/workers/{worker_id}/exit",
    status_code=204,
    response_class=Response,
    responses=NOT_FOUND | {403: {"description": "not this token's worker"}},
)
def worker_exit(service: ServiceDep, worker_id: RowId, token: WorkerToken) -> None:
    """The worker's process ends, cleanly: it has reported what it measured and handed back
    (`POST /v1/jobs/release`) what it will not measure. It is not live from now on: its
    name is free at once to a worker on another token (a restart after a token rotation
    waited out the lease TTL, refused with 409), and the live-worker gauges and a task's
    `no_worker` stop counting it, until it is heard from again (a heartbeat or a
    registration clears `exited_at`). Its lease requests are answered as a stopping
    worker's are. Leases it still holds are left to expire."""
    service.queue.worker_exited(worker_id, token)


@router.get("/v1/workers", response_model=WorkerList, dependencies=[Depends(user_access)])
def list_workers(
    service: ServiceDep,
    state: Annotated[WorkerState | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_WORKER_PAGE), QUERY_INT] = WORKER_PAGE,
) -> WorkerList:
    """Registered workers, most recent heartbeat first (those in `state` only, where given:
    live, silent past the lease TTL, or exited), each with its state, and `counts`: how many
    registered workers are in each state."""
    with service.db.read() as s:
        return list_worker_docs(s, state, limit, service.settings.lease_ttl_s)
