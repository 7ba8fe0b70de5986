"""Search strategies and their one registry, `STRATEGY_MAP` (as Kernel Tuner's strategy_map).

- `grid`, `random`: learn nothing.
- `analytical`: rank by the workload family's analytical model (ALCOP's for the tensor-core
  GEMMs, the wave/bandwidth model for the memory-intensive operators).
- `xgb`: XGBoost on measurements and simulated annealing, epsilon-greedy (TVM's XGBTuner); the
  knob-only baseline the model-based search replaced.
- `bo`: knob-only model-based search (tuner/bo.py): an initial design that represents the
  space, a Gaussian process with an uncertainty, a classifier of failures, expected
  improvement, diverse batches.
- `analytical+xgb`: the same search with the analytical model as the prior mean, corrected
  by the measurements (the name is the API's since the first release: the prior was an
  XGBoost model pretrained on the analytical model's predictions).
- `auto` (the default): pipetune's best strategy for the space: `analytical+xgb` where the
  kernel is one of pipetune's (a kernel family's space, which its analytical model covers),
  `bo` otherwise.

The API's list of names lives in the wire contract (`model.wire.StrategyName`, which cannot
import the tuner); this module checks at import that the registry and that list agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np

from pipetune.model.cost_model import CostModel, predicted_log_throughput
from pipetune.model.family import KernelFamily, family_of
from pipetune.model.wire import DEFAULT_STRATEGY, StrategyName
from pipetune.tuner.bo import BayesianStrategy, PriorMean
from pipetune.tuner.encoding import KnobEncoding
from pipetune.tuner.sa import SimulatedAnnealing, codec_for
from pipetune.tuner.strategy_base import FixedOrderStrategy, Observation, Strategy
from pipetune.tuner.transfer import completed_by_model, fitted_to_record

__all__ = [
    "DEFAULT_STRATEGY",
    "KNOB_ONLY",
    "STRATEGIES",
    "STRATEGY_MAP",
    "Observation",
    "Strategy",
    "make_strategy",
]


class GridStrategy(FixedOrderStrategy):
    name = "grid"

    def __init__(self, space, rng):
        super().__init__(space, rng)
        self._order = np.arange(len(space))


class RandomStrategy(FixedOrderStrategy):
    name = "random"

    def __init__(self, space, rng):
        super().__init__(space, rng)
        self._order = rng.permutation(len(space))


class AnalyticalStrategy(FixedOrderStrategy):
    name = "analytical"

    def __init__(self, space, rng):
        super().__init__(space, rng)
        self._order = family_of(space.workload).evaluate(space).order


class XGBStrategy(Strategy):
    """Cost model + simulated annealing, with epsilon-greedy random picks for diversity."""

    name = "xgb"

    def __init__(
        self,
        space: Any,
        rng: np.random.Generator,
        *,
        seed: int,
        epsilon: float = 0.05,
        min_observations: int = 8,
    ):
        super().__init__(space, rng)
        self.epsilon = epsilon
        self.min_observations = min_observations
        self.cost_model = CostModel(seed=seed, use_analytical=False)
        self.sa = SimulatedAnnealing(codec_for(space), rng=rng)
        self._fitted_on = -1

    def _refit(self, history: list[Observation]) -> None:
        if len(history) == self._fitted_on:
            return
        rows = np.array([o.row for o in history], dtype=np.int64)
        latency = np.array([o.latency_s if o.latency_s else np.nan for o in history])
        failed = np.array([o.failed for o in history], dtype=bool)
        self.cost_model.fit(self.space, rows, latency, failed)
        self._fitted_on = len(history)

    def _random_unvisited(self, n: int, exclude: set[int]) -> list[int]:
        pool = np.setdiff1d(np.arange(len(self.space)), np.fromiter(exclude, dtype=np.int64))
        if len(pool) == 0:
            return []
        return self.rng.choice(pool, size=min(n, len(pool)), replace=False).tolist()

    def next_batch(self, n, exclude, history):
        if len(history) < self.min_observations:
            return self._random_unvisited(n, exclude)  # TVM: random until the model has data
        self._refit(history)
        scores = self.cost_model.predict(self.space)
        tiebreak = self.rng.random(len(scores))  # (equal scores in a random order: sa.py)
        picks = self.sa.find_maximums(scores, n, exclude, tiebreak)
        # Epsilon-greedy: each slot is a random unvisited schedule with probability epsilon.
        chosen = set(picks)
        for i in range(len(picks)):
            if self.rng.random() < self.epsilon:
                extra = self._random_unvisited(1, exclude | chosen)
                if extra:
                    chosen.discard(picks[i])
                    picks[i] = extra[0]
                    chosen.add(extra[0])
        if len(picks) < n:  # SA found fewer unvisited maxima than asked: top up in score order
            picks += self._in_order(
                np.lexsort((-tiebreak, -scores)), n - len(picks), exclude | chosen
            )
        return picks


def space_family(space: Any) -> KernelFamily | None:
    """The kernel family of a space, None for a foreign recorded space (it has no workload
    of one of pipetune's operators)."""
    workload = getattr(space, "workload", None)
    if workload is None:
        return None
    try:
        return family_of(workload)
    except ValueError:  # WorkloadError: not an operator of any family
        return None


def is_ours(space: Any) -> bool:
    """A schedule space of one of pipetune's kernel families: its analytical model covers it."""
    return space_family(space) is not None


def analytical_prior(space: Any) -> PriorMean:
    return PriorMean(predicted_log_throughput(space), source="analytical model")


# A factory gets the space, the seed and, optionally, a prior recorded elsewhere (the same
# kernel measured on another GPU, aligned with the space's rows: tuner/transfer.py).
Factory = Callable[[Any, int, PriorMean | None], Strategy]


@dataclass(frozen=True)
class StrategySpec:
    factory: Factory
    needs_model: bool  # only for pipetune's own kernels (the analytical model ranks them)
    uses_prior: bool  # takes a recorded prior (warm start from another GPU)
    # Its prior mean on pipetune's own kernels is the analytical model's, which a prior learned
    # from measurements of other shapes refines (service: a family's default learned prior).
    model_prior: bool = False
    # Believes trials proposed and not measured yet at its own predictions (tuner/bo.py), so
    # the service may propose its next batch before the last one is complete (driver.py).
    proposes_early: bool = False


def _bo(space: Any, seed: int, prior: PriorMean | None) -> Strategy:
    if prior is not None and prior.sampled:
        # A task's trials, a few dozen of the space: the rest is guessed from them.
        features = KnobEncoding.of(space).features
        fitted = fitted_to_record(prior, features, seed)
        prior = completed_by_model(prior, fitted, "a fit to its trials")
    return BayesianStrategy(space, np.random.default_rng(seed), seed=seed, prior=prior)


def _analytical_bo(space: Any, seed: int, prior: PriorMean | None) -> Strategy:
    # A recorded prior (this kernel measured on another GPU) is closer to the truth here than
    # the model's prediction: it takes the model's place where it has a record, and the model
    # guesses the rows it has none of (a tuning task's trials are a few dozen of the space).
    return BayesianStrategy(
        space,
        np.random.default_rng(seed),
        seed=seed,
        prior=(
            completed_by_model(prior, predicted_log_throughput(space))
            if prior is not None
            else analytical_prior(space)
        ),
        name="analytical+xgb",
    )


def _auto(space: Any, seed: int, prior: PriorMean | None) -> Strategy:
    return (_analytical_bo if is_ours(space) else _bo)(space, seed, prior)


STRATEGY_MAP: dict[str, StrategySpec] = {
    "grid": StrategySpec(
        lambda sp, seed, _: GridStrategy(sp, np.random.default_rng(seed)), False, False
    ),
    "random": StrategySpec(
        lambda sp, seed, _: RandomStrategy(sp, np.random.default_rng(seed)), False, False
    ),
    "analytical": StrategySpec(
        lambda sp, seed, _: AnalyticalStrategy(sp, np.random.default_rng(seed)), True, False
    ),
    "xgb": StrategySpec(
        lambda sp, seed, _: XGBStrategy(sp, np.random.default_rng(seed), seed=seed), False, False
    ),
    "bo": StrategySpec(_bo, False, True, proposes_early=True),
    "analytical+xgb": StrategySpec(
        _analytical_bo, True, True, model_prior=True, proposes_early=True
    ),
    "auto": StrategySpec(_auto, False, True, model_prior=True, proposes_early=True),
}

STRATEGIES: tuple[str, ...] = tuple(STRATEGY_MAP)
# Strategies that need nothing but the knobs: the ones that can search any recorded space.
KNOB_ONLY: tuple[str, ...] = tuple(n for n, s in STRATEGY_MAP.items() if not s.needs_model)

if set(STRATEGIES) != set(get_args(StrategyName)) or DEFAULT_STRATEGY not in STRATEGY_MAP:
    raise RuntimeError(
        "tuner.strategies.STRATEGY_MAP and model.wire.StrategyName disagree: "
        f"{sorted(STRATEGIES)} vs {sorted(get_args(StrategyName))}"
    )


def make_strategy(name: str, space: Any, seed: int, prior: PriorMean | None = None) -> Strategy:
    spec = STRATEGY_MAP.get(name)
    if spec is None:
        raise ValueError(f"unknown strategy '{name}'; known: {', '.join(STRATEGIES)}")
    if spec.needs_model and not is_ours(space):
        raise ValueError(
            f"strategy '{name}' needs pipetune's analytical model, and this is a foreign space "
            f"(use {', '.join(KNOB_ONLY)})"
        )
    if prior is not None and not spec.uses_prior:
        raise ValueError(
            f"strategy '{name}' takes no recorded prior (these do: "
            f"{', '.join(n for n, s in STRATEGY_MAP.items() if s.uses_prior)})"
        )
    return spec.factory(space, seed, prior)
