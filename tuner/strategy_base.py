"""What every search strategy is: a source of the next unvisited rows of a space to measure."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Observation:
    row: int
    latency_s: float | None  # None for a failed trial
    failed: bool


class Strategy(ABC):
    name: str

    def __init__(self, space: Any, rng: np.random.Generator):
        self.space = space
        self.rng = rng

    @abstractmethod
    def next_batch(self, n: int, exclude: set[int], history: list[Observation]) -> list[int]:
        """Up to n space rows not in exclude, in the order to measure them."""

    def _in_order(self, order: np.ndarray, n: int, exclude: set[int]) -> list[int]:
        """The first n rows of `order` not in exclude. At most len(exclude) of them are
        skipped, so only that head of the order is read (not the whole space, every batch)."""
        picked: list[int] = []
        for r in order[: n + len(exclude)].tolist():
            if r not in exclude:
                picked.append(r)
                if len(picked) == n:
                    break
        return picked
