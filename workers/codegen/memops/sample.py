"""Samples of memory-intensive schedules that reach every knob value, for compile,
emulation and the GPU campaign's correctness checks (the spaces hold hundreds to thousands
of schedules; compiling or emulating all of them would take minutes to hours), and the
strata and tails those checks count.

A greedy weighted set cover over (knob, value) pairs: repeatedly take the candidate that
covers the most pairs not yet covered per unit of cost (ties broken by a seeded shuffle),
until every pair some candidate has is covered; then random candidates up to ``extra``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from pipetune.model.memops.space import KNOB_NAMES, KNOBS, MemSchedule, geometry
from pipetune.model.memops.workloads import MemWorkload

KNOB = {k.name: k for k in KNOBS}

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


def stratified_sample(space: Any, n: int, seed: int = 0) -> list[MemSchedule]:
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


def compile_sample(schedules: Sequence[MemSchedule], count: int) -> list[MemSchedule]:
    """Up to ``count`` schedules, the first of a cover of every knob value among them."""
    return covering_sample(list(schedules), lambda s: s)[:count]


def stratum(schedule: MemSchedule) -> str:
    """The stratum a correctness check counts a schedule in: how rows map to blocks (one
    per block, packed, split with a second kernel or fused) and where a row is kept."""
    kept = KNOB["row_cache"].label(schedule.row_cache)
    if schedule.blocks_per_row > 1:
        mapping = "split-" + KNOB["split_mode"].label(schedule.split_mode)
    else:
        mapping = "packed" if schedule.rows_per_block > 1 else "one-row"
    return f"mapping={mapping},row_cache={kept}"


def tails(workload: MemWorkload, schedule: MemSchedule) -> dict[str, bool]:
    """Where a schedule leaves a partial unit of work on a workload: a last row group with
    fewer rows than a block packs ("rows"), a last split segment shorter than the others
    ("segment"), threads of a row with one vector fewer than the others ("lanes")."""
    g = geometry(schedule.knob_arrays(), workload)
    nvec = int(np.asarray(g.nvec).reshape(-1)[0])
    seg = int(np.asarray(g.seg_vecs).reshape(-1)[0])
    return {
        "rows": workload.rows % schedule.rows_per_block != 0,
        "segment": nvec % schedule.blocks_per_row != 0,
        "lanes": seg % schedule.threads_per_row != 0,
    }
