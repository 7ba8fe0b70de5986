"""A task whose prior is learned (`learned_prior`): a cost model of every finished task of the
same kernel family measured on a GPU, over the analytical model's terms. The tasks it learned
from are recorded on the task, measured trials only (simulated ones never teach it), its first
batch is the one an offline session with the same prior proposes, a replica with empty caches
replays it exactly, and what cannot have a learned prior is a 422 naming the field. SQLite
and PostgreSQL, on the H100 campaign's measured datasets (benchmarks/data/h100)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_support import (
    GEMM,
    client_for,
    create_task,
    drain,
    drain_rebuilding,
    fake_latency,
    ok,
    register,
    service_of,
)
from typer.testing import CliRunner

from pipetune.clients.cli.bench_cmds import recorded_dataset
from pipetune.clients.cli.main import app
from pipetune.model.family import family_of, parse_any_workload
from pipetune.model.hardware import get_gpu
from pipetune.service import priors
from pipetune.service.priors import learned_tasks
from pipetune.tuner.learned_prior import learned_prior
from pipetune.tuner.session import TuningSession

pytest_plugins = ["service_fixtures"]

MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100"
# Three small measured H100 GEMM spaces (the largest 1,600 schedules): the corpus.
CORPUS = ("MM_RN50_Conv1x1_1", "BMM_BERT_QK", "BMM_GPT2_QK")
runner = CliRunner()


@pytest.fixture(autouse=True)
def learn_by_default_from_a_few_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests' corpora are a few small spaces: the default learns from them here (the
    service's minimum number of shapes is tested on its own, below)."""
    monkeypatch.setattr(priors, "MIN_DEFAULT_SHAPES", 1)


def _import(path: Path, db_url: str) -> int:
    result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["id"]


def _measured_corpus(db_url: str) -> list[int]:
    return [_import(MEASURED / f"{name}.t4.json.gz", db_url) for name in CORPUS]


def _simulated_task(client, gpu: str = "h200") -> int:
    """A finished random-search task answered by a simulated worker: not a measurement."""
    doc = create_task(client, budget=8, strategy="random", seed=2, workload=GEMM, gpu=gpu)
    worker = register(client, name=f"sim-{gpu}", gpu=gpu, runner="simulated")
    assert drain(client, worker, lambda job: ok(fake_latency(job["schedule"]))) == 8
    return doc["id"]


def _trials(client, task_id: int) -> list[dict]:
    docs = client.get(f"/v1/tasks/{task_id}/trials?limit=1000").json()["trials"]
    return [t["schedule"] for t in docs]


def _offline_first_batch(
    strategy: str, seed: int, budget: int, batch: int, workload: dict = GEMM
) -> list[dict]:
    """What an offline session proposes first with the prior learned from the same files."""
    workload = parse_any_workload(workload)
    space = family_of(workload).enumerate(workload, get_gpu("h200"))
    corpus = [recorded_dataset(MEASURED / f"{name}.t4.json.gz").ours for name in CORPUS]
    prior = learned_prior(space, [r for r in corpus if r is not None])
    session = TuningSession(workload, space.gpu, strategy, seed, budget, space=space, prior=prior)
    return [s.as_dict() for s in session.propose(batch)]


def test_a_learned_prior_reads_the_measured_tasks_and_proposes_what_offline_does(db_url):
    measured = _measured_corpus(db_url)
    with client_for(db_url) as client:
        simulated = _simulated_task(client)
        doc = create_task(
            client, budget=16, strategy="auto", seed=3, gpu="h200", learned_prior=True
        )
        assert doc["learned_from"] == sorted(measured), "measured tasks only, in id order"
        assert simulated not in doc["learned_from"]
        again = client.get(f"/v1/tasks/{doc['id']}").json()
        assert again["learned_from"] == sorted(measured) and again["prior_task"] is None
        batch = service_of(client).settings.batch_size
        assert _trials(client, doc["id"])[:batch] == _offline_first_batch("auto", 3, 16, batch)
        control = create_task(
            client, budget=16, strategy="auto", seed=3, gpu="h200", learned_prior=False
        )
        assert control["learned_from"] is None
        assert _trials(client, control["id"])[:batch] != _trials(client, doc["id"])[:batch]


