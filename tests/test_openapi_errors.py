"""/openapi.json documents the errors the service answers: every 422 as ValidationErrorBody
(service.errors answers every invalid request with it; 7 routes documented FastAPI's stock
HTTPValidationError instead), and the lease route's 404 for a worker that is not
registered."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from fastapi import FastAPI, Query
from service_support import WORKER_HEADERS, TestClient, client_for

from pipetune.service.migrate import upgrade
from pipetune.service.routers.common import with_project_errors

OURS = "#/components/schemas/ValidationErrorBody"
STOCK = ("HTTPValidationError", "ValidationError")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path_factory.mktemp('openapi') / 'openapi.db'}"
    upgrade(url)
    with client_for(url) as c:
        yield c


@pytest.fixture(scope="module")
def spec(client: TestClient) -> dict[str, Any]:
    return client.get("/openapi.json").json()


def _operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            yield method.upper(), path, operation


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_every_documented_422_is_the_projects_error_body(spec):
    documented = []
    for method, path, operation in _operations(spec):
        responses = operation["responses"]
        if "422" not in responses:
            continue
        documented.append(f"{method} {path}")
        schema = responses["422"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": OURS}, (method, path, schema)
    # Every route that takes a parameter or a body documents it (the 7 that documented the
    # stock body among them).
    for route in ["GET /v1/workers", "POST /v1/workers/{worker_id}/heartbeat", "GET /v1/tasks"]:
        assert route in documented
    for route in ["GET /v1/tasks/{task_id}", "DELETE /v1/tasks/{task_id}"]:
        assert route in documented
    assert "GET /v1/tasks/{task_id}/trials" in documented
    assert "GET /v1/tasks/{task_id}/curve" in documented
    components = spec["components"]["schemas"]
    for stock in STOCK:
        assert stock not in components
    assert "HTTPValidationError" not in json.dumps(spec)
    for ref in set(_refs(spec)):  # what is left refers to something that is there
        assert ref.removeprefix("#/components/schemas/") in components, ref


def test_a_422_the_service_answers_has_the_documented_fields(client, spec):
    required = spec["components"]["schemas"]["ValidationErrorBody"]["required"]
    for method, path in [
        ("GET", "/v1/workers?limit=0"),
        ("GET", "/v1/tasks?state=bogus"),
        ("GET", "/v1/tasks/0"),
        ("POST", "/v1/workers/0/heartbeat"),
    ]:
        headers = WORKER_HEADERS if "heartbeat" in path else {}
        answer = client.request(method, path, headers=headers, json={})
        assert answer.status_code == 422, (path, answer.text)
        assert set(required) <= set(answer.json()), (path, answer.json())


def test_the_lease_route_documents_its_404(client, spec):
    responses = spec["paths"]["/v1/jobs/lease"]["post"]["responses"]
    assert "404" in responses and "registered" in responses["404"]["description"]
    answer = client.post(
        "/v1/jobs/lease", json={"worker_id": 999, "wait_s": 0}, headers=WORKER_HEADERS
    )
    assert answer.status_code == 404, answer.text


def test_the_batched_result_route_documents_no_403_it_never_sends(client, spec):
    """A token that does not own the worker is answered item by item (each result's
    `status_code`), in a 200: the route documented a request-level 403 it never sent, and a
    client generated from the schema waited for it."""
    responses = spec["paths"]["/v1/jobs/results"]["post"]["responses"]
    assert "403" not in responses and "404" not in responses
    assert "403" in responses["200"]["description"]
    body = {"worker_id": 999, "results": [{"job_id": 1, "lease_token": "x" * 32,
            "result": {"status": "ok", "latency_us": 3.0}}], "max_jobs": 1}  # fmt: skip
    answer = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
    assert answer.status_code == 200, answer.text
    assert [a["status_code"] for a in answer.json()["acks"]] == [404]


def test_no_route_declaring_the_body_still_gets_it():
    """Where no route declares ERRORS, the body's schema is added with the 422s."""
    app = FastAPI()

    @app.get("/things")
    def things(limit: Annotated[int, Query(ge=1)] = 1) -> dict[str, int]:
        return {"limit": limit}

    schema = with_project_errors(app.openapi())
    answer = schema["paths"]["/things"]["get"]["responses"]["422"]
    assert answer["content"]["application/json"]["schema"] == {"$ref": OURS}
    components = schema["components"]["schemas"]
    assert "ValidationErrorBody" in components and "ErrorItem" in components
    assert not set(STOCK) & set(components)
    for ref in set(_refs(schema)):
        assert ref.removeprefix("#/components/schemas/") in components, ref


