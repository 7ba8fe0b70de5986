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

    def forget(self) -> None:
        """Rows proposed before may be proposed again (TuningSession.adopt took a recorded
        batch in place of the one proposed): what a strategy assumed of `exclude` no longer
        holds. Most strategies read `exclude` afresh at every call and assume nothing."""
        return None

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


class FixedOrderStrategy(Strategy):
    """A strategy that proposes the rows of one order fixed at the start (`_order`), skipping
    those already proposed. The rows it proposed are the head of that order, so a call
    resumes where the last one stopped: reading the order from its start again cost
    O(trials) per batch, O(trials^2) over a task of thousands.

    It relies on `exclude` growing between calls by the rows it returned, as the session's
    proposed rows do; the rows the last call read are checked (a caller that did not take
    them gets a reading from the start, as before), and the session's one way of shrinking
    it, TuningSession.adopt, calls `forget`."""

    _order: np.ndarray

    def __init__(self, space: Any, rng: np.random.Generator):
        super().__init__(space, rng)
        self._head = 0  # the rows of _order before it were all in exclude...
        self._read_from = 0  # ...checked at the last call up to here, the rest then read

    def forget(self) -> None:
        self._head = self._read_from = 0

    def next_batch(self, n: int, exclude: set[int], history: list[Observation]) -> list[int]:
        order = self._order
        if not all(r in exclude for r in order[self._read_from : self._head].tolist()):
            self._head = 0
        picked: list[int] = []
        self._read_from = head = self._head
        while len(picked) < n and head < len(order):
            for r in order[head : head + 2 * n + 64].tolist():
                if len(picked) == n:
                    break
                head += 1
                if r not in exclude:
                    picked.append(r)
        self._head = head
        return picked
