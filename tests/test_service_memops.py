"""The memory-intensive family through API v1, on SQLite and on PostgreSQL: schedules, tasks
to their budget, trials, curves and bad input, as GEMM workloads get them."""

from __future__ import annotations

import math

import pytest
from service_support import create_task, drain, fake_latency, ok, register, service_of
from sqlalchemy import func, select

from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import KNOB_NAMES as MEM_KNOBS
from pipetune.model.space import KNOB_NAMES as GEMM_KNOBS
from pipetune.service.orm import Base

pytest_plugins = ["service_fixtures"]

SOFTMAX = {"op": "softmax", "rows": 4096, "cols": 768}
LAYERNORM = {"op": "layernorm", "rows": 1024, "cols": 768, "eps": 1e-5}
RMSNORM = {"op": "rmsnorm", "rows": 2048, "cols": 4096, "eps": 1e-5}


def _rows(client) -> dict[str, int]:
    with service_of(client).db.read() as s:
        return {
            t.name: s.scalar(select(func.count()).select_from(t))
            for t in Base.metadata.sorted_tables
        }


def test_untuned_softmax_is_the_models_pick_in_gb_per_s(client):
    response = client.post("/v1/schedules", json={"workload": SOFTMAX, "gpu": "h100"})
    assert response.status_code == 200, response.text
    doc = response.json()
    workload = parse_any_workload(SOFTMAX)
    fam = family_of(workload)
    _, _, ranked = fam.rank(workload, get_gpu("h100"), top=1)
    assert doc["source"] == "model"
    assert doc["schedule"] == ranked[0].schedule
    assert set(doc["schedule"]) == set(MEM_KNOBS)
    assert doc["schedule_id"] == ranked[0].schedule_id and doc["schedule_id"].startswith("m-")
    assert doc["throughput_unit"] == "GB/s"
    assert doc["tflops"] is None  # API v1's field is only given in TFLOP/s
    expected = fam.throughput_of(workload, doc["predicted_us"])
    assert math.isclose(doc["throughput"], expected, rel_tol=1e-9)


def test_a_layernorm_task_runs_to_its_budget_with_memops_schedules(client):
    task = create_task(client, budget=12, workload=LAYERNORM, strategy="random")
    assert task["label"] and "layernorm" in task["label"]
    worker = register(client)
    assert drain(client, worker) == 12
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["state"] == "done" and doc["trials_done"] == 12

    trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    assert [t["trial"] for t in trials] == list(range(12))
    assert len({tuple(sorted(t["schedule"].items())) for t in trials}) == 12
    workload = parse_any_workload(LAYERNORM)
    space = family_of(workload).enumerate(workload, get_gpu("h100"))
    for t in trials:
        assert set(t["schedule"]) == set(MEM_KNOBS)
        assert family_of(workload).parse_schedule(t["schedule"]) in space  # a valid schedule
        assert t["latency_us"] == fake_latency(t["schedule"])
        assert t["schedule_label"]

    best = doc["best"]
    assert best["latency_us"] == min(t["latency_us"] for t in trials)
    assert best["throughput_unit"] == "GB/s" and best["tflops"] is None
    work = family_of(workload).work(workload)
    assert math.isclose(best["throughput"], work / (best["latency_us"] * 1e-6) / 1e9)

    curve = client.get(f"/v1/tasks/{task['id']}/curve").json()
    assert curve["throughput_unit"] == "GB/s"
    throughputs = [p["best_throughput"] for p in curve["points"]]
    assert len(throughputs) == 12 and throughputs == sorted(throughputs)  # never gets worse
    assert all(p["best_tflops"] is None for p in curve["points"])
    assert math.isclose(throughputs[-1], best["throughput"])

    measured = client.post("/v1/schedules", json={"workload": LAYERNORM, "gpu": "h100"}).json()
    assert measured["source"] == "measured" and measured["runner"] == "simulated"
    assert measured["latency_us"] == best["latency_us"]
    assert measured["throughput_unit"] == "GB/s"


def test_an_rmsnorm_task_tunes_with_the_default_strategy(client):
    """The default strategy (the analytical model as the prior) proposes RMS norm schedules:
    valid, distinct, gamma's bytes counted in the throughput."""
    task = create_task(client, budget=16, workload=RMSNORM)
    assert "rmsnorm 2048x4096" in task["label"]
    worker = register(client)
    assert drain(client, worker) == 16
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["state"] == "done" and doc["trials_done"] == 16
    trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    workload = parse_any_workload(RMSNORM)
    space = family_of(workload).enumerate(workload, get_gpu("h100"))
    assert len({tuple(sorted(t["schedule"].items())) for t in trials}) == 16
    assert all(family_of(workload).parse_schedule(t["schedule"]) in space for t in trials)
    best = doc["best"]
    read_and_written = 2 * (2 * 2048 * 4096 + 4096)  # x in, y out, gamma once
    assert family_of(workload).work(workload) == read_and_written
    assert math.isclose(best["throughput"], read_and_written / (best["latency_us"] * 1e-6) / 1e9)


def test_gemm_results_keep_api_v1_tflops(client):
    task = create_task(client, budget=4, strategy="random")
    worker = register(client)
    assert drain(client, worker, lambda job: ok(100.0)) == 4
    best = client.get(f"/v1/tasks/{task['id']}").json()["best"]
    assert best["throughput_unit"] == "TFLOP/s"
    assert best["tflops"] == best["throughput"] > 0
    assert set(best["schedule"]) == set(GEMM_KNOBS)


BAD_MEMOPS = [
    ({**SOFTMAX, "cols": 100}, "cols", "multiple of 8"),
    ({**SOFTMAX, "rows": 0}, "rows", "greater than or equal to 1"),
    ({**SOFTMAX, "cols": 1 << 30}, "cols", "less than or equal to"),
    ({**SOFTMAX, "rows": "4096"}, "rows", "valid integer"),
    ({**SOFTMAX, "m": 64}, "m", "Extra inputs are not permitted"),
    ({"op": "softmaxx", "rows": 64, "cols": 64}, "op", "unknown operator"),
    ({**LAYERNORM, "eps": 0}, "eps", "greater than 0"),
    ({**RMSNORM, "beta": 0.5}, "beta", "Extra inputs are not permitted"),
    ({**RMSNORM, "eps": 1e-40}, "eps", "smallest normal"),
    ({"op": "bias_gelu", "rows": 8, "cols": 64, "approximate": "fast"}, "approximate", "'tanh'"),
]


@pytest.mark.parametrize(("workload", "field", "reason"), BAD_MEMOPS)
def test_bad_memops_workloads_name_the_field_and_write_nothing(client, workload, field, reason):
    for path, body in (
        ("/v1/tasks", {"workload": workload, "gpu": "h100", "budget": 10}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100"}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100", "tune": {"budget": 5}}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        doc = response.json()
        assert doc["field"] == field, doc
        assert reason in doc["reason"], doc
    assert set(_rows(client).values()) == {0}
