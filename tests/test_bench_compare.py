"""Runs of the tuner benchmark compared seed by seed: the per-seed figures a run saves, the
paired differences and their standard errors, and `bench_tuner compare`."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from benchmarks import bench_tuner
from pipetune.tuner.bench import bench
from pipetune.tuner.metrics import geomean, paired_difference, paired_geomean_difference


def test_a_paired_difference_is_the_mean_of_the_seeds_differences_with_their_error():
    a = np.array([0.5, 0.7, 0.9, 0.6])
    b = np.array([0.6, 0.7, 1.0, 0.8])
    mean, se = paired_difference(a, b)
    d = b - a
    assert mean == pytest.approx(d.mean())
    assert se == pytest.approx(d.std(ddof=1) / 2.0)
    # The same shift on every seed is known exactly, however much the seeds differ.
    assert paired_difference(a, a + 0.05) == pytest.approx((0.05, 0.0))
    with pytest.raises(ValueError, match="no paired seeds"):
        paired_difference([], [])


def test_the_geomean_difference_is_the_headline_figures_and_its_error_matches_its_spread():
    a = {"x": [0.5, 0.7, 0.9], "y": [0.8, 0.9, 0.7]}
    b = {"x": [0.6, 0.7, 1.0], "y": [0.8, 0.95, 0.75]}
    diff, _ = paired_geomean_difference(a, b)
    headline = geomean([np.mean(v) for v in b.values()]) - geomean([np.mean(v) for v in a.values()])
    assert diff == pytest.approx(headline)
    # B = A scaled by 1.1 on every seed: a difference without error.
    scaled = {k: [1.1 * v for v in vs] for k, vs in a.items()}
    diff, se = paired_geomean_difference(a, scaled)
    assert diff == pytest.approx(0.1 * geomean([np.mean(v) for v in a.values()]))
    assert se == pytest.approx(0.0, abs=1e-12)
    # The error is what repeated experiments spread by: seeds that differ widely (shared by
    # both runs) and a small per-seed effect whose mean is the true difference.
    rng = np.random.default_rng(0)
    estimates, errors = [], []
    for _ in range(400):
        seed_level = {k: rng.uniform(0.4, 0.9, 30) for k in ("x", "y", "z")}
        effect = {k: 0.02 + rng.normal(0, 0.03, 30) for k in seed_level}
        b = {k: np.minimum(seed_level[k] + effect[k], 1.0) for k in seed_level}
        diff, se = paired_geomean_difference(seed_level, b)
        estimates.append(diff)
        errors.append(se)
    assert np.std(estimates) == pytest.approx(np.mean(errors), rel=0.15)
    with pytest.raises(ValueError, match="same datasets"):
        paired_geomean_difference({"x": [1.0]}, {"y": [1.0]})
    with pytest.raises(ValueError, match="2 seeds against 3"):
        paired_geomean_difference({"x": [1.0, 0.9]}, {"x": [1.0, 0.9, 0.8]})


def test_a_run_saves_each_seeds_figure_and_a_merge_keeps_them_in_seed_order(tmp_path, small_ours):
    whole = bench([small_ours], ["random", "bo"], [5, 10], seeds=4, batch=4)
    for r in whole["results"]:
        cell = r["per_dataset"]["synthetic"]
        assert len(cell["per_seed"]) == 4
        assert np.mean(cell["per_seed"]) == pytest.approx(cell["best_in_k"], abs=1e-6)
    for first in (0, 2):
        part = bench([small_ours], ["random", "bo"], [5, 10], seeds=2, batch=4, first_seed=first)
        (tmp_path / f"part{first}.json").write_text(json.dumps(part))
    merged = bench_tuner.merge([tmp_path / "part2.json", tmp_path / "part0.json"])
    for a, b in zip(whole["results"], merged["results"], strict=True):
        kept = b["per_dataset"]["synthetic"]["per_seed"]
        assert kept == a["per_dataset"]["synthetic"]["per_seed"]


def test_a_merge_pools_each_strategys_own_seeds_and_refuses_runs_of_other_settings(
    tmp_path, small_ours
):
    """Results were matched by their place in each file: a part without one strategy (a
    peer that failed there) filed another strategy's seeds under its name."""
    first = bench([small_ours], ["random", "grid"], [5, 10], seeds=2, batch=4)
    second = bench([small_ours], ["random", "bo", "grid"], [5, 10], seeds=2, batch=4, first_seed=2)
    for name, doc in (("a", first), ("b", second)):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match=r"strategies differ \(\['grid', 'random'\] against"):
        bench_tuner.merge([tmp_path / "a.json", tmp_path / "b.json"])
    # The same strategies stored in another order pool by name.
    second["results"] = [r for r in second["results"] if r["strategy"] != "bo"][::-1]
    (tmp_path / "b.json").write_text(json.dumps(second))
    merged = bench_tuner.merge([tmp_path / "a.json", tmp_path / "b.json"])
    grid = next(r for r in merged["results"] if r["strategy"] == "grid" and r["budget"] == 5)
    assert len(set(grid["per_dataset"]["synthetic"]["per_seed"])) == 1  # grid: no draw
    third = bench([small_ours], ["random", "grid"], [5, 10], seeds=2, batch=2, first_seed=4)
    (tmp_path / "c.json").write_text(json.dumps(third))
    with pytest.raises(SystemExit, match="batch differ"):
        bench_tuner.merge([tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"])


def test_render_puts_each_figure_under_its_budget_and_says_the_seeds(tmp_path, small_ours):
    """`run --budgets 50,10` stored its results in that order, and the table's sorted
    columns showed k=50's figures under k=10."""
    assert bench_tuner.budget_list("50,10,10") == [10, 50]
    for bad in ("0", "x", ""):
        with pytest.raises(SystemExit, match="--budgets"):
            bench_tuner.budget_list(bad)
    doc = bench([small_ours], ["random"], [5, 10], seeds=2, batch=4, first_seed=3)
    doc["results"] = doc["results"][::-1]  # as a run given 10,5 stored them
    (tmp_path / "run.json").write_text(json.dumps(doc))
    table = bench_tuner.render([tmp_path / "run.json"])
    by_k = {r["budget"]: r for r in doc["results"]}
    row = next(line for line in table.splitlines() if line.startswith("| run | random |"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    assert cells == [bench_tuner._cell(by_k[5]), bench_tuner._cell(by_k[10])]
    assert "2 seeds (3..4)" in table


def _run_main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_tuner", *argv])
    bench_tuner.main()


def test_compare_prints_b_minus_a_per_budget_and_refuses_runs_it_cannot_pair(
    tmp_path, small_ours, monkeypatch, capsys
):
    runs = {
        "before": bench([small_ours], ["random"], [5, 10], seeds=3, batch=4),
        "after": bench([small_ours], ["random", "bo"], [5, 10], seeds=3, batch=4),
        "other-seeds": bench([small_ours], ["bo"], [5, 10], seeds=3, batch=4, first_seed=3),
    }
    for label, doc in runs.items():
        (tmp_path / f"{label}.json").write_text(json.dumps(doc))
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    _run_main(monkeypatch, "compare", str(before), str(after), "--against", "bo")
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    seeds = {
        label: {
            r["budget"]: r["per_dataset"]["synthetic"]["per_seed"]
            for r in runs[label]["results"]
            if r["strategy"] == strategy
        }
        for label, strategy in (("before", "random"), ("after", "bo"))
    }
    for k in (5, 10):
        diff, se = paired_difference(seeds["before"][k], seeds["after"][k])
        assert f"{diff:+.3f} ± {se:.3f}" in rows["| synthetic"]
        one = {"synthetic": seeds["before"][k]}, {"synthetic": seeds["after"][k]}
        diff, se = paired_geomean_difference(*one)
        assert f"{diff:+.3f} ± {se:.3f}" in rows["| geomean"]
    assert "A = `before` (random, batch 4), B = `after` (bo, batch 4), seeds 0..2" in out

    refusals = [
        ((str(before), str(after)), "after has strategies random, bo: name one"),
        ((str(before), str(tmp_path / "other-seeds.json")), "first_seed: 0 in before, 3 in"),
        ((str(before), str(after), "--against", "xgb"), "after has no strategy 'xgb'"),
    ]
    runs["before"]["results"][0]["per_dataset"]["synthetic"].pop("per_seed")
    (tmp_path / "old.json").write_text(json.dumps(runs["before"]))
    refusals.append(((str(tmp_path / "old.json"), str(before)), "old was saved without per-seed"))
    for argv, message in refusals:
        with pytest.raises(SystemExit) as exit_info:
            _run_main(monkeypatch, "compare", *argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
