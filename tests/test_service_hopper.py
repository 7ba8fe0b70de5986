"""The Hopper warpgroup-MMA GEMM family through API v1, on SQLite and on PostgreSQL: the
model's pick, a task of the default strategy to its budget, and a Hopper shape asked for on a
GPU without wgmma."""

from __future__ import annotations

import pytest
from service_support import create_task, drain, fake_latency, register, service_of
from sqlalchemy import func, select

from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.space import KNOB_NAMES
from pipetune.service.orm import Base

pytest_plugins = ["service_fixtures"]

FC2 = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
QK = {"op": "hopper_bmm", "b": 12, "m": 1024, "n": 1024, "k": 64}


def test_untuned_hopper_gemm_is_the_models_pick(client):
    response = client.post("/v1/schedules", json={"workload": QK, "gpu": "h100"})
    assert response.status_code == 200, response.text
    doc = response.json()
    workload = parse_any_workload(QK)
    _, _, ranked = family_of(workload).rank(workload, get_gpu("h100"), top=1)
    assert doc["source"] == "model"
    assert doc["schedule"] == ranked[0].schedule and set(doc["schedule"]) == set(KNOB_NAMES)
    assert doc["schedule_id"] == ranked[0].schedule_id and doc["schedule_id"].startswith("wg")
    assert doc["throughput_unit"] == "TFLOP/s"


def test_a_hopper_task_runs_to_its_budget_with_the_default_strategy(client):
    task = create_task(client, budget=16, workload=FC2)
    assert task["strategy"] == "auto" and "hopper_gemm" in task["label"]
    worker = register(client)
    assert drain(client, worker) == 16
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["state"] == "done" and doc["trials_done"] == 16
    trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    workload = parse_any_workload(FC2)
    space = family_of(workload).enumerate(workload, get_gpu("h100"))
    assert len({tuple(sorted(t["schedule"].items())) for t in trials}) == 16
    for t in trials:
        assert family_of(workload).parse_schedule(t["schedule"]) in space
        assert t["latency_us"] == fake_latency(t["schedule"])
    assert doc["best"]["latency_us"] == min(t["latency_us"] for t in trials)


@pytest.mark.parametrize("path", ["/v1/tasks", "/v1/schedules"])
def test_a_hopper_shape_on_a_gpu_without_wgmma_is_refused_naming_why(client, path):
    body = {"workload": FC2, "gpu": "a100"} | ({"budget": 8} if path == "/v1/tasks" else {})
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    doc = response.json()
    assert doc["field"] == "workload", doc
    assert "needs a Hopper GPU" in doc["reason"] and "a100" in doc["reason"], doc
    with service_of(client).db.read() as s:
        counts = [
            s.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables
        ]
    assert set(counts) == {0}


@pytest.mark.parametrize(
    "workload",
    [
        {"op": "hopper_gemm_bias_gelu", "m": 1024, "n": 3072, "k": 768},
        {"op": "hopper_gemm_swiglu", "m": 1024, "n": 4096, "k": 4096},
    ],
)
def test_a_task_of_a_fused_hopper_gemm_is_stored(client, workload):
    """Their op names (21 and 18 characters) did not fit the workloads table's 16:
    PostgreSQL refused every such task with a 500, SQLite kept it."""
    response = client.post("/v1/tasks", json={"workload": workload, "gpu": "h100", "budget": 2})
    assert response.status_code == 201, response.text
    task = client.get(f"/v1/tasks/{response.json()['id']}").json()
    assert task["workload"]["op"] == workload["op"]
