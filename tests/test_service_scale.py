"""With 100k trials in the database, the endpoints the dashboard polls stay fast, and the
hot queries use their indexes (SQLite, the embedded default)."""

from __future__ import annotations

import random
import time

import pytest
from service_support import WORKER_HEADERS, client_for, register
from sqlalchemy import text

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import parse_workload
from pipetune.service.orm import JobRow, TaskRow, WorkloadRow

pytest_plugins = ["service_fixtures"]

TASKS = 40
TRIALS = 2500  # 40 x 2500 = 100k trials
WORKLOADS = [
    {"op": "gemm", "m": 1024, "n": 1024, "k": 1024},
    {"op": "gemm", "m": 4096, "n": 1024, "k": 4096},
]
STRATEGIES = ["analytical+xgb", "xgb", "random", "grid"]


def _populate(service) -> int:
    """Insert 100k finished trials (plus 8 queued) straight into the tables."""
    rng = random.Random(0)
    gpu = get_gpu("h100")
    jobs = []
    with service.db.write() as s:
        for w_index, doc in enumerate(WORKLOADS):
            workload = parse_workload(doc)
            s.add(
                WorkloadRow(
                    id=w_index + 1,
                    hash=workload.workload_hash,
                    op="gemm",
                    canonical=workload.canonical(),
                    label=workload.label(),
                    flops=workload.flops,
                )
            )
        s.flush()
        spaces = [Space.enumerate(parse_workload(doc), gpu) for doc in WORKLOADS]
        for task_id in range(1, TASKS + 1):
            w_index = task_id % len(WORKLOADS)
            space = spaces[w_index]
            rows = rng.sample(range(len(space)), TRIALS)
            curve, best = [], None
            for trial, row in enumerate(rows):
                latency = rng.uniform(50, 500)
                failed = trial % 17 == 3
                if not failed and (best is None or latency < best[0]):
                    best = (latency, trial)
                curve.append(best[0] if best else None)
                schedule = space[row]
                jobs.append(
                    {
                        "task_id": task_id,
                        "workload_id": w_index + 1,
                        "gpu": "h100",
                        "arch": "sm_90",
                        "trial": trial,
                        "batch": trial // 8,
                        "schedule": schedule.as_dict(),
                        "schedule_id": schedule.id,
                        "predicted_us": latency * rng.uniform(0.8, 1.2),
                        "state": "failed" if failed else "done",
                        "attempts": 0,
                        "status": "compile_error" if failed else "ok",
                        "latency_us": None if failed else latency,
                    }
                )
            s.add(
                TaskRow(
                    id=task_id,
                    workload_id=w_index + 1,
                    gpu="h100",
                    arch="sm_90",
                    strategy=STRATEGIES[task_id % len(STRATEGIES)],
                    budget=TRIALS,
                    seed=task_id,
                    batch_size=8,
                    state="done",
                    batches=TRIALS // 8,
                    trials_target=TRIALS,
                    trials_enqueued=TRIALS,
                    trials_done=TRIALS,
                    trials_failed=sum(1 for t in range(TRIALS) if t % 17 == 3),
                    best_trial=best[1],
                    best_latency_us=best[0],
                    curve=curve,
                )
            )
        s.flush()
        s.execute(JobRow.__table__.insert(), jobs)
    return len(jobs)


def _timed(client, method: str, path: str, **kwargs) -> tuple[float, dict]:
    started = time.perf_counter()
    response = client.request(method, path, **kwargs)
    elapsed = time.perf_counter() - started
    assert response.status_code in (200, 201, 202), response.text
    is_json = response.headers["content-type"].startswith("application/json")
    return elapsed, response.json() if is_json else {}


@pytest.fixture(scope="module")
def big_client(tmp_path_factory, sqlite_template):
    import shutil

    path = tmp_path_factory.mktemp("scale") / "big.db"
    shutil.copy(sqlite_template, path)
    with client_for(f"sqlite:///{path}") as client:
        assert _populate(client.app.state.service) == TASKS * TRIALS
        yield client


def test_polling_endpoints_stay_fast_with_100k_trials(big_client):
    c = big_client
    # Warm-up: the first request pays for imports and caches.
    c.get("/v1/tasks")
    limits = {
        "/v1/tasks": 0.5,
        f"/v1/tasks/{TASKS}": 0.1,
        f"/v1/tasks/{TASKS}/trials?after={TRIALS - 10}": 0.1,
        f"/v1/tasks/{TASKS}/curve?after={TRIALS - 10}": 0.5,
        f"/v1/tasks/{TASKS}/curve": 1.0,
        f"/v1/tasks/{TASKS}/trials?limit=2000": 1.5,
        "/v1/curves": 1.5,
        "/v1/curves?strategy=xgb&gpu=h100&op=gemm": 1.0,
        "/metrics": 0.5,
        "/dashboard": 0.1,
    }
    for path, limit in limits.items():
        elapsed = min(_timed(c, "GET", path)[0] for _ in range(3))
        assert elapsed < limit, f"GET {path} took {elapsed * 1e3:.0f} ms (limit {limit} s)"
    _, doc = _timed(c, "GET", f"/v1/tasks/{TASKS}/trials?after={TRIALS - 10}")
    assert [t["trial"] for t in doc["trials"]] == list(range(TRIALS - 9, TRIALS))
    _, curves = _timed(c, "GET", "/v1/curves")
    assert set(curves["curves"]) == set(STRATEGIES)
    assert len(curves["curves"]["xgb"]) == 1000  # max_k's default
    for points in curves["curves"].values():
        assert all(0 < p["best_in_k"] <= 1 for p in points)


def test_best_schedule_and_lease_stay_fast_with_100k_trials(big_client):
    c = big_client
    body = {"workload": WORKLOADS[0], "gpu": "h100"}
    elapsed, doc = min(_timed(c, "POST", "/v1/schedules", json=body) for _ in range(3))
    # A bound against a scan of the 100k trials (seconds), not a speed goal: the answer
    # takes 0.09-0.10 s on a slow day of the 2-core VM (the lookup's model view), which a
    # 0.1 s bound failed at random.
    assert doc["source"] == "measured" and elapsed < 0.5, elapsed
    worker = register(c, "scale-worker")
    assert c.post("/v1/tasks", json={**body, "budget": 8, "strategy": "grid"}).status_code == 201
    lease = {"worker_id": worker, "max_jobs": 8, "wait_s": 0}
    elapsed, leased = _timed(c, "POST", "/v1/jobs/lease", json=lease, headers=WORKER_HEADERS)
    assert len(leased["jobs"]) == 8 and elapsed < 0.2


def test_hot_queries_use_their_indexes(big_client):
    service = big_client.app.state.service
    plans = {
        "ix_jobs_queue": "SELECT id FROM jobs WHERE state = 'queued' AND arch = 'sm_90' "
        "AND gpu = 'h100' ORDER BY fair_key, id LIMIT 8",
        "ix_jobs_lease_expiry": "SELECT id FROM jobs WHERE state = 'leased' "
        "AND lease_expires_at < '2030-01-01'",
        "ix_jobs_best": "SELECT id FROM jobs WHERE workload_id = 1 AND gpu = 'h100' "
        "AND status = 'ok' ORDER BY latency_us LIMIT 1",
        "(task_id=? AND trial>?)": "SELECT trial FROM jobs WHERE task_id = 3 AND trial > 100 "
        "ORDER BY trial",
    }
    with service.db.read() as s:
        for index, query in plans.items():
            plan = " ".join(str(row[-1]) for row in s.execute(text(f"EXPLAIN QUERY PLAN {query}")))
            assert index in plan, (index, plan)
