"""Tuning tasks: create, list, inspect, cancel; their trials and best-so-far curve."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from pipetune.model.wire import (
    MAX_TASK_PAGE,
    SAMPLES_PAGE,
    TASK_PAGE,
    Curve,
    TaskCreate,
    TaskDoc,
    TaskList,
    TaskPrior,
    TaskState,
    TrialList,
)
from pipetune.service.auth import user_access
from pipetune.service.context import Service, ServiceDep
from pipetune.service.curves import task_curve
from pipetune.service.errors import NotFoundError
from pipetune.service.routers.api_route import ApiRoute
from pipetune.service.routers.common import ERRORS, ID_MAX, NOT_FOUND, QUERY_INT, RowId
from pipetune.service.views import get_task_doc, list_task_docs, list_trial_docs, task_work

router = APIRouter(route_class=ApiRoute, tags=["tasks"], dependencies=[Depends(user_access)])


def _task_doc(service: Service, task_id: int) -> TaskDoc:
    with service.db.read() as s:
        doc = get_task_doc(s, task_id, service.settings.lease_ttl_s)
    if doc is None:
        raise NotFoundError(f"task {task_id} does not exist")
    return doc


@router.post("/v1/tasks", status_code=201, response_model=TaskDoc, responses=ERRORS)
def create_task(
    service: ServiceDep,
    body: TaskCreate,
) -> TaskDoc:
    """Create a tuning task; its first batch of trials is queued at once."""
    return _task_doc(service, service.driver.create(body))


@router.post("/v1/tasks/prior", response_model=TaskPrior, responses=ERRORS)
def task_prior(
    service: ServiceDep,
    body: TaskCreate,
) -> TaskPrior:
    """The prior a task of this body (POST /v1/tasks's) would start from now, creating
    nothing: `prior_task`, the finished task of the workload whose trials warm-start it
    (`prior_gpu` resolved to it); `learned_from`, the measured tasks whose cost model is its
    prior (asked for with `learned_prior`, or the kernel family's default); both null: it
    starts cold, from its strategy's own prior. A body task creation refuses is refused
    here with the same 422 (a prior that cannot be one names `prior_task`, `prior_gpu` or
    `learned_prior`). A client resuming earlier tasks asks this to know whether a task that
    started cold would start cold again, rather than copying the service's choice."""
    prior_task, learned_from = service.driver.prior_for(body)
    return TaskPrior(
        prior_task=prior_task, learned_from=None if learned_from is None else list(learned_from)
    )


@router.get("/v1/tasks", response_model=TaskList)
def list_tasks(
    service: ServiceDep,
    state: TaskState | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_TASK_PAGE), QUERY_INT] = TASK_PAGE,
    offset: Annotated[int, Query(ge=0, le=ID_MAX), QUERY_INT] = 0,
    before: Annotated[int | None, Query(ge=1, le=ID_MAX), QUERY_INT] = None,
) -> TaskList:
    """Tasks, newest first. Page with `before` (the last id of the page before): an offset
    shifts as tasks are created between pages, and a page then repeats a task."""
    with service.db.read() as s:
        ttl = service.settings.lease_ttl_s
        return TaskList(tasks=list_task_docs(s, state, limit, offset, before, ttl))


@router.get("/v1/tasks/{task_id}", name="get_task", response_model=TaskDoc, responses=NOT_FOUND)
def get_task(
    service: ServiceDep,
    task_id: RowId,
) -> TaskDoc:
    return _task_doc(service, task_id)


@router.delete(
    "/v1/tasks/{task_id}",
    response_model=TaskDoc,
    responses=NOT_FOUND | {409: {"description": "the task already finished"}},
)
def cancel_task(
    service: ServiceDep,
    task_id: RowId,
) -> TaskDoc:
    """Cancel a task: its queued and leased jobs are cancelled, late results refused."""
    service.driver.cancel(task_id)
    return _task_doc(service, task_id)


@router.get("/v1/tasks/{task_id}/trials", response_model=TrialList, responses=NOT_FOUND)
def list_trials(
    service: ServiceDep,
    task_id: RowId,
    after: Annotated[
        int, Query(ge=-1, le=ID_MAX, description="only trials with a larger index"), QUERY_INT
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=10000), QUERY_INT] = 1000,
    samples: Annotated[
        bool,
        Query(
            description=f"with each trial's timed repeats (samples_us); a page then holds "
            f"at most {SAMPLES_PAGE} trials"
        ),
    ] = False,
    error_chars: Annotated[
        int | None,
        Query(
            ge=0,
            le=ID_MAX,
            description="each trial's error cut to its first error_chars characters, "
            "saying how many more it had (a compiler's log can run to pages)",
        ),
        QUERY_INT,
    ] = None,
) -> TrialList:
    """The task's trials in proposal order (incremental with `after`)."""
    if samples:  # each trial may carry MAX_SAMPLES: keep a page's size bounded
        limit = min(limit, SAMPLES_PAGE)
    with service.db.read() as s:
        if task_work(s, task_id) is None:
            raise NotFoundError(f"task {task_id} does not exist")
        docs = list_trial_docs(s, task_id, after, limit, samples, error_chars)
        return TrialList(trials=docs)


@router.get("/v1/tasks/{task_id}/curve", response_model=Curve, responses=NOT_FOUND)
def get_curve(
    service: ServiceDep,
    task_id: RowId,
    after: Annotated[
        int,
        Query(ge=-1, le=ID_MAX, description="only points with a larger `trial` (place)"),
        QUERY_INT,
    ] = -1,
) -> Curve:
    """Best-so-far latency and throughput (TFLOP/s for GEMMs, GB/s for memory-intensive
    operators: `throughput_unit`) after each trial, over the trials that are final. A point's
    `trial` is its place among the task's trials, 0-based: the trial's number, except after a
    job cancelled with its task (no trial: left out, the trials after it counted on)."""
    with service.db.read() as s:
        work = task_work(s, task_id)
        if work is None:
            raise NotFoundError(f"task {task_id} does not exist")
        return task_curve(s, task_id, *work, after)
