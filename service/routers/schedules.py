"""POST /v1/schedules: the best known schedule of a workload on a GPU."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from pipetune.model.wire import ScheduleRequest, ScheduleResponse, TaskCreate
from pipetune.model.workloads import WorkloadError
from pipetune.service.auth import user_access
from pipetune.service.context import ServiceDep
from pipetune.service.errors import InputError
from pipetune.service.records import measured_or_failures, measuring_device, schedule_response
from pipetune.service.routers.api_route import ApiRoute
from pipetune.service.routers.common import ERRORS

router = APIRouter(route_class=ApiRoute, tags=["schedules"], dependencies=[Depends(user_access)])


@router.post(
    "/v1/schedules",
    response_model=ScheduleResponse,
    responses={202: {"model": ScheduleResponse, "description": "with `tune`: task created"}}
    | ERRORS,
)
def best_schedule(
    service: ServiceDep,
    body: ScheduleRequest,
    request: Request,
    response: Response,
) -> ScheduleResponse:
    """The best measured schedule for the workload on the GPU if one was measured
    (`source: measured`), else the model's pick (`source: model`): for a tensor-core GEMM
    or a memory-intensive operator, a cost model learned from the measured tasks of other
    shapes where they hold 8 or more shapes (`learned_from` names them), else the analytical
    model; never a schedule whose trial failed on the GPU (`failed_trials` counts those
    trials). With `tune`, also creates a tuning task (202, `task_id` and `url`)."""
    workload = body.workload
    with service.db.read() as s:
        job, failed = measured_or_failures(s, workload.workload_hash, body.gpu)
        device = measuring_device(s, job)
    try:
        learned = None
        if job is None or job.latency_us is None:  # nothing measured: a learned pick?
            learned = service.driver.learned_pick(workload, body.gpu, failed.schedule_ids)
        doc = schedule_response(workload, body.gpu, job, learned, failed, device)
    except WorkloadError as exc:
        raise InputError(["body", "workload"], exc.reason) from None
    if body.tune is not None:
        task_id = service.driver.create(
            TaskCreate(workload=workload, gpu=body.gpu, **body.tune.model_dump()),
            where=("body", "tune"),
        )
        doc.task_id = task_id
        doc.url = str(request.url_for("get_task", task_id=task_id))
        response.status_code = 202
    return doc
