"""Benchmark: what one worker heartbeat costs the service and PostgreSQL.

    python -m benchmarks.bench_heartbeat [--workers 200] [--rounds 10] [--repeats 3]

A fleet's worker daemons each send a heartbeat every few seconds (`pipetune worker
--heartbeat`, 5 s by default) while they hold jobs, and less often while idle
(workers/daemon/heartbeats.py): a thousand of them send one to two hundred a second, busy
or not. This starts `pipetune serve` on a fresh PostgreSQL database, registers `--workers`
simulated workers and has each send `--rounds` heartbeats (16 in flight at once, each
listing no lease, as an idle daemon's does), and prints the service process's and
PostgreSQL's CPU per heartbeat, `--repeats` times.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.harness import (
    DEFAULT_PG,
    HEADERS,
    PostgresCpu,
    cpu_s,
    pg_database,
    register_worker,
    service_process,
)
from pipetune.service.migrate import upgrade

IN_FLIGHT = 16


async def _register(base: str, workers: int) -> list[int]:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        return [await register_worker(client, f"beat-{i}") for i in range(workers)]


async def _beat(base: str, ids: list[int], rounds: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(worker_id: int) -> None:
            async with gate:
                response = await client.post(
                    f"/v1/workers/{worker_id}/heartbeat",
                    json={"busy_jobs": 0, "leases": []},
                    headers=HEADERS,
                )
                response.raise_for_status()

        for _ in range(rounds):
            await asyncio.gather(*(one(i) for i in ids))


def measure(workers: int, rounds: int, repeats: int, admin_url: str) -> list[dict[str, float]]:
    """Per repeat: heartbeats, seconds, and ms of service and PostgreSQL CPU per heartbeat."""
    out = []
    with pg_database(admin_url) as url:
        upgrade(url)
        log = Path(tempfile.mkdtemp(prefix="bench-heartbeat-")) / "service.log"
        with service_process(url, log, {}) as service:
            assert service.process is not None
            pid = service.process.pid
            ids = asyncio.run(_register(service.url, workers))
            asyncio.run(_beat(service.url, ids, 1))  # every worker cached, connections open
            database = url.rsplit("/", 1)[1]
            for _ in range(repeats):
                with PostgresCpu(database) as pg:
                    before, started = cpu_s(pid), time.monotonic()
                    asyncio.run(_beat(service.url, ids, rounds))
                    after, ended = cpu_s(pid), time.monotonic()
                n = rounds * len(ids)
                out.append(
                    {
                        "heartbeats": n,
                        "seconds": ended - started,
                        "service_cpu_ms": 1e3 * (after - before) / n,
                        "postgres_cpu_ms": 1e3 * pg.seconds() / n,
                    }
                )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL server (admin URL)")
    args = parser.parse_args(argv)
    for problem, bad in (
        ("--workers must be at least 1", args.workers < 1),
        ("--rounds must be at least 1", args.rounds < 1),
        ("--repeats must be at least 1", args.repeats < 1),
    ):
        if bad:
            parser.error(problem)
    for r in measure(args.workers, args.rounds, args.repeats, args.pg):
        print(
            f"{r['heartbeats']} heartbeats in {r['seconds']:.1f} s: service "
            f"{r['service_cpu_ms']:.3f} ms, PostgreSQL {r['postgres_cpu_ms']:.3f} ms of CPU each",
            flush=True,
        )


if __name__ == "__main__":
    main()
