"""A task's best-so-far curve kept by its steps (service/best_curve.py): the same curve as the
plain form of a value per trial, which rows written before it still hold."""

from __future__ import annotations

import random

import numpy as np
from service_support import create_task, drain, ok, register, service_of
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
