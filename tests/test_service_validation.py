"""Bad input gets a 422 that names the field and the reason, and writes nothing."""

from __future__ import annotations

import pytest
from service_support import (
    GEMM,
    WORKER_HEADERS,
    client_for,
    lease,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import func, select

from pipetune.service.driver import Driver
from pipetune.service.orm import Base

pytest_plugins = ["service_fixtures"]
JSON_WORKER = {**WORKER_HEADERS, "Content-Type": "application/json"}

BAD_WORKLOADS = [
    ({"op": "transpose", "m": 64}, "op", "unknown operator"),
    ({"m": 64, "n": 64, "k": 64}, "op", "missing"),
    ({**GEMM, "m": -5}, "m", "greater than or equal to 1 (got -5)"),
    ({**GEMM, "n": 0}, "n", "greater than or equal to 1 (got 0)"),
    ({**GEMM, "k": 1001}, "k", "must be a multiple of 8"),
    ({**GEMM, "m": "1024"}, "m", "valid integer"),
    ({**GEMM, "m": 1.5}, "m", "valid integer"),
    ({**GEMM, "dtype": "float32"}, "dtype", "float16"),
    ({**GEMM, "alpha": 2}, "alpha", "Extra inputs are not permitted"),
    (
        {"op": "conv2d", "n": 1, "h": 8, "w": 8, "c": 8, "k": 8, "r": 3, "s": 3, "pad": 3},
        "pad",
        "must be smaller than the filter size",
    ),
    ({"op": "bmm", "b": 2, "m": 64, "n": 60, "k": 64}, "n", "multiple of 8"),
]


def _row_counts(client) -> dict[str, int]:
    service = service_of(client)
    with service.db.read() as s:
        return {
            t.name: s.scalar(select(func.count()).select_from(t))
            for t in Base.metadata.sorted_tables
        }


def _assert_422(response, field: str, reason: str) -> dict:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field, body
    assert reason in body["reason"], body
    assert body["detail"][0]["field"] == field
    return body


@pytest.mark.parametrize(("workload", "field", "reason"), BAD_WORKLOADS)
def test_bad_workloads_name_the_field(client, workload, field, reason):
    for path, body in (
        ("/v1/tasks", {"workload": workload, "gpu": "h100", "budget": 10}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100"}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100", "tune": {"budget": 5}}),
    ):
        _assert_422(client.post(path, json=body), field, reason)
    assert set(_row_counts(client).values()) == {0}


def test_misaligned_k_points_at_k(client):
    body = _assert_422(
        client.post("/v1/tasks", json={"workload": {**GEMM, "k": 1001}, "gpu": "h100"}),
        "k",
        "multiple of 8",
    )
    assert body["detail"][0]["loc"] == ["body", "workload", "k"]


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"gpu": "v100"}, "gpu", "unknown GPU 'v100'"),
        ({"gpu": 5}, "gpu", "valid string"),
        ({"budget": 0}, "budget", "greater than or equal to 1"),
        ({"budget": -3}, "budget", "greater than or equal to 1"),
        ({"budget": 5001}, "budget", "less than or equal to 5000"),
        ({"strategy": "bayes"}, "strategy", "Input should be"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"priority": 1}, "priority", "Extra inputs"),
    ],
)
def test_bad_task_fields_name_the_field(client, change, field, reason):
    body = {"workload": GEMM, "gpu": "h100", "budget": 10, **change}
    _assert_422(client.post("/v1/tasks", json=body), field, reason)
    assert set(_row_counts(client).values()) == {0}


@pytest.mark.parametrize("budget", [0, 5001])
def test_a_bad_tune_budget_is_refused_and_nothing_is_tuned(client, budget):
    body = {"workload": GEMM, "gpu": "h100", "tune": {"budget": budget}}
    error = _assert_422(client.post("/v1/schedules", json=body), "budget", "than or equal")
    assert error["detail"][0]["loc"] == ["body", "tune", "budget"]
    assert set(_row_counts(client).values()) == {0}


@pytest.mark.parametrize(
    "raw",
    [b'{"workload": {"op": "gemm", ', b"not json", b"[1, 2]", b""],
)
def test_malformed_json_is_a_422(client, raw):
    response = client.post("/v1/tasks", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "body" or response.json()["detail"]
    assert set(_row_counts(client).values()) == {0}


def test_malformed_json_says_so(client):
    response = client.post(
        "/v1/schedules", content=b'{"gpu": "h100",', headers={"Content-Type": "application/json"}
    )
    _assert_422(response, "body", "malformed JSON")


def test_bad_query_parameters(client):
    _assert_422(client.get("/v1/tasks/1/trials?after=-5"), "after", "greater than or equal")
    _assert_422(client.get("/v1/tasks?limit=0"), "limit", "greater than or equal to 1")
    _assert_422(client.get("/v1/curves?gpu=v100"), "gpu", "unknown GPU")
    _assert_422(client.get("/v1/tasks?state=sleeping"), "state", "Input should be")


def test_task_creation_is_all_or_nothing(db_url, monkeypatch):
    def broken_insert(*args, **kwargs):
        raise RuntimeError("disk full while writing the first batch")

    with client_for(db_url) as c:
        monkeypatch.setattr(Driver, "_insert_jobs", staticmethod(broken_insert))
        with pytest.raises(RuntimeError, match="disk full"):
            c.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 10})
        # Neither the task nor its workload row was left behind.
        assert set(_row_counts(c).values()) == {0}
        monkeypatch.undo()
        assert c.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100"}).status_code == 201
        counts = _row_counts(c)
        assert counts["tasks"] == 1 and counts["workloads"] == 1 and counts["jobs"] == 8


def test_results_a_trial_row_cannot_hold_are_refused(client):
    client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 1})
    worker = register(client)
    (job,) = lease(client, worker)
    url = f"/v1/jobs/{job['job_id']}/result"
    start = f'{{"worker_id": {worker}, "lease_token": "{job["lease_token"]}", "result": '
    infinite = (start + '{"status": "ok", "latency_us": Infinity}}').encode()
    response = client.post(url, content=infinite, headers=JSON_WORKER)
    _assert_422(response, "latency_us", "finite")
    huge = {"status": "ok", "latency_us": 5.0, "registers": 2**40}
    _assert_422(post_result(client, worker, job, huge), "registers", "at most")
    assert post_result(client, worker, job, ok(5.0)).json()["accepted"] is True
    beat = client.post(
        f"/v1/workers/{worker}/heartbeat", json={"busy_jobs": 2**70}, headers=WORKER_HEADERS
    )
    assert beat.status_code == 200
    assert client.get(f"/v1/tasks/{2**40}").status_code == 422


def test_an_error_that_echoes_a_nul_is_still_a_422(client):
    """Found by the schema fuzzer: the 422 body quoting `gpu=\\x00` failed its own validation."""
    response = client.get("/v1/curves", params={"gpu": "\x00"})
    assert response.status_code == 422
    assert "gpu" in response.text
