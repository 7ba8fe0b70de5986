"""Tasks that share a GPU's workers share them fairly: leases go in start-time fair order
(service/fair_share.py), not first come by job id, on each dialect.

Before, a task with a deep backlog (a large batch of a strategy that proposes ahead) took
every worker until its backlog was measured: beside a batch-64 task a batch-8 task got 16
trials to its 272, and a task created behind such a backlog waited for all of it.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import datetime

import pytest
from service_support import (
    GEMM,
    SMALL_GEMM,
    WORKER_HEADERS,
    client_for,
    create_task,
    fake_latency,
    lease,
    ok,
    post_result,
    register,
    service_of,
)
from sqlalchemy import create_engine, text, update

from pipetune.service.fair_share import KEY_UNIT
from pipetune.service.orm import JobRow

pytest_plugins = ["service_fixtures"]


def _answer(client, worker: int, jobs: list[dict], failed: bool = False) -> None:
    for job in jobs:
        result = ok(fake_latency(job["schedule"]))
        if failed:
            result = {"status": "compile_error", "error": "ptxas: out of registers"}
        response = post_result(client, worker, job, result)
        assert response.status_code == 200 and response.json()["accepted"], response.text


def _take_turns(client, worker: int, leases: int) -> Counter:
    """Lease 8 jobs at a time `leases` times, answering each lease before the next (the
    tasks propose as they go); the jobs taken, by task."""
    taken: Counter = Counter()
    for _ in range(leases):
        jobs = lease(client, worker, max_jobs=8)
        taken.update(job["task_id"] for job in jobs)
        _answer(client, worker, jobs)
    return taken


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
    taken = _take_turns(client, worker, 12)  # 96 trials
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
    taken = _take_turns(client, worker, 4)
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
    taken = _take_turns(client, worker, 4)
    assert abs(taken[old] - taken[new]) <= 8, taken


def test_failed_trials_move_the_virtual_time_as_done_ones(client):
    """The GPU's only worker measures on the GPU (cupy), and its task for such workers only
    fails every trial: its queued jobs (one runner kind's) and its failed ones were both
    left out of the virtual time, which stayed at the last job done, an earlier task's. A
    task created then started back there and took every trial (32 of 32, the old task
    none) until it caught up."""
    worker = register(client, "gpu", runner="cupy")
    create_task(client, budget=8, strategy="random", batch_size=8, seed=11)
    _answer(client, worker, lease(client, worker, max_jobs=8))
    old = create_task(client, budget=512, strategy="random", batch_size=8, seed=12, runner="cupy")
    for _ in range(10):
        _answer(client, worker, lease(client, worker, max_jobs=8), failed=True)
    new = create_task(client, budget=512, strategy="random", batch_size=8, seed=13)["id"]
    taken: Counter = Counter()
    for _ in range(4):
        jobs = lease(client, worker, max_jobs=8)
        taken.update(job["task_id"] for job in jobs)
        for task, failed in ((new, False), (old["id"], True)):
            _answer(client, worker, [job for job in jobs if job["task_id"] == task], failed)
    assert abs(taken[old["id"]] - taken[new]) <= 8, taken


def test_a_task_of_priority_p_takes_p_trials_to_a_priority_1_tasks_one(client):
    worker = register(client)
    low = create_task(client, budget=512, strategy="random", batch_size=16, seed=8)["id"]
    high = create_task(client, budget=512, strategy="random", batch_size=16, seed=9, priority=3)
    assert high["priority"] == 3 and client.get(f"/v1/tasks/{low}").json()["priority"] == 1
    taken = _take_turns(client, worker, 8)  # 64 trials, answered as they come
    assert abs(taken[high["id"]] - 48) <= 4 and abs(taken[low] - 16) <= 4, taken


@pytest.mark.parametrize("priority", [0, 11, "2", 2.0, None])
def test_a_priority_out_of_range_or_not_an_integer_is_a_422_naming_it(client, priority):
    body = {"workload": GEMM, "gpu": "h100", "budget": 4, "priority": priority}
    for path, sent in (("/v1/tasks", body), ("/v1/schedules", _as_tune(body))):
        response = client.post(path, json=sent)
        assert response.status_code == 422, response.text
        locations = [tuple(e["loc"]) for e in response.json()["detail"]]
        assert any(loc[-1] == "priority" for loc in locations), locations


def _as_tune(body: dict) -> dict:
    options = {k: v for k, v in body.items() if k not in ("workload", "gpu")}
    return {"workload": body["workload"], "gpu": body["gpu"], "tune": options}


def test_a_schedule_request_starts_its_task_with_the_priority_asked(client):
    body = {"workload": GEMM, "gpu": "h100", "budget": 4, "priority": 5}
    task_id = client.post("/v1/schedules", json=_as_tune(body)).json()["task_id"]
    assert client.get(f"/v1/tasks/{task_id}").json()["priority"] == 5


def test_the_virtual_time_is_each_gpus_own(client):
    """A GPU whose tasks got far does not move another GPU's virtual time: a batch an H200
    task enqueues with nothing queued on its GPU starts where the H200's tasks got, not
    where the H100's did."""
    h100 = register(client, "w-h100", gpu="h100")
    create_task(client, budget=256, strategy="random", batch_size=16, seed=10)
    for _ in range(6):  # the H100's task gets 96 trials ahead
        _answer(client, h100, lease(client, h100, max_jobs=16))
    h200 = register(client, "w-h200", gpu="h200")
    body = {"workload": GEMM, "gpu": "h200", "budget": 24, "strategy": "random", "seed": 11}
    task = client.post("/v1/tasks", json={**body, "batch_size": 8}).json()["id"]
    held = lease(client, h200, max_jobs=16)  # both batches it proposed: its GPU's queue empties
    assert len(held) == 16
    _answer(client, h200, held)  # its third batch is enqueued now, by an advance
    with service_of(client).db.read_conn() as conn:
        keys = (
            conn.execute(
                text("SELECT fair_key FROM jobs WHERE task_id = :t ORDER BY trial"), {"t": task}
            )
            .scalars()
            .all()
        )
    assert keys == [trial * KEY_UNIT for trial in range(24)], keys  # priority 1: a unit each


def _history(url: str, strategy: str, propose_early: float) -> list[tuple]:
    """One scripted history, the same on any database: tasks on three GPUs (h100 and h200
    share sm_90), one for cupy workers only, a worker of each of two GPUs leasing and
    answering in turn, part of each lease answered after the next. The h200 task's first
    batch finds nothing on its GPU (the virtual time is its active tasks' furthest key
    then), and every h200 trial fails (the furthest failed key is the time after). Tasks of
    priorities 2 and 3; one h100 lease expires (its jobs queued again with their keys),
    and an h100 task is cancelled with jobs queued and leased. Returns every job's
    (task, trial, fair_key, seen_at)."""
    with client_for(url, propose_early=propose_early) as c:
        create_task(c, budget=256, strategy="random", batch_size=64, seed=1, gpu="a100")
        create_task(c, budget=64, strategy=strategy, batch_size=8, seed=2, priority=2)
        create_task(c, budget=32, strategy="analytical+xgb", batch_size=8, seed=3, gpu="h200")
        create_task(c, budget=32, strategy="random", batch_size=8, seed=4, runner="cupy")
        h100, h200 = register(c, "h100"), register(c, "h200", gpu="h200")
        for round_ in range(6):
            for worker in (h100, h200):
                jobs = lease(c, worker, max_jobs=16)
                failed = worker == h200
                _answer(c, worker, jobs[:6], failed)  # the rest after the next lease
                if round_ == 1 and worker == h100:  # the rest's lease expires instead
                    _expire(c, jobs[6:])
                    jobs = jobs[:6]
                _answer(c, worker, lease(c, worker, max_jobs=4) + jobs[6:], failed)
            if round_ == 2:  # a task created with the h100 queue served up to date
                create_task(c, budget=64, strategy=strategy, batch_size=4, seed=5, priority=3)
            if round_ == 3:
                held = lease(c, h100, max_jobs=2)
                assert c.delete(f"/v1/tasks/{held[0]['task_id']}").status_code == 200
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            sql = "SELECT task_id, trial, fair_key, seen_at FROM jobs ORDER BY task_id, trial"
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()


def _expire(client, jobs: list[dict]) -> None:
    """The jobs' leases expired (by the database clock): queued again by the reclaim."""
    service = service_of(client)
    with service.db.write_conn() as conn:
        conn.execute(
            update(JobRow)
            .where(JobRow.id.in_([job["job_id"] for job in jobs]))
            .values(lease_expires_at=datetime(2000, 1, 1))
        )
    assert service.queue.reclaim() == set()  # queued again, none lost


@pytest.mark.parametrize(("strategy", "propose_early"), [("random", 0.0), ("analytical+xgb", 0.5)])
def test_both_dialects_give_the_same_keys_for_the_same_history(
    sqlite_template, pg, tmp_path, strategy, propose_early
):
    """PostgreSQL numbers a batch in its one-statement commit (the rule's compiled text,
    service/driver.py; with early proposals, the statement that marks what they saw),
    SQLite through the ORM: the same rule, so the same keys. The text compared an active
    task's GPU with itself (`tasks.gpu = tasks.gpu`), so on PostgreSQL a GPU with nothing
    queued (nothing leased or done either, since the next commit) took the furthest key of
    any GPU's tasks: the h200 task's second batch numbered 128 on, the a100 task's."""
    path = tmp_path / "pipetune.db"
    shutil.copy(sqlite_template, path)
    on_sqlite = _history(f"sqlite:///{path}", strategy, propose_early)
    on_pg = _history(pg, strategy, propose_early)
    assert len(on_sqlite) == len(on_pg) > 100
    # With early proposals, batches were committed by the statement that marks what they saw.
    assert any(row[3] is not None for row in on_pg) == (propose_early > 0)
    differ = [(s, p) for s, p in zip(on_sqlite, on_pg, strict=True) if s != p]
    assert not differ, differ[:10]


def _register_for(client, workload: dict) -> int:
    """A replay worker of h100: it leases the one workload's jobs only."""
    body = {"name": "replay", "gpu": "h100", "arch": "sm_90", "runner": "replay"}
    body["workload"] = workload
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def test_jobs_no_worker_takes_do_not_give_a_new_task_the_time_it_did_not_exist(client):
    """The only worker answers one workload (a replay worker: its dataset's), so another
    workload's task waits with its first keys queued. Taken for the GPU's virtual time, they
    held it at 0 while the served task went on: a task created later started back there and
    took every trial until it caught up (32 of 32, the old task none)."""
    worker = _register_for(client, GEMM)
    create_task(client, budget=64, strategy="random", batch_size=8, seed=8, workload=SMALL_GEMM)
    old = create_task(client, budget=512, strategy="random", batch_size=8, seed=9)["id"]
    for _ in range(8):
        _answer(client, worker, lease(client, worker, max_jobs=8))
    new = create_task(client, budget=512, strategy="random", batch_size=8, seed=10)["id"]
    taken = _take_turns(client, worker, 4)
    assert abs(taken[old] - taken[new]) <= 8, taken
