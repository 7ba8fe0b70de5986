"""The task driver off the request path: strategies that propose ahead propose exactly what
they would one batch later, a replica whose session is behind rolls it forward instead of
rebuilding it, and spaces are enumerated once per workload and GPU. SQLite and
PostgreSQL where a database is involved."""

from __future__ import annotations

import numpy as np
import pytest
from service_support import (
    GEMM,
    TOKEN,
    client_for,
    create_task,
    fake_latency,
    lease,
    ok,
    post_result,
    register,
    service_of,
    two_replicas_on_a_task,
)

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobResult
from pipetune.model.workloads import parse_workload
from pipetune.service.driver import PROPOSE_AHEAD, Driver, outstanding_allowed
from pipetune.service.queue import WorkerRef
from pipetune.service.settings import token_hash
from pipetune.tuner.offline import RecordedSpace, run_offline
from pipetune.tuner.session import TuningSession

pytest_plugins = ["service_fixtures"]


@pytest.mark.parametrize("strategy", sorted(PROPOSE_AHEAD))
def test_a_strategy_that_proposes_ahead_ignores_the_measurements(strategy: str):
    """What proposing ahead rests on: the next batch is the same whether the previous one
    was observed first (with any results) or not at all."""
    workload, gpu = parse_workload(GEMM), get_gpu("h100")
    rng = np.random.default_rng(0)
    in_order = TuningSession(workload, gpu, strategy, seed=3, budget=40)
    ahead = TuningSession(workload, gpu, strategy, seed=3, budget=40, space=in_order.space)
    pending: list[Schedule] = ahead.propose(8)
    for _ in range(4):
        batch = in_order.propose(8)
        assert batch == pending
        in_order.observe([(s, MeasureResult(status="ok", latency_us=1.0)) for s in batch])
        proposed = ahead.propose(8)  # before observing the batch in hand
        ahead.observe(
            [(s, MeasureResult(status="ok", latency_us=float(rng.uniform(1, 99)))) for s in batch]
        )
        pending = proposed
    assert in_order.propose(8) == pending


def _answer(queue, ref: WorkerRef, max_jobs: int = 64) -> int:
    jobs = queue.try_lease(ref, max_jobs)
    for job in jobs:
        result = ok(fake_latency(job.schedule.model_dump()))
        body = JobResult(worker_id=ref.id, lease_token=job.lease_token, result=result)
        queue.submit(job.job_id, token_hash(TOKEN), body)
    return len(jobs)


def test_a_replica_whose_session_is_behind_rolls_it_forward(db_url):
    with two_replicas_on_a_task(db_url, "xgb", budget=16, seed=6) as r:
        a, task_id, first, second, queue, ref = r.a, r.task_id, r.first, r.second, r.queue, r.ref
        rebuilt: list[int] = []
        new_live = first._new_live

        def counting(*args, **kwargs):
            rebuilt.append(1)
            return new_live(*args, **kwargs)

        first._new_live = counting  # type: ignore[method-assign]
        _answer(queue, ref)
        assert second.advance(task_id)  # B had no session: it rebuilt one (batch 1)
        _answer(queue, ref)
        assert first.advance(task_id)  # A's session is one batch behind (batch 2)
        assert rebuilt == []  # rolled forward, not rebuilt from the first batch
        while _answer(queue, ref):
            first.advance(task_id)
        doc = a.get(f"/v1/tasks/{task_id}").json()
        assert doc["state"] == "done" and doc["trials_done"] == 16
        # Whoever proposed, the record is what one session proposes batch after batch.
        session = TuningSession(parse_workload(GEMM), get_gpu("h100"), "xgb", 6, 16)
        trials = a.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
        for start in range(0, 16, 4):
            batch = trials[start : start + 4]
            assert session.propose(4) == [Schedule(**t["schedule"]) for t in batch]
            session.observe(
                [(Schedule(**t["schedule"]), MeasureResult(status="ok", latency_us=t["latency_us"]))
                 for t in batch]
            )  # fmt: skip


def test_spaces_and_predictions_are_computed_once_per_workload_and_gpu(db_url):
    with client_for(db_url) as c:
        driver: Driver = service_of(c).driver
        for seed in range(3):
            create_task(c, budget=8, strategy="grid", seed=seed)
        assert len(driver._spaces) == 1
        (space, predicted), *_ = driver._spaces.values()
        assert len(predicted) == len(space)
        sessions = [live.session for live in driver._live.values()]
        assert len(sessions) == 3 and all(s.space is space for s in sessions)


@pytest.mark.parametrize(
    ("strategy", "share"),
    [("random", 0.0), ("analytical", 0.0), ("xgb", 0.0), ("auto", 0.0), ("auto", 0.25)],
)
def test_the_service_measures_exactly_what_an_offline_session_does(db_url, strategy, share):
    """Tuning quality is the tuner's: whatever the service does around it (proposing ahead,
    proposing early, off the request path, sessions cached, rolled forward or replayed), a
    task measures the very trials `pipetune bench tuner` measures for the same strategy,
    seed, budget, batch and early proposals (PIPETUNE_PROPOSE_EARLY a quarter of 8 is
    `--early 2`), so its best-in-k is the bench's. Failures included."""
    workload, gpu = parse_workload(GEMM), get_gpu("h100")
    space = TuningSession(workload, gpu, "grid", 0, 1).space
    latency_s = np.array([fake_latency(s.as_dict()) * 1e-6 for s in space])
    latency_s[::7] = np.inf  # recorded as failed
    recorded = RecordedSpace(space, latency_s)
    early = outstanding_allowed(strategy, 8, share, batches=2)
    assert early == (2 if share else 0)
    offline = run_offline(recorded, strategy, seed=9, budget=24, batch=8, early=early).tolist()

    with client_for(db_url, batch_size=8, propose_early=share) as c:
        task_id = create_task(c, budget=24, strategy=strategy, seed=9)["id"]
        worker = register(c, runner="replay")  # (its results say so; the service checks)
        while jobs := lease(c, worker, max_jobs=64, wait_s=0):
            for job in jobs:
                row = space.index(Schedule(**job["schedule"]))
                post_result(c, worker, job, recorded.result(row).model_dump(mode="json"))
        trials = c.get(f"/v1/tasks/{task_id}/trials").json()["trials"]
        assert c.get(f"/v1/tasks/{task_id}").json()["state"] == "done"
    measured = [space.index(Schedule(**t["schedule"])) for t in trials]
    assert measured == offline
