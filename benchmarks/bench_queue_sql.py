"""How the queue's hot statements are run on PostgreSQL: CPU per lease + result, three ways.

One process, one thread, no HTTP: a worker leases one job and records its result, again and
again, on a fresh PostgreSQL database (the tasks' batches are refilled outside the timing).
The same work done

* with SQLAlchemy Core statements built per call, several per path (service/queue_sqlite.py's
  code, which is what the queue ran on PostgreSQL before the hot paths were rewritten);
* as the one-statement SQL of service/queue_pg.py, through SQLAlchemy (`text()`, compiled
  once and cached);
* as that SQL sent through the driver itself (psycopg, service/queue_pg.py): what the
  service runs.

The figures are this process's CPU per lease + result (the client side of the database
work, which is what runs in a service replica), and the PostgreSQL backend's.

    python -m benchmarks.bench_queue_sql [--rounds 400] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from collections.abc import Callable

from sqlalchemy import text

from benchmarks.harness import DEFAULT_PG, PostgresCpu, pg_database
from benchmarks.results import write_section
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import TaskCreate, WorkerRegister
from pipetune.service.db import Database
from pipetune.service.driver import Driver
from pipetune.service.metrics import Metrics
from pipetune.service.migrate import upgrade
from pipetune.service.queue import Queue
from pipetune.service.queue_pg import (
    _STATES,
    CLAIM_SQL,
    RECORD_SQL,
    PostgresQueueStore,
    _report_row,
)
from pipetune.service.queue_sqlite import SqliteQueueStore
from pipetune.service.queue_types import Report, WorkerRef
from pipetune.service.settings import Settings, token_hash

TASKS = 6
RESULT = MeasureResult(status="ok", latency_us=10.0, samples_us=[10.0], spread=0.0)


def _sqlalchemy_text(sql: str):  # type: ignore[no-untyped-def]
    # psycopg's %(name)s placeholders as SQLAlchemy's :name
    return text(sql.replace("%(", ":").replace(")s", ""))


class TextStore:
    """service/queue_pg.py's statements, run through SQLAlchemy's text()."""

    def __init__(self, db: Database):
        self.db = db
        # The statement for any task (task_id None) of any workload: the one-task variant
        # given no task claimed nothing, and its row measured empty claims.
        self.claim_sql = _sqlalchemy_text(CLAIM_SQL[False, False, False])
        self.record_sql = _sqlalchemy_text(RECORD_SQL)

    def claim(self, worker: WorkerRef, n: int, token: str) -> list:
        params = {**_STATES, "arch": worker.arch, "gpu": worker.gpu, "n": n}
        params.update(worker=worker.id, token=token, ttl=120.0, runner=worker.runner_kind)
        with self.db.engine.begin() as conn:
            return conn.execute(self.claim_sql, params).all()

    def record(self, worker: WorkerRef, reports: list[Report]) -> list:
        params = {**_STATES, "worker": worker.id}
        params["reports"] = json.dumps([_report_row(i, r, worker) for i, r in enumerate(reports)])
        with self.db.engine.begin() as conn:
            return conn.execute(self.record_sql, params).all()


def measure(url: str, rounds: int) -> list[tuple[str, float, float]]:
    settings = Settings(database_url=url, worker_tokens=["t"], batch_size=64)
    db = Database(url)
    metrics = Metrics()
    queue, driver = Queue(db, settings, metrics), Driver(db, settings, metrics)
    for i in range(TASKS):
        workload = {"op": "gemm", "m": 1024 + 256 * i, "n": 1024, "k": 2048}
        body = TaskCreate(workload=workload, gpu="h100", budget=5000, strategy="grid", seed=i)
        driver.create(body)
    doc, _ = queue.register(token_hash("t"), WorkerRegister(
        name="bench", gpu="h100", arch="sm_90", runner="simulated"
    ))  # fmt: skip
    worker = WorkerRef(id=doc.id, gpu="h100", arch="sm_90", runner="simulated")
    core, plain = SqliteQueueStore(db), PostgresQueueStore(db)
    via_text = TextStore(db)

    def one_job(claimed: list) -> list:
        # A round that claims nothing measures an empty claim, not a round trip.
        if len(claimed) != 1:
            raise RuntimeError(f"a round claimed {len(claimed)} jobs, not 1")
        return claimed

    def core_round() -> None:
        token = secrets.token_urlsafe(24)
        for job in one_job(core.claim(worker, 1, None, token, 120.0)):
            core.record(worker, [Report(job.id, token, RESULT)])

    def text_round() -> None:
        token = secrets.token_urlsafe(24)
        for job in one_job(via_text.claim(worker, 1, token)):
            via_text.record(worker, [Report(job.id, token, RESULT)])

    def driver_round() -> None:
        token = secrets.token_urlsafe(24)
        for job in one_job(plain.claim(worker, 1, None, token, 120.0)):
            plain.record(worker, [Report(job.id, token, RESULT)])

    ways: list[tuple[str, Callable[[], None]]] = [
        ("SQLAlchemy Core, statements built per call (several per path)", core_round),
        ("one statement (CTEs) through SQLAlchemy text()", text_round),
        ("one statement (CTEs) through the driver (psycopg)", driver_round),
    ]
    rows = []
    with PostgresCpu(url.rsplit("/", 1)[1]) as backends:
        for _ in range(2):  # twice, interleaved: the second pass is recorded
            rows = []
            for label, run in ways:
                for t in range(1, TASKS + 1):
                    driver.advance(t)  # refill (a new batch each time the last one is done)
                for _ in range(20):
                    run()  # warm: statements prepared, caches filled
                pg_before, cpu_before = backends.seconds(), time.process_time()
                for _ in range(rounds):
                    run()
                cpu = time.process_time() - cpu_before
                rows.append(
                    (label, 1e3 * cpu / rounds, 1e3 * (backends.seconds() - pg_before) / rounds)
                )
    db.dispose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--write", action="store_true", help="record in benchmarks/RESULTS.md")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with pg_database(args.pg_url) as url:
        upgrade(url)
        rows = measure(url, args.rounds)
    for label, cpu, pg in rows:
        print(f"{label:66s} {cpu:6.3f} ms   PostgreSQL {pg:6.3f} ms")
    body = "\n".join(
        [
            f"One lease of one job plus its result, {args.rounds} times in one thread (no HTTP), "
            "on a fresh PostgreSQL 15 database; CPU of this process (what a service replica "
            "spends on the database work) and of the PostgreSQL backend, per lease + result. "
            f"Load average (1 min) before: {load:.1f}.",
            "",
            "| how | client CPU (ms) | PostgreSQL CPU (ms) |",
            "|---|---:|---:|",
            *[f"| {label} | {cpu:.3f} | {pg:.3f} |" for label, cpu, pg in rows],
            "",
            "The service runs the last (service/queue_pg.py, service/db.py).",
            "",
            f"Command: `python -m benchmarks.bench_queue_sql --rounds {args.rounds} --write`.",
        ]
    )
    if args.write:
        write_section("queue-sql", "Queue hot paths on PostgreSQL: how the SQL is run", body)


if __name__ == "__main__":
    main()