def test_a_tensor_gemm_task_learns_its_prior_by_default_where_measured_tasks_exist(db_url):
    """Nothing said of a learned prior: a tensor GEMM task of a strategy whose prior is the
    analytical model learns one, as if asked; `bo` stays knob-only, `random` takes none."""
    measured = _measured_corpus(db_url)
    with client_for(db_url) as client:
        asked = create_task(
            client, budget=16, strategy="auto", seed=3, gpu="h200", learned_prior=True
        )
        batch = service_of(client).settings.batch_size
        for strategy in ("auto", "analytical+xgb"):
            doc = create_task(client, budget=16, strategy=strategy, seed=3, gpu="h200")
            assert doc["learned_from"] == sorted(measured), strategy
        default = create_task(client, budget=16, strategy="auto", seed=3, gpu="h200")
        assert _trials(client, default["id"])[:batch] == _trials(client, asked["id"])[:batch]
        for strategy in ("bo", "random"):
            doc = create_task(client, budget=8, strategy=strategy, seed=3, gpu="h200")
            assert doc["learned_from"] is None, strategy


def test_without_measured_tasks_a_default_learned_prior_is_none_and_no_error(client):
    _simulated_task(client, gpu="h100")  # simulated trials never teach a prior
    doc = create_task(client, budget=8, strategy="auto", gpu="h200")
    assert doc["learned_from"] is None and doc["prior_task"] is None


def test_a_memory_intensive_task_learns_by_default_and_not_when_told(db_url):
    """The memory-intensive family's learned prior ranks better than its model since the cost
    model learns each shape relative to its median: left to the default, a task learns where
    measured tasks exist; told not to, it does not."""
    measured = _import(MEASURED / "BiasGELU_BERT_b1_s128.t4.json.gz", db_url)
    bias_gelu = {"op": "bias_gelu", "rows": 1024, "cols": 3072}
    with client_for(db_url) as client:
        default = create_task(client, budget=8, strategy="auto", workload=bias_gelu)
        assert default["learned_from"] == [measured]
        refused = create_task(
            client, budget=8, strategy="auto", workload=bias_gelu, learned_prior=False
        )
        assert refused["learned_from"] is None


def test_a_task_with_a_learned_prior_replays_exactly_on_a_replica_with_empty_caches(db_url):
    _measured_corpus(db_url)
    with client_for(db_url) as a:
        kept = create_task(a, budget=24, strategy="analytical+xgb", seed=4, learned_prior=True)
        rebuilt = create_task(a, budget=24, strategy="analytical+xgb", seed=4, learned_prior=True)
        assert kept["learned_from"] == rebuilt["learned_from"]
        worker = register(a, runner="cupy")
        # Each advance of `rebuilt` refits the prior on the recorded tasks' trials.
        assert drain_rebuilding(a, worker, rebuilt["id"]) == 48
        for task in (kept, rebuilt):
            assert a.get(f"/v1/tasks/{task['id']}").json()["state"] == "done"
        assert _trials(a, kept["id"]) == _trials(a, rebuilt["id"])
        # A finished task measured by a GPU worker is part of the next learned prior.
        with service_of(a).driver.db.read_conn() as conn:
            assert kept["id"] in learned_tasks(conn, parse_any_workload(GEMM), "h200")


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"strategy": "random"}, "strategy", "takes no prior"),
        ({"prior_task": 1}, "learned_prior", "not both"),
        ({"prior_gpu": "a100"}, "learned_prior", "not both"),
    ],
)
def test_a_learned_prior_that_cannot_be_one_is_a_422_naming_the_field(
    client, change, field, reason
):
    body = {"workload": GEMM, "gpu": "h100", "budget": 8, "learned_prior": True, **change}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"][-1] == field and reason in error["reason"], error
    assert client.get("/v1/tasks").json()["tasks"] == []  # nothing half-written


