"""Other tuners in the same harness: Kernel Tuner's strategies in simulation mode, and
Optuna's TPE sampler over the same categorical space. Optional (`pip install pipetune[peers]`).

Every peer is scored on the first `budget` *distinct* configurations it evaluated: a repeat
costs no measurement (Kernel Tuner answers it from its cache), a failed configuration costs
one, as it does for pipetune's strategies.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: keeps `PEERS` cheap to import for the CLI
    from pipetune.tuner.recorded import RecordedConfigs

KT_STRATEGIES = {
    "kt_simulated_annealing": ("simulated_annealing", {"T": 1.0}),
    "kt_genetic_algorithm": ("genetic_algorithm", {}),
    "kt_bayes_opt": ("bayes_opt", {}),
    "kt_random_sample": ("random_sample", {}),
}
PEERS = (*KT_STRATEGIES, "optuna_tpe")
FAILED = "RuntimeFailedConfig"


class PeerUnavailableError(RuntimeError):
    """The peer's package is not installed."""


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
    path.write_text(json.dumps(document))


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


def run_kernel_tuner(name: str, recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    try:
        import kernel_tuner
    except ImportError as exc:
        raise PeerUnavailableError(
            "kernel_tuner is not installed: pip install pipetune[peers]"
        ) from exc
    strategy, options = KT_STRATEGIES[name]
    present = set(recorded.row_of())
    names = recorded.knob_names
    throughput = recorded.throughput
    rows = recorded.row_of()

    def member(p: dict) -> bool:  # the space is exactly the recorded configurations
        return tuple(p[k] for k in names) in present

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache.json"
        write_kt_cache(recorded, cache)
        np.random.seed(seed)
        random.seed(seed)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
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
                strategy_options={"max_fevals": budget, **options},
                verbose=False,
                quiet=True,
                lang="CUDA",
            )
    keys = [tuple(r[k] for k in names) for r in results]
    return _first_distinct(keys, [throughput[rows[k]] for k in keys], budget)


def run_optuna_tpe(recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    try:
        import optuna
    except ImportError as exc:
        raise PeerUnavailableError("optuna is not installed: pip install pipetune[peers]") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = recorded.row_of()
    names = recorded.knob_names
    throughput = recorded.throughput
    finite = recorded.objective_ms[np.isfinite(recorded.objective_ms)]
    # Failed and non-member configurations are told a value worse than any real one, so TPE
    # learns to avoid them; a non-member costs no trial (as a restriction would not).
    penalty = float(finite.max() * 10) if len(finite) else 1e9
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    keys: list[tuple] = []
    for _ in range(200 * budget):
        trial = study.ask()
        key = tuple(trial.suggest_categorical(k, recorded.tune_params[k]) for k in names)
        row = rows.get(key)
        if row is None:
            study.tell(trial, penalty)
            continue
        objective = recorded.objective_ms[row]
        study.tell(trial, float(objective) if np.isfinite(objective) else penalty)
        keys.append(key)
        if len(set(keys)) >= budget:
            break
    return _first_distinct(keys, [throughput[rows[k]] for k in keys], budget)


def run_peer(name: str, recorded: RecordedConfigs, seed: int, budget: int) -> np.ndarray:
    """Throughputs (0 = failed) of the first `budget` distinct configurations the peer tried."""
    if name in KT_STRATEGIES:
        return run_kernel_tuner(name, recorded, seed, budget)
    if name == "optuna_tpe":
        return run_optuna_tpe(recorded, seed, budget)
    raise ValueError(f"unknown peer '{name}'; known: {', '.join(PEERS)}")
