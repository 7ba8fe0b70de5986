"""ASGI middleware recording request latency (the body size limit is FastAPI's own).

Plain ASGI (not BaseHTTPMiddleware): no extra task per request and streaming untouched.
"""

from __future__ import annotations

import time
from typing import Any

from pipetune.service.metrics import Metrics

Scope = dict[str, Any]


class RequestMetrics:
    """Latency histogram per (method, route template, status)."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            # Route templates, never raw paths: ids in paths would explode the label set.
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.request_seconds.labels(scope["method"], path, str(status)).observe(
                time.perf_counter() - start
            )