def test_without_a_measured_task_of_the_family_a_learned_prior_is_a_422(client):
    _simulated_task(client, gpu="h100")  # simulated trials never teach a prior
    body = {"workload": GEMM, "gpu": "h200", "budget": 8, "learned_prior": True}
    response = client.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "learned_prior"], error
    assert "no finished task of the tensor_gemm family measured on a GPU" in error["reason"]


def test_tasks_learning_from_the_same_tasks_share_one_fit(db_url, monkeypatch):
    """The cost model of a set of measured tasks is fitted once for all the shapes that learn
    from it (a network's layers, queued at once), and each still gets the prior an offline
    fit gives its own space."""
    import pipetune.service.priors as priors

    fits = []
    fit = priors.fit_learned_model
    monkeypatch.setattr(priors, "fit_learned_model", lambda *a, **k: fits.append(1) or fit(*a, **k))
    measured = _measured_corpus(db_url)
    other = {**GEMM, "m": GEMM["m"] * 2}
    with client_for(db_url) as client:
        batch = service_of(client).settings.batch_size
        first = create_task(client, budget=16, strategy="auto", seed=3, gpu="h200")
        second = create_task(client, budget=16, strategy="auto", seed=3, gpu="h200", workload=other)
        assert first["learned_from"] == second["learned_from"] == sorted(measured)
        assert len(fits) == 1
        assert _trials(client, first["id"])[:batch] == _offline_first_batch("auto", 3, 16, batch)
        assert _trials(client, second["id"])[:batch] == _offline_first_batch(
            "auto", 3, 16, batch, workload=other
        )


def test_an_unmeasured_gemm_is_answered_with_the_learned_models_pick(db_url):
    """POST /v1/schedules for a shape nothing measured: the pick of the prior the measured
    tasks teach (the same as an offline fit's), naming them; the local database without a
    service answers the same; with learning refused by nothing measured, the analytical
    model's pick."""
    import numpy as np

    from pipetune.clients.library.lookup import best_schedule
    from pipetune.service.records import model_pick

    workload = parse_any_workload(GEMM)
    with client_for(db_url) as client:
        before = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h200"}).json()
        assert before["source"] == "model" and before["learned_from"] is None
        assert before["schedule_id"] == model_pick(workload, "h200").schedule.id
    measured = _measured_corpus(db_url)
    space = family_of(workload).enumerate(workload, get_gpu("h200"))
    corpus = [recorded_dataset(MEASURED / f"{name}.t4.json.gz").ours for name in CORPUS]
    prior = learned_prior(space, [r for r in corpus if r is not None])
    expected = space[int(np.argmax(prior.values))].id
    assert expected != before["schedule_id"]  # (else this test could not tell them apart)
    with client_for(db_url) as client:
        doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h200"}).json()
    assert doc["source"] == "model" and doc["learned_from"] == sorted(measured)
    assert doc["schedule_id"] == expected and doc["predicted_us"] > 0
    local = best_schedule(GEMM, "h200", db=db_url)
    assert (local.schedule_id, local.learned_from) == (expected, sorted(measured))


