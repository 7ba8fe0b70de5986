"""API v1 through FastAPI's TestClient, on SQLite and on PostgreSQL."""

from __future__ import annotations

import errno
import math
import os
import sys

import pytest
from service_support import (
    GEMM,
    SMALL_GEMM,
    TOKEN,
    WORKER_HEADERS,
    client_for,
    create_task,
    drain,
    fake_latency,
    lease,
    metric_value,
    ok,
    post_result,
    register,
    service_of,
)

from pipetune.model.analytical import rank
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.workloads import parse_workload

pytest_plugins = ["service_fixtures"]


def test_schedule_of_an_untuned_workload_is_the_models_pick(client):
    response = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"})
    assert response.status_code == 200, response.text
    doc = response.json()
    _, _, ranked = rank(parse_workload(GEMM), get_gpu("h100"), top=1)
    assert doc["source"] == "model"
    assert doc["schedule"] == ranked[0].schedule
    assert doc["schedule_id"] == ranked[0].schedule_id
    assert math.isclose(doc["predicted_us"], ranked[0].terms["predicted_us"])
    assert doc["latency_us"] is None and doc["task_id"] is None
    assert doc["gpu"] == "h100" and doc["workload"]["m"] == 1024


def test_a_measured_answer_names_the_device_its_worker_registered(client):
    """`pipetune export`'s index.json named the GPU by its key only: which board measured the
    time was in a T4 export and nowhere else."""
    body = {"name": "w1", "gpu": "h100", "arch": "sm_90", "runner": "cupy"}
    body["device_name"] = "NVIDIA H100 80GB HBM3"
    worker = client.post("/v1/workers", json=body, headers=WORKER_HEADERS).json()["id"]
    create_task(client, budget=8, strategy="random")
    drain(client, worker)
    doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert doc["source"] == "measured" and doc["runner"] == "cupy"
    assert doc["device_name"] == "NVIDIA H100 80GB HBM3"
    model = client.post("/v1/schedules", json={"workload": SMALL_GEMM, "gpu": "h100"}).json()
    assert model["source"] == "model" and model["device_name"] is None


def test_schedule_with_tune_creates_a_task_and_then_answers_measured(client):
    body = {"workload": SMALL_GEMM, "gpu": "H100", "tune": {"budget": 8, "strategy": "random"}}
    response = client.post("/v1/schedules", json=body)
    assert response.status_code == 202, response.text
    doc = response.json()
    assert doc["source"] == "model" and doc["gpu"] == "h100"
    task_id = doc["task_id"]
    assert doc["url"].endswith(f"/v1/tasks/{task_id}")
    assert client.get(doc["url"]).json()["id"] == task_id

    worker = register(client)
    latencies = {}

    def answer(job):
        latencies[job["job_id"]] = fake_latency(job["schedule"])
        return ok(latencies[job["job_id"]])

    assert drain(client, worker, answer) == 8
    measured = client.post("/v1/schedules", json={"workload": SMALL_GEMM, "gpu": "h100"})
    assert measured.status_code == 200
    best = measured.json()
    assert best["source"] == "measured"
    assert best["runner"] == "simulated"  # the registered worker's runner: labelled, not hidden
    assert best["latency_us"] == min(latencies.values())
    flops = parse_workload(SMALL_GEMM).flops
    assert math.isclose(best["tflops"], flops / (best["latency_us"] * 1e-6) / 1e12)
    # Another GPU has no measurement: the model answers there.
    other = client.post("/v1/schedules", json={"workload": SMALL_GEMM, "gpu": "a100"})
    assert other.json()["source"] == "model"


def _fail(job: dict) -> dict:
    return {"status": "compile_error", "error": "ptxas: too many resources requested"}


def test_an_untuned_pick_is_never_a_schedule_that_failed_on_the_gpu(client):
    """With no successful trial of a workload on a GPU, the lookup answered the model's pick
    even where that very schedule had failed there (the kernel would not compile), and said
    "not tuned yet". The pick now skips every schedule that failed on the GPU, counting the
    failed trials; another GPU's failures do not count; a success answers `measured`."""
    workload = parse_workload(GEMM)
    _, _, ranked = rank(workload, get_gpu("h100"), top=6)
    task = create_task(client, budget=4, strategy="analytical", workload=GEMM)
    worker = register(client)
    failed = []

    def fail(job):
        failed.append(family_of(workload).parse_schedule(job["schedule"]).id)
        return _fail(job)

    assert drain(client, worker, fail) == 4
    assert client.get(f"/v1/tasks/{task['id']}").json()["state"] == "done"
    assert ranked[0].schedule_id in failed  # the model's pick failed (else no test)
    doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert doc["source"] == "model" and doc["failed_trials"] == 4
    assert doc["schedule_id"] not in failed
    assert doc["schedule_id"] == next(r.schedule_id for r in ranked if r.schedule_id not in failed)
    assert math.isclose(
        doc["predicted_us"],
        next(r.terms["predicted_us"] for r in ranked if r.schedule_id == doc["schedule_id"]),
    )
    other = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h200"}).json()
    h200_pick = rank(workload, get_gpu("h200"), top=1)[2][0].schedule_id
    assert other["failed_trials"] == 0 and other["schedule_id"] == h200_pick

    create_task(client, budget=1, strategy="random", seed=5, workload=GEMM)
    assert drain(client, worker) == 1
    measured = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert measured["source"] == "measured" and measured["failed_trials"] is None


