"""A task's best-so-far curve as the task row stores it: the steps, not every trial.

The aggregate view (`GET /v1/curves`, service/curves.py) reads one row per task, so each task
keeps its curve (the best latency measured by each observed trial) on its row, and the
driver rewrites it with each batch. Stored as a value per trial, a task of n trials wrote
O(n) each batch: O(n^2) over the task, JSON encoded on the replica and rewritten by
PostgreSQL (at 2,800 trials the curve was 17% of the proposer thread's samples, and an
advance cost 1.9 ms on average against 1.3 at 320 trials; benchmarks/RESULTS.md, "a task's
best-so-far curve by its steps"). The best changes a few dozen times in a task, so the steps
are short:

    {"n": 24, "steps": [[0, 31.5], [3, 12.25], [17, 11.0]]}

("simulated": true beside them where a simulated runner answered any of its trials.)

n trials observed; from trial i (0-based, in trial order: the task's proposal order, its
place among the trials as its own curve numbers them, a job cancelled with the task left
out) the best is the step's latency, until the next step; before the first step no trial had
succeeded. Rows
written before this format hold the plain list (a latency or null per trial), which
`best_latencies` reads too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipetune.model.states import JobState


def counted_trials(jobs: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """The rows (state first) of a task's jobs in trial order that its curve counts: every
    final trial up to the first job still out (it would change the points after it), a job
    cancelled with the task left out (no trial; the trials after it count on)."""
    for job in jobs:
        if job[0] == JobState.CANCELLED:
            continue
        if not JobState(job[0]).is_trial():
            return
        yield job


@dataclass
class BestCurve:
    """The curve a session builds as it observes trials (best latency so far, in us)."""

    n: int = 0
    steps: list[tuple[int, float]] = field(default_factory=list)
    # Trials observed ahead of one before them (early proposals observe a batch's late
    # trials after the next batch's others): placed once every trial before them is.
    waiting: dict[int, float | None] = field(default_factory=dict)
    # Whether a simulated runner answered any of its trials: the aggregate view says so
    # (a task's best trial may be measured where its earlier bests were simulated).
    simulated: bool = False

    @property
    def best(self) -> float | None:
        return self.steps[-1][1] if self.steps else None

    def extend(self, latencies: Iterable[float | None]) -> None:
        """Observe trials in order: each one's latency, None where it did not succeed."""
        best = self.best
        for latency in latencies:
            if latency is not None and (best is None or latency < best):
                best = latency
                self.steps.append((self.n, latency))
            self.n += 1

    def observe(self, trials: Iterable[tuple[int, float | None]]) -> None:
        """Observe trials by their index (0-based), in any order: the curve covers the
        prefix of trials all observed, in trial order (in the order observed, the
        aggregate's best-in-k at k counted a trial proposed after the k-th in place of one
        still being measured)."""
        self.waiting.update(trials)
        while self.n in self.waiting:
            self.extend([self.waiting.pop(self.n)])

    def doc(self) -> dict[str, Any]:
        """What the task row stores (JSON)."""
        doc: dict[str, Any] = {"n": self.n, "steps": [[i, v] for i, v in self.steps]}
        if self.simulated:
            doc["simulated"] = True
        return doc


def best_latencies(stored: Any, max_k: int) -> np.ndarray:
    """The best latency after each of the first max_k trials of a stored curve (either
    form), inf before the first success; none of a task that keeps no curve (an imported
    dataset's: JSON null)."""
    if stored is None:
        return np.empty(0)
    if isinstance(stored, dict):
        n = min(int(stored["n"]), max_k)
        out = np.full(n, np.inf)
        steps = stored["steps"]
        ends = [i for i, _ in steps[1:]] + [n]
        for (start, latency), end in zip(steps, ends[: len(steps)], strict=True):
            out[int(start) : int(end)] = float(latency)  # (slices past n are empty)
        return out
    return np.array([np.inf if c is None else c for c in stored[:max_k]], dtype=float)
