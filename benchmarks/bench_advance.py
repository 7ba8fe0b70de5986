"""Benchmark: the task driver's CPU per advance (a batch of results observed, the next batch
proposed and written), on PostgreSQL, with one replica or two taking turns.

    python -m benchmarks.bench_advance [--replicas 1 2] [--rounds 150] [--strategy random]

Four tasks of batch 8 on two replicas of one fresh database (in this process, each with its
own driver and connection pool; their proposer threads stopped, so that the advances are
made, and timed, here). Each round one worker leases every queued job, posts made-up results
for them in one request, and each task is advanced by a replica: with two, the task's turn
alternates between them each round, as under load the replica that takes a batch's last
result advances it, and the other rolls its session forward through the batches it missed.
The figure is the calling thread's CPU time per advance that enqueued a batch (its own work
and the database driver's client side; PostgreSQL's side is not counted). It isolates the
driver's share of `benchmarks/bench_load.py`'s service CPU per result (an advance per batch).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from fastapi.testclient import TestClient

from benchmarks.harness import DEFAULT_PG, HEADERS, TOKEN, fake_result, pg_database
from benchmarks.load_driver import workload
from pipetune.service.app import create_app
from pipetune.service.migrate import upgrade
from pipetune.service.settings import Settings

TASKS = 4
BATCH = 8


@contextmanager
def replicas_of(url: str, count: int) -> Iterator[list[TestClient]]:
    with ExitStack() as stack:
        clients = []
        for _ in range(count):
            settings = Settings(
                database_url=url,
                worker_tokens=[TOKEN],
                api_keys=[],
                sweep_interval_s=0,
                batch_size=BATCH,
            )
            client = stack.enter_context(TestClient(create_app(settings)))
            client.app.state.service.proposer.stop()  # the advances are made here
            clients.append(client)
        yield clients


def cpu_per_advance(url: str, replicas: int, rounds: int, strategy: str) -> tuple[float, int]:
    """Milliseconds of thread CPU per advance that enqueued a batch, and how many there were."""
    with replicas_of(url, max(replicas, 1)) as clients:
        first = clients[0]
        budget = BATCH * (rounds + 4)
        tasks = []
        for i in range(TASKS):
            body = {
                "workload": workload(i),
                "gpu": "h100",
                "strategy": strategy,
                "budget": budget,
                "seed": i,
            }
            response = first.post("/v1/tasks", json=body)
            response.raise_for_status()
            tasks.append(response.json()["id"])
        worker = {"name": "bench", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
        response = first.post("/v1/workers", json=worker, headers=HEADERS)
        response.raise_for_status()
        worker_id = response.json()["id"]
        spent, advances = 0.0, 0
        for r in range(rounds):
            lease = {"worker_id": worker_id, "max_jobs": BATCH * TASKS * 2, "wait_s": 0}
            jobs = first.post("/v1/jobs/lease", json=lease, headers=HEADERS).json()["jobs"]
            if not jobs:
                break
            results = [
                {"job_id": j["job_id"], "lease_token": j["lease_token"], "result": fake_result(j)}
                for j in jobs
            ]
            body = {"worker_id": worker_id, "results": results}
            first.post("/v1/jobs/results", json=body, headers=HEADERS).raise_for_status()
            for i, task_id in enumerate(tasks):
                driver = clients[(r + i) % len(clients)].app.state.service.driver
                began = time.thread_time()
                changed = driver.advance(task_id)
                took = time.thread_time() - began
                if changed:
                    spent, advances = spent + took, advances + 1
        return 1e3 * spent / max(advances, 1), advances


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--strategy", default="random")
    args = parser.parse_args()
    for replicas in args.replicas:
        with pg_database(args.pg_url) as url:
            upgrade(url)
            ms, advances = cpu_per_advance(url, replicas, args.rounds, args.strategy)
        print(
            f"{args.strategy}, {replicas} replica(s): {ms:.3f} ms of CPU per advance "
            f"({advances} advances)",
            flush=True,
        )


if __name__ == "__main__":
    main()
