"""Benchmark: the reads whose cost should not grow with the database, on one that has.

    python -m benchmarks.bench_lookup [--datasets 2] [--copies 40] [--tasks 10000] [--calls 5]

Builds a fresh PostgreSQL database: the first `--datasets` of the repository's measured
datasets (benchmarks/data/*/, imported as `pipetune db import-dataset` does), `--copies`
copies of each of their tasks with their trials (bench_learned_tasks' copy: with 2 datasets
and 40 copies, about 115 k trials of one workload on one GPU), and `--tasks` more finished
tasks without trials. Then prints the median milliseconds of `--calls` calls of each:
- the best-schedule lookup of the most measured workload (`measured_or_failures`, what
  POST /v1/schedules, `pipetune schedule` and `pipetune export` read);
- `GET /v1/curves` unfiltered and with filters that keep every task or next to none
  (through the app, in process);
- every task read page after page as `pipetune export --gpu` reads them (`all_tasks`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select, text

from benchmarks.bench_learned_tasks import _copy_tasks, _import_measured
from benchmarks.harness import DEFAULT_PG, pg_database
from pipetune.clients.library.store import LocalStore, all_tasks
from pipetune.service.app import create_app
from pipetune.service.db import Database
from pipetune.service.migrate import upgrade
from pipetune.service.orm import JobRow, TaskRow, WorkloadRow
from pipetune.service.records import measured_or_failures
from pipetune.service.settings import Settings


def _add_tasks(db: Database, count: int) -> None:
    """`count` copies of the first task's row, without trials (a database of many tasks)."""
    cols = ", ".join(c.name for c in TaskRow.__table__.columns if c.name != "id")
    with db.engine.begin() as conn:
        first = conn.scalar(text("SELECT min(id) FROM tasks"))
        conn.execute(
            text(
                f"INSERT INTO tasks ({cols}) SELECT {cols} FROM tasks, generate_series(1, :n) "
                "WHERE id = :first"
            ),
            {"n": count, "first": first},
        )
        conn.execute(text("ANALYZE"))


def _median_ms(call: Callable[[], object], calls: int) -> float:
    took = []
    for _ in range(calls):
        began = time.perf_counter()
        call()
        took.append(1000 * (time.perf_counter() - began))
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--datasets", type=int, default=2, help="import only the first N")
    parser.add_argument("--copies", type=int, default=40, help="copies of each imported task")
    parser.add_argument("--tasks", type=int, default=10000, help="more tasks, without trials")
    parser.add_argument("--calls", type=int, default=5, help="timed calls of each read")
    args = parser.parse_args()
    with pg_database(args.pg_url) as url:
        upgrade(url)
        db = Database(url, 2)
        try:
            _import_measured(db, args.datasets)
            _copy_tasks(db, args.copies)
            _add_tasks(db, args.tasks)
            with db.read() as s:
                workload_id, gpu, trials = s.execute(
                    select(JobRow.workload_id, JobRow.gpu, text("count(*)"))
                    .group_by(JobRow.workload_id, JobRow.gpu)
                    .order_by(text("count(*) DESC"))
                    .limit(1)
                ).one()
                digest = s.scalar(select(WorkloadRow.hash).where(WorkloadRow.id == workload_id))
                tasks = s.scalar(select(text("count(*)")).select_from(TaskRow))

            def lookup() -> None:
                with db.read() as s:
                    measured_or_failures(s, digest, gpu)

            print(f"{tasks} tasks; the most measured workload: {trials} trials on {gpu}")
            print(f"best-schedule lookup: {_median_ms(lookup, args.calls):.1f} ms")
        finally:
            db.dispose()
        settings = Settings(database_url=url, worker_tokens=["t" * 16], api_keys=[])
        with TestClient(create_app(settings)) as client:
            # Filters that leave out the copied tasks (imports: grid, on the datasets' GPU):
            # their cost should be the few tasks they keep, not the database's.
            other = "h200" if gpu != "h200" else "h100"
            for query in ("", f"?gpu={gpu}", f"?gpu={other}", "?op=softmax", "?strategy=random"):
                ms = _median_ms(lambda q=query: client.get(f"/v1/curves{q}"), args.calls)
                print(f"GET /v1/curves{query}: {ms:.1f} ms")
        store = LocalStore(url)
        ms = _median_ms(lambda: all_tasks(store), max(1, args.calls // 2))
        print(f"every task, page after page (export --gpu's read): {ms:.0f} ms")


if __name__ == "__main__":
    main()