def test_a_simulated_success_is_never_the_answer_for_a_schedule_that_failed_on_the_gpu(client):
    """With no GPU measurement of a workload, the lookup answered the simulated runner's
    fastest schedule even where a cupy worker had found that very schedule computing a wrong
    result: `pipetune schedule` and `pipetune.kernel` handed out a kernel known to fail. A
    simulated success is the model's guess: one of a schedule that failed is skipped."""
    simulated = register(client, "sim", runner="simulated")
    gpu = register(client, "gpu", runner="cupy")
    create_task(client, budget=4, batch_size=4, runner="simulated")
    jobs = lease(client, simulated, max_jobs=4)
    for i, job in enumerate(jobs):
        post_result(client, simulated, job, ok(5.0 if i == 0 else 50.0 + i))
    create_task(client, budget=4, batch_size=4, runner="cupy")
    first = lease(client, gpu, max_jobs=4)[0]
    assert first["schedule"] == jobs[0]["schedule"]  # (the same seed proposes the same first)
    wrong = {"status": "wrong_result", "error": "max abs error 3.2"}
    assert post_result(client, gpu, first, wrong).json()["accepted"]
    doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert doc["schedule"] != jobs[0]["schedule"]
    assert doc["source"] == "measured" and doc["runner"] == "simulated"
    assert doc["latency_us"] == 51.0  # the fastest simulated one that never failed


def test_a_rehearsed_fault_is_no_evidence_against_a_schedule(client):
    """A simulated worker rehearsing a GPU's faults (PIPETUNE_SIMULATED_FAULTS: its measuring
    child crashed or hung) records runtime_error and timeout trials: they excluded the
    schedule that another simulated task had timed fastest, and export left the workload out
    ("every success it had failed on the GPU"). A crash or hang is the rehearsal's, not the
    schedule's; a compile error or a wrong result of the simulated runner still counts."""
    simulated = register(client, "sim", runner="simulated")
    create_task(client, budget=4, batch_size=4, runner="simulated")
    jobs = lease(client, simulated, max_jobs=4)
    for i, job in enumerate(jobs):
        post_result(client, simulated, job, ok(5.0 if i == 0 else 50.0 + i))
    for status in ("runtime_error", "timeout"):
        create_task(client, budget=4, batch_size=4, runner="simulated")
        first = lease(client, simulated, max_jobs=4)[0]
        assert first["schedule"] == jobs[0]["schedule"]  # (the same seed proposes the same)
        crashed = {"status": status, "error": "the measuring child died (SIGSEGV)"}
        assert post_result(client, simulated, first, crashed).json()["accepted"]
        doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
        assert doc["schedule"] == jobs[0]["schedule"] and doc["latency_us"] == 5.0, status
    create_task(client, budget=4, batch_size=4, runner="simulated")
    first = lease(client, simulated, max_jobs=4)[0]
    assert post_result(client, simulated, first, _fail(first)).json()["accepted"]
    doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert doc["schedule"] != jobs[0]["schedule"] and doc["latency_us"] == 51.0


def test_a_gpu_measurement_is_never_the_answer_for_a_schedule_that_failed_on_the_gpu(client):
    """A schedule timed fastest on the GPU in one task and computing a wrong result there in
    another was answered as the one to run (`source: measured`): the failure filter covered
    only the simulated fallback. A GPU's failure outweighs its success (a race that corrupts
    the output only sometimes); the next fastest measured schedule answers. A simulated
    failure of a schedule the GPU ran is the model's guess and does not."""
    gpu = register(client, "gpu", runner="cupy")
    simulated = register(client, "sim", runner="simulated")
    create_task(client, budget=4, batch_size=4, runner="cupy")
    jobs = lease(client, gpu, max_jobs=4)
    for i, job in enumerate(jobs):
        post_result(client, gpu, job, ok(10.0 if i == 0 else 50.0 + i))
    fastest = jobs[0]["schedule"]
    create_task(client, budget=4, batch_size=4, runner="simulated")
    first = lease(client, simulated, max_jobs=4)[0]
    assert first["schedule"] == fastest  # (the same seed proposes the same first)
    wrong = {"status": "wrong_result", "error": "simulated: a made-up failure"}
    assert post_result(client, simulated, first, wrong).json()["accepted"]
    doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert doc["schedule"] == fastest and doc["latency_us"] == 10.0  # the model's word only

    create_task(client, budget=4, batch_size=4, runner="cupy")
    again = lease(client, gpu, max_jobs=4)[0]
    assert again["schedule"] == fastest
    wrong = {"status": "wrong_result", "error": "max abs error 3.2"}
    assert post_result(client, gpu, again, wrong).json()["accepted"]
    doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"}).json()
    assert doc["schedule"] != fastest
    assert doc["source"] == "measured" and doc["runner"] == "cupy"
    assert doc["latency_us"] == 51.0  # the fastest GPU measurement that never failed there


def test_a_workload_whose_every_schedule_failed_is_a_clear_422(client):
    """When every valid schedule failed on the GPU there is no pick to give: a 422 naming
    the workload and saying so, not a schedule known not to run."""
    tiny = {"op": "gemm", "m": 16, "n": 16, "k": 16}
    workload = parse_workload(tiny)
    size = len(family_of(workload).enumerate(workload, get_gpu("h100")))
    assert 1 < size <= 64  # (a space a test can fail whole)
    create_task(client, budget=size, strategy="grid", workload=tiny)
    worker = register(client)
    assert drain(client, worker, _fail) == size
    response = client.post("/v1/schedules", json={"workload": tiny, "gpu": "h100"})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == "workload"
    assert f"every one of its {size} valid schedules failed on h100" in body["reason"]


