"""Offline benchmark of search strategies on recorded spaces (`pipetune bench tuner`).

Each (dataset, strategy, seed) is one run of the largest budget; best-in-k for smaller k is
read off its first k trials (the best-so-far curve, as ALCOP's Fig. 13). A peer that plans by
its budget (peers.PLANS_BY_BUDGET: SMAC's initial design, Kernel Tuner's annealing schedule)
runs once per budget instead, as a user asking for k trials would run it. Per dataset and
budget: the mean over seeds and its standard error, and the methodology score P against
random search's exact expectation. Over datasets: the geometric mean of the means (its
standard error by the delta method: se(g) = g * sqrt(sum_d (se_d / m_d)^2) / D) and the mean
P score.

pipetune's strategies propose `batch` trials per round (the service's batch is 8) and see
their results only after the whole batch; the peers propose one trial at a time and see
each result before the next proposal (that is how they run), which favours them at the same
budget unless `batch` is 1.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from pipetune.model.trials import is_simulated
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.metrics import (
    geomean,
    mean_p_score,
    p_score,
    p_score_se,
    random_search_expectation,
)
from pipetune.tuner.offline import RecordedSpace, propose_and_measure, run_offline, throughput_of
from pipetune.tuner.peers import PEERS, PLANS_BY_BUDGET, PeerFailedError, run_peer, run_rules
from pipetune.tuner.recorded import RecordedConfigs
from pipetune.tuner.strategies import DEFAULT_STRATEGY, KNOB_ONLY, STRATEGY_MAP, make_strategy
from pipetune.tuner.strategy_base import Observation, Strategy
from pipetune.tuner.transfer import recorded_prior

__all__ = ["KNOB_ONLY", "Dataset", "bench", "run_strategy_rows", "trial_throughputs"]


@dataclass(frozen=True)
class Dataset:
    """A recorded space, with pipetune's schedule space when it is one of ours."""

    name: str
    configs: RecordedConfigs
    ours: RecordedSpace | None = None
    # pipetune's datasets: the runner its results came from (model.trials' runner strings):
    # only GPU measurements may teach a learned prior.
    runner: str | None = None
    # pipetune's datasets: the schedules of the workload's valid space it does not hold, and
    # whether it says it left some out by design (a campaign's quarantined knob values).
    lacking: int = 0
    quarantined: bool = False


def run_strategy_rows(
    strategy: Strategy, objective_ms: np.ndarray, budget: int, batch: int, early: int = 0
) -> list[int]:
    """Drive a strategy directly (no session) over a foreign space; the rows it measured, in
    the order their results came in. `early`: each batch is proposed while the last `early`
    trials of the batch before it are still unmeasured (the service's early proposals)."""
    history: list[Observation] = []
    exclude: set[int] = set()
    # A trial failed where its throughput is 0 (inf, nan, zero or negative time), as the
    # benchmark scores it: a time <= 0 taken as measured fed the models log(0) and log(-1)
    # (XGBoost refused its labels, the GP fitted NaN).
    ran = throughput_of(objective_ms) > 0

    cap = min(budget, len(objective_ms))

    def propose(n: int) -> list[int]:
        # (Asked whole, cut to the budget: as TuningSession.propose.)
        rows = strategy.next_batch(min(n, len(objective_ms) - len(exclude)), exclude, history)
        rows = rows[: cap - len(exclude)]
        exclude.update(rows)
        return rows

    def measure(rows: list[int]) -> None:
        for r in rows:
            ok = bool(ran[r])
            ms = float(objective_ms[r])
            history.append(Observation(row=r, latency_s=ms * 1e-3 if ok else None, failed=not ok))

    propose_and_measure(propose, measure, cap, batch, early)
    return [o.row for o in history]


# The seed of a prior task's run is the run's plus this: the same seed on a space of the same
# knobs would start from the same design rows as the run it warm-starts.
PRIOR_TASK_SEED = 1_000_003


def prior_for(dataset: Dataset, prior: RecordedConfigs, sampled: bool = False) -> PriorMean:
    """A recorded space of the same kernel (another GPU) as a prior over this dataset's rows."""
    return recorded_prior(prior, dataset.configs.configs, dataset.configs.knob_names, sampled)


def task_prior(dataset: Dataset, prior: Dataset, seed: int, trials: int, batch: int) -> PriorMean:
    """What a finished task on the prior's GPU would give (the service's `prior_task`): the
    first `trials` trials of `auto` on the prior dataset, as a sampled prior. No more than
    the dataset holds (a billion ran for minutes for the prior a whole sweep gives)."""
    trials = min(trials, len(prior.configs.configs))
    rows = trial_rows(prior, DEFAULT_STRATEGY, seed + PRIOR_TASK_SEED, trials, batch)
    configs = prior.configs
    sample = RecordedConfigs(
        f"{configs.name} ({trials} trials of {DEFAULT_STRATEGY})",
        configs.tune_params,
        [configs.configs[r] for r in rows],
        configs.objective_ms[rows],
        configs.ordered,
    )
    return prior_for(dataset, sample, sampled=True)