def test_the_learned_pick_skips_schedules_that_failed_on_the_gpu(db_url):
    """A shape nothing succeeded on: the learned prior's pick was answered even where a
    trial of that very schedule had failed on the GPU. The pick is now the prior's best of
    the schedules that did not fail, the service, the local database and `pipetune
    schedule` alike, with the failed trials counted and said."""
    import numpy as np

    from pipetune.clients.library.lookup import best_schedule

    measured = _measured_corpus(db_url)
    workload = parse_any_workload(GEMM)
    space = family_of(workload).enumerate(workload, get_gpu("h200"))
    corpus = [recorded_dataset(MEASURED / f"{name}.t4.json.gz").ours for name in CORPUS]
    values = learned_prior(space, [r for r in corpus if r is not None]).values
    order = np.argsort(-values, kind="stable")
    with client_for(db_url) as client:
        # A learned-prior task's first trial is the prior's pick: a worker that fails it.
        task = create_task(client, budget=2, strategy="auto", seed=0, workload=GEMM, gpu="h200")
        assert task["learned_from"] == sorted(measured)
        worker = register(client, name="failing", gpu="h200", runner="simulated")
        failed = []

        def fail(job):
            failed.append(family_of(workload).parse_schedule(job["schedule"]).id)
            return {"status": "wrong_result", "error": "max abs error 3.2 over 0.05"}

        assert drain(client, worker, fail) == 2
        assert space[int(order[0])].id in failed  # the prior's pick failed (else no test)
        doc = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h200"}).json()
    expected = next(space[int(i)].id for i in order if space[int(i)].id not in failed)
    assert doc["source"] == "model" and doc["learned_from"] == sorted(measured)
    assert doc["schedule_id"] == expected and doc["failed_trials"] == 2
    local = best_schedule(GEMM, "h200", db=db_url)
    assert (local.schedule_id, local.failed_trials) == (expected, 2)
    args = ["--m", str(workload.m), "--n", str(workload.n), "--k", str(workload.k)]
    table = runner.invoke(app, ["schedule", "gemm", *args, "--gpu", "h200", "--db", db_url])
    assert table.exit_code == 0, table.output
    said = " ".join(table.stdout.split())
    assert "learned from 3 tasks (no trial succeeded)" in said
    assert "2 trials failed on h200: their schedules are not picked" in said
    assert expected in said and "not tuned yet" not in said


def test_a_stored_time_no_kernel_can_take_does_not_break_every_lookup(db_url):
    """A 1e-300 us result, stored before results were checked for it, overflowed the
    throughput to infinity: the learned cost model's fit failed (XGBoost refuses infinite
    labels) for every later lookup and task of the family, a 500 each. Read back, it counts
    as a failed trial."""
    from sqlalchemy import create_engine, text

    (task_id,) = [_import(MEASURED / f"{CORPUS[0]}.t4.json.gz", db_url)]
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET latency_us = 1e-300 WHERE task_id = :t AND trial = 0"),
            {"t": task_id},
        )
    engine.dispose()
    with client_for(db_url) as client:
        response = client.post("/v1/schedules", json={"workload": GEMM, "gpu": "h200"})
        assert response.status_code == 200, response.text
        assert response.json()["learned_from"] == [task_id]
        created = client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h200", "budget": 8})
        assert created.status_code == 201, created.text
        assert created.json()["learned_from"] == [task_id]


def test_a_default_learned_prior_needs_enough_measured_shapes(db_url, monkeypatch):
    """From one to four shapes a learned prior ranked a new shape worse than the analytical
    model (benchmarks/RESULTS.md, "a learned prior of too few shapes"): a task that says
    nothing of one, and the model's pick, keep the analytical model until the corpus holds
    MIN_DEFAULT_SHAPES; asked for, a learned prior is taken from the few."""
    measured = _measured_corpus(db_url)  # three shapes
    monkeypatch.setattr(priors, "MIN_DEFAULT_SHAPES", len(CORPUS) + 1)
    unmeasured = {"op": "gemm", "m": 2048, "n": 768, "k": 3072}
    with client_for(db_url) as client:
        default = create_task(client, budget=8, strategy="auto", seed=3, gpu="h200")
        assert default["learned_from"] is None and default["prior_task"] is None
        asked = create_task(client, budget=8, strategy="auto", gpu="h200", learned_prior=True)
        assert asked["learned_from"] == sorted(measured)
        pick = client.post("/v1/schedules", json={"workload": unmeasured, "gpu": "h200"})
        assert pick.status_code == 200 and pick.json()["learned_from"] is None
    monkeypatch.setattr(priors, "MIN_DEFAULT_SHAPES", len(CORPUS))
    with client_for(db_url) as client:
        default = create_task(client, budget=8, strategy="auto", seed=3, gpu="h200")
        assert default["learned_from"] == sorted(measured)
        pick = client.post("/v1/schedules", json={"workload": unmeasured, "gpu": "h200"})
        assert pick.json()["learned_from"] == sorted(measured)


