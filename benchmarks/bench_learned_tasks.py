"""Benchmark: finding the tasks a learned prior reads, on a database that has run for months.

    python -m benchmarks.bench_learned_tasks [--copies 14] [--calls 3] [--datasets N]

A task created with a default strategy on a kernel family that learns by default (and a
schedule lookup of a shape nothing measured) first finds the finished, GPU-measured tasks to
learn from (service/priors.learned_tasks). This builds a fresh PostgreSQL database of the
repository's measured datasets (benchmarks/data/*/, written as `pipetune db import-dataset`
writes them) and `--copies` copies of each of their tasks, jobs included (14 copies: about
2.2 M jobs), then prints the milliseconds of `learned_tasks` for a new GEMM shape, `--calls`
times with one replica's kept summaries (the first call of a replica reads them) and once
without, and of `POST /v1/tasks` with the default strategy, three times (the first also fits
the learned cost model, which the next ones share).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import text

from benchmarks.harness import DEFAULT_PG, pg_database
from pipetune.model.family import parse_any_workload
from pipetune.service import priors
from pipetune.service.app import create_app
from pipetune.service.db import Database
from pipetune.service.imports import import_once
from pipetune.service.migrate import upgrade
from pipetune.service.orm import JobRow, TaskRow
from pipetune.service.settings import Settings
from pipetune.workers.datasets import DatasetError, check_pipetune, load_dataset

DATA = Path(__file__).resolve().parent / "data"
NEW_SHAPES = ({"m": 1008, "n": 3008, "k": 704}, {"m": 1016, "n": 3016, "k": 712})


def _import_measured(db: Database, limit: int | None = None) -> int:
    imported = 0
    for path in sorted(DATA.glob("*/*.t4.json.gz"))[:limit]:
        try:
            data = load_dataset(path)
            info = check_pipetune(data)
        except DatasetError:
            continue
        with db.write() as s:
            import_once(s, data, info, str(path), db.now())
        imported += 1
    return imported


def _copy_tasks(db: Database, copies: int) -> None:
    """Each imported task `copies` times more, jobs and all, in SQL."""
    task_cols = [c.name for c in TaskRow.__table__.columns if c.name != "id"]
    job_cols = [c.name for c in JobRow.__table__.columns if c.name not in ("id", "task_id")]
    tasks, jobs = ", ".join(task_cols), ", ".join(job_cols)
    with db.engine.begin() as conn:
        sources = conn.scalars(text("SELECT id FROM tasks ORDER BY id")).all()
        for _ in range(copies):
            for source in sources:
                new = conn.scalar(
                    text(
                        f"INSERT INTO tasks ({tasks}) SELECT {tasks} FROM tasks WHERE id = :s "
                        "RETURNING id"
                    ),
                    {"s": source},
                )
                conn.execute(
                    text(
                        f"INSERT INTO jobs (task_id, {jobs}) SELECT :new, {jobs} FROM jobs "
                        "WHERE task_id = :s"
                    ),
                    {"new": new, "s": source},
                )
        conn.execute(text("ANALYZE"))


def _time_learned_tasks(url: str, calls: int) -> None:
    db = Database(url, 2)
    workload = parse_any_workload({"op": "gemm", **NEW_SHAPES[0]})
    kept = priors.TaskSummaries()
    try:
        for i in range(calls):
            began = time.perf_counter()
            with db.read_conn() as conn:
                found = priors.learned_tasks(conn, workload, "a100", kept)
            took = 1000 * (time.perf_counter() - began)
            print(
                f"learned_tasks, kept summaries, call {i + 1}: {took:.0f} ms ({len(found)} tasks)"
            )
        began = time.perf_counter()
        with db.read_conn() as conn:
            priors.learned_tasks(conn, workload, "a100")
        took = 1000 * (time.perf_counter() - began)
        print(f"learned_tasks, no summaries kept: {took:.0f} ms")
    finally:
        db.dispose()


def _time_task_creation(url: str) -> None:
    settings = Settings(database_url=url, worker_tokens=["t" * 16], api_keys=[], sweep_interval_s=0)
    with TestClient(create_app(settings)) as client:
        for i, shape in enumerate([*NEW_SHAPES, {"m": 1024, "n": 3024, "k": 720}]):
            body = {"workload": {"op": "gemm", **shape}, "gpu": "a100", "budget": 16}
            began = time.perf_counter()
            answer = client.post("/v1/tasks", json=body)
            took = 1000 * (time.perf_counter() - began)
            doc = answer.json()
            learned = len(doc.get("learned_from") or [])
            print(
                f"POST /v1/tasks {i + 1}: {took:.0f} ms (HTTP {answer.status_code}, "
                f"{doc.get('strategy')}, learned from {learned} tasks)"
            )
            client.delete(f"/v1/tasks/{doc['id']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="admin URL of a PostgreSQL")
    parser.add_argument("--copies", type=int, default=14, help="copies of each imported task")
    parser.add_argument("--calls", type=int, default=3, help="timed learned_tasks calls")
    parser.add_argument("--datasets", type=int, default=None, help="import only the first N")
    args = parser.parse_args()
    with pg_database(args.pg_url) as url:
        upgrade(url)
        db = Database(url, 2)
        try:
            began = time.perf_counter()
            imported = _import_measured(db, args.datasets)
            _copy_tasks(db, args.copies)
            with db.engine.connect() as conn:
                jobs = conn.scalar(text("SELECT count(*) FROM jobs"))
                tasks = conn.scalar(text("SELECT count(*) FROM tasks"))
            took = time.perf_counter() - began
            print(f"{imported} datasets imported, {tasks} tasks, {jobs} jobs ({took:.0f} s)")
        finally:
            db.dispose()
        _time_learned_tasks(url, args.calls)
        _time_task_creation(url)


if __name__ == "__main__":
    main()
