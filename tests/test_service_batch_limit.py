"""A batched GEMM whose batch the kernel grid cannot hold is a 422 naming b, not a task."""

from __future__ import annotations

import pytest

pytest_plugins = ["service_fixtures"]


@pytest.mark.parametrize("op", ["bmm", "hopper_bmm"])
def test_a_batch_over_the_grid_z_limit_is_a_422_naming_b(client, op):
    workload = {"op": op, "b": 65536, "m": 64, "n": 64, "k": 64}
    for path, body in (
        ("/v1/tasks", {"workload": workload, "gpu": "h100", "budget": 10}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100"}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        error = response.json()
        assert error["field"] == "b", error
        assert "at most 65535" in error["reason"], error
    assert client.get("/v1/tasks").json()["tasks"] == []
