"""A task warm-started from a finished task of the same workload on another GPU
(`prior_task`): what the prior teaches reaches the new task's first batch, every replica
replays it exactly, and a prior that cannot be one is a 422 naming the field. SQLite and
PostgreSQL."""

from __future__ import annotations

import pytest
from service_support import (
    GEMM,
    SMALL_GEMM,
    client_for,
    create_task,
    drain,
    drain_rebuilding,
    fake_latency,
    lease,
    ok,
    post_result,
    register,
)

pytest_plugins = ["service_fixtures"]

SURPRISE_TRIAL = 7  # the prior task's trial that ran far faster than anything else there


def _finished_prior(
    client, gpu: str = "a100", workload=GEMM, budget: int = 16, runner: str = "simulated"
) -> tuple[int, dict]:
    """A finished random-search task on `gpu` in which one schedule (trial SURPRISE_TRIAL)
    was twenty times faster than the rest (a thousand times was faster than the GPU's peak:
    a failed trial, below the task's latency floor), measured by a worker of `runner`;
    returns its id and that schedule."""
    body = {"workload": workload, "gpu": gpu, "budget": budget, "strategy": "random", "seed": 1}
    body["runner"] = runner
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    task = response.json()["id"]
    worker = register(client, name=f"prior-{gpu}-{runner}", gpu=gpu, runner=runner)

    def result_of(job: dict) -> dict:
        scale = 0.05 if job["trial"] == SURPRISE_TRIAL else 1.0
        return ok(fake_latency(job["schedule"]) * scale)

    assert drain(client, worker, result_of) == budget
    assert client.get(f"/v1/tasks/{task}").json()["state"] == "done"
    trials = client.get(f"/v1/tasks/{task}/trials").json()["trials"]
    return task, trials[SURPRISE_TRIAL]["schedule"]


def _trials(client, task_id: int) -> list[dict]:
    return [t["schedule"] for t in client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]]


def test_the_prior_tasks_best_schedule_is_the_first_trial_on_the_new_gpu(client):
    prior, surprise = _finished_prior(client)
    doc = create_task(client, budget=16, strategy="auto", seed=3, prior_task=prior)
    assert doc["prior_task"] == prior and doc["gpu"] == "h100"
    assert client.get(f"/v1/tasks/{doc['id']}").json()["prior_task"] == prior
    control = create_task(client, budget=16, strategy="auto", seed=3)
    assert control["prior_task"] is None
    assert _trials(client, control["id"])[0] != surprise, "the model alone would start there"
    warm = _trials(client, doc["id"])
    assert warm[0] == surprise
    # The rest of the space is the analytical model's to rank (the prior task measured 16
    # schedules of it): the first batch is not only the prior's own trials.
    prior_schedules = _trials(client, prior)
    assert any(s not in prior_schedules for s in warm)


def test_a_bfloat16_task_warm_starts_from_its_float16_twin_on_the_same_gpu(client):
    """One shape in two element types: the same kernels but for their type words, at one
    rate, so the float16 task's measurements are the bfloat16 task's prior on that GPU too
    (a same-workload prior must come from another GPU)."""
    prior, surprise = _finished_prior(client, gpu="h100")
    bf16 = {**GEMM, "dtype": "bfloat16"}
    doc = create_task(client, budget=16, strategy="auto", seed=3, prior_task=prior, workload=bf16)
    assert doc["prior_task"] == prior and doc["gpu"] == "h100"
    assert _trials(client, doc["id"])[0] == surprise
    # And back: a float16 task from a finished bfloat16 one.
    back, back_surprise = _finished_prior(client, gpu="h200", workload=bf16)
    again = create_task(client, budget=8, gpu="h200", strategy="auto", prior_task=back)
    assert _trials(client, again["id"])[0] == back_surprise
    # Another shape in bfloat16 is another workload, as before.
    other = {**SMALL_GEMM, "dtype": "bfloat16"}
    body = {"workload": other, "gpu": "h100", "budget": 8, "prior_task": prior}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422 and "tuned another workload" in response.text


