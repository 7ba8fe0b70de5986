"""Benchmark: how long a replica's other tasks wait for their next batch while it rebuilds
one long task's session (a restart, a takeover), by its number of proposer threads.

    python -m benchmarks.bench_proposer_hold [--threads 1 4] [--long-trials 400]

On a fresh PostgreSQL database (in this process): one long `auto` task is run to
`--long-trials` trials and three short ones to their first batch, by a first replica whose
advances are made here. The first replica goes, a second one starts (a restart: it holds no
session), and one request posts the batch results of every task, the long task's first, so
its proposer is asked for the long task before the short ones. The figure is, for each short
task, the seconds from that request until its next batch is queued: with one thread each
waits for the long task's replay (every one of its proposals re-run); with more, it does not.
Results are made up (benchmarks.harness.fake_result), so no GPU and nothing simulated is
measured: only the service's scheduling of its proposals.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient

from benchmarks.harness import DEFAULT_PG, HEADERS, TOKEN, fake_result, pg_database
from benchmarks.load_driver import workload
from pipetune.service.app import create_app
from pipetune.service.migrate import upgrade
from pipetune.service.settings import Settings

BATCH = 8
SHORT_TASKS = 3
STRATEGY = "auto"
WORKER = {"name": "bench", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}


@contextmanager
def replica(url: str, threads: int, proposing: bool) -> Iterator[TestClient]:
    settings = Settings(
        database_url=url,
        worker_tokens=[TOKEN],
        api_keys=[],
        sweep_interval_s=0,  # no upkeep: every advance is the proposer's (or made here)
        batch_size=BATCH,
        proposer_threads=threads,
    )
    with TestClient(create_app(settings)) as client:
        if not proposing:
            client.app.state.service.proposer.stop()
        yield client


def _lease(client: TestClient, worker_id: int) -> list[dict]:
    body = {"worker_id": worker_id, "max_jobs": 64, "wait_s": 0}
    response = client.post("/v1/jobs/lease", json=body, headers=HEADERS)
    response.raise_for_status()
    return response.json()["jobs"]


def _report(client: TestClient, worker_id: int, jobs: list[dict]) -> None:
    results = [
        {"job_id": j["job_id"], "lease_token": j["lease_token"], "result": fake_result(j)}
        for j in jobs
    ]
    body = {"worker_id": worker_id, "results": results}
    client.post("/v1/jobs/results", json=body, headers=HEADERS).raise_for_status()


def _task(client: TestClient, i: int, budget: int) -> int:
    body = {"workload": workload(i), "gpu": "h100", "strategy": STRATEGY, "budget": budget}
    response = client.post("/v1/tasks", json=body)
    response.raise_for_status()
    return response.json()["id"]


def waits(url: str, threads: int, long_trials: int) -> list[float]:
    """Seconds each short task waited for its next batch after the restart."""
    with replica(url, threads, proposing=False) as first:
        worker_id = first.post("/v1/workers", json=WORKER, headers=HEADERS).json()["id"]
        long_task = _task(first, 0, budget=long_trials + 4 * BATCH)
        driver = first.app.state.service.driver
        for _ in range(long_trials // BATCH):  # the long task's history, advanced here
            _report(first, worker_id, _lease(first, worker_id))
            driver.advance(long_task)
        short = [_task(first, 1 + i, budget=4 * BATCH) for i in range(SHORT_TASKS)]
        jobs = _lease(first, worker_id)
    # The long task's results first: its proposer is asked for it first.
    jobs.sort(key=lambda j: j["task_id"] != long_task)
    with replica(url, threads, proposing=True) as second:
        worker_id = second.post("/v1/workers", json=WORKER, headers=HEADERS).json()["id"]
        began = time.monotonic()
        _report(second, worker_id, jobs)
        waited: dict[int, float] = {}
        while len(waited) < len(short):
            for job in _lease(second, worker_id):
                if job["task_id"] in short:
                    waited.setdefault(job["task_id"], time.monotonic() - began)
            time.sleep(0.02)
        return [waited[t] for t in short]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--long-trials", type=int, default=400)
    args = parser.parse_args()
    for threads in args.threads:
        with pg_database(args.pg_url) as url:
            upgrade(url)
            seconds = waits(url, threads, args.long_trials)
        said = ", ".join(f"{s:.2f}" for s in seconds)
        print(
            f"{threads} proposer thread(s), a {args.long_trials}-trial {STRATEGY} task replayed: "
            f"the other tasks' next batches after {said} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
