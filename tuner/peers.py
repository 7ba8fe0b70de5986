"""Other tuners in the same harness: Kernel Tuner's strategies in simulation mode, Optuna's
samplers and SMAC3 over the same space. Optional (`pip install pipetune[peers]`).

Every peer proposes one trial at a time and sees its result before the next proposal.

Every peer is scored on the first `budget` *distinct* configurations it evaluated: a repeat
costs no measurement (Kernel Tuner answers it from its cache), a failed configuration costs
one, as it does for pipetune's strategies.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import logging
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipetune.model.errors import PipetuneError

if TYPE_CHECKING:  # annotations only: keeps `PEERS` cheap to import for the CLI
    from pipetune.tuner.recorded import RecordedConfigs

# Every Kernel Tuner strategy that runs in simulation mode on a recorded cache (Kernel Tuner
# 1.5's strategy_map), with its default options. Left out: brute_force (the exhaustive sweep
# itself: it ignores the budget), skopt (scikit-optimize 0.10 fails inside its sampler on
# these spaces) and pyatf_strategies (pyatf 0.0.13 does not match Kernel Tuner 1.5's calls).
KT_STRATEGIES: dict[str, tuple[str, dict]] = {
    f"kt_{name}": (name, options)
    for name, options in (
        ("random_sample", {}),
        ("simulated_annealing", {"T": 1.0}),
        ("genetic_algorithm", {}),
        ("bayes_opt", {}),
        ("minimize", {}),
        ("basinhopping", {}),
        ("diff_evo", {}),
        ("dual_annealing", {}),
        ("greedy_mls", {}),
        ("ordered_greedy_mls", {}),
        ("greedy_ils", {}),
        ("mls", {}),
        ("pso", {}),
        ("firefly_algorithm", {}),
        ("hybrid_vndx", {}),
        ("adaptive_tabu_greywolf", {}),
        ("nsga2", {}),
        ("nsga3", {}),
    )
}
# Optuna's samplers: TPE as configured by default, multivariate TPE (Optuna's recommended
# variant for dependent knobs), and GPSampler (Bayesian optimisation with a Gaussian process:
# the peer nearest to pipetune's own search; it needs PyTorch). Left out: CmaEsSampler (over
# the knobs' value indices most of its proposals fall outside these constrained spaces: a run
# needs tens of thousands of proposals for 100 trials, hours per dataset).
OPTUNA_SAMPLERS = ("optuna_tpe", "optuna_tpe_multivariate", "optuna_gp")
# SMAC3 (Lindauer et al., JMLR 2022): Bayesian optimisation with a random forest of the
# objective (its spread across the trees the uncertainty) and expected improvement, the
# standard for algorithm configuration over discrete and categorical knobs; its
# hyperparameter-optimisation facade with every default (a Sobol start of a quarter of the
# budget, one proposal in five at random).
SMAC = "smac"
PEERS = (*KT_STRATEGIES, *OPTUNA_SAMPLERS, SMAC)
# Peers that need PyTorch (hundreds of megabytes, not among pipetune's extras): run when named,
# left out of the `peers` and `all` groups, so that those run wherever the extras installed.
NEEDS_TORCH = frozenset({"optuna_gp"})
LIGHT_PEERS = tuple(p for p in PEERS if p not in NEEDS_TORCH)
# Kernel Tuner strategies that may end before the budget (their local optimiser converges,
# or scipy's call limit is spent): such a run is scored as it is, its best carried to the
# larger budgets.
STOPS_EARLY = frozenset({"kt_minimize", "kt_dual_annealing"})
# Kernel Tuner passes max_fevals on to scipy's dual_annealing as `maxfun`, which counts every
# call: repeats (answered from the cache) and configurations outside the space too, which cost
# no trial here (as for every other peer). With maxfun = budget it was scored on 37 distinct
# trials of 100 on average over the development set (11 on one space). Its limit is this many
# calls per trial, and the run is still cut at the budget's distinct trials; its annealing
# schedule does not depend on maxfun, so those are the trials of any larger limit.
SCIPY_CALLS_PER_TRIAL = {"kt_dual_annealing": 10}
KT_LEAST_FEVALS = 2  # (run_kernel_tuner)
# Peers that plan by the budget they are given: SMAC sizes its initial design from n_trials
# (2, 5, 12 and 25 configurations at 10, 20, 50 and 100), Kernel Tuner's simulated annealing
# cools over max_fevals. best-in-k read off a run of the largest budget is not what they give
# a user who asks for k trials: the benchmark runs them once per budget (tuner/bench.py).
# pipetune's strategies and the other peers do not depend on the budget.
PLANS_BY_BUDGET = frozenset({SMAC, "kt_simulated_annealing"})
# Kernel Tuner strategies that draw Latin hypercube samples (seeded: _seeded_latin_hypercubes).
DRAWS_LATIN_HYPERCUBES = frozenset({"kt_bayes_opt", "kt_diff_evo"})
FAILED = "RuntimeFailedConfig"


def run_rules(strategies: Iterable[str]) -> dict[str, str]:
    """How each peer among `strategies` is run beyond its library's defaults, for a saved run
    to say: runs of one peer made under other rules measured something else and do not pool
    (`benchmarks/bench_tuner.py merge`; a run from before the rules says none)."""
    rules = {}
    for name in strategies:
        said = []
        if name in SCIPY_CALLS_PER_TRIAL:
            said.append(f"{SCIPY_CALLS_PER_TRIAL[name]} scipy calls per trial")
        if name in DRAWS_LATIN_HYPERCUBES:
            said.append("Latin hypercubes drawn from the run's seed")
        if name in PLANS_BY_BUDGET:
            said.append("one run per budget")
        if said:
            rules[name] = "; ".join(said)
    return rules


class PeerUnavailableError(PipetuneError, RuntimeError):
    """The peer's package is not installed."""


