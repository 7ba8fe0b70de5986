"""Property-based requests generated from the OpenAPI document (schemathesis): whatever
the body, query or path, the service answers with a documented status, never a 5xx."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from service_support import TOKEN, client_for

pytest_plugins = ["service_fixtures"]
SKIP = ("/metrics", "/dashboard")


def test_no_generated_request_makes_the_service_fail(db_url):
    with client_for(db_url) as client:
        client.post(
            "/v1/tasks",
            json={"workload": {"op": "gemm", "m": 64, "n": 64, "k": 64}, "gpu": "a100"},
        )
        schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
        checked = []
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.path.startswith(SKIP):
                continue

            @given(case=operation.as_strategy())
            @settings(
                max_examples=12,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def call(case):
                response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
                assert response.status_code < 500, (case.method, case.path, response.text)
                assert response.status_code in {200, 201, 202, 401, 403, 404, 409, 413, 422}

            call()
            checked.append(f"{operation.method.upper()} {operation.path}")
    assert "POST /v1/tasks" in checked and "POST /v1/jobs/{job_id}/result" in checked
