"""Health and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy import text

from pipetune.model.wire import Health
from pipetune.service.context import ServiceDep
from pipetune.service.db import DatabaseGoneError, is_unavailable
from pipetune.service.errors import DatabaseFullError, DatabaseStalledError
from pipetune.service.metrics import CONTENT_TYPE
from pipetune.service.middleware import HEALTH_PATH
from pipetune.service.routers.bounded_json import BoundedJsonRoute

router = APIRouter(route_class=BoundedJsonRoute, tags=["operations"])


# HEAD too: load balancers' health checks often send it, and a 405 marked the service down.
# (HEALTH_PATH: the Host guard answers it for any Host, for a load balancer's checks.)
@router.head(HEALTH_PATH, include_in_schema=False)
@router.get(HEALTH_PATH, response_model=Health, responses={503: {"description": "no database"}})
def healthz(service: ServiceDep) -> Health:
    problem = service.db.file_problem()
    if problem is not None:
        # The open connections still answer from the old file: what is written now is lost.
        raise DatabaseGoneError(problem)
    if (refused := service.db.write_problem()) is not None:
        raise DatabaseFullError(refused)
    db = service.db
    try:
        if db.stalled:
            # The probe (one at a time; the others fail at once): a stalled database found
            # answering again is so for every request from here on.
            db.probe()
        else:
            with db.read() as s:
                s.execute(text("SELECT 1"))
            if not db.is_sqlite:
                # The hot paths' own connections too (Database.driver_statement): with the
                # server's slots taken, this replica's leases and heartbeats answered 503
                # while the ORM's pooled connection answered /healthz 200.
                with db.driver_statement() as cur:
                    cur.execute("SELECT 1")
    except Exception as exc:
        stall = db.stall_problem()
        if stall is None or not is_unavailable(exc):
            raise
        raise DatabaseStalledError(stall) from exc
    return Health(status="ok", database=service.db.dialect, schema_revision=service.schema_revision)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(service: ServiceDep) -> PlainTextResponse:
    """Prometheus text format: queue depth, leases, results, expiries, request latency."""
    return PlainTextResponse(service.metrics.render(), media_type=CONTENT_TYPE)