def trial_rows(
    dataset: Dataset,
    strategy: str,
    seed: int,
    budget: int,
    batch: int = 8,
    prior: PriorMean | None = None,
    early: int = 0,
) -> list[int]:
    """The rows of dataset.configs one of pipetune's strategies measures, in the order their
    results came in (`early`: see run_strategy_rows).

    `prior` goes to the strategies that take one; the others ignore it.
    """
    spec = STRATEGY_MAP.get(strategy)
    if spec is None:
        raise ValueError(f"unknown strategy '{strategy}'")
    prior = prior if spec.uses_prior else None
    if dataset.ours is not None:
        # configs rows are the space rows (RecordedConfigs.from_recorded_space keeps the order)
        return run_offline(dataset.ours, strategy, seed, budget, batch, prior=prior, early=early)
    if strategy not in KNOB_ONLY:
        raise ValueError(
            f"strategy '{strategy}' needs pipetune's analytical model; "
            f"dataset '{dataset.name}' is a foreign space (use {', '.join(KNOB_ONLY)})"
        )
    return run_strategy_rows(
        make_strategy(strategy, dataset.configs.search_space, seed, prior=prior),
        dataset.configs.objective_ms,
        budget,
        batch,
        early,
    )


def trial_throughputs(
    dataset: Dataset,
    strategy: str,
    seed: int,
    budget: int,
    batch: int = 8,
    prior: PriorMean | None = None,
    early: int = 0,
) -> np.ndarray:
    """Throughputs of the trials a strategy (ours or a peer) makes, in order; 0 = failed.
    The peers ignore `prior`."""
    if strategy in PEERS:
        return run_peer(strategy, dataset.configs, seed, budget)
    rows = trial_rows(dataset, strategy, seed, budget, batch, prior, early)
    return dataset.configs.throughput[rows]


def _summary(tables: Mapping[str, np.ndarray], randoms: Mapping[str, list[float]], j: int) -> dict:
    """Per-dataset means, standard errors and P scores at budget index j, and the geomean."""
    per = {}
    for name, table in tables.items():
        column = table[:, j]
        mean = float(column.mean())
        se = float(column.std(ddof=1) / np.sqrt(len(column))) if len(column) > 1 else 0.0
        rnd = randoms[name][j]
        per[name] = {
            "best_in_k": mean,
            "se": se,
            "p_score": p_score(mean, rnd),
            "p_se": p_score_se(se, rnd),
            "random": rnd,
            # Each seed's figure, in seed order: runs on the same seeds compare pairwise
            # (benchmarks/bench_tuner.py compare), more precisely than by their means.
            "per_seed": [round(float(v), 6) for v in column],
        }
    g = geomean([v["best_in_k"] for v in per.values()])
    p_mean, p_se = mean_p_score(per)
    d = len(per)
    rel = [v["se"] / v["best_in_k"] for v in per.values() if v["best_in_k"] > 0]
    return {
        "best_in_k": g,
        "se": float(g * np.sqrt(np.sum(np.square(rel))) / d),
        "p_score": p_mean,
        "p_se": p_se,
        "per_dataset": per,
    }


# The datasets and settings of the running benchmark, for worker processes forked from it
# (fork shares them without pickling the spaces).
_RUN: dict = {}


def _table(ds_index: int, strategy: str) -> np.ndarray:
    """best-in-k of one strategy on one dataset: shape (seeds, budgets)."""
    datasets, priors, budgets, seeds, batch, first, prior_trials = (
        _RUN[k]
        for k in ("datasets", "priors", "budgets", "seeds", "batch", "first_seed", "prior_trials")
    )
    ds = datasets[ds_index]
    top = max(budgets)
    source = priors.get(ds.name)
    uses_prior = strategy in STRATEGY_MAP and STRATEGY_MAP[strategy].uses_prior
    if source is None:
        prior = _RUN["learned"].get(ds.name)
    else:
        prior = prior_for(ds, source.configs) if not prior_trials else None
    table = np.zeros((seeds, len(budgets)))
    for i, seed in enumerate(range(first, first + seeds)):
        if source and prior_trials and uses_prior:
            prior = task_prior(ds, source, seed, prior_trials, batch)
        # (budget of the run, the budget indices read off it)
        if strategy in PLANS_BY_BUDGET:
            runs = [(k, [j]) for j, k in enumerate(budgets)]
        else:
            runs = [(top, list(range(len(budgets))))]
        for run_budget, columns in runs:
            throughputs = trial_throughputs(
                ds, strategy, seed, run_budget, batch, prior, _RUN["early"]
            )
            curve = np.maximum.accumulate(throughputs) / ds.configs.optimum
            for j in columns:
                k = budgets[j]
                table[i, j] = curve[min(k, len(curve)) - 1] if len(curve) else 0.0
    return table


