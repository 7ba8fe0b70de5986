"""The hot statements' benchmark (python -m benchmarks.bench_queue_sql) on PostgreSQL: each of
its three ways leases and answers one job per round; no timing is asserted."""

from __future__ import annotations

from service_support import require_pg

from benchmarks.bench_queue_sql import measure
from benchmarks.harness import pg_database
from pipetune.service.migrate import upgrade


def test_each_way_leases_and_answers_a_job_every_round():
    """It failed at every run (a bind parameter the claim gained, `runner`, was not given),
    and before that its text() row ran the one-task statement with no task: every round of
    that row claimed nothing. A round that claims no job now raises."""
    with pg_database(require_pg()) as url:
        upgrade(url)
        rows = measure(url, rounds=3)
    assert [label for label, _, _ in rows] == [
        "SQLAlchemy Core, statements built per call (several per path)",
        "one statement (CTEs) through SQLAlchemy text()",
        "one statement (CTEs) through the driver (psycopg)",
    ]
    assert all(cpu > 0 for _, cpu, _ in rows)
