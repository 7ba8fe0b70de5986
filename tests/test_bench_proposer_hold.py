"""The proposer benchmark (python -m benchmarks.bench_proposer_hold) on PostgreSQL: after the
restart every short task gets its next batch, however many proposer threads; no timing is
asserted (benchmarks/RESULTS.md has the figures)."""

from __future__ import annotations

from service_support import require_pg

from benchmarks.bench_proposer_hold import SHORT_TASKS, waits
from benchmarks.harness import pg_database
from pipetune.service.migrate import upgrade


def test_every_short_task_gets_its_next_batch_after_the_restart():
    admin = require_pg()
    for threads in (1, 2):
        with pg_database(admin) as url:
            upgrade(url)
            seconds = waits(url, threads, long_trials=16)
        assert len(seconds) == SHORT_TASKS and all(s > 0 for s in seconds)
