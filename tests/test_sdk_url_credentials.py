"""A service URL with a user and password (a reverse proxy's basic auth in front of the
service): httpx sends them as the Authorization header, which replaced the worker's bearer
token, and the worker exited "a valid worker token required: give --token", its token given.
The token goes in the service's own header then, beside the proxy's basic auth."""

from __future__ import annotations

import base64

import httpx

from pipetune.clients.sdk import Client, WorkerApi


def _seen(requests: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"tasks": []})

    return httpx.MockTransport(answer)


def _worker_request(url: str) -> httpx.Request:
    """The request a WorkerApi of `url` (token "worker-token") sends."""
    requests: list[httpx.Request] = []
    api = WorkerApi(url, "worker-token", transport=_seen(requests))
    try:
        api._http.request("GET", "/v1/tasks")
    finally:
        api._http.close()
    (request,) = requests
    return request


def test_a_worker_sends_its_token_beside_a_urls_basic_auth():
    request = _worker_request("http://alice:pw@127.0.0.1:9")
    basic = base64.b64encode(b"alice:pw").decode()
    assert request.headers["Authorization"] == f"Basic {basic}"
    assert request.headers["X-Worker-Token"] == "worker-token"


def test_a_worker_without_url_credentials_sends_a_bearer_token():
    request = _worker_request("http://127.0.0.1:9")
    assert request.headers["Authorization"] == "Bearer worker-token"
    assert "X-Worker-Token" not in request.headers


def test_a_clients_token_goes_beside_a_urls_basic_auth():
    requests: list[httpx.Request] = []
    with Client("http://alice:pw@127.0.0.1:9", token="api-key", transport=_seen(requests)) as c:
        c.tasks()
    assert requests[0].headers["Authorization"].startswith("Basic ")
    assert requests[0].headers["X-API-Key"] == "api-key"
