"""Service benchmark: POST /v1/schedules latency, and lease+result round trips per second
with concurrent workers.

The service runs as `pipetune serve` in a child process on loopback; the load comes from
this process over HTTP (httpx, asyncio). Workers are simulated HTTP clients: they lease a
job and post a made-up result at once, so the numbers are the service's and the database's
cost per trial, not a GPU's.

    python -m benchmarks.bench_service                     # print
    python -m benchmarks.bench_service --write             # and record in RESULTS.md
    python -m benchmarks.bench_service --pg-url postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks.harness import (
    DEFAULT_PG,
    HEADERS,
    cpu_s,
    fake_result,
    pct,
    pg_database,
    register_worker,
    service_process,
)
from benchmarks.results import write_section
from pipetune.service.settings import sqlite_url

TUNED = {"op": "gemm", "m": 1024, "n": 1024, "k": 1024}
UNTUNED = {"op": "gemm", "m": 2048, "n": 512, "k": 4096}


@contextmanager
def serve(url: str, batch_size: int = 32):
    log = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "serve.log"
    with service_process(url, log, {"PIPETUNE_BATCH_SIZE": str(batch_size)}) as service:
        assert service.process is not None
        yield service.url, service.process.pid


async def _tune_one(base: str, workload: dict, budget: int) -> int:
    """Run one task to completion through the worker API (makes a workload 'tuned')."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        body = {"workload": workload, "gpu": "h100", "budget": budget, "strategy": "random"}
        task_id = (await client.post("/v1/tasks", json=body)).json()["id"]
        worker = await register_worker(client, f"tuner-{task_id}")
        while (await client.get(f"/v1/tasks/{task_id}")).json()["state"] != "done":
            lease = {"worker_id": worker, "max_jobs": 32, "wait_s": 1}
            jobs = (await client.post("/v1/jobs/lease", json=lease, headers=HEADERS)).json()
            for job in jobs["jobs"]:
                result = {
                    "worker_id": worker,
                    "lease_token": job["lease_token"],
                    "result": fake_result(job),
                }
                await client.post(f"/v1/jobs/{job['job_id']}/result", json=result, headers=HEADERS)
        return task_id


async def _schedule_latencies(base: str, workloads: list[dict], n: int) -> list[float]:
    times: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        for i in range(n):
            body = {"workload": workloads[i % len(workloads)], "gpu": "h100"}
            started = time.perf_counter()
            response = await client.post("/v1/schedules", json=body)
            times.append(time.perf_counter() - started)
            response.raise_for_status()
    return times


def bench_schedules(base: str, n: int) -> dict[str, list[float]]:
    asyncio.run(_tune_one(base, TUNED, 200))
    # Distinct untuned shapes: every request pays for the space and the model.
    shapes = [{"op": "gemm", "m": 64 * (i + 1), "n": 512, "k": 2048} for i in range(n)]
    out = {
        "tuned (measured)": asyncio.run(_schedule_latencies(base, [TUNED], n)),
        "untuned, same shape (model, cached)": asyncio.run(_schedule_latencies(base, [UNTUNED], n)),
        "untuned, new shape each time (model)": asyncio.run(_schedule_latencies(base, shapes, n)),
    }
    return out


