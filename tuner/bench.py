"""Offline benchmark of search strategies on recorded spaces (`pipetune bench tuner`).

Each (dataset, strategy, seed) is one run of the largest budget; best-in-k for smaller k is
read off its first k trials (the best-so-far curve, as ALCOP's Fig. 13). Per budget: mean
over seeds, geometric mean over datasets, and the methodology score P against random
search's exact expectation (mean of the per-dataset scores).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipetune.tuner.metrics import geomean, p_score, random_search_expectation
from pipetune.tuner.offline import RecordedSpace, run_offline
from pipetune.tuner.peers import PEERS, run_peer
from pipetune.tuner.recorded import ForeignSpace, RecordedConfigs
from pipetune.tuner.strategies import Observation, Strategy, make_strategy

# Strategies that need nothing but the knobs: the ones that can search a foreign space.
KNOB_ONLY = ("grid", "random", "xgb")


@dataclass(frozen=True)
class Dataset:
    """A recorded space, with pipetune's schedule space when it is one of ours."""

    name: str
    configs: RecordedConfigs
    ours: RecordedSpace | None = None


def run_strategy_rows(
    strategy: Strategy, objective_ms: np.ndarray, budget: int, batch: int
) -> list[int]:
    """Drive a strategy directly (no session) over a foreign space; the rows it measured."""
    history: list[Observation] = []
    exclude: set[int] = set()
    while len(history) < min(budget, len(objective_ms)):
        rows = strategy.next_batch(min(batch, budget - len(history)), exclude, history)
        if not rows:
            break
        for r in rows:
            ms = float(objective_ms[r])
            ok = bool(np.isfinite(ms))
            history.append(Observation(row=r, latency_s=ms * 1e-3 if ok else None, failed=not ok))
            exclude.add(r)
    return [o.row for o in history]


def trial_throughputs(
    dataset: Dataset, strategy: str, seed: int, budget: int, batch: int = 8
) -> np.ndarray:
    """Throughputs of the trials a strategy (ours or a peer) makes, in order; 0 = failed."""
    if strategy in PEERS:
        return run_peer(strategy, dataset.configs, seed, budget)
    if dataset.ours is not None:
        # configs rows are the space rows (RecordedConfigs.from_recorded_space keeps the order)
        return dataset.configs.throughput[run_offline(dataset.ours, strategy, seed, budget, batch)]
    if strategy not in KNOB_ONLY:
        raise ValueError(
            f"strategy '{strategy}' needs pipetune's analytical model; "
            f"dataset '{dataset.name}' is a foreign space (use {', '.join(KNOB_ONLY)})"
        )
    space = ForeignSpace(dataset.configs)
    rows = run_strategy_rows(
        make_strategy(strategy, space, seed), dataset.configs.objective_ms, budget, batch
    )
    return dataset.configs.throughput[rows]


def bench(
    datasets: Sequence[Dataset],
    strategies: Sequence[str],
    budgets: Sequence[int],
    seeds: int,
    progress: Callable[[str], None] | None = None,
) -> dict:
    top = max(budgets)
    # best[strategy][dataset] = array (seeds, len(budgets))
    best: dict[str, dict[str, np.ndarray]] = {s: {} for s in strategies}
    for ds in datasets:
        optimum = ds.configs.optimum
        for strategy in strategies:
            if progress:
                progress(f"{ds.name}: {strategy}")
            table = np.zeros((seeds, len(budgets)))
            for seed in range(seeds):
                curve = np.maximum.accumulate(trial_throughputs(ds, strategy, seed, top)) / optimum
                for j, k in enumerate(budgets):
                    table[seed, j] = curve[min(k, len(curve)) - 1] if len(curve) else 0.0
            best[strategy][ds.name] = table
    randoms = {
        ds.name: [
            random_search_expectation(ds.configs.throughput / ds.configs.optimum, k)
            for k in budgets
        ]
        for ds in datasets
    }
    results = []
    for strategy in strategies:
        for j, k in enumerate(budgets):
            per = {}
            for ds in datasets:
                mean = float(best[strategy][ds.name][:, j].mean())
                rnd = randoms[ds.name][j]
                per[ds.name] = {"best_in_k": mean, "p_score": p_score(mean, rnd), "random": rnd}
            results.append(
                {
                    "strategy": strategy,
                    "budget": k,
                    "best_in_k": geomean([v["best_in_k"] for v in per.values()]),
                    "p_score": float(np.mean([v["p_score"] for v in per.values()])),
                    "per_dataset": per,
                }
            )
    return {"results": results, "seeds": seeds, "datasets": [d.name for d in datasets]}
