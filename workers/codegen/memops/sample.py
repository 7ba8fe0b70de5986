"""Samples of memory-intensive schedules that reach every knob value, for compile and
emulation checks (the spaces hold hundreds to thousands of schedules; compiling or
emulating all of them would take minutes to hours).

A greedy weighted set cover over (knob, value) pairs: repeatedly take the candidate that
covers the most pairs not yet covered per unit of cost (ties broken by a seeded shuffle),
until every pair some candidate has is covered; then random candidates up to ``extra``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from pipetune.model.memops.space import KNOB_NAMES, MemSchedule

T = TypeVar("T")


def _pairs(schedule: MemSchedule) -> set[tuple[str, int]]:
    return {(name, getattr(schedule, name)) for name in KNOB_NAMES}


def covering_sample(
    candidates: Sequence[T],
    schedule_of: Callable[[T], MemSchedule],
    *,
    cost: Callable[[T], float] | None = None,
    extra: int = 0,
    seed: int = 0,
) -> list[T]:
    """Candidates that together reach every (knob, value) any candidate reaches."""
    rng = np.random.default_rng(seed)
    order = [candidates[i] for i in rng.permutation(len(candidates))]
    pairs = [_pairs(schedule_of(c)) for c in order]
    costs = [float(cost(c)) if cost else 1.0 for c in order]
    wanted = set().union(*pairs) if pairs else set()
    chosen: list[int] = []
    while wanted:
        best = max(
            range(len(order)),
            key=lambda i: (len(pairs[i] & wanted) / costs[i], -i),
        )
        if not pairs[best] & wanted:
            break
        chosen.append(best)
        wanted -= pairs[best]
    rest = [i for i in range(len(order)) if i not in set(chosen)]
    chosen += rest[:extra]
    return [order[i] for i in chosen]
