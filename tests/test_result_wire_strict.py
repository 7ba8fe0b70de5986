"""A result's measured numbers (latency_us, samples_us, spread, compile_ms, max_abs_error)
are strict, as every other number of the wire: JSON's true and "12" are a 422 naming the
field on `POST /v1/jobs/{id}/result` and `POST /v1/jobs/results`, and nothing is stored
(`"latency_us": true` was stored as a 1 µs measured best). A JSON integer is a number and is
taken. SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from service_support import GEMM, WORKER_HEADERS, lease, post_result, register

from pipetune.model.trials import MeasureResult

pytest_plugins = ["service_fixtures"]
JSON_WORKER = {**WORKER_HEADERS, "Content-Type": "application/json"}
# Repeats that span the latencies sent below (5 and 12): a latency outside its repeats is
# refused on its own account (service/queue.check_storable).
BASE = {"status": "ok", "latency_us": 5.0, "samples_us": [5.0, 12.0], "spread": 0.0}
FIELDS = ["latency_us", "samples_us", "spread", "compile_ms", "max_abs_error"]


def _with(field: str, value: object) -> dict:
    """BASE with `field` set to `value` (a list of it for samples_us)."""
    return {**BASE, field: [5.0, value] if field == "samples_us" else value}


def _posts(client, worker: int, job: dict, result: dict) -> list:  # type: ignore[no-untyped-def]
    """The result sent on each route, as a JSON library writes it."""
    single = {"worker_id": worker, "lease_token": job["lease_token"], "result": result}
    item = {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": result}
    batch = {"worker_id": worker, "results": [item]}
    return [
        client.post(
            f"/v1/jobs/{job['job_id']}/result", content=json.dumps(single), headers=JSON_WORKER
        ),
        client.post("/v1/jobs/results", content=json.dumps(batch), headers=JSON_WORKER),
    ]


@pytest.mark.parametrize("field", FIELDS)
def test_a_flag_or_text_for_a_measured_number_is_a_422_naming_it(client, field):
    client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 4})
    worker = register(client)
    (job,) = lease(client, worker)
    for value in (True, False, "12", "1e-3"):
        for response in _posts(client, worker, job, _with(field, value)):
            assert response.status_code == 422, (value, response.text)
            body = response.json()
            assert body["field"] == field, body
            assert "valid number" in body["reason"], body
            loc = body["detail"][0]["loc"]
            assert loc[loc.index("result") + 1] == field, body
    (task,) = client.get("/v1/tasks").json()["tasks"]
    assert task["trials_done"] == 0 and task["best"] is None  # nothing stored
    trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    assert all(t["status"] is None for t in trials), trials

    # A JSON integer is a number: taken, and stored as one.
    accepted = post_result(client, worker, job, _with(field, 12))
    assert accepted.status_code == 200 and accepted.json()["accepted"] is True, accepted.text
    trials = client.get(f"/v1/tasks/{task['id']}/trials?samples=true").json()["trials"]
    trial = next(t for t in trials if t["status"] == "ok")
    assert trial[field] == ([5.0, 12.0] if field == "samples_us" else 12.0)


def test_the_model_takes_numbers_and_refuses_flags_and_text():
    """What every producer passes (Python and NumPy numbers, JSON integers) is taken."""
    import numpy as np

    taken = MeasureResult(
        status="ok",
        latency_us=np.float64(5.0),
        samples_us=[5, np.float32(6.0)],
        spread=0,
        compile_ms=np.float64(1.5),
        max_abs_error=0,
    )
    assert taken.latency_us == 5.0 and taken.samples_us == [5.0, 6.0]
    assert (
        MeasureResult.model_validate_json('{"status": "ok", "latency_us": 12}').latency_us == 12.0
    )
    for field in FIELDS:
        for value in (True, "12"):
            with pytest.raises(ValueError, match="valid number"):
                MeasureResult.model_validate(_with(field, value))
