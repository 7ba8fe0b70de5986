"""The proposal benchmark's whole-task mode: the proposer's CPU over the load benchmark's
tasks, per trial it proposed."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_propose import task_cpu


@pytest.mark.parametrize("strategy", ["random", "analytical+xgb"])
def test_whole_tasks_are_proposed_through_their_budget(strategy):
    cpu, proposed = task_cpu(strategy, tasks=2, budget=20)
    assert proposed == 2 * 20  # batches of 8, 8 and 4 per task
    assert cpu > 0.0


def test_made_up_results_are_the_load_benchmarks(monkeypatch):
    from benchmarks.harness import fake_result
    from pipetune.tuner.session import TuningSession

    seen = []
    observe = TuningSession.observe

    def recording(self, results):
        seen.extend((s, r.latency_us) for s, r in results)
        return observe(self, results)

    monkeypatch.setattr(TuningSession, "observe", recording)
    _, proposed = task_cpu("random", tasks=1, budget=8, results="made-up")
    assert proposed == len(seen) == 8
    for schedule, latency in seen:
        assert latency == pytest.approx(fake_result({"schedule": schedule.as_dict()})["latency_us"])


def test_the_large_synthetic_space_has_its_size_a_failing_corner_and_is_searched():
    from benchmarks.bench_propose import large_space_rounds, synthetic_space

    configs = synthetic_space(4096)  # 4^6
    assert len(configs.configs) == 4096 and len(configs.knob_names) == 6
    failing = ~np.isfinite(configs.objective_ms)
    assert 0 < failing.mean() < 0.5
    assert synthetic_space(4096).objective_ms.tolist() == configs.objective_ms.tolist()  # seeded
    timed, peak = large_space_rounds("auto", configs, budget=20)
    assert len(timed.rounds) == 3 and all(t > 0 for t in timed.rounds)  # batches 8, 8, 4
    assert peak > 0
