"""Search strategies: which unvisited schedules to measure next.

`grid` and `random` learn nothing; `analytical` ranks by the ALCOP model; `xgb` fits XGBoost
on measurements only and samples with simulated annealing (TVM's XGBTuner); `analytical+xgb`
(the default) starts from XGBoost pretrained on the analytical model and refits on top of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import get_args

import numpy as np

from pipetune.model.analytical import evaluate
from pipetune.model.cost_model import CostModel
from pipetune.model.space import Space
from pipetune.model.wire import StrategyName
from pipetune.tuner.sa import SimulatedAnnealing, codec_for

STRATEGIES: tuple[str, ...] = get_args(StrategyName)  # one list: the API's strategy names
DEFAULT_STRATEGY = "analytical+xgb"


@dataclass(frozen=True)
class Observation:
    row: int
    latency_s: float | None  # None for a failed trial
    failed: bool


class Strategy(ABC):
    name: str

    def __init__(self, space: Space, rng: np.random.Generator):
        self.space = space
        self.rng = rng

    @abstractmethod
    def next_batch(self, n: int, exclude: set[int], history: list[Observation]) -> list[int]:
        """Up to n space rows not in exclude, in the order to measure them."""

    def _in_order(self, order: np.ndarray, n: int, exclude: set[int]) -> list[int]:
        picked: list[int] = []
        for r in order.tolist():
            if r not in exclude:
                picked.append(r)
                if len(picked) == n:
                    break
        return picked


class GridStrategy(Strategy):
    name = "grid"

    def next_batch(self, n, exclude, history):
        return self._in_order(np.arange(len(self.space)), n, exclude)


class RandomStrategy(Strategy):
    name = "random"

    def __init__(self, space, rng):
        super().__init__(space, rng)
        self._order = rng.permutation(len(space))

    def next_batch(self, n, exclude, history):
        return self._in_order(self._order, n, exclude)


class AnalyticalStrategy(Strategy):
    name = "analytical"

    def __init__(self, space, rng):
        super().__init__(space, rng)
        self._order = evaluate(space).order

    def next_batch(self, n, exclude, history):
        return self._in_order(self._order, n, exclude)


class XGBStrategy(Strategy):
    """Cost model + simulated annealing, with epsilon-greedy random picks for diversity."""

    def __init__(
        self,
        space: Space,
        rng: np.random.Generator,
        *,
        prior: bool,
        seed: int,
        epsilon: float = 0.05,
        min_observations: int = 8,
        prior_spaces: list[Space] | None = None,
    ):
        super().__init__(space, rng)
        self.name = "analytical+xgb" if prior else "xgb"
        self.epsilon = epsilon
        self.min_observations = min_observations
        self.cost_model = CostModel(seed=seed, use_analytical=prior)
        if prior:
            # Pretrain on this space, and on a corpus of other workloads if given, so the
            # first batch is already model-guided.
            self.cost_model.pretrain([space, *(prior_spaces or [])])
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
        no_prior = not self.cost_model.is_fitted and len(history) < self.min_observations
        if no_prior:
            return self._random_unvisited(n, exclude)  # TVM: random until the model has data
        if history:
            self._refit(history)
        scores = self.cost_model.predict(self.space)
        picks = self.sa.find_maximums(scores, n, exclude)
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
                np.argsort(-scores, kind="stable"), n - len(picks), exclude | chosen
            )
        return picks


def make_strategy(
    name: str, space: Space, seed: int, prior_spaces: list[Space] | None = None
) -> Strategy:
    rng = np.random.default_rng(seed)
    if name == "grid":
        return GridStrategy(space, rng)
    if name == "random":
        return RandomStrategy(space, rng)
    if name == "analytical":
        return AnalyticalStrategy(space, rng)
    if name in ("xgb", "analytical+xgb"):
        return XGBStrategy(
            space, rng, prior=name == "analytical+xgb", seed=seed, prior_spaces=prior_spaces
        )
    raise ValueError(f"unknown strategy '{name}'; known: {', '.join(STRATEGIES)}")
