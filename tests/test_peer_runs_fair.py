"""Kernel Tuner peers run as their authors meant, repeatable per seed, on their full budget.

- `kt_dual_annealing` was scored on fewer distinct trials than its budget: Kernel Tuner hands
  max_fevals to scipy as `maxfun`, which counts repeats and configurations outside the space,
  both free here (37 trials of 100 on average over the development set).
- `kt_bayes_opt` and `kt_diff_evo` ran differently each time for one seed: Kernel Tuner draws
  their Latin hypercube samples without a seed, from the OS's entropy.
A small space of the same kind as the recorded ones (a restriction: a product that leaves out
configurations; a failing region) stands in for the datasets.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from benchmarks.bench_tuner import _run_per_budget, render
from pipetune.tuner.peers import run_kernel_tuner
from pipetune.tuner.recorded import RecordedConfigs

pytest.importorskip("kernel_tuner")  # (installed with pipetune's `peers` extra, as make test does)


def _space() -> RecordedConfigs:
    params = {
        "a": [1, 2, 4, 8, 16, 32],
        "b": [1, 2, 4, 8, 16, 32],
        "c": [0, 1, 2, 3],
        "d": [1, 2, 3],
    }
    configs, objective = [], []
    for a, b, c, d in itertools.product(*params.values()):
        if a * b > 64:  # not in the space
            continue
        configs.append({"a": a, "b": b, "c": c, "d": d})
        fails = (a + c) % 7 == 0
        ms = 1.0 + abs(np.log2(a) - 3) + abs(np.log2(b) - 2) + 0.3 * c + 0.1 * d
        objective.append(np.inf if fails else ms)
    return RecordedConfigs("toy", params, configs, np.array(objective))


def test_dual_annealing_is_scored_on_its_whole_budget():
    for seed in range(3):
        assert len(run_kernel_tuner("kt_dual_annealing", _space(), seed, 40)) == 40


@pytest.mark.parametrize("peer", ["kt_bayes_opt", "kt_diff_evo"])
def test_a_seed_repeats_its_run_and_another_seed_does_not(peer):
    space = _space()
    first, again = (run_kernel_tuner(peer, space, 0, 40) for _ in range(2))
    np.testing.assert_array_equal(first, again)
    others = [run_kernel_tuner(peer, space, seed, 40) for seed in (1, 2)]
    assert any(not np.array_equal(first, other) for other in others)


def test_a_peer_that_plans_by_its_budget_is_run_at_each_budget(monkeypatch, tmp_path):
    """SMAC's initial design and Kernel Tuner's annealing schedule follow the budget: best-in-k
    read off a 100-trial run is not what they give a user who asks for k. Each budget is its
    own run for them; the other searchers' runs are the largest budget's, read at each k."""
    from pipetune.tuner import bench
    from pipetune.tuner.peers import PLANS_BY_BUDGET

    space = _space()
    asked: list[tuple[str, int]] = []

    def fake_peer(name, recorded, seed, budget):
        asked.append((name, budget))
        # a run of budget b: its first trial reaches b / 100 of the optimum, the rest nothing
        return np.array([recorded.optimum * budget / 100] + [0.0] * (budget - 1))

    monkeypatch.setattr(bench, "run_peer", fake_peer)
    planner, other = "kt_simulated_annealing", "kt_random_sample"
    assert planner in PLANS_BY_BUDGET and other not in PLANS_BY_BUDGET
    doc = bench.bench([bench.Dataset("toy", space)], [planner, other], [10, 20, 50], seeds=1)
    assert sorted(asked) == sorted([(planner, 10), (planner, 20), (planner, 50), (other, 50)])
    found = {(r["strategy"], r["budget"]): round(r["best_in_k"], 6) for r in doc["results"]}
    assert [found[planner, k] for k in (10, 20, 50)] == [0.1, 0.2, 0.5]
    assert [found[other, k] for k in (10, 20, 50)] == [0.5, 0.5, 0.5]
    assert "one run per budget" in doc["peer_rules"][planner]
    assert "one run per budget" not in doc["peer_rules"].get(other, "")
    assert _run_per_budget(doc) == [planner]
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(doc))
    assert f"({planner} run once per budget: they plan by it)" in render([saved])


def test_runs_of_a_peer_under_other_rules_do_not_merge(monkeypatch, tmp_path):
    """A run saved before a peer's rules changed measured something else: merging it with a
    new one pooled seeds of both under the new run's label (and render said every seed was
    run once per budget). Runs of strategies whose rules did not change still pool."""
    import json

    from benchmarks.bench_tuner import Refused, merge
    from pipetune.tuner import bench

    def fake_peer(name, recorded, seed, budget):
        return np.array([recorded.optimum * (seed + 1) / 10] + [0.0] * (budget - 1))

    monkeypatch.setattr(bench, "run_peer", fake_peer)
    dataset = [bench.Dataset("toy", _space())]

    def saved(strategy, first, older=False):
        doc = bench.bench(dataset, [strategy], [10, 20], seeds=2, first_seed=first)
        if older:  # as saved before the rules were recorded
            del doc["peer_rules"]
        path = tmp_path / f"{strategy}-{first}-{older}.json"
        path.write_text(json.dumps(doc))
        return path

    annealing = "kt_simulated_annealing"
    with pytest.raises(Refused, match="peer_rules differ"):
        merge([saved(annealing, 0, older=True), saved(annealing, 2)])
    assert merge([saved(annealing, 0), saved(annealing, 2)])["seeds"] == 4
    assert merge([saved("kt_random_sample", 0, older=True), saved("kt_random_sample", 2)])