# The packages each peer imports (PyTorch is not among pipetune's extras: NEEDS_TORCH).
_PACKAGES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(KT_STRATEGIES, ("kernel_tuner",)),
    **dict.fromkeys(OPTUNA_SAMPLERS, ("optuna",)),
    **dict.fromkeys(NEEDS_TORCH, ("optuna", "torch")),
    SMAC: ("smac",),
}


def unavailable(name: str) -> str | None:
    """Why a peer cannot run here (a package it needs is not installed), or None. Asked
    before a benchmark starts: found missing mid-run, it ended the run after the strategies
    before it had run, as an unexpected error (exit 1)."""
    for module in _PACKAGES.get(name, ()):
        if importlib.util.find_spec(module) is not None:
            continue
        if module == "torch":
            return "Optuna's GPSampler needs PyTorch: pip install torch (the CPU build is enough)"
        return f"{module} is not installed: pip install 'pipetune[peers]'"
    return None


def _require(name: str) -> None:
    if why := unavailable(name):
        raise PeerUnavailableError(why)


class PeerFailedError(PipetuneError, RuntimeError):
    """A peer's own code failed on a space (Kernel Tuner's differential evolution on a dozen
    configurations, SMAC on one): the benchmark leaves that peer out and says why."""


class PeerTimeoutError(PipetuneError, RuntimeError):
    """A peer's run went past the wall-clock limit (`peer_time_limit_s`)."""


# A peer library's search can stall on a small space and never end: Kernel Tuner's NSGA-II,
# once no unseen neighbour of its population is left, mates again and again without one
# evaluation (seen on a 56-configuration space with a budget of 50: a benchmark that never
# finished). Each peer run gets this long on the wall clock before it counts as failed on the
# space; PIPETUNE_PEER_TIME_LIMIT_S sets another limit.
PEER_TIME_LIMIT_S = 600.0
PEER_TIME_LIMIT_ENV = "PIPETUNE_PEER_TIME_LIMIT_S"
PEER_TIME_LIMIT_MAX_S = 7 * 24 * 3600.0  # as every other duration setting


def peer_time_limit_s() -> float:
    """The wall-clock limit of one peer run (ValueError naming the variable if it is bad)."""
    raw = os.environ.get(PEER_TIME_LIMIT_ENV)
    if raw is None or raw.strip() == "":
        return PEER_TIME_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{PEER_TIME_LIMIT_ENV} must be a positive number of seconds, got {raw!r}")
    if value > PEER_TIME_LIMIT_MAX_S:
        # (The timer signal takes no more: 1e12 failed every peer run, blamed on the peer.)
        raise ValueError(
            f"{PEER_TIME_LIMIT_ENV} must be at most {PEER_TIME_LIMIT_MAX_S:g} s (a week), "
            f"got {raw!r}"
        )
    return value


