"""A latency no GPU can reach is no measurement. A worker's 0.001 us for a 1024^3 GEMM on
an H100 (2,000 times its peak tensor throughput), consistent with its own samples, was
stored as a valid trial and became the task's best, its curve and the workload's answer to
POST /v1/schedules. A task keeps the least latency its workload can take on its GPU
(tasks.latency_floor_us, from its FLOPs at a few times the GPU's peak, set when it is made);
a result below it is recorded as a failed trial that says why, and answered accepted (the
worker neither retries it nor measures it again), on both routes and both databases."""

from __future__ import annotations

import pytest
from service_support import (
    GEMM,
    create_task,
    job_row,
    lease,
    ok,
    post_result,
    post_results,
    register,
    result_item,
    service_of,
)
from sqlalchemy import update

from pipetune.model.hardware import get_gpu
from pipetune.service.orm import (
    LATENCY_FLOOR_PEAK_FACTOR,
    TaskRow,
    latency_floor_us,
)

pytest_plugins = ["service_fixtures"]

IMPOSSIBLE = {"status": "ok", "latency_us": 0.001, "samples_us": [0.001, 0.001, 0.001]}
GEMM_FLOPS = 2 * 1024**3


def _h100_peak_flops() -> float:
    """The H100's peak dense tensor FLOP/s the bound counts: the spec sheet's or the shipped
    profile's (measured above the sheet's boost clock), the higher."""
    sheet = get_gpu("h100", calibrated=False).peak_tensor_tflops
    return max(sheet, get_gpu("h100", user_profile=False).peak_tensor_tflops) * 1e12


FLOOR_US = GEMM_FLOPS / (LATENCY_FLOOR_PEAK_FACTOR * _h100_peak_flops()) * 1e6


def _implausible(detail: str) -> None:
    assert detail.startswith(
        "implausible latency: latency_us 0.001 (samples_us 0.001 to 0.001) is below "
        f"{FLOOR_US:.4g} us, the least this task's workload can take on its GPU"
    ), detail


def test_the_bound_is_generous_and_bounds_only_what_the_model_knows():
    assert latency_floor_us("gemm", GEMM_FLOPS, "h100") == pytest.approx(FLOOR_US)
    # Generous: at twice the peak (the sparse rate, which dense kernels never reach) a
    # latency is still above it.
    assert GEMM_FLOPS / (2 * _h100_peak_flops()) * 1e6 > FLOOR_US
    assert latency_floor_us("hopper_gemm", GEMM_FLOPS, "h100") == pytest.approx(FLOOR_US)
    assert latency_floor_us("gemm", GEMM_FLOPS, "NVIDIA H100 80GB HBM3") == pytest.approx(FLOOR_US)
    # A memory-bound operator's work is bytes: caches beat DRAM, no bound from them.
    assert latency_floor_us("softmax", 1e9, "h100") is None
    # A GPU (or an op) the model does not know: no bound.
    assert latency_floor_us("gemm", GEMM_FLOPS, "rtx-9999") is None
    assert latency_floor_us("no_such_op", GEMM_FLOPS, "h100") is None


def test_a_task_keeps_its_floor_from_its_creation(client):
    task = create_task(client, budget=2, strategy="grid")
    with service_of(client).db.read() as s:
        floor = s.get(TaskRow, task["id"]).latency_floor_us
    assert floor == pytest.approx(FLOOR_US)


