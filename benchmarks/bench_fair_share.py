"""How tasks that share a GPU's workers share them: trials per task while they compete, and
how long a task created behind another's backlog waits for its first trial.

One `pipetune serve` on a fresh PostgreSQL database, a few simulated workers (HTTP clients in
this process: each leases one job, sleeps --measure-ms as if measuring it, posts a made-up
result). At the start two tasks: a large-batch `random` task (--big-batch, 64: it proposes a
batch ahead, so it keeps up to two batches queued) and a batch-8 task of the service's
default strategy (`auto`: its next batch waits on its results). After --late-s a third task
(`random`, batch 8) joins. Every leased job is logged with its time, so the figures are
counted from the leases, not sampled:

* trials leased per task before the third task joins, and after;
* the third task's wait from its creation to its first lease.

`--late-priority P` gives the third task priority P: it should take P trials to each of the
others' one while all three wait.

    python -m benchmarks.bench_fair_share                 # 2 workers, 30 s
    python -m benchmarks.bench_fair_share --json
    python -m benchmarks.bench_fair_share --write         # and record in RESULTS.md

The results are made up (no runner measures anything): the benchmark is of the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import (
    DEFAULT_PG,
    HEADERS,
    fake_result,
    pg_database,
    register_worker,
    service_process,
)
from benchmarks.load_driver import workload
from benchmarks.results import write_section
from pipetune.model.wire import DEFAULT_PRIORITY

BUDGET = 2000  # more than a run leases (2 workers, 30 s): no task finishes within it


@dataclass
class Run:
    """What the workers saw: (seconds since the start, task id) per leased job."""

    started: float = field(default_factory=time.monotonic)
    leases: list[tuple[float, int]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started


async def _create(
    client: httpx.AsyncClient, i: int, strategy: str, batch: int, priority: int = DEFAULT_PRIORITY
) -> int:
    body = {
        "workload": workload(i),
        "gpu": "h100",
        "budget": BUDGET,
        "strategy": strategy,
        "batch_size": batch,
        "seed": i,
    }
    if priority != DEFAULT_PRIORITY:  # (a service from before priorities still answers the default)
        body["priority"] = priority
    response = await client.post("/v1/tasks", json=body)
    response.raise_for_status()
    return int(response.json()["id"])


async def _worker(client: httpx.AsyncClient, name: str, run: Run, until: float, measure_s: float):
    worker_id = await register_worker(client, name)
    while run.now() < until:
        body = {"worker_id": worker_id, "max_jobs": 1, "wait_s": 1.0}
        response = await client.post("/v1/jobs/lease", json=body, headers=HEADERS)
        response.raise_for_status()
        for job in response.json()["jobs"]:
            run.leases.append((run.now(), int(job["task_id"])))
            await asyncio.sleep(measure_s)
            result = {
                "worker_id": worker_id,
                "lease_token": job["lease_token"],
                "result": fake_result(job),
            }
            posted = await client.post(
                f"/v1/jobs/{job['job_id']}/result", json=result, headers=HEADERS
            )
            posted.raise_for_status()


async def _drive(base: str, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        run = Run()
        big = await _create(client, 0, "random", args.big_batch)
        small = await _create(client, 1, "auto", 8)
        workers = [
            asyncio.create_task(
                _worker(client, f"fair-{i}", run, args.seconds, args.measure_ms / 1e3)
            )
            for i in range(args.workers)
        ]
        await asyncio.sleep(max(0.0, args.late_s - run.now()))
        late_created = run.now()
        late = await _create(client, 2, "random", 8, args.late_priority)
        await asyncio.gather(*workers)
    before = Counter(task for at, task in run.leases if at < late_created)
    after = Counter(task for at, task in run.leases if at >= late_created)
    first_late = min((at for at, task in run.leases if task == late), default=None)
    late_name = "late random 8" + (
        f" priority {args.late_priority}" if args.late_priority > DEFAULT_PRIORITY else ""
    )
    names = {big: f"random batch {args.big_batch}", small: "auto batch 8", late: late_name}
    return {
        "workers": args.workers,
        "measure_ms": args.measure_ms,
        "seconds": args.seconds,
        "late_created_s": round(late_created, 2),
        "before_late": {names[t]: before[t] for t in (big, small)},
        "after_late": {names[t]: after[t] for t in (big, small, late)},
        "late_first_trial_wait_s": None
        if first_late is None
        else round(first_late - late_created, 2),
    }


def _section(report: dict[str, Any], command: str) -> str:
    rows = [
        "| task | trials before the third task | trials after |",
        "|---|---:|---:|",
    ]
    for name, after in report["after_late"].items():
        before = report["before_late"].get(name, "-")
        rows.append(f"| {name} | {before} | {after} |")
    return "\n".join(
        [
            f"`{command}`: {report['workers']} simulated workers, {report['measure_ms']} ms per "
            f"trial, {report['seconds']} s; the third task created at "
            f"{report['late_created_s']} s. Made-up results (the queue is measured, not "
            "kernels).",
            "",
            *rows,
            "",
            f"The third task's first trial came {report['late_first_trial_wait_s']} s after "
            "it was created.",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--measure-ms", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--late-s", type=float, default=10.0)
    parser.add_argument("--big-batch", type=int, default=64)
    parser.add_argument(
        "--late-priority",
        type=int,
        default=DEFAULT_PRIORITY,
        help="the third task's priority (1..10)",
    )
    parser.add_argument("--pg", default=DEFAULT_PG, help="admin URL (a database is made)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--write", action="store_true", help="record in RESULTS.md")
    parser.add_argument("--section", default="fair-share", help="the RESULTS.md section")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as logs,
        pg_database(args.pg) as url,
        service_process(url, Path(logs) / "serve.log", {}) as service,
    ):
        report = asyncio.run(_drive(service.url, args))
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=2))
    if args.write:
        command = "python -m benchmarks.bench_fair_share"
        write_section(args.section, "Service: shares between tasks", _section(report, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
