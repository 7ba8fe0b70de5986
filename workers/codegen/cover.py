"""Samples of a kernel family's schedules that reach every knob value, for compile,
emulation and the GPU campaign's correctness checks (the spaces hold hundreds to thousands
of schedules; compiling or emulating all of them would take minutes to hours). Any family's
schedules: a (knob, value) pair is an item of the schedule's ``as_dict()``.

A greedy weighted set cover over (knob, value) pairs: repeatedly take the candidate that
covers the most pairs not yet covered per unit of cost (ties broken by a seeded shuffle),
until every pair some candidate has is covered; then random candidates up to ``extra``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def covering_sample(
    candidates: Sequence[T],
    schedule_of: Callable[[T], Any],
    *,
    cost: Callable[[T], float] | None = None,
    extra: int = 0,
    seed: int = 0,
) -> list[T]:
    """Candidates that together reach every (knob, value) any candidate reaches."""
    rng = np.random.default_rng(seed)
    order = [candidates[i] for i in rng.permutation(len(candidates))]
    pairs = [set(schedule_of(c).as_dict().items()) for c in order]
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


def stratified_sample(space: Any, n: int, seed: int = 0) -> list[Any]:
    """min(n, len(space)) schedules of a space, deterministic for a seed: first a cover of
    every knob value the space holds (greedy, the most new values first: a sample of at
    least the cover's size reaches them all), then random others."""
    if n < 1:
        raise ValueError("the sample needs at least one schedule")
    rows = list(range(len(space)))
    chosen = covering_sample(rows, lambda i: space[i], seed=seed)
    if len(chosen) < n:
        taken = set(chosen)
        rest = [int(i) for i in np.random.default_rng(seed).permutation(rows) if i not in taken]
        chosen += rest[: n - len(chosen)]
    return [space[int(i)] for i in chosen[:n]]


def compile_sample(schedules: Sequence[T], count: int) -> list[T]:
    """Up to ``count`` schedules, the first of a cover of every knob value among them."""
    return covering_sample(list(schedules), lambda s: s)[:count]