async def _round_trips(base: str, workers: int, seconds: float, strategy: str) -> dict:
    async with httpx.AsyncClient(
        base_url=base, timeout=60, limits=httpx.Limits(max_connections=workers + 8)
    ) as client:
        for i in range(max(4, workers // 4)):
            body = {"workload": {**TUNED, "m": 1024 + 64 * i}, "gpu": "h100"}
            body.update(budget=5000, strategy=strategy, seed=i)
            (await client.post("/v1/tasks", json=body)).raise_for_status()
        ids = [
            await register_worker(client, f"load-{uuid.uuid4().hex[:6]}") for _ in range(workers)
        ]
        lease_times: list[float] = []
        result_times: list[float] = []
        done = 0
        stop = time.monotonic() + seconds

        async def worker(worker_id: int) -> None:
            nonlocal done
            while time.monotonic() < stop:
                started = time.perf_counter()
                lease = {"worker_id": worker_id, "max_jobs": 1, "wait_s": 2}
                response = await client.post("/v1/jobs/lease", json=lease, headers=HEADERS)
                lease_times.append(time.perf_counter() - started)
                for job in response.json()["jobs"]:
                    body = {
                        "worker_id": worker_id,
                        "lease_token": job["lease_token"],
                        "result": fake_result(job),
                    }
                    started = time.perf_counter()
                    ack = await client.post(
                        f"/v1/jobs/{job['job_id']}/result", json=body, headers=HEADERS
                    )
                    result_times.append(time.perf_counter() - started)
                    if ack.json()["accepted"]:
                        done += 1

        began = time.monotonic()
        await asyncio.gather(*(worker(w) for w in ids))
        elapsed = time.monotonic() - began
    return {
        "round_trips_per_s": done / elapsed,
        "trials": done,
        "seconds": elapsed,
        "lease_p50_ms": 1e3 * pct(lease_times, 0.5),
        "lease_p99_ms": 1e3 * pct(lease_times, 0.99),
        "result_p50_ms": 1e3 * pct(result_times, 0.5),
        "result_p99_ms": 1e3 * pct(result_times, 0.99),
    }


@contextmanager
def _fresh(label: str, tmp: str, pg_admin_url: str) -> Iterator[str]:
    """An empty database of the kind the row's label names."""
    if label == "SQLite":
        yield sqlite_url(Path(tmp) / "bench.db")
        return
    with pg_database(pg_admin_url) as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--write", action="store_true", help="record in benchmarks/RESULTS.md")
    args = parser.parse_args()

    rows_latency = []
    rows_rt = []
    with tempfile.TemporaryDirectory() as tmp, pg_database(args.pg_url) as pg:
        for label, url in (("SQLite", sqlite_url(Path(tmp) / "bench.db")), ("PostgreSQL", pg)):
            with serve(url) as (base, _):
                for kind, times in bench_schedules(base, args.requests).items():
                    p50, p99 = 1e3 * pct(times, 0.5), 1e3 * pct(times, 0.99)
                    rows_latency.append((label, kind, len(times), p50, p99))
                    print(f"{label:10s} {kind:40s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    # Each row on a database of its own: on one database the row before left its tasks
    # (budget 5000) queued, and of the `analytical+xgb` row's round trips 463 of 591 were
    # the `random` row's jobs.
    for label, strategy in (
        ("PostgreSQL", "random"),
        ("PostgreSQL", "analytical+xgb"),
        ("SQLite", "random"),
    ):
        with tempfile.TemporaryDirectory() as tmp, _fresh(label, tmp, args.pg_url) as url:
            with serve(url) as (base, pid):
                before = cpu_s(pid)
                r = asyncio.run(_round_trips(base, args.workers, args.seconds, strategy))
                r["server_cpu_ms"] = 1e3 * (cpu_s(pid) - before) / max(1, r["trials"])
            rows_rt.append((label, strategy, r))
            print(f"{label:10s} {strategy:15s} {r['round_trips_per_s']:7.1f} round trips/s", r)

    body = [
        f"`pipetune serve` (one process, uvicorn) in a child process on loopback, "
        f"{os.cpu_count()} CPU cores shared with the load generator. Workers are simulated "
        "HTTP clients (httpx, asyncio): each leases one job and posts a made-up result at "
        "once, so these are the service's and the database's costs per trial, no GPU's. "
        "PostgreSQL 15 runs on the same machine.",
        "",
        f"### POST /v1/schedules ({args.requests} sequential requests each)",
        "",
        "Tuned: a workload with a finished 200-trial task (the answer is the best measured "
        "trial, an index lookup). Untuned: the analytical model's pick (space enumeration + "
        "model; the same shape again is served from an in-process cache).",
        "",
        "| database | request | n | p50 (ms) | p99 (ms) |",
        "|---|---|---:|---:|---:|",
        *[f"| {d} | {k} | {n} | {p50:.2f} | {p99:.2f} |" for d, k, n, p50, p99 in rows_latency],
        "",
        f"### Lease + result round trips, {args.workers} concurrent workers, {args.seconds:g} s",
        "",
        f"{max(4, args.workers // 4)} tasks of budget 5000 keep the queue full (batch size "
        "32), each row on an empty database of its own. With `analytical+xgb` each completed "
        "batch also costs the next batch's proposal (the task driver's real cost: the "
        "Gaussian-process search with the analytical model as its prior mean, tuner/bo.py).",
        "",
        "| database | strategy | round trips/s | service CPU per round trip (ms) "
        "| lease p50 / p99 (ms) | result p50 / p99 (ms) |",
        "|---|---|---:|---:|---:|---:|",
        *[
            f"| {d} | {s} | {r['round_trips_per_s']:.0f} | {r['server_cpu_ms']:.1f} | "
            f"{r['lease_p50_ms']:.1f} / {r['lease_p99_ms']:.1f} | "
            f"{r['result_p50_ms']:.1f} / {r['result_p99_ms']:.1f} |"
            for d, s, r in rows_rt
        ],
        "",
        "The service process, PostgreSQL and the load generator share the machine's cores: "
        "the service's own CPU per round trip (lease + result, both HTTP requests, the "
        "task driver's share included) is the figure that carries to a bigger machine.",
        "",
        "Command: `python -m benchmarks.bench_service --write`.",
    ]
    text_body = "\n".join(body)
    print(text_body)
    if args.write:
        write_section("service", "Service: schedule lookups and queue throughput", text_body)


if __name__ == "__main__":
    main()