def test_a_task_with_a_prior_replays_exactly_on_a_replica_with_empty_caches(db_url):
    with client_for(db_url) as a:
        prior, _ = _finished_prior(a)
        kept = create_task(a, budget=24, strategy="analytical+xgb", seed=4, prior_task=prior)
        rebuilt = create_task(a, budget=24, strategy="analytical+xgb", seed=4, prior_task=prior)
        worker = register(a)
        # Each advance of `rebuilt` reads the prior again from the prior task's trials.
        assert drain_rebuilding(a, worker, rebuilt["id"]) == 48
        for task in (kept, rebuilt):
            doc = a.get(f"/v1/tasks/{task['id']}").json()
            assert doc["state"] == "done" and doc["error"] is None and doc["trials_done"] == 24
        assert _trials(a, rebuilt["id"]) == _trials(a, kept["id"])


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"prior_task": 987654}, "prior_task", "task 987654 does not exist"),
        ({"prior_task": "unfinished"}, "prior_task", "a prior must be a finished task"),
        ({"prior_task": "other workload"}, "prior_task", "tuned another workload (gemm 256x"),
        ({"prior_task": "same gpu"}, "prior_task", "ran on a100 too: a prior is the same"),
        ({"prior_task": "same gpu"}, "prior_task", "or its twin in the other element type"),
        ({"prior_task": "all failed"}, "prior_task", "has no successful trial"),
        ({"strategy": "random"}, "strategy", "strategy 'random' takes no prior (these do: bo,"),
        ({"prior_task": 0}, "prior_task", "greater than or equal to 1"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_prior_that_cannot_be_one_is_a_422_naming_the_field(client, change, field, reason):
    prior, _ = _finished_prior(client)
    named = {
        "unfinished": lambda: create_task(client, budget=8)["id"],
        "other workload": lambda: _finished_prior(client, "h100", SMALL_GEMM)[0],
        "same gpu": lambda: prior,
        "all failed": lambda: _all_failed(client),
    }
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, "prior_task": prior, **change}
    if change.get("prior_task") == "same gpu":
        body["gpu"] = "a100"
    if isinstance(body["prior_task"], str):
        body["prior_task"] = named[body["prior_task"]]()
    before = len(client.get("/v1/tasks").json()["tasks"])
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", field] and reason in error["reason"], error
    assert response.json()["field"] == field
    assert len(client.get("/v1/tasks").json()["tasks"]) == before  # nothing half-written


def _all_failed(client) -> int:
    body = {"workload": GEMM, "gpu": "h200", "budget": 4, "strategy": "random"}
    task = client.post("/v1/tasks", json=body).json()["id"]
    worker = register(client, name="failing-h200", gpu="h200")
    drain(client, worker, lambda job: {"status": "compile_error", "error": "ptxas"})
    assert client.get(f"/v1/tasks/{task}").json()["state"] == "done"
    return task


def test_schedules_with_tune_takes_a_prior_and_names_its_field(client):
    prior, surprise = _finished_prior(client)
    body = {"workload": GEMM, "gpu": "h100", "tune": {"budget": 8, "prior_task": prior}}
    response = client.post("/v1/schedules", json=body)
    assert response.status_code == 202, response.text
    task = response.json()["task_id"]
    assert client.get(f"/v1/tasks/{task}").json()["prior_task"] == prior
    assert _trials(client, task)[0] == surprise
    body["tune"]["prior_task"] = task  # unfinished
    response = client.post("/v1/schedules", json=body)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "tune", "prior_task"], error
    body["tune"] = {"budget": 8, "prior_gpu": "h200"}  # nothing finished there
    response = client.post("/v1/schedules", json=body)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "tune", "prior_gpu"], error
    body["tune"] = {"budget": 8, "prior_gpu": "a100"}
    response = client.post("/v1/schedules", json=body)
    assert response.status_code == 202, response.text
    assert client.get(f"/v1/tasks/{response.json()['task_id']}").json()["prior_task"] == prior


def test_a_replica_that_never_saw_the_task_created_continues_it_with_its_prior(db_url):
    with client_for(db_url) as a:
        prior, surprise = _finished_prior(a)
        task = create_task(a, budget=16, prior_task=prior)["id"]
    with client_for(db_url) as b:  # (a's process is gone: b rebuilds the session)
        worker = register(b)
        [first] = lease(b, worker, max_jobs=1)
        assert first["schedule"] == surprise
        assert post_result(b, worker, first, ok(1.0)).json()["accepted"]
        assert drain(b, worker) == 15
        doc = b.get(f"/v1/tasks/{task}").json()
        assert doc["state"] == "done" and doc["error"] is None and doc["trials_done"] == 16


def test_prior_gpu_names_the_task_there_with_most_successes_and_records_it(client):
    older, _ = _finished_prior(client)
    newer, surprise = _finished_prior(client)
    _finished_prior(client, budget=8)  # the newest, with fewer measurements
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, "prior_gpu": "A100"}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 201, response.text
    doc = response.json()
    assert doc["prior_task"] == newer != older  # 16 successes each: the newer of the two
    assert _trials(client, doc["id"])[0] == surprise


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"prior_gpu": "h200"}, "no finished task of this workload on h200"),
        ({"prior_gpu": "h100"}, "h100 is this task's GPU"),
        ({"prior_gpu": "v100"}, "unknown GPU 'v100'"),
        ({"prior_gpu": "a100", "prior_task": 1}, "give prior_task or prior_gpu, not both"),
    ],
    ids=["none there", "same gpu", "unknown gpu", "both"],
)
def test_a_prior_gpu_that_cannot_give_a_prior_is_a_422(client, change, reason):
    _finished_prior(client)
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, **change}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "prior_gpu" and reason in response.json()["reason"]