@contextlib.contextmanager
def _wall_clock_limit(seconds: float) -> Iterator[None]:
    """PeerTimeoutError in this thread once `seconds` have passed. A timer signal interrupts
    a library's pure-Python loop where nothing else would; where there is none (not Unix, or
    not the main thread) the run goes unguarded. A SMAC child is killed by subprocess.run
    when the signal interrupts its wait."""
    if (
        not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise PeerTimeoutError(
            f"no result within {seconds:g} s on the wall clock (the library's search stalled"
            f" or is too slow on this space; {PEER_TIME_LIMIT_ENV} sets the limit)"
        )

    previous = signal.signal(signal.SIGALRM, expired)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)  # (inside: the handler restored if not)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _why(exc: BaseException) -> str:
    """One short line for a peer's failure: its exception's type and last line of text."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def write_kt_cache(recorded: RecordedConfigs, path: Path) -> None:
    """Export as a Kernel Tuner cache file; failed configurations stay in it as failures."""
    names = recorded.knob_names
    cache = {}
    for config, objective in zip(recorded.configs, recorded.objective_ms, strict=True):
        entry = {k: config[k] for k in names}
        entry["time"] = float(objective) if np.isfinite(objective) else FAILED
        entry.update(
            compile_time=0,
            verification_time=0,
            benchmark_time=0,
            strategy_time=0,
            framework_time=0,
            times=[],
        )
        cache[",".join(str(config[k]) for k in names)] = entry
    document = {
        "device_name": "recorded",
        "kernel_name": recorded.name,
        "problem_size": [1],
        "tune_params_keys": names,
        "tune_params": recorded.tune_params,
        "objective": "time",
        "cache": cache,
    }
    path.write_text(json.dumps(document), encoding="utf-8")


def _first_distinct(keys: list[tuple], values: list[float], budget: int) -> np.ndarray:
    seen: set[tuple] = set()
    out = []
    for key, value in zip(keys, values, strict=True):
        if key in seen:
            continue
        seen.add(key)
        out.append(value)
        if len(out) == budget:
            break
    return np.array(out)


@contextlib.contextmanager
def _seeded_latin_hypercubes(seed: int) -> Iterator[None]:
    """Kernel Tuner's Latin hypercube samples (bayes_opt's initial sample, diff_evo's
    population) drawn from `seed`: it makes scipy's LatinHypercube without one, which takes
    fresh entropy from the OS, so those two peers ran differently each time for the same
    seed (and a paired comparison seed by seed did not hold). Each sampler made gets its own
    seed from a stream of `seed`'s (not from np.random's, which the strategies draw from)."""
    from scipy.stats import qmc

    unseeded = qmc.LatinHypercube
    seeds = np.random.default_rng([seed, 0x4C4853])  # ("LHS")

    # (scipy 1.15 named it `rng`; pipetune takes scipy 1.11 on, where it was `seed`)
    keyword = "rng" if "rng" in inspect.signature(unseeded).parameters else "seed"

    def seeded(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault(keyword, int(seeds.integers(2**31)))
        return unseeded(*args, **kwargs)

    # Where Kernel Tuner looks the name up: scipy's module (searchspace imports it in the
    # function that samples) and bayes_opt's own (imported at its top).
    bayes_opt = importlib.import_module("kernel_tuner.strategies.bayes_opt")
    targets = [(qmc, "LatinHypercube"), (bayes_opt, "LatinHypercube")]
    for module, attribute in targets:
        setattr(module, attribute, seeded)
    try:
        yield
    finally:
        for module, attribute in targets:
            setattr(module, attribute, unseeded)


def run_kernel_tuner(name: str, recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    _require(name)
    import kernel_tuner
    from kernel_tuner.util import StopCriterionReached

    strategy, options = KT_STRATEGIES[name]
    calls_per_trial = SCIPY_CALLS_PER_TRIAL.get(name, 1)
    present = set(recorded.row_of())
    names = recorded.knob_names
    throughput = recorded.throughput
    rows = recorded.row_of()

    def member(p: Any) -> bool:  # the space is exactly the recorded configurations
        if not isinstance(p, dict):  # a one-knob space's value comes bare (not a dict)
            p = dict(zip(names, p if isinstance(p, list | tuple) else (p,), strict=True))
        return tuple(p[k] for k in names) in present

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache.json"
        write_kt_cache(recorded, cache)
        np.random.seed(seed)
        random.seed(seed)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            _seeded_latin_hypercubes(seed),
        ):
            warnings.simplefilter("ignore")
            try:
                results, _ = kernel_tuner.tune_kernel(
                    recorded.name,
                    "__global__ void k() {}",
                    [1],
                    [],
                    recorded.tune_params,
                    restrictions=member,
                    simulation_mode=True,
                    cache=str(cache),
                    strategy=strategy,
                    strategy_options={
                        # At least KT_LEAST_FEVALS: at 1, simulated annealing's start point is
                        # evaluated outside the strategy's own stop handling, and Kernel Tuner
                        # raised StopCriterionReached out of tune_kernel: the peer was left out
                        # of the whole benchmark, every budget, as failing on the space. The
                        # run is cut at the budget's distinct trials below.
                        "max_fevals": max(budget, KT_LEAST_FEVALS) * calls_per_trial,
                        **options,
                    },
                    verbose=False,
                    quiet=True,
                    lang="CUDA",
                )
            except StopCriterionReached:
                # Kernel Tuner cuts max_fevals to the space's size (KT_LEAST_FEVALS cannot
                # lift it), so on a space of one configuration simulated annealing and greedy
                # ILS raised the stop out of tune_kernel after their start point, evaluated
                # outside their own stop handling, and the peer was left out of the whole
                # benchmark. That one configuration, evaluated, was the whole run.
                if len(present) != 1:
                    raise
                results = list(recorded.configs)
    keys = [tuple(r[k] for k in names) for r in results]
    return _first_distinct(keys, [throughput[rows[k]] for k in keys], budget)


def _optuna_sampler(name: str, seed: int):
    import optuna

    if name == "optuna_tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "optuna_tpe_multivariate":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if name == "optuna_gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise ValueError(f"unknown Optuna sampler '{name}'")


def run_optuna(name: str, recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    _require(name)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = recorded.knob_names
    params = recorded.tune_params
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature warnings (multivariate TPE)
        study = optuna.create_study(direction="minimize", sampler=_optuna_sampler(name, seed))

        def ask():
            trial = study.ask()
            return trial, tuple(trial.suggest_categorical(k, params[k]) for k in names)

        return _ask_and_tell(recorded, budget, ask, study.tell, max_asks=200 * budget)


def _ask_and_tell(
    recorded: RecordedConfigs,
    budget: int,
    ask: Callable[[], tuple[Any, tuple]],
    tell: Callable[[Any, float], object],
    max_asks: int,
) -> np.ndarray:
    """Drive an ask-and-tell optimiser (Optuna, SMAC) over the recorded space: `ask()` gives
    (handle, configuration key), `tell(handle, value)` reports its time in ms. Failed and
    non-member configurations are told a value worse than any real one, so the optimiser
    learns to avoid them; a non-member costs no trial (as a restriction would not). Returns
    the throughputs of the first `budget` distinct members tried."""
    rows = recorded.row_of()
    finite = recorded.objective_ms[np.isfinite(recorded.objective_ms)]
    penalty = float(finite.max() * 10) if len(finite) else 1e9
    keys: list[tuple] = []
    distinct: set[tuple] = set()
    # A budget over the space's size ends when every member was tried: waiting for `budget`
    # distinct ones asked max_asks times (minutes of TPE on a 20-configuration space).
    wanted = min(budget, len(rows))
    for _ in range(max_asks):
        handle, key = ask()
        row = rows.get(key)
        objective = recorded.objective_ms[row] if row is not None else np.inf
        tell(handle, float(objective) if np.isfinite(objective) else penalty)
        if row is not None:
            keys.append(key)
            distinct.add(key)
            if len(distinct) >= wanted:
                break
    return _first_distinct(keys, [recorded.throughput[rows[k]] for k in keys], budget)


def _smac_space(recorded: RecordedConfigs, seed: int):
    """The knobs as SMAC's ConfigSpace sees them: numbers as ordinals (SMAC's forest and its
    local search then know their order), anything else as categories, one value as a
    constant."""
    from ConfigSpace import (
        CategoricalHyperparameter,
        ConfigurationSpace,
        Constant,
        OrdinalHyperparameter,
    )

    from pipetune.tuner.encoding import is_ordered  # (here: keeps `PEERS` cheap to import)

    declared = recorded.ordered or {}
    space = ConfigurationSpace(seed=seed)
    for name, values in recorded.tune_params.items():
        if len(values) == 1:
            space.add(Constant(name, str(values[0])))  # (ConfigSpace constants are strings)
        elif declared.get(name, is_ordered(values)):
            space.add(OrdinalHyperparameter(name, list(values)))
        else:
            space.add(CategoricalHyperparameter(name, list(values)))
    return space


# SMAC breaks ties among its candidates in set order, which follows Python's string-hash seed
# (random per process unless PYTHONHASHSEED is set): a run in this process would not repeat.
# So it runs in a child process with this hash seed, and repeats as every other peer's does.
SMAC_HASH_SEED = "0"


def run_smac(recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    _require(SMAC)
    if os.environ.get("PYTHONHASHSEED") == SMAC_HASH_SEED:
        return _run_smac_here(recorded, seed, budget)
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.pickle"
        job.write_bytes(pickle.dumps((recorded, seed, budget)))
        child = subprocess.run(
            [sys.executable, "-m", "pipetune.tuner.peers", str(job)],
            env={**os.environ, "PYTHONHASHSEED": SMAC_HASH_SEED},
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            raise RuntimeError(f"the SMAC run failed: {child.stderr.strip()[-2000:]}")
        return np.load(job.with_suffix(".npy"))


def _run_smac_here(recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    import joblib
    from smac import HyperparameterOptimizationFacade, Scenario
    from smac.runhistory.dataclasses import TrialValue

    names = recorded.knob_names
    params = recorded.tune_params

    def value_of(config, k):  # a constant comes back as its string
        return params[k][0] if len(params[k]) == 1 else config[k]

    def never_called(config, seed: int = 0) -> float:  # ask-and-tell: SMAC runs nothing
        raise AssertionError("SMAC is driven by ask and tell here")

    # SMAC's forest asks joblib for every core; with a few trees per call that is mostly
    # hand-off waits (two thirds of a run's time here), so the trees are grown in turn: the
    # same trees (fixed seeds), and runs of the benchmark's --jobs stay apart.
    with (
        tempfile.TemporaryDirectory() as tmp,
        warnings.catch_warnings(),
        joblib.parallel_config(backend="sequential"),
    ):
        warnings.simplefilter("ignore")
        scenario = Scenario(
            _smac_space(recorded, seed),
            deterministic=True,
            n_trials=budget,  # sets the Sobol start's size, as for a user's run of `budget`
            seed=seed,
            output_directory=Path(tmp),
        )
        smac = HyperparameterOptimizationFacade(
            scenario, never_called, overwrite=True, logging_level=logging.ERROR
        )

        def ask():
            info = smac.ask()
            return info, tuple(value_of(info.config, k) for k in names)

        def tell(info, cost: float) -> None:
            smac.tell(info, TrialValue(cost=cost), save=False)

        return _ask_and_tell(recorded, budget, ask, tell, max_asks=50 * budget)


def run_peer(name: str, recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    """Throughputs (0 = failed) of the first `budget` distinct configurations the peer tried.
    PeerFailedError where the peer's own code fails on this space."""
    if name in KT_STRATEGIES:
        run = run_kernel_tuner
    elif name in OPTUNA_SAMPLERS:
        run = run_optuna
    elif name == SMAC:
        return _peer_run(name, recorded, lambda: run_smac(recorded, seed, budget))
    else:
        raise ValueError(f"unknown peer '{name}'; known: {', '.join(PEERS)}")
    return _peer_run(name, recorded, lambda: run(name, recorded, seed, budget))


def _peer_run(name: str, recorded: RecordedConfigs, run: Callable[[], np.ndarray]) -> np.ndarray:
    limit = peer_time_limit_s()
    try:
        with _wall_clock_limit(limit):
            return run()
    except PeerUnavailableError:
        raise
    except Exception as exc:  # the peer library's own failure (not ours to fix): say which
        raise PeerFailedError(
            f"{name} failed on {recorded.name} ({len(recorded.configs)} configurations): "
            f"{_why(exc)}"
        ) from exc


if __name__ == "__main__":  # a SMAC run in a child process with a fixed hash seed (run_smac)
    job_path = Path(sys.argv[1])
    job = pickle.loads(job_path.read_bytes())  # written by run_smac, in a private directory
    np.save(job_path.with_suffix(".npy"), _run_smac_here(*job))