def test_credentials_and_bodies_document_their_401_and_413(client, spec):
    """Every route that takes a credential answers 401 without a valid one, and every route
    that reads a body answers 413 for one over the limit: both were answered and documented
    nowhere."""
    for method, path, operation in _operations(spec):
        responses = operation["responses"]
        assert ("401" in responses) == bool(operation.get("security")), (method, path)
        assert ("413" in responses) == ("requestBody" in operation), (method, path)
    worker_routes = [p for _, p, o in _operations(spec) if "401" in o["responses"]]
    assert "/v1/jobs/lease" in worker_routes and "/v1/tasks" in worker_routes
    # The service does answer them on such a route.
    refused = client.post("/v1/jobs/lease", json={"worker_id": 1, "wait_s": 0})
    assert refused.status_code == 401, refused.text
    big = client.post(
        "/v1/jobs/lease",
        content=b'{"worker_id": 1, "pad": "' + b"x" * (2 << 20) + b'"}',
        headers={**WORKER_HEADERS, "Content-Type": "application/json"},
    )
    assert big.status_code == 413, big.text


def test_bodies_document_415_the_api_503_and_registration_409(client, spec):
    """A compressed body is answered 415 (it was a 422 calling gzip's bytes undecodable
    UTF-8); every /v1 route may answer 503 when the database is unavailable, and a
    registration 409 for a name another token holds: all three were answered and documented
    nowhere."""
    for method, path, operation in _operations(spec):
        responses = operation["responses"]
        assert ("415" in responses) == ("requestBody" in operation), (method, path)
        assert ("503" in responses) == (path.startswith("/v1/") or path == "/healthz"), path
    assert "409" in spec["paths"]["/v1/workers"]["post"]["responses"]
    import gzip

    body = gzip.compress(json.dumps({"gpu": "h100", "workload": {"op": "gemm"}}).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    refused = client.post("/v1/tasks", content=body, headers=headers)
    assert refused.status_code == 415, refused.text
    assert refused.json()["detail"].startswith("Content-Encoding 'gzip' is not supported")
    plain = client.post("/v1/tasks", json={}, headers={"Content-Encoding": "identity"})
    assert plain.status_code == 422  # identity is no encoding: the body is read as ever


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_pages_load_their_scripts_from_the_service_not_a_cdn(client, page):
    """FastAPI's own /docs and /redoc load Swagger UI and ReDoc from a CDN: a blank page on a
    fleet's machine with no network. Every script and style they name is the service's."""
    answer = client.get(page)
    assert answer.status_code == 200, answer.text
    html = answer.text
    assert "/openapi.json" in html
    scripts = [
        u for u in re.findall(r'(?:src|href)="([^"]+)"', html) if u.endswith((".js", ".css"))
    ]
    assert scripts, html
    for url in scripts:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        assert client.get(url).status_code == 200, url
    assert "cdn." not in html and "https://" not in html.replace("https://fonts", "")


def test_bounds_are_published_in_json_schemas_words(spec):
    """A bound written after a validator came out as pydantic's "ge"/"le" (59 fields: every
    workload dimension), which JSON Schema does not have: generated clients and validators
    saw no bounds, and schema-driven tests sent negative sizes as valid."""
    foreign = {"ge", "le", "gt", "lt", "multiple_of", "min_length", "max_length"}

    def walk(node: Any, where: str) -> Iterator[str]:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number", "string", "array"):
                for key in foreign & node.keys():
                    yield f"{where}: {key}"
            for key, child in node.items():
                yield from walk(child, f"{where}/{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                yield from walk(child, f"{where}/{i}")

    assert list(walk(spec, "#")) == []
    m = spec["components"]["schemas"]["Gemm"]["properties"]["m"]
    assert (m["minimum"], m["maximum"]) == (1, 1 << 24)


def test_worker_routes_name_the_worker_tokens_header_and_user_routes_the_api_keys(spec):
    """Both headers were one scheme (the default name, APIKeyHeader): every route listed
    X-API-Key, which the worker routes refuse, and X-Worker-Token, which they take, nowhere."""
    schemes = spec["components"]["securitySchemes"]
    headers = {name: s.get("name") for name, s in schemes.items() if s["type"] == "apiKey"}
    assert sorted(headers.values()) == ["X-API-Key", "X-Worker-Token"]
    by_header = {header: name for name, header in headers.items()}

    def schemes_of(method: str, path: str) -> set[str]:
        return {k for s in spec["paths"][path][method].get("security", []) for k in s}

    assert by_header["X-Worker-Token"] in schemes_of("post", "/v1/workers")
    assert by_header["X-API-Key"] not in schemes_of("post", "/v1/workers")
    assert by_header["X-API-Key"] in schemes_of("post", "/v1/tasks")
    assert by_header["X-Worker-Token"] not in schemes_of("post", "/v1/tasks")