def test_a_worker_of_one_workload_leases_only_its_jobs(client):
    """A replay worker registers with the one workload its dataset holds: it leases that
    workload's jobs and leaves the others queued (it took them and failed them); re-registered
    without one, it takes any job again; a workload that is no workload is a 422."""
    small = create_task(client, budget=2, strategy="random", workload=SMALL_GEMM)
    big = create_task(client, budget=2, strategy="random", workload=GEMM)
    body = {"name": "replay-1", "gpu": "h100", "arch": "sm_90", "runner": "replay"}
    one = client.post("/v1/workers", json={**body, "workload": SMALL_GEMM}, headers=WORKER_HEADERS)
    assert one.status_code == 201, one.text
    assert one.json()["workload_hash"] == parse_workload(SMALL_GEMM).workload_hash
    jobs = lease(client, one.json()["id"], max_jobs=8)
    assert sorted(j["task_id"] for j in jobs) == [small["id"], small["id"]]
    assert lease(client, one.json()["id"], max_jobs=8) == []
    again = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert again.status_code == 200 and again.json()["workload_hash"] is None
    assert sorted(j["task_id"] for j in lease(client, again.json()["id"], max_jobs=8)) == [
        big["id"],
        big["id"],
    ]
    bad = client.post(
        "/v1/workers", json={**body, "workload": {"op": "gemm", "m": 0}}, headers=WORKER_HEADERS
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "workload"]


def test_a_name_registered_again_while_heartbeating_says_it_may_be_in_use(db_url):
    """Two worker processes given one --name shared one worker row without a word: the
    re-registration's answer says whether the name sent a heartbeat within a lease TTL (a
    second process, or a restart just after a stop); a new name says nothing."""
    import datetime as dt

    from sqlalchemy import update

    from pipetune.service.orm import WorkerRow

    with client_for(db_url, lease_ttl_s=60) as c:
        body = {"name": "twin", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
        first = c.post("/v1/workers", json=body, headers=WORKER_HEADERS)
        assert first.status_code == 201 and first.json()["name_in_use"] is None
        # (The TTL within which it must be heard from to count as live: its idle heartbeats.)
        assert first.json()["lease_ttl_s"] == 60
        second = c.post("/v1/workers", json=body, headers=WORKER_HEADERS)
        assert second.status_code == 200 and second.json()["name_in_use"] is True
        assert second.json()["id"] == first.json()["id"]
        # Its last heartbeat two TTLs ago (set, not slept for: SQLite stamps a new row to
        # the whole second): a restart after the process stopped.
        old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=120)
        with service_of(c).db.write() as s:
            s.execute(update(WorkerRow).values(last_heartbeat=old))
        later = c.post("/v1/workers", json=body, headers=WORKER_HEADERS)
        assert later.status_code == 200 and later.json()["name_in_use"] is False


@pytest.mark.skipif(sys.platform != "linux", reason="Linux descriptor numbering")
def test_a_registration_with_every_file_descriptor_taken_reads_no_profile(tmp_path):
    """At the open-files hard limit a registration answered 500: it read the GPU's profile
    (get_gpu) from disk, and the open failed with EMFILE. The profile is parsed once; a
    registration then needs no descriptor beyond the database connection it already has."""
    import resource

    from pipetune.service.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'pipetune.db'}"
    upgrade(url)
    body = {"name": "w1", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    with client_for(url) as c:
        register(c)  # the first registration reads the profile, and opens the pool's connection
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        # A few above the descriptors in use (not the soft limit, which may be a million).
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        taken: list[int] = []
        try:
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
            again = c.post("/v1/workers", json=body, headers=WORKER_HEADERS)
        finally:
            for fd in taken:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert again.status_code == 200, again.text


def test_a_task_for_one_runner_is_measured_by_its_workers_only(client):
    """`"runner": "cupy"`: GPU measurements only. A simulated worker of the GPU leases none
    of its jobs (it leases a task for any runner); a cupy worker leases them all; the task
    says so; a runner that is no runner is a 422 naming the field."""
    cupy_only = create_task(client, budget=3, strategy="random", runner="cupy")
    assert cupy_only["runner"] == "cupy"
    anyone = create_task(client, budget=2, strategy="random", seed=1, workload=SMALL_GEMM)
    assert anyone["runner"] is None
    simulated = register(client, name="sim", runner="simulated")
    assert {j["task_id"] for j in lease(client, simulated, max_jobs=8)} == {anyone["id"]}
    assert lease(client, simulated, max_jobs=8) == []
    gpu = register(client, name="gpu", runner="cupy")
    jobs = lease(client, gpu, max_jobs=8)
    assert [j["task_id"] for j in jobs] == [cupy_only["id"]] * 3
    bad = client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "runner": "gpu"})
    assert bad.status_code == 422 and bad.json()["field"] == "runner"
    via_schedules = client.post(
        "/v1/schedules",
        json={"workload": GEMM, "gpu": "h100", "tune": {"budget": 2, "runner": "cupy"}},
    )
    assert via_schedules.status_code == 202, via_schedules.text
    assert client.get(via_schedules.json()["url"]).json()["runner"] == "cupy"


def test_trials_carry_the_whole_measurement_and_samples_when_asked(client):
    """A trial showed its median latency alone: the repeats, spread, counts and compile time
    a worker reported were stored and not shown (and a T4 export of the task lost them)."""
    task = create_task(client, budget=3)
    worker = register(client)

    def answer(job):
        latency = fake_latency(job["schedule"])
        return {
            **ok(latency),
            "samples_us": [latency * 0.99, latency, latency * 1.02],
            "spread": 0.03,
            "registers": 96,
            "spill_bytes": 0,
            "smem_bytes": 32768,
            "compile_ms": 412.5,
            "max_abs_error": 0.0004,
            "generator_revision": 2,
        }

    assert drain(client, worker, answer) == 3
    url = f"/v1/tasks/{task['id']}/trials"
    light = client.get(url).json()["trials"]
    assert [t["samples_us"] for t in light] == [None] * 3  # following a task stays light
    for t in light:
        assert (t["spread"], t["registers"], t["spill_bytes"]) == (0.03, 96, 0)
        assert (t["smem_bytes"], t["compile_ms"], t["max_abs_error"]) == (32768, 412.5, 0.0004)
        assert t["generator_revision"] == 2  # which kernels the worker measured
    full = client.get(url, params={"samples": "true"}).json()["trials"]
    for t in full:
        latency = t["latency_us"]
        assert t["samples_us"] == [latency * 0.99, latency, latency * 1.02]
    assert client.get(url, params={"samples": "maybe"}).status_code == 422
    # With samples a page holds at most SAMPLES_PAGE trials, whatever the limit asked.
    assert len(client.get(url, params={"samples": "true", "limit": 2}).json()["trials"]) == 2


