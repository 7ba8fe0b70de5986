"""ASGI middleware: request latency, the request body's size limit, and the Host names the
service answers.

Plain ASGI (not BaseHTTPMiddleware): no extra task per request and streaming untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.routing import Match

from pipetune.service.metrics import Metrics

Scope = dict[str, Any]


# The methods a request is labelled with; any other (the HTTP parser takes some thirty, WebDAV's
# PROPFIND and the like) is "other": each method x route x status was a series of its own,
# kept for good, and requests without any credential made them (1,680 such requests took
# /metrics from 85 KB to 1.5 MB).
LABELLED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetrics:
    """Latency histogram per (method, route template, status)."""

    def __init__(self, app: Any, metrics: Metrics, routes: Sequence[Any] = ()):
        """`routes`: the service's routes, to label a request refused before routing (a
        body too large, an encoding or a Host refused) with the one it was for."""
        self.app = app
        self.metrics = metrics
        self.routes = routes

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
            route = scope.get("route") or _route_of(scope, self.routes)
            # Route templates, never raw paths: ids in paths would explode the label set.
            path = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in LABELLED_METHODS else "other"
            self.metrics.request_seconds.labels(method, path, str(status)).observe(
                time.perf_counter() - start
            )


def _route_of(scope: Scope, routes: Sequence[Any]) -> Any:
    """The route a request refused before routing would have gone to (a body too large, an
    encoding refused, a Host refused: set by the router only, they read "unmatched", as a
    request for a path the service does not have); None where no route matches its path."""
    partial = None
    for route in routes:  # (as Starlette's router: the first full match, else a partial one)
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route
        if match is Match.PARTIAL and partial is None:
            partial = route
    return partial


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(
            413, f"the request body is over the service's limit of {limit} bytes "
            "(PIPETUNE_MAX_BODY_BYTES)",
        )  # fmt: skip


class BodyLimit:
    """Requests whose body is over `limit` bytes are answered 413, as JSON like every other
    error of the API (the service's handler of HTTPException writes it) and saying the
    limit. Written here rather than FastAPI's `max_body_size`, whose limiter (Starlette's)
    answers in plain text ("Content Too Large"), replacing the app's own answer: a declared
    Content-Length over the limit is refused before the app runs; a body that grows past it
    while it is read (no Content-Length, or a false one) raises in the route that reads it."""

    def __init__(self, app: Any, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            # (connection: close: the body it declared is not read)
            await _send_error(send, 413, BodyTooLarge(self.limit).detail, close=True)
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)


class ContentEncodingGuard:
    """A request body sent compressed (a Content-Encoding other than identity) is answered
    415, saying so: the service reads JSON as sent, and a gzip body was a 422 that called
    its bytes undecodable UTF-8."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                encoding = value.decode("latin-1").strip().lower()
                if name == b"content-encoding" and encoding not in ("", "identity"):
                    detail = (
                        f"Content-Encoding {encoding!r} is not supported: send the JSON body "
                        "uncompressed"
                    )
                    await _send_error(send, 415, detail, close=True)
                    return
        await self.app(scope, receive, send)


API_PREFIX = "/v1/"


class RootPath:
    """The service behind a proxy that serves it under a path prefix (PIPETUNE_ROOT_PATH):
    each request's `root_path` is the prefix and its path starts with it, as ASGI has it,
    whether the proxy stripped the prefix or passed it on (uvicorn's --root-path assumes a
    stripping proxy: one that passed it on was answered 404; FastAPI's own parameter is
    deprecated). Routes then match the path without it, and /docs and the OpenAPI
    document name it."""

    def __init__(self, app: Any, root_path: str):
        self.app = app
        self.root = root_path
        self.raw_root = root_path.encode("ascii")  # (settings.root_path_problem: ASCII)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": self.root}
            path = scope["path"]
            if not (path == self.root or path.startswith(self.root + "/")):
                scope["path"] = self.root + path
                if scope.get("raw_path") is not None:
                    scope["raw_path"] = self.raw_root + scope["raw_path"]
        await self.app(scope, receive, send)


def route_path(scope: Scope) -> str:
    """The request's path as the routes read it: without the root path where a proxy
    passed its prefix on (PIPETUNE_ROOT_PATH; as Starlette's router matches it)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


NO_STORE = (b"cache-control", b"no-store")


class NoStore:
    """The API's answers (/v1/...) carry `Cache-Control: no-store`: they hold what a key or a
    worker token was needed to read (tasks, trials, workers, leases), and a caching proxy
    in front of the service that keys its cache on the address alone (nginx's
    `proxy_cache_valid 200 ...`) served one key-holder's answer to the next request without
    a key. Nothing in the API is worth caching: its answers change with every result. The
    dashboard's page and files, /healthz and /metrics are not under /v1/ and keep their own
    headers."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not route_path(scope).startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return

        async def send_no_store(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"cache-control" for name, _ in headers):
                    headers.append(NO_STORE)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_no_store)


async def _send_error(send: Any, status: int, detail: str, close: bool = False) -> None:
    """An error answered by a middleware, before the app runs: JSON like every other error
    of the API ({"detail": ...})."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # (the server refuses such a request before the app sees it)
    return None


def host_name(value: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" -> "::1")."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 literal: its colons are not the port's
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


HEALTH_PATH = "/healthz"


class HostGuard:
    """Requests addressed to a Host not in `allowed` are answered 400, as JSON like every
    other error of the API. `serve` on a loopback address without API keys allows only the
    loopback names: a web page the user opens could otherwise reach the open API through
    DNS rebinding (its own name resolving to 127.0.0.1), which a browser's same-origin rule
    lets it read. Written here rather than Starlette's TrustedHostMiddleware, which reads
    an IPv6 Host ("[::1]:8000") as "[" and answers in plain text."""

    def __init__(self, app: Any, allowed: list[str]):
        self.app = app
        self.allowed = {host_name(h) for h in allowed}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        # /healthz answers whatever the Host: health checks address the service by its IP
        # (compose's and the image's check ask 127.0.0.1, a load balancer its own view), and
        # refused there a service with PIPETUNE_ALLOWED_HOSTS read as down and its workers,
        # waiting on its health, never started. What it says is no secret a rebinding
        # page could use.
        # (The path without the root path: a proxy may pass its prefix on, PIPETUNE_ROOT_PATH.)
        if scope["type"] != "http" or "*" in self.allowed or route_path(scope) == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if host_name(host) in self.allowed:
            await self.app(scope, receive, send)
            return
        detail = (
            f"Host {host!r} is not one this service answers (PIPETUNE_ALLOWED_HOSTS: "
            f"{', '.join(sorted(self.allowed))}; a service on a loopback address without API "
            "keys answers only its loopback names, against DNS rebinding)"
        )
        await _send_error(send, 400, detail)
