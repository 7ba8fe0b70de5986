"""Tasks that share a GPU's workers share them fairly: leases go in start-time fair order
(service/fair_share.py), not first come by job id, on each dialect.

Before, a task with a deep backlog (a large batch of a strategy that proposes ahead) took
every worker until its backlog was measured: beside a batch-64 task a batch-8 task got 24
trials to its 404, and a task created behind such a backlog waited for all of it.
"""

from __future__ import annotations

from collections import Counter

from service_support import create_task, fake_latency, lease, ok, post_result, register

pytest_plugins = ["service_fixtures"]


def _answer(client, worker: int, jobs: list[dict]) -> None:
    for job in jobs:
        response = post_result(client, worker, job, ok(fake_latency(job["schedule"])))
        assert response.status_code == 200 and response.json()["accepted"], response.text


def test_a_task_created_behind_a_backlog_gets_its_share_at_once(client):
    worker = register(client)
    big = create_task(client, budget=256, strategy="random", batch_size=64, seed=1)["id"]
    small = create_task(client, budget=16, strategy="random", batch_size=8, seed=2)["id"]
    taken = Counter(job["task_id"] for job in lease(client, worker, max_jobs=16))
    # Both are at the same virtual time: one job each, in turn (first come by id: 16 to 0).
    assert taken == {big: 8, small: 8}, taken


def test_each_backlogged_task_gets_an_equal_share_whatever_its_batch(client):
    worker = register(client)
    tasks = [
        create_task(client, budget=512, strategy="random", batch_size=size, seed=size)["id"]
        for size in (64, 16, 8)
    ]
    taken: Counter = Counter()
    for _ in range(12):  # 96 trials, answered as they come: the tasks propose as they go
        jobs = lease(client, worker, max_jobs=8)
        taken.update(job["task_id"] for job in jobs)
        _answer(client, worker, jobs)
    # Each keeps jobs queued throughout (it proposes a batch ahead), so each gets a third.
    assert all(abs(taken[t] - 32) <= 8 for t in tasks), taken


def test_a_new_task_gets_no_credit_for_the_time_it_did_not_exist(client):
    worker = register(client)
    old = create_task(client, budget=96, strategy="random", batch_size=8, seed=3)["id"]
    for _ in range(5):
        _answer(client, worker, lease(client, worker, max_jobs=8))
    # Everything queued is leased: the queue is empty while the old task has 40 trials
    # behind it. A task created now starts level with it, not 40 trials ahead of it.
    held = lease(client, worker, max_jobs=64)
    assert held and {job["task_id"] for job in held} == {old}
    new = create_task(client, budget=64, strategy="random", batch_size=8, seed=4)["id"]
    _answer(client, worker, held)
    taken: Counter = Counter()
    for _ in range(4):
        jobs = lease(client, worker, max_jobs=8)
        taken.update(job["task_id"] for job in jobs)
        _answer(client, worker, jobs)
    assert abs(taken[old] - taken[new]) <= 8, taken


def test_jobs_no_worker_can_take_do_not_hold_the_others_back(client):
    """A task for GPU measurements only (runner cupy) with no such worker: its jobs stay
    queued with their first keys. They must not hold the GPU's virtual time there, or every
    new task would start that far back and take turns from the tasks being served."""
    worker = register(client)  # simulated: it cannot take the cupy task's jobs
    create_task(client, budget=64, strategy="random", batch_size=8, seed=5, runner="cupy")
    old = create_task(client, budget=512, strategy="random", batch_size=8, seed=6)["id"]
    for _ in range(8):
        _answer(client, worker, lease(client, worker, max_jobs=8))
    new = create_task(client, budget=512, strategy="random", batch_size=8, seed=7)["id"]
    taken: Counter = Counter()
    for _ in range(4):
        jobs = lease(client, worker, max_jobs=8)
        taken.update(job["task_id"] for job in jobs)
        _answer(client, worker, jobs)
    assert abs(taken[old] - taken[new]) <= 8, taken
