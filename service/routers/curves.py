"""GET /v1/curves: best-in-k-trials per strategy, aggregated over tasks."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from pipetune.model.hardware import HardwareError, resolve_gpu_key
from pipetune.model.wire import AggregateCurves, OpName, StrategyName
from pipetune.service.auth import user_access
from pipetune.service.context import ServiceDep
from pipetune.service.curves import aggregate
from pipetune.service.errors import InputError
from pipetune.service.routers.api_route import ApiRoute
from pipetune.service.routers.common import ERRORS, QUERY_INT

router = APIRouter(route_class=ApiRoute, tags=["curves"], dependencies=[Depends(user_access)])


@router.get("/v1/curves", response_model=AggregateCurves, responses=ERRORS)
def get_curves(
    service: ServiceDep,
    gpu: str | None = None,
    op: OpName | None = None,
    strategy: StrategyName | None = None,
    max_k: Annotated[int, Query(ge=1, le=5000), QUERY_INT] = 1000,
) -> AggregateCurves:
    """best-in-k (k = 1, 2, ...): best throughput of a task's first k trials over the best
    known for its workload (an imported exhaustive sweep where one exists), mean over tasks
    per workload, geometric mean over workloads (the ALCOP Fig. 13 view)."""
    if gpu is not None:
        try:
            gpu = resolve_gpu_key(gpu)
        except HardwareError as exc:
            raise InputError(["query", "gpu"], str(exc)) from None
    with service.db.read() as s:
        curves, runners = aggregate(s, gpu, op, strategy, max_k)
    return AggregateCurves(gpu=gpu, op=op, curves=curves, runners=runners)
