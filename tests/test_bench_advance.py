"""The driver benchmark (python -m benchmarks.bench_advance) on PostgreSQL: every round
advances each task once, on whichever replica's turn it is; no timing is asserted."""

from __future__ import annotations

from service_support import require_pg

from benchmarks.bench_advance import TASKS, cpu_per_advance
from benchmarks.harness import pg_database
from pipetune.service.migrate import upgrade


def test_every_round_advances_every_task_on_one_replica_or_two():
    admin = require_pg()
    for replicas in (1, 2):
        with pg_database(admin) as url:
            upgrade(url)
            ms, advances = cpu_per_advance(url, replicas, rounds=3, strategy="random")
        assert advances == 3 * TASKS and ms > 0.0