@pytest.mark.parametrize("chunk", [500, 1])  # (1: the first call reads in one pass)
def test_finding_the_tasks_to_learn_from_reads_each_finished_tasks_jobs_once(
    db_url, chunk, monkeypatch
):
    """`learned_tasks` read every job of every finished task on each call: 1.0-1.2 s at
    2.25 M jobs, on every task created with a default strategy. A finished task's jobs never
    change: with the driver's summaries a call reads only the tasks finished since the last,
    and finds what a call without them finds."""
    from sqlalchemy import event

    from pipetune.service.db import Database

    monkeypatch.setattr(priors.TaskSummaries, "CHUNK", chunk)
    first = _measured_corpus(db_url)
    db = Database(db_url, 2)
    job_reads: list[tuple[str, object]] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if "FROM jobs" in statement:
            job_reads.append((statement, parameters))

    read_tasks: list[list[int]] = []

    class Summaries(priors.TaskSummaries):
        def of(self, conn, task_ids):  # type: ignore[no-untyped-def]
            read_tasks.append([t for t in task_ids if t not in self._by_task])
            return super().of(conn, task_ids)

    event.listen(db.engine, "before_cursor_execute", count)
    summaries = Summaries()
    workload = parse_any_workload(GEMM)
    try:
        with db.read_conn() as conn:
            found = learned_tasks(conn, workload, "h200", summaries)
            assert found == sorted(first)
            assert len(job_reads) == 1  # the three tasks' jobs, in one statement
            job_reads.clear()
            assert learned_tasks(conn, workload, "h200", summaries) == found
            assert job_reads == []  # nothing read again
        later = _import(MEASURED / "MM_RN50_Conv1x1_2.t4.json.gz", db_url)
        with db.read_conn() as conn:
            both = learned_tasks(conn, workload, "h200", summaries)
            assert both == sorted([*first, later])
            assert len(job_reads) == 1 and read_tasks[-1] == [later]  # its jobs alone
            assert learned_tasks(conn, workload, "h200") == both  # as without the summaries
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
        db.dispose()


def test_a_learned_pick_whose_prediction_no_measurement_could_have_is_no_answer(monkeypatch):
    """A prior fitted on accepted but absurd latencies (1e-3 and 1e10 µs alternating)
    answered a pick predicted at 7e-10 µs: outside the range a measurement may take, the
    learned pick is dropped and the analytical model's stands (None here)."""
    from types import SimpleNamespace

    import numpy as np

    workload = parse_any_workload(GEMM)
    space = family_of(workload).enumerate(workload, get_gpu("h100"))
    monkeypatch.setattr(priors, "default_learned_tasks", lambda *args: [1, 2, 3])

    def pick(log_throughput: float):
        values = np.full(len(space), log_throughput)
        return priors.learned_pick(
            None, workload, "h100", lambda: space, lambda ids, s: SimpleNamespace(values=values)
        )

    plausible = pick(np.log(100.0))  # 100 TFLOP/s
    assert plausible is not None and 1e-3 < plausible.predicted_us < 1e10
    assert plausible.learned_from == (1, 2, 3)
    assert pick(np.log(1e18)) is None  # faster than 1e-3 µs
    assert pick(np.log(1e-18)) is None  # slower than 1e10 µs
