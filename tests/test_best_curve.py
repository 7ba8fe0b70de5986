"""A task's best-so-far curve kept by its steps (service/best_curve.py): the same curve as the
plain form of a value per trial, which rows written before it still hold."""

from __future__ import annotations

import random

import numpy as np
from service_support import (
    SMALL_GEMM,
    client_for,
    create_task,
    drain,
    lease,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import select

from pipetune.service.best_curve import BestCurve, best_latencies
from pipetune.service.orm import TaskRow

pytest_plugins = ["service_fixtures"]


def _plain(latencies: list[float | None]) -> list[float | None]:
    """The form rows held before the steps: the best after each trial."""
    out, best = [], None
    for latency in latencies:
        if latency is not None and (best is None or latency < best):
            best = latency
        out.append(best)
    return out


def test_the_steps_are_the_plain_curve_at_every_length():
    rng = random.Random(7)
    for _ in range(200):
        latencies = [
            None if rng.random() < 0.3 else rng.uniform(1.0, 100.0)
            for _ in range(rng.randrange(0, 60))
        ]
        curve = BestCurve()
        cut = rng.randrange(0, len(latencies) + 1)  # observed in two advances
        curve.extend(latencies[:cut])
        curve.extend(latencies[cut:])
        plain = _plain(latencies)
        assert curve.n == len(latencies)
        assert len(curve.steps) == len({v for v in plain if v is not None})
        for max_k in (len(latencies), max(len(latencies) - 5, 0), len(latencies) + 5, 1):
            steps = best_latencies(curve.doc(), max_k)
            np.testing.assert_array_equal(steps, best_latencies(plain, max_k))
            assert len(steps) == min(max_k, len(latencies))


def test_before_the_first_success_the_best_is_inf_and_no_curve_is_empty():
    curve = BestCurve()
    curve.extend([None, None, 5.0, None, 7.0, 4.0])
    assert curve.doc() == {"n": 6, "steps": [[2, 5.0], [5, 4.0]]}
    assert best_latencies(curve.doc(), 10).tolist() == [np.inf, np.inf, 5.0, 5.0, 5.0, 4.0]
    assert best_latencies(None, 10).size == 0  # an imported dataset's task keeps none


def test_a_task_stores_its_curve_by_its_steps(client):
    """A task of n trials rewrote n values with each batch (O(n^2) over the task); now the
    steps, and the aggregate view reads them as it read the values."""
    worker = register(client)
    task_id = create_task(client, budget=24, strategy="grid")["id"]
    drain(client, worker)
    with service_of(client).db.read() as s:
        stored = s.scalar(select(TaskRow.curve).where(TaskRow.id == task_id))
    points = client.get(f"/v1/tasks/{task_id}/curve").json()["points"]
    assert stored["n"] == 24 == len(points)
    bests = [p["best_latency_us"] for p in points]
    assert [v for _, v in stored["steps"]] == sorted(set(bests), reverse=True)
    assert best_latencies(stored, 24).tolist() == bests


def test_a_task_that_fails_stores_its_curve_over_every_trial_it_ran(client):
    """A task that cannot advance fails; its stored curve stayed the last batch boundary's,
    so the aggregate view counted 4 of its 8 trials (and drew best-in-4 against a best known
    that the left-out trials had found)."""
    worker = register(client)
    task_id = create_task(client, budget=16, strategy="random", batch_size=4)["id"]
    driver = service_of(client).driver
    propose, calls = driver._propose, []

    def failing(live, n):
        calls.append(n)
        if len(calls) > 1:
            raise ValueError("the session cannot propose")
        return propose(live, n)

    driver._propose = failing
    drain(client, worker, lambda job: ok(100.0 - job["trial"]))
    task = client.get(f"/v1/tasks/{task_id}").json()
    assert task["state"] == "failed" and task["trials_done"] == 8
    points = client.get(f"/v1/tasks/{task_id}/curve").json()["points"]
    with service_of(client).db.read() as s:
        stored = s.scalar(select(TaskRow.curve).where(TaskRow.id == task_id))
    assert best_latencies(stored, 100).tolist() == [p["best_latency_us"] for p in points]
    aggregate = client.get("/v1/curves").json()["curves"]["random"]
    assert [p["k"] for p in aggregate] == list(range(1, 9)) and aggregate[-1]["best_in_k"] == 1.0


def test_the_stored_curve_is_in_trial_order_when_trials_are_observed_out_of_it(db_url):
    """With early proposals a batch's late trial is observed after the next batch's others:
    the stored curve took the order observed, and the aggregate's best-in-6 of a task whose
    trial 5 found the optimum read 0.05 where the task's own curve read the optimum."""

    def latency(trial: int) -> float:
        return 5.0 if trial == 5 else 100.0 - trial

    with client_for(db_url, propose_early=0.25) as client:
        worker = register(client)
        task_id = create_task(client, budget=12, strategy="bo", batch_size=4)["id"]
        for job in lease(client, worker, max_jobs=4):
            post_result(client, worker, job, ok(latency(job["trial"])))
        second = lease(client, worker, max_jobs=4)
        assert sorted(j["trial"] for j in second) == [4, 5, 6, 7]
        for job in second:  # trial 5 still measured: the third batch is proposed early
            if job["trial"] != 5:
                post_result(client, worker, job, ok(latency(job["trial"])))
        trials = client.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
        assert len(trials) == 12
        late = next(j for j in second if j["trial"] == 5)
        post_result(client, worker, late, ok(latency(5)))
        drain(client, worker, lambda job: ok(latency(job["trial"])))
        points = client.get(f"/v1/tasks/{task_id}/curve").json()["points"]
        with service_of(client).db.read() as s:
            stored = s.scalar(select(TaskRow.curve).where(TaskRow.id == task_id))
        bests = [p["best_latency_us"] for p in points]
        assert bests == [100.0, 99.0, 98.0, 97.0, 96.0] + [5.0] * 7
        assert best_latencies(stored, 100).tolist() == bests
        aggregate = client.get("/v1/curves").json()["curves"]["bo"]
        assert [p["best_in_k"] for p in aggregate[5:]] == [1.0] * 7


def test_trials_observed_out_of_order_wait_for_the_ones_before_them():
    curve = BestCurve()
    curve.observe([(0, 9.0), (2, 3.0), (3, None)])
    assert curve.doc() == {"n": 1, "steps": [[0, 9.0]]}  # trial 1 not observed yet
    curve.observe([(1, 7.0), (4, 8.0)])
    assert curve.doc() == {"n": 5, "steps": [[0, 9.0], [1, 7.0], [2, 3.0]]}


def test_a_cancelled_tasks_curve_counts_the_trials_measured_after_a_cancelled_job(db_url):
    """A cancelled task whose first job was still out when it was cancelled, and whose later
    jobs had been measured: its row counted them (trials_done, its best), while its curve,
    its stored curve and the aggregate stopped at the cancelled job: no point at all, the
    task's best left out."""
    with client_for(db_url) as client:
        worker = register(client)
        task_id = create_task(client, budget=3, strategy="grid", batch_size=3)["id"]
        jobs = sorted(lease(client, worker, max_jobs=3), key=lambda j: j["trial"])
        for job, latency in zip(jobs[1:], (20.0, 10.0), strict=True):
            post_result(client, worker, job, ok(latency))
        assert client.delete(f"/v1/tasks/{task_id}").status_code in (200, 204)
        task = client.get(f"/v1/tasks/{task_id}").json()
        assert (task["state"], task["trials_done"], task["best"]["trial"]) == ("cancelled", 2, 2)
        curve = client.get(f"/v1/tasks/{task_id}/curve").json()
        assert [(p["trial"], p["best_latency_us"]) for p in curve["points"]] == [
            (0, 20.0),
            (1, 10.0),
        ]
        assert curve["runners"] == ["simulated"]
        with service_of(client).db.read() as s:
            stored = s.scalar(select(TaskRow.curve).where(TaskRow.id == task_id))
        assert best_latencies(stored, 100).tolist() == [20.0, 10.0]
        aggregate = client.get("/v1/curves").json()["curves"]["grid"]
        assert [(p["k"], p["best_in_k"]) for p in aggregate] == [(1, 0.5), (2, 1.0)]


def test_a_task_that_ended_before_k_counts_at_k_as_it_ended(client):
    """best-in-k over tasks of one strategy and workload, one with a smaller budget: it
    stopped counting past its budget, and the curve fell (0.84 at k=3, 0.69 at k=4) though
    nobody's best got worse. It counts as it ended, as `bench tuner` counts a shorter run;
    a task still running counts up to the trials it has."""
    worker = register(client)
    short = create_task(client, budget=2, strategy="random", batch_size=2)["id"]
    drain(client, worker, lambda job: ok(10.0))  # found the best known at once
    longer = create_task(client, budget=4, strategy="random", batch_size=4)["id"]
    drain(client, worker, lambda job: ok(40.0 - 5 * job["trial"]))  # 40, 35, 30, 25
    states = [client.get(f"/v1/tasks/{t}").json()["state"] for t in (short, longer)]
    assert states == ["done", "done"]
    aggregate = client.get("/v1/curves").json()["curves"]["random"]
    # Mean over the two tasks of best-known / best-so-far (10 us is the best known).
    expected = [(1.0 + 10 / 40) / 2, (1.0 + 10 / 35) / 2, (1.0 + 10 / 30) / 2, (1.0 + 10 / 25) / 2]
    assert [p["k"] for p in aggregate] == [1, 2, 3, 4]
    assert [p["tasks"] for p in aggregate] == [2, 2, 2, 2]
    assert np.allclose([p["best_in_k"] for p in aggregate], expected)


def test_a_cancelled_task_counts_only_up_to_the_trials_it_ran(client):
    """Counted as it ended past its trials, a task cancelled after one failed trial made its
    strategy's best-in-k 0 at every k (a workload's 0 makes the geometric mean 0): a
    user's cancel is no result of the strategy's beyond what it ran."""
    worker = register(client)
    create_task(client, budget=4, strategy="random", batch_size=4)
    drain(client, worker, lambda job: ok(40.0 - 5 * job["trial"]))  # 40, 35, 30, 25
    create_task(client, budget=2, strategy="grid", batch_size=2, workload=SMALL_GEMM)
    drain(client, worker, lambda job: ok(10.0))
    cancelled = create_task(client, budget=4, strategy="random", batch_size=1, workload=SMALL_GEMM)[
        "id"
    ]
    (job,) = lease(client, worker)
    post_result(client, worker, job, {"status": "compile_error", "error": "nvrtc: no"})
    client.delete(f"/v1/tasks/{cancelled}")
    aggregate = client.get("/v1/curves").json()["curves"]["random"]
    assert [p["tasks"] for p in aggregate] == [2, 1, 1, 1]
    assert np.allclose([p["best_in_k"] for p in aggregate], [0.0, 25 / 35, 25 / 30, 1.0])