def test_a_page_of_trials_with_samples_is_bounded(monkeypatch, client):
    from pipetune.model import wire
    from pipetune.service.routers import tasks

    monkeypatch.setattr(tasks, "SAMPLES_PAGE", 2)
    task = create_task(client, budget=5)
    assert drain(client, register(client), lambda job: ok(fake_latency(job["schedule"]))) == 5
    url = f"/v1/tasks/{task['id']}/trials"
    assert len(client.get(url, params={"samples": "true"}).json()["trials"]) == 2
    assert len(client.get(url).json()["trials"]) == 5
    assert wire.SAMPLES_PAGE == 100


def test_task_lifecycle_list_get_cancel(client):
    created = create_task(client, budget=16, strategy="grid", seed=3)
    assert created["state"] == "queued"
    assert created["budget"] == 16 and created["strategy"] == "grid" and created["seed"] == 3
    task_id = created["id"]
    second = create_task(client, budget=5)
    listed = client.get("/v1/tasks").json()["tasks"]
    assert [t["id"] for t in listed] == [second["id"], task_id]  # newest first
    assert [t["id"] for t in client.get("/v1/tasks?state=queued&limit=1").json()["tasks"]] == [
        second["id"]
    ]
    assert client.get(f"/v1/tasks/{task_id}").json()["id"] == task_id
    assert client.get("/v1/tasks/999999").status_code == 404

    cancelled = client.delete(f"/v1/tasks/{task_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    assert client.delete(f"/v1/tasks/{task_id}").json()["state"] == "cancelled"  # idempotent
    trials = client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
    assert trials and {t["state"] for t in trials} == {"cancelled"}
    assert client.delete("/v1/tasks/999999").status_code == 404


def test_trials_errors_are_cut_to_what_the_reader_asks(client):
    """The dashboard shows 300 characters of an error; a task of failed compiles sent every
    compiler log whole (8.8 MB for 2,000 trials) at each refresh."""
    task = create_task(client, budget=8)
    worker = register(client)
    log = "ptxas error: " + "x" * 5000
    short = "ptxas: too many resources"

    def answer(job):
        error = log if job["trial"] % 2 else short
        return {"status": "compile_error", "error": error}

    assert drain(client, worker, answer) == 8
    url = f"/v1/tasks/{task['id']}/trials"
    whole = client.get(url).json()["trials"]
    assert [t["error"] for t in whole] == [short, log] * 4
    cut = client.get(f"{url}?error_chars=300").json()["trials"]
    assert [t["error"] for t in cut] == [short, f"{log[:300]}... (4713 more characters)"] * 4
    assert client.get(f"{url}?error_chars=0").json()["trials"][0]["error"].startswith("...")
    # Everything else about a trial is as without the cut.
    assert [{**t, "error": None} for t in cut] == [{**t, "error": None} for t in whole]
    response = client.get(f"{url}?error_chars=-1")
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == [
        "query",
        "error_chars",
    ]


def test_task_runs_to_exactly_its_budget_and_reports_trials_and_curve(client):
    task = create_task(client, budget=20)
    worker = register(client)
    failing = {3, 11}

    def answer(job):
        if job["trial"] in failing:
            return {"status": "compile_error", "error": "ptxas: too many resources"}
        return ok(fake_latency(job["schedule"]))

    assert drain(client, worker, answer) == 20
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert doc["state"] == "done"
    assert doc["trials_done"] == 20 and doc["trials_failed"] == 2

    trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    assert [t["trial"] for t in trials] == list(range(20))
    assert len({tuple(t["schedule"].values()) for t in trials}) == 20  # no schedule twice
    for t in trials:
        assert t["predicted_us"] > 0 and t["worker"] == "w1"
        if t["trial"] in failing:
            assert t["state"] == "failed" and t["status"] == "compile_error"
            assert t["latency_us"] is None and "ptxas" in t["error"]
        else:
            assert t["state"] == "done" and t["status"] == "ok"
            assert t["latency_us"] == fake_latency(t["schedule"])
    best_trial = min((t for t in trials if t["status"] == "ok"), key=lambda t: t["latency_us"])
    assert doc["best"]["trial"] == best_trial["trial"]
    assert doc["best"]["latency_us"] == best_trial["latency_us"]

    after = client.get(f"/v1/tasks/{task['id']}/trials?after=15").json()["trials"]
    assert [t["trial"] for t in after] == [16, 17, 18, 19]
    page = client.get(f"/v1/tasks/{task['id']}/trials?after=-1&limit=5").json()["trials"]
    assert [t["trial"] for t in page] == [0, 1, 2, 3, 4]

    points = client.get(f"/v1/tasks/{task['id']}/curve").json()["points"]
    assert [p["trial"] for p in points] == list(range(20))
    running = None
    for p, t in zip(points, trials, strict=True):
        if t["status"] == "ok":
            running = t["latency_us"] if running is None else min(running, t["latency_us"])
        assert p["best_latency_us"] == running
    values = [p["best_latency_us"] for p in points if p["best_latency_us"] is not None]
    assert values == sorted(values, reverse=True)  # best so far never gets worse
    tail = client.get(f"/v1/tasks/{task['id']}/curve?after=17").json()["points"]
    assert tail == points[18:]


def test_a_task_proposes_in_its_own_batch_size(client):
    """A task that asks for batches of 1 has one trial queued at a time, each proposed after
    the result before it; a task that asks for nothing gets the service's batch size."""
    own = create_task(client, budget=3, strategy="bo", batch_size=1)
    default = create_task(client, budget=9, strategy="bo")
    assert own["batch_size"] == 1
    assert default["batch_size"] == service_of(client).settings.batch_size == 8
    worker = register(client)
    for trial in range(3):
        jobs = [j for j in lease(client, worker, max_jobs=64) if j["task_id"] == own["id"]]
        assert [j["trial"] for j in jobs] == [trial]
        assert post_result(client, worker, jobs[0], ok(10.0 + trial)).status_code == 200
    assert client.get(f"/v1/tasks/{own['id']}").json()["state"] == "done"
    queued = client.get(f"/v1/tasks/{default['id']}/trials").json()["trials"]
    assert [t["trial"] for t in queued] == list(range(8))


def test_curve_covers_only_the_final_prefix(client):
    task = create_task(client, budget=8, strategy="grid")
    worker = register(client)
    jobs = lease(client, worker, max_jobs=8)
    by_trial = {j["trial"]: j for j in jobs}
    for trial in (0, 1, 3):  # trial 2 still leased
        assert post_result(client, worker, by_trial[trial], ok(100.0 - trial)).json()["accepted"]
    points = client.get(f"/v1/tasks/{task['id']}/curve").json()["points"]
    assert [p["trial"] for p in points] == [0, 1]
    assert [p["best_latency_us"] for p in points] == [100.0, 99.0]


def test_aggregate_curves_per_strategy(client):
    worker = register(client)
    tasks = {s: create_task(client, budget=16, strategy=s)["id"] for s in ("grid", "analytical")}
    drain(client, worker)
    doc = client.get("/v1/curves?gpu=h100").json()
    assert doc["gpu"] == "h100" and doc["op"] is None
    assert set(doc["curves"]) == {"grid", "analytical"}
    best_known = min(
        client.get(f"/v1/tasks/{t}").json()["best"]["latency_us"] for t in tasks.values()
    )
    for strategy, task_id in tasks.items():
        points = doc["curves"][strategy]
        assert [p["k"] for p in points] == list(range(1, 17))
        assert all(p["tasks"] == 1 for p in points)
        curve = client.get(f"/v1/tasks/{task_id}/curve").json()["points"]
        for p, c in zip(points, curve, strict=True):
            assert math.isclose(p["best_in_k"], best_known / c["best_latency_us"])
        values = [p["best_in_k"] for p in points]
        assert values == sorted(values) and 0 < values[-1] <= 1
    assert max(doc["curves"][s][-1]["best_in_k"] for s in tasks) == 1.0
    only = client.get("/v1/curves?strategy=grid&op=gemm&max_k=4").json()["curves"]
    assert set(only) == {"grid"} and len(only["grid"]) == 4
    # A filter narrows the tasks drawn, not their yardstick: grid's curve alone is normalised
    # to the best any strategy found, as beside analytical's.
    unfiltered = client.get("/v1/curves").json()["curves"]
    assert doc["curves"] == unfiltered
    for strategy in tasks:
        alone = client.get(f"/v1/curves?strategy={strategy}&gpu=h100&op=gemm").json()
        assert alone["curves"] == {strategy: unfiltered[strategy]}
    assert client.get("/v1/curves?gpu=a100").json()["curves"] == {}
    assert client.get("/v1/curves?op=conv2d").json()["curves"] == {}


def test_aggregate_normalises_to_an_imported_exhaustive_optimum(client):
    from pipetune.model.workloads import parse_workload as parse
    from pipetune.service.records import set_reference_optimum

    worker = register(client)
    task_id = create_task(client, budget=8, strategy="grid")["id"]
    drain(client, worker)
    best = client.get(f"/v1/tasks/{task_id}").json()["best"]["latency_us"]
    service = service_of(client)
    with service.db.write() as s:
        set_reference_optimum(s, parse(GEMM), "h100", best / 2, 2840, "exhaustive.t4.json")
    points = client.get("/v1/curves").json()["curves"]["grid"]
    assert math.isclose(points[-1]["best_in_k"], 0.5)


def test_the_task_list_pages_by_a_cursor_that_tasks_created_meanwhile_do_not_shift(client):
    """An offset shifts as tasks are created between two pages, and the second page then
    repeated a task of the first; `before` (the last id of the page before) does not."""
    for seed in range(4):
        create_task(client, budget=8, strategy="random", seed=seed)
    first = [t["id"] for t in client.get("/v1/tasks?limit=2").json()["tasks"]]
    create_task(client, budget=8, strategy="random", seed=9)
    second = client.get(f"/v1/tasks?limit=2&before={first[-1]}").json()["tasks"]
    assert first == [4, 3] and [t["id"] for t in second] == [2, 1]
    running = client.get(f"/v1/tasks?limit=2&before={first[-1]}&state=queued").json()["tasks"]
    assert [t["id"] for t in running] == [t["id"] for t in second if t["state"] == "queued"]
    refused = client.get("/v1/tasks?before=0")
    assert refused.status_code == 422 and refused.json()["field"] == "before"


def test_simulated_and_measured_tasks_are_each_normalised_to_the_best_of_their_kind(client):
    """A simulated latency is the model's: as the yardstick of a measured task (the best of
    every task of the workload, whatever its runner) it capped the measured task's curve at
    0.2 here, and an imported simulated sweep's optimum did the same."""
    from pipetune.model.workloads import parse_workload as parse
    from pipetune.service.records import set_reference_optimum

    simulated_worker = register(client, "sim", runner="simulated")
    gpu_worker = register(client, "gpu", runner="cupy")
    create_task(client, budget=4, strategy="grid", runner="cupy")
    create_task(client, budget=4, strategy="analytical", runner="simulated")

    def result(runner: str, latency_us: float):
        return lambda job: {**ok(latency_us + job["trial"]), "runner": runner}

    drain(client, gpu_worker, result("cupy", 100.0))
    drain(client, simulated_worker, result("simulated", 20.0))

    def last_points() -> dict[str, float]:
        curves = client.get("/v1/curves").json()["curves"]
        return {name: round(points[-1]["best_in_k"], 9) for name, points in curves.items()}

    assert last_points() == {"grid": 1.0, "analytical": 1.0}
    with service_of(client).db.write() as s:  # an exhaustive simulated sweep: 10 us
        set_reference_optimum(s, parse(GEMM), "h100", 10.0, 2840, "sim.t4.json", "simulated")
    assert last_points() == {"grid": 1.0, "analytical": 0.5}
    with service_of(client).db.write() as s:  # replaced by a measured sweep's: 50 us
        set_reference_optimum(s, parse(GEMM), "h100", 50.0, 2840, "gpu.t4.json", "cupy")
    assert last_points() == {"grid": 0.5, "analytical": 1.0}
    with service_of(client).db.write() as s:  # one whose runner is not known: every task's
        set_reference_optimum(s, parse(GEMM), "h100", 10.0, 2840, "old.t4.json")
    assert last_points() == {"grid": 0.1, "analytical": 0.5}


def test_a_simulated_task_whose_every_trial_failed_counts_as_finding_nothing(client):
    """A task with no successful trial has no best trial to say its kind, and was read as
    measured: with only simulated tasks of its workload there was no measured best known
    to normalise it to, and it was left out, so its strategy's curve read 1.0 where one of
    its two tasks had found nothing."""
    worker = register(client, "sim", runner="simulated")
    create_task(client, budget=4, strategy="random", seed=1)
    drain(client, worker, lambda job: ok(10.0))
    create_task(client, budget=4, strategy="random", seed=2)
    drain(client, worker, lambda job: {"status": "runtime_error", "error": "crash"})
    points = client.get("/v1/curves").json()["curves"]["random"]
    assert [(p["best_in_k"], p["tasks"]) for p in points] == [(0.5, 2)] * 4


def test_a_task_whose_earlier_bests_were_simulated_labels_the_aggregate_simulated(client):
    """A task any worker may take, measured first by a simulated worker and then by a GPU:
    its best trial is measured, so the aggregate's runners said only "cupy" while its
    best-in-k up to k = 4 was the simulated trials' (the dashboard drew it unlabelled)."""
    simulated_worker = register(client, "sim", runner="simulated")
    gpu_worker = register(client, "gpu", runner="cupy")
    task_id = create_task(client, budget=8, strategy="grid", batch_size=4)["id"]
    for job in lease(client, simulated_worker, max_jobs=4):
        post_result(client, simulated_worker, job, {**ok(90.0), "runner": "simulated"})
    drain(client, gpu_worker, lambda job: {**ok(50.0 - job["trial"]), "runner": "cupy"})
    assert client.get(f"/v1/tasks/{task_id}").json()["best"]["runner"] == "cupy"
    doc = client.get("/v1/curves").json()
    assert doc["runners"] == ["cupy", "simulated"]
    assert [round(p["best_in_k"], 3) for p in doc["curves"]["grid"][:4]] == [0.478] * 4


def test_workers_list_heartbeat_and_reregistration(client):
    first = register(client, "gpu-box-1", "a100")
    assert register(client, "gpu-box-1", "a100") == first  # same name, same token: same id
    register(client, "gpu-box-2", "h200")
    names = {w["name"]: w for w in client.get("/v1/workers").json()["workers"]}
    assert names["gpu-box-1"]["arch"] == "sm_80" and names["gpu-box-2"]["gpu"] == "h200"
    ack = client.post(
        f"/v1/workers/{first}/heartbeat", json={"busy_jobs": 2}, headers=WORKER_HEADERS
    )
    assert ack.status_code == 200 and ack.json()["ok"] is True
    assert ack.json()["server_time"].endswith("Z") or "+00:00" in ack.json()["server_time"]
    missing = client.post("/v1/workers/99999/heartbeat", json={}, headers=WORKER_HEADERS)
    assert missing.status_code == 404


def test_worker_routes_need_a_worker_token(client):
    body = {"name": "w", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    assert client.post("/v1/workers", json=body).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert client.post("/v1/workers", json=body, headers=wrong).status_code == 401
    header = {"X-Worker-Token": TOKEN}
    assert client.post("/v1/workers", json=body, headers=header).status_code == 201
    lease_body = {"worker_id": 1, "max_jobs": 1, "wait_s": 0}
    assert client.post("/v1/jobs/lease", json=lease_body).status_code == 401
    # User routes stay open when no API key is configured.
    assert client.get("/v1/tasks").status_code == 200


def test_a_worker_token_header_counts_beside_a_proxys_authorization(client):
    """A proxy on the way that sets an Authorization of its own (its Bearer, or Basic) left
    the worker's valid X-Worker-Token unread: 401 for every worker route."""
    body = {"name": "w", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    for proxy in ("Bearer the-proxys-own", "Basic dXNlcjpwYXNz"):
        headers = {"Authorization": proxy, "X-Worker-Token": TOKEN}
        assert client.post("/v1/workers", json=body, headers=headers).status_code in (200, 201)
    both_wrong = {"Authorization": "Bearer the-proxys-own", "X-Worker-Token": "not-it"}
    assert client.post("/v1/workers", json=body, headers=both_wrong).status_code == 401
    # The token as a Bearer still counts beside a wrong header.
    bearer = {"Authorization": f"Bearer {TOKEN}", "X-Worker-Token": "not-it"}
    assert client.post("/v1/workers", json=body, headers=bearer).status_code == 200


def test_api_keys_guard_the_user_routes(db_url):
    with client_for(db_url, api_keys=["k1", "k2"]) as c:
        assert c.get("/v1/tasks").status_code == 401
        assert c.get("/v1/tasks", headers={"X-API-Key": "nope"}).status_code == 401
        assert c.get("/v1/tasks", headers={"X-API-Key": "k2"}).status_code == 200
        assert c.get("/v1/tasks", headers={"Authorization": "Bearer k1"}).status_code == 200
        # The key as a Bearer counts beside a stale X-API-Key, as a worker token does beside
        # a stale X-Worker-Token; two wrong ones are refused.
        stale = {"Authorization": "Bearer k1", "X-API-Key": "an-old-key"}
        assert c.get("/v1/tasks", headers=stale).status_code == 200
        both_wrong = {"Authorization": "Bearer nope", "X-API-Key": "an-old-key"}
        assert c.get("/v1/tasks", headers=both_wrong).status_code == 401
        schedules = c.post("/v1/schedules", json={"workload": GEMM, "gpu": "h100"})
        assert schedules.status_code == 401
        # Health, metrics and the dashboard page need no key.
        assert c.get("/healthz").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert c.get("/dashboard").status_code == 200


def test_a_request_without_its_credential_is_refused_before_its_body_or_query_is_read(
    db_url,
):
    """FastAPI decodes and validates a body before it runs the route's dependencies: a 1 MB
    body of empty objects without any credential cost 55 ms of the event loop before its
    401, and malformed JSON got a 422 that told an anonymous caller the route's schema. The
    credential is checked first; with it, the same request gets its 422."""
    many = "[" + ",".join(["{}"] * 200_000) + "]"
    json_type = {"Content-Type": "application/json"}
    with client_for(db_url, api_keys=["k1"]) as c:
        for path in ("/v1/tasks", "/v1/jobs/lease", "/v1/jobs/results", "/v1/workers"):
            refused = c.post(path, content=many, headers=json_type)
            assert refused.status_code == 401, (path, refused.text)
            assert c.post(path, content="{not json", headers=json_type).status_code == 401
        assert c.get("/v1/tasks?limt=1").status_code == 401
        key = {**json_type, "X-API-Key": "k1"}
        assert c.post("/v1/tasks", content="{not json", headers=key).status_code == 422
        assert c.get("/v1/tasks?limt=1", headers=key).status_code == 422
        worker = {**json_type, **WORKER_HEADERS}
        assert c.post("/v1/jobs/lease", content="{not json", headers=worker).status_code == 422
        # A worker token is no API key, nor the reverse, before the body as after it.
        assert c.post("/v1/tasks", content="{}", headers=worker).status_code == 401
        assert c.post("/v1/jobs/lease", content="{}", headers=key).status_code == 401


def test_the_apis_answers_are_never_stored_by_a_cache_on_the_way(db_url):
    """A caching proxy that keys on the address alone served one key-holder's tasks to a
    request without a key: every /v1 answer, refusals included, says no-store."""
    with client_for(db_url, api_keys=["k1"]) as c:
        key = {"X-API-Key": "k1"}
        worker_id = register(c)
        answers = [
            c.get("/v1/tasks", headers=key),
            c.post(
                "/v1/tasks", json={"workload": SMALL_GEMM, "gpu": "h100", "budget": 8}, headers=key
            ),
            c.get("/v1/tasks/1/trials", headers=key),
            c.get("/v1/curves", headers=key),
            c.get("/v1/workers", headers=key),
            c.post(
                "/v1/jobs/lease",
                json={"worker_id": worker_id, "max_jobs": 1, "wait_s": 0},
                headers=WORKER_HEADERS,
            ),
            c.get("/v1/tasks"),  # 401
            c.get("/v1/tasks/99", headers=key),  # 404
            c.get("/v1/tasks?limt=1", headers=key),  # 422
        ]
        assert [a.status_code for a in answers] == [200, 201, 200, 200, 200, 200, 401, 404, 422]
        for answer in answers:
            assert answer.headers.get_list("cache-control") == ["no-store"], answer.request.url
        # The page, its health check and the metrics are not the API's answers.
        for path in ("/healthz", "/metrics"):
            assert "no-store" not in c.get(path).headers.get("cache-control", "")


def test_a_worker_arch_must_match_its_gpu(client):
    body = {"name": "w", "gpu": "h100", "arch": "sm_80", "runner": "simulated"}
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code == 422
    assert response.json()["field"] == "arch" and "sm_90" in response.json()["reason"]


def test_a_worker_of_a_workload_its_gpu_cannot_run_is_refused(client):
    """A Hopper-only workload on an A100: task creation refuses the pair, and registration
    took it (201), leaving a worker that waited for a job that can never exist."""
    hopper = {"op": "hopper_gemm", "m": 64, "n": 64, "k": 64}
    body = {"name": "r1", "gpu": "a100", "arch": "sm_80", "runner": "replay", "workload": hopper}
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code == 422, response.text
    answer = response.json()
    assert answer["field"] == "workload"
    assert answer["reason"].startswith("no schedule of the Hopper")
    task = client.post("/v1/tasks", json={"workload": hopper, "gpu": "a100"})
    assert (task.status_code, task.json()["reason"]) == (422, answer["reason"])
    on_hopper = {**body, "gpu": "h100", "arch": "sm_90"}
    assert client.post("/v1/workers", json=on_hopper, headers=WORKER_HEADERS).status_code == 201


def test_rows_are_stamped_to_below_a_second_on_both_databases(client):
    """SQLite's CURRENT_TIMESTAMP is whole seconds: tasks, jobs and workloads were stamped
    so there (a task looked created before a worker that registered a moment earlier),
    while workers, and every row on PostgreSQL, carried the fraction."""
    from sqlalchemy import select

    from pipetune.service.orm import JobRow, TaskRow, WorkloadRow

    for m in (64, 128, 192):
        create_task(client, budget=2, strategy="random", workload={**SMALL_GEMM, "m": m})
    with service_of(client).db.read() as s:
        for column in (TaskRow.created_at, TaskRow.updated_at, JobRow.created_at,
                       WorkloadRow.created_at):  # fmt: skip
            stamps = s.scalars(select(column)).all()
            assert len(stamps) >= 3, column
            # (Three or more rows all on a whole second: one chance in a billion.)
            assert any(t.microsecond for t in stamps), (column, stamps)


def test_request_bodies_over_the_limit_are_refused_saying_the_limit(db_url):
    """A 413 in JSON like every other error, naming the limit (Starlette's limiter answered
    "Content Too Large" in plain text), whether the body declared its length or not."""
    import json

    with client_for(db_url, max_body_bytes=4096) as c:
        big = json.dumps({"workload": GEMM, "gpu": "h100", "padding": "x" * 10_000}).encode()
        declared = c.post("/v1/tasks", content=big, headers={"content-type": "application/json"})
        chunked = c.post(
            "/v1/tasks",
            content=iter([big[:3000], big[3000:]]),  # no Content-Length: read until too long
            headers={"content-type": "application/json"},
        )
        for response in (declared, chunked):
            assert response.status_code == 413
            assert response.headers["content-type"] == "application/json"
            assert "limit of 4096 bytes" in response.json()["detail"]
        assert c.get("/v1/tasks").json()["tasks"] == []  # nothing was created
        small = {"workload": GEMM, "gpu": "h100", "budget": 8}
        assert c.post("/v1/tasks", content=iter([json.dumps(small).encode()]),
                      headers={"content-type": "application/json"}).status_code == 201  # fmt: skip
        # Counted under the route they were for (they read "unmatched": a path with none).
        count = "pipetune_http_request_duration_seconds_count"
        text = c.get("/metrics").text
        assert metric_value(text, count, method="POST", route="/v1/tasks", status="413") == 2.0


def test_health_metrics_and_openapi(client):
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["schema_revision"]
    assert health["database"] in ("sqlite", "postgresql")
    # A load balancer's HEAD check: the same answer without a body.
    head = client.head("/healthz")
    assert head.status_code == 200 and head.content == b""
    worker = register(client)
    create_task(client, budget=4, strategy="grid")
    jobs = lease(client, worker, max_jobs=4)
    post_result(client, worker, jobs[0], ok(10.0))
    post_result(client, worker, jobs[0], ok(10.0))  # a repeat: acknowledged, not counted
    post_result(client, worker, jobs[1], {"status": "timeout"})
    text = client.get("/metrics").text
    assert 'pipetune_queue_depth{gpu="h100"} 0.0' in text  # all four leased: 0, not absent
    assert 'pipetune_leases_active{gpu="h100"} 2.0' in text
    assert 'pipetune_jobs_leased_total{gpu="h100"} 4.0' in text
    # Label order carries no meaning in the exposition (prometheus_client sorts them).
    results = "pipetune_results_total"
    # The repeat is accepted, and not counted as recorded: recorded ones add up to the
    # database's results (the repeat was counted as one more).
    # (simulated: the worker registered as simulated, and its results name no runner)
    counted = {"accepted": "true", "simulated": "true"}
    assert metric_value(text, results, status="ok", recorded="true", **counted) == 1.0
    assert metric_value(text, results, status="ok", recorded="false", **counted) == 1.0
    assert metric_value(text, results, status="timeout", recorded="true", **counted) == 1.0
    assert "pipetune_lease_expiries_total" in text
    assert 'route="/v1/jobs/{job_id}/result"' in text
    assert "pipetune_http_request_duration_seconds_bucket" in text

    spec = client.get("/openapi.json").json()
    for path in (
        "/v1/schedules",
        "/v1/tasks",
        "/v1/tasks/{task_id}",
        "/v1/tasks/{task_id}/trials",
        "/v1/tasks/{task_id}/curve",
        "/v1/curves",
        "/v1/workers",
        "/v1/workers/{worker_id}/heartbeat",
        "/v1/jobs/lease",
        "/v1/jobs/{job_id}/result",
        "/healthz",
        "/metrics",
    ):
        assert path in spec["paths"], path
    created = spec["paths"]["/v1/tasks"]["post"]["responses"]
    assert "TaskDoc" in created["201"]["content"]["application/json"]["schema"]["$ref"]
    assert "ValidationErrorBody" in str(created["422"])


def test_the_workers_routes_are_matched_before_every_other(client):
    """Routes are tried in order: a fleet's requests (leases, results) come first, and no
    route behind them answers one of their paths."""
    from starlette.routing import Match

    def paths(route) -> list[str]:  # (FastAPI keeps an included router as one entry)
        inner = getattr(route, "original_router", None)
        return [p for r in inner.routes for p in paths(r)] if inner else [route.path]

    app = client.app
    ours = [p for r in app.router.routes for p in paths(r) if p.startswith("/v1/")]
    hot = {"/v1/jobs/lease", "/v1/jobs/{job_id}/result", "/v1/jobs/results"}
    assert set(ours[: len(hot)]) == hot
    for path in ["/v1/jobs/lease", "/v1/jobs/7/result", "/v1/jobs/results"]:
        scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "app": app}
        matched = [r for r in app.router.routes if r.matches(scope)[0] == Match.FULL]
        assert len(matched) == 1, path
