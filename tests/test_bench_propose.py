"""The proposal benchmark's whole-task mode: the proposer's CPU over the load benchmark's
tasks, per trial it proposed."""

from __future__ import annotations

import pytest

from benchmarks.bench_propose import task_cpu


@pytest.mark.parametrize("strategy", ["random", "analytical+xgb"])
def test_whole_tasks_are_proposed_through_their_budget(strategy):
    cpu, proposed = task_cpu(strategy, tasks=2, budget=20)
    assert proposed == 2 * 20  # batches of 8, 8 and 4 per task
    assert cpu > 0.0