@pytest.mark.parametrize("finished_there", [False, True], ids=["none there", "one there"])
def test_a_strategy_without_a_prior_is_named_whatever_the_prior_gpu_has(client, finished_there):
    """The 422 names `strategy` for a strategy that takes no prior, before the other GPU is
    looked at: it named `prior_gpu` while the GPU had no finished task, then `strategy` once
    it had one, so a client that fixed the first got a second 422."""
    if finished_there:
        _finished_prior(client)
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, "strategy": "grid", "prior_gpu": "a100"}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "strategy", response.text
    assert "takes no prior" in response.json()["reason"]


def test_a_task_of_gpu_measurements_takes_no_simulated_prior(client):
    """A task for cupy workers only was warm-started from a simulated task without a word:
    the analytical model's own numbers steering a measured search. Named, it is a 422;
    through prior_gpu, the measured task there is taken, and none measured is a 422."""
    simulated, _ = _finished_prior(client, runner="simulated")
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, "runner": "cupy"}
    refused = client.post("/v1/tasks", json={**body, "prior_task": simulated})
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "prior_task"
    assert "not all measured on a GPU" in refused.json()["reason"]
    none_there = client.post("/v1/tasks", json={**body, "prior_gpu": "a100"})
    assert none_there.status_code == 422 and none_there.json()["field"] == "prior_gpu"
    assert "measured on a GPU" in none_there.json()["reason"]
    # A task any worker may take still warm-starts from the simulated one.
    anyone = client.post("/v1/tasks", json={**body, "runner": None, "prior_task": simulated})
    assert anyone.status_code == 201, anyone.text


def test_prior_gpu_takes_a_measured_task_before_a_larger_simulated_one(client):
    measured, _ = _finished_prior(client, runner="cupy", budget=8)
    simulated, _ = _finished_prior(client, runner="simulated", budget=16)  # more, and newer
    for runner in ("cupy", None):
        body = {"workload": GEMM, "gpu": "h100", "budget": 8, "prior_gpu": "a100"}
        response = client.post("/v1/tasks", json={**body, "runner": runner})
        assert response.status_code == 201, response.text
        assert response.json()["prior_task"] == measured != simulated


def test_a_prior_gpu_with_no_schedule_in_common_is_a_422_naming_prior_gpu(client):
    """prior_gpu resolves to a task, and the 422 named `prior_task`, a field the request
    never gave. The H100 task's successes here are all schedules an A100 cannot run."""
    from pipetune.model.hardware import get_gpu
    from pipetune.model.space import Schedule, Space
    from pipetune.model.workloads import parse_workload

    on_a100 = {s.id for s in Space.enumerate(parse_workload(GEMM), get_gpu("a100"))}
    body = {"workload": GEMM, "gpu": "h100", "budget": 48, "strategy": "random", "seed": 1}
    task = client.post("/v1/tasks", json=body).json()["id"]
    worker = register(client, name="h100-only", gpu="h100")

    def result_of(job: dict) -> dict:
        if Schedule(**job["schedule"]).id in on_a100:
            return {"status": "compile_error", "error": "made to fail"}
        return ok(fake_latency(job["schedule"]))

    drain(client, worker, result_of)
    trials = client.get(f"/v1/tasks/{task}/trials").json()["trials"]
    assert any(t["status"] == "ok" for t in trials)  # what this test needs of the seed
    body = {"workload": GEMM, "gpu": "a100", "budget": 8, "prior_gpu": "h100"}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "prior_gpu", response.text
    assert "no configuration of this space ran there" in response.json()["reason"]


@pytest.mark.parametrize("prior", ["prior_task", "prior_gpu"])
def test_a_prior_for_a_workload_the_gpu_cannot_run_names_the_workload(client, prior):
    """A Hopper-only GEMM on an A100 with a prior from the H100 was a 422 on the prior's field
    ("no configuration of this space ran there"), sending the user to fix the prior; without
    the prior the same request named the workload, which is what is wrong."""
    hopper = {"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}
    first = {"workload": hopper, "gpu": "h100", "budget": 4, "strategy": "random"}
    task = create_task(client, **first)["id"]
    assert drain(client, register(client, name="h100", gpu="h100")) == 4
    body = {"workload": hopper, "gpu": "a100", "budget": 4}
    body[prior] = task if prior == "prior_task" else "h100"
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "workload", response.text
    assert "needs a Hopper GPU" in response.json()["reason"]