def bench(
    datasets: Sequence[Dataset],
    strategies: Sequence[str],
    budgets: Sequence[int],
    seeds: int,
    progress: Callable[[str], None] | None = None,
    batch: int = 8,
    priors: Mapping[str, Dataset] | None = None,
    jobs: int = 1,
    first_seed: int = 0,
    prior_trials: int | None = None,
    learned: Mapping[str, PriorMean] | None = None,
    early: int = 0,
) -> dict:
    """`priors` maps a dataset's name to a recorded space of the same kernel elsewhere; with
    `prior_trials`, only what a task of that many trials of `auto` measured there (per seed).
    `learned` maps a dataset's name to a prior mean learned from other spaces' measurements
    (tuner/learned_prior.py), for the datasets without a recorded prior.
    `jobs` > 1 runs (dataset, strategy) pairs in forked processes; the results are the same.
    Seeds are first_seed .. first_seed + seeds - 1 (a long run can be split and merged).
    `early`: pipetune's strategies propose each batch while the last `early` trials of the
    batch before it are unmeasured (the service's early proposals, PIPETUNE_PROPOSE_EARLY)."""
    priors = dict(priors or {})
    # A dataset with a recorded prior runs from it: a learned one is neither used nor said.
    learned = {name: p for name, p in (learned or {}).items() if name not in priors}
    _RUN.update(datasets=list(datasets), priors=priors, learned=learned, budgets=list(budgets))
    _RUN.update(seeds=seeds)
    _RUN.update(batch=batch, first_seed=first_seed, prior_trials=prior_trials, early=early)
    pairs = [(i, s) for i in range(len(datasets)) for s in strategies]
    # best[strategy][dataset] = array (seeds, len(budgets))
    best: dict[str, dict[str, np.ndarray]] = {s: {} for s in strategies}
    # A peer whose own code fails on a space is left out of the whole run (a geomean over
    # fewer datasets would not compare with the others'), and the reason said.
    left_out: dict[str, str] = {}
    if jobs > 1:
        context = multiprocessing.get_context("fork")
        # No more processes than (dataset, strategy) pairs: the rest would start idle.
        workers = min(jobs, len(pairs))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(_table, i, s): (i, s) for i, s in pairs}
            for future in as_completed(futures):
                i, s = futures[future]
                try:
                    best[s][datasets[i].name] = future.result()
                except PeerFailedError as exc:
                    left_out.setdefault(s, str(exc))
                if progress:
                    progress(f"{datasets[i].name}: {s} done")
    else:
        for i, s in pairs:
            if s in left_out:
                continue
            if progress:
                progress(f"{datasets[i].name}: {s}")
            try:
                best[s][datasets[i].name] = _table(i, s)
            except PeerFailedError as exc:
                left_out[s] = str(exc)
    strategies = [s for s in strategies if s not in left_out]
    if not strategies:
        raise PeerFailedError("; ".join(left_out.values()))
    best = {s: {ds.name: best[s][ds.name] for ds in datasets} for s in strategies}

    def sampled(prior: Dataset) -> str:
        """A --prior-trials prior's caption: the trials a task there holds (no more than
        its space: trial_rows measures at most every configuration)."""
        if not prior_trials:
            return ""
        return f" ({min(prior_trials, len(prior.configs.configs))} trials of {DEFAULT_STRATEGY})"

    randoms = {
        ds.name: [
            random_search_expectation(ds.configs.throughput / ds.configs.optimum, k)
            for k in budgets
        ]
        for ds in datasets
    }
    results = [
        {"strategy": strategy, "budget": k, **_summary(best[strategy], randoms, j)}
        for strategy in strategies
        for j, k in enumerate(budgets)
    ]
    return {
        "results": results,
        "strategies": strategies,
        "left_out": left_out,
        "seeds": seeds,
        "first_seed": first_seed,
        "batch": batch,
        # As run: a batch leaves at most all but one of its trials unmeasured (late_trials).
        "early": min(early, batch - 1),
        "peer_batch": 1,
        # Run once per budget (they plan by it), not read off the largest budget's run.
        "peer_rules": run_rules(strategies),
        "datasets": [d.name for d in datasets],
        "priors": {name: p.name + sampled(p) for name, p in priors.items()},
        # A budget over a space's size measures all of it (best-in-k is then 1).
        "configurations": {d.name: len(d.configs.configs) for d in datasets},
        "prior_trials": prior_trials,
        "learned_priors": {name: p.source for name, p in learned.items()},
        "random": {
            name: dict(zip(map(str, budgets), values, strict=True))
            for name, values in randoms.items()
        },
        # Datasets whose latencies are the analytical model's (a simulated sweep, an export of
        # a simulated task): their tables read as a GPU's would, and on them the model's own
        # strategies are scored against its own predictions. (Last: `pipetune bench tuner
        # --json` printed it last, after its own keys.)
        "simulated": [d.name for d in datasets if is_simulated(d.runner)],
    }