def test_an_impossible_latency_is_recorded_as_a_failed_trial_never_the_best(client):
    task = create_task(client, budget=4, strategy="grid", batch_size=4)
    worker = register(client)
    jobs = lease(client, worker, max_jobs=2)
    implausible = service_of(client).metrics.results_implausible
    before = implausible._value.get()
    response = post_result(client, worker, jobs[0], IMPOSSIBLE)
    assert response.status_code == 200, response.text
    assert implausible._value.get() == before + 1
    answer = response.json()
    assert (answer["accepted"], answer["job_state"]) == (True, "failed")
    _implausible(answer["detail"])

    job = job_row(client, jobs[0]["job_id"])
    assert (job.state, job.status, job.latency_us, job.samples_us) == (
        "failed",
        "runtime_error",
        None,
        [],
    )
    _implausible(job.error)
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["trials_failed"], doc["best"]) == (1, 1, None)

    # Sent again (its answer lost): a duplicate, nothing counted twice.
    again = post_result(client, worker, jobs[0], IMPOSSIBLE).json()
    assert (again["accepted"], again["job_state"], again["detail"]) == (
        True,
        "failed",
        "duplicate: already recorded",
    )
    assert implausible._value.get() == before + 1  # (a repeat is recorded by nobody: not counted)
    # Another result on that lease conflicts with the failure recorded.
    other = post_result(client, worker, jobs[0], ok(30.0)).json()
    assert other["accepted"] is False
    assert other["detail"].startswith(
        "conflict: a different result is already recorded for this lease "
        "(recorded runtime_error, sent ok 30 us;"
    )

    assert post_result(client, worker, jobs[1], ok(30.0)).json()["detail"] is None
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["trials_failed"]) == (2, 1)
    assert doc["best"]["latency_us"] == 30.0
    points = client.get(f"/v1/tasks/{task['id']}/curve").json()["points"]
    assert all(p["best_latency_us"] in (None, 30.0) for p in points), points
    best = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert (best["source"], best["latency_us"]) == ("measured", 30.0)


def test_the_batched_route_records_the_impossible_one_as_failed_and_the_rest_as_sent(client):
    task = create_task(client, budget=4, strategy="grid", batch_size=4)
    worker = register(client)
    jobs = lease(client, worker, max_jobs=4)
    items = [result_item(jobs[0], IMPOSSIBLE), result_item(jobs[1], ok(30.0))]
    acks = post_results(client, worker, items)
    assert [(a["accepted"], a["job_state"]) for a in acks] == [(True, "failed"), (True, "done")]
    _implausible(acks[0]["detail"])
    assert acks[1]["detail"] is None
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["trials_failed"]) == (2, 1)
    assert doc["best"]["latency_us"] == 30.0

    # The whole request again: duplicates both.
    again = post_results(client, worker, items)
    assert [(a["accepted"], a["detail"]) for a in again] == [
        (True, "duplicate: already recorded"),
        (True, "duplicate: already recorded"),
    ]
    # An impossible result and a real one for the same lease in one request: the real one
    # is recorded (the first that may be), the impossible one conflicts with it.
    acks = post_results(
        client, worker, [result_item(jobs[2], IMPOSSIBLE), result_item(jobs[2], ok(40.0))]
    )
    assert [a["accepted"] for a in acks] == [False, True]
    assert acks[0]["detail"].startswith(
        "conflict: a different result is already recorded for this lease "
        "(recorded ok 40 us, sent ok 0.001 us;"
    )
    assert job_row(client, jobs[2]["job_id"]).latency_us == 40.0
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["trials_failed"]) == (3, 1)


def test_a_latency_at_the_floor_or_twice_the_peak_is_a_measurement(client):
    """Generous: the floor itself, and a latency at twice the GPU's peak (what no dense
    kernel reaches), are recorded as sent."""
    task = create_task(client, budget=2, strategy="grid", batch_size=2)
    with service_of(client).db.read() as s:
        floor = s.get(TaskRow, task["id"]).latency_floor_us  # (as stored, to the last bit)
    worker = register(client)
    jobs = lease(client, worker, max_jobs=2)
    at_twice_the_peak = GEMM_FLOPS / (2 * _h100_peak_flops()) * 1e6
    for job, latency in zip(jobs, (floor, at_twice_the_peak), strict=True):
        answer = post_result(client, worker, job, ok(latency)).json()
        assert (answer["accepted"], answer["job_state"]) == (True, "done"), answer
        assert job_row(client, job["job_id"]).latency_us == latency


def test_a_task_without_a_floor_takes_any_latency(client):
    """A task from before revision 0014 (or of a GPU the model does not know) has none:
    results are recorded as sent, as before."""
    task = create_task(client, budget=2, strategy="grid")
    with service_of(client).db.write() as s:
        s.execute(update(TaskRow).where(TaskRow.id == task["id"]).values(latency_floor_us=None))
    worker = register(client)
    (job,) = lease(client, worker)
    answer = post_result(client, worker, job, IMPOSSIBLE).json()
    assert (answer["accepted"], answer["job_state"], answer["detail"]) == (True, "done", None)
    assert job_row(client, job["job_id"]).latency_us == 0.001
