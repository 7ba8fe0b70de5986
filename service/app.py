"""The FastAPI app factory.

    create_app(Settings(database_url="sqlite:///pipetune.db", worker_tokens=["..."]))

The schema is checked before anything else (service.migrate.check_schema): an app never
serves a database whose schema differs from its ORM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline
from starlette.responses import JSONResponse, Response

from pipetune.service.context import Service
from pipetune.service.db import Database, is_unavailable, unavailable_reason
from pipetune.service.driver import Driver
from pipetune.service.errors import install as install_error_handlers
from pipetune.service.metrics import Metrics
from pipetune.service.middleware import (
    BodyLimit,
    ContentEncodingGuard,
    HostGuard,
    NoStore,
    RequestMetrics,
    RootPath,
)
from pipetune.service.migrate import check_schema, check_writable
from pipetune.service.proposer import Proposer
from pipetune.service.queue import Queue
from pipetune.service.routers import curves, dashboard, jobs, ops, schedules, tasks, workers
from pipetune.service.routers.common import with_project_errors
from pipetune.service.settings import Settings
from pipetune.service.thread_cpu import LISTENER_THREAD
from pipetune.service.wakeup import Wakeup, listen, service_channel
from pipetune.tuner.allocator import keep_freed_blocks

log = logging.getLogger(__name__)

DESCRIPTION = """Autotuning of pipelined tensor-core kernels: ask for the best schedule of a
workload on a GPU, start tuning tasks, and let GPU workers lease and measure the trials.
Worker routes need a worker token (`Authorization: Bearer <token>` or `X-Worker-Token`)."""


async def _upkeep_loop(service: Service, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await run_in_threadpool(service.upkeep, True)
        except Exception as exc:  # keep sweeping: the next round may well succeed
            if is_unavailable(exc):
                log.warning("upkeep skipped: database unavailable: %s", unavailable_reason(exc))
            else:
                log.exception("upkeep failed")


class JsonCORS(CORSMiddleware):
    """Starlette's CORS middleware, its refused preflight answered in JSON as every other
    error of the API is ({"detail": ...}; it was a text/plain 400)."""

    def preflight_response(self, request_headers: Any) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        headers = {k: v for k, v in response.headers.items() if k.lower().startswith("access-")}
        detail = bytes(response.body).decode()
        return JSONResponse({"detail": detail}, status_code=response.status_code, headers=headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    revision = check_schema(settings.database_url, create_if_empty=settings.create_empty_schema)
    check_writable(settings.database_url)
    db = Database(settings.database_url, settings.db_pool_size, settings.db_statement_deadline_s)
    metrics = Metrics(db, settings.lease_ttl_s)  # its database gauges are read at each scrape
    wakeup = Wakeup(shared=not db.is_sqlite, channel=service_channel(db))
    driver = Driver(db, settings, metrics, wakeup)
    service = Service(
        settings=settings,
        db=db,
        queue=Queue(db, settings, metrics, wakeup),
        driver=driver,
        metrics=metrics,
        schema_revision=revision,
        wakeup=wakeup,
        proposer=Proposer(driver, shared=not db.is_sqlite, threads=settings.proposer_threads),
    )
    # The other replicas ask for the one holding a task's session, which answers.
    wakeup.on_advance = service.proposer.request_if_held
    wakeup.on_held = service.proposer.held_elsewhere
    service.queue.on_lost = service.proposer.request

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        wakeup.attach(asyncio.get_running_loop())
        metrics.thread_cpu.mark_event_loop()
        # A served app owns its process: proposal rounds reuse their freed temporaries
        # instead of faulting fresh pages in (tuner/allocator.py).
        keep_freed_blocks()
        service.proposer.start()
        stop_listening = threading.Event()
        listener = None
        if not db.is_sqlite:
            # Jobs enqueued by the other replicas (and by anything else on this database).
            listener = threading.Thread(
                target=listen,
                args=(
                    wakeup,
                    db.listener_conninfo(),
                    stop_listening,
                    settings.db_statement_deadline_s,
                ),
                name=LISTENER_THREAD,
                daemon=True,
            )
            listener.start()
        upkeep = None
        if settings.sweep_interval_s > 0:
            upkeep = asyncio.create_task(_upkeep_loop(service, settings.sweep_interval_s))
        try:
            yield
        finally:
            # Answer no more "who holds this task": a stopping replica will not advance it,
            # and an answer would keep the asker from adopting it.
            wakeup.on_advance = None
            wakeup.close()
            if upkeep is not None:
                upkeep.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await upkeep
            stop_listening.set()  # the listener ends within its wait (a daemon thread)
            await asyncio.to_thread(service.proposer.stop)
            db.dispose()

    # /docs and /redoc with Swagger UI's and ReDoc's scripts served by the service itself
    # (FastAPI's own pages load them from a CDN: blank on a fleet's machine with no network).
    app = FastAPIOffline(
        title="pipetune",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.service = service
    install_error_handlers(app)
    if settings.cors_origins:
        # Off unless origins are named: a browser page elsewhere must not drive the API
        # with a user's credentials. Never a wildcard together with credentials.
        app.add_middleware(
            JsonCORS,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type"],
        )
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(ContentEncodingGuard)
    app.add_middleware(NoStore)  # (outside the guards above: their refusals carry it too)
    if settings.allowed_hosts:
        app.add_middleware(HostGuard, allowed=settings.allowed_hosts)  # the first guard
    # Routes are matched in the order they are included, each tried in turn: the workers'
    # routes, a fleet's every request, first (matching a job route behind the other routers
    # cost 18 us more a request; they share no path with them).
    routers = [
        module.router for module in (jobs, workers, schedules, tasks, curves, ops, dashboard)
    ]
    for router in routers:
        app.include_router(router)
    # Outermost: every answer counted, the guards' refusals too (a Host refused was in no
    # series), each under the route it was for (a body too large read "unmatched").
    # (The app's own routes too, /openapi.json and /docs: those with a path of their own.)
    own = [route for route in app.routes if getattr(route, "path", None)]
    routes = own + [route for router in routers for route in router.routes]
    app.add_middleware(RequestMetrics, metrics=metrics, routes=routes)
    if settings.root_path:  # (outside everything that reads the path)
        app.add_middleware(RootPath, root_path=settings.root_path)
    _document_project_errors(app)
    return app


def _document_project_errors(app: FastAPI) -> None:
    """/openapi.json with every route's 422 as the ValidationErrorBody it answers (once for
    all routes: FastAPI documents its own 422 body wherever a route declares none)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_project_errors(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
