"""Offline tuning runs against a recorded space: every trial is answered from a table of
latencies (a replayed dataset, or any latency array aligned with a space)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from pipetune.model.family import FIRST_REVISION, FamilySpace
from pipetune.model.trials import MeasureResult
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.session import TuningSession

T = TypeVar("T")


def late_trials(batch: int, early: int, first: bool, last: bool) -> int:
    """How many of a batch's trials are still unmeasured when the next batch is proposed:
    `early`, fewer than the batch; none of the first batch (the model's first data, where
    each missing result weighs most) and none after the last."""
    return 0 if first or last else min(early, batch - 1)


def propose_and_measure(
    propose: Callable[[int], list[T]],
    measure: Callable[[list[T]], None],
    total: int,
    batch: int,
    early: int = 0,
) -> None:
    """Propose `total` trials, `batch` at a time, and measure them in the order their results
    come in: each batch from the second on is proposed while the last `early` trials of the
    one before are unmeasured (late_trials; the service's early proposals)."""
    proposed, late = 0, []
    while proposed < total:
        # A whole batch asked for, cut to what the budget has left (the service's way: a
        # strategy's batch may depend on its size, and a run's first k trials must be what
        # a run of budget k measures, which `bench tuner` reads off its longest run).
        trials = propose(batch)[: total - proposed]
        if not trials:
            break
        first, proposed = proposed == 0, proposed + len(trials)
        held = late_trials(len(trials), early, first, proposed >= total)
        measure(late + trials[: len(trials) - held])
        late = trials[len(trials) - held :]
    measure(late)


def throughput_of(latency) -> np.ndarray:
    """Normalisable throughput per configuration: 1/latency, 0 for a failure (inf, nan, <= 0)."""
    lat = np.asarray(latency, dtype=np.float64)
    ok = np.isfinite(lat) & (lat > 0)
    out = np.zeros(len(lat))
    out[ok] = 1.0 / lat[ok]
    return out


@dataclass(frozen=True)
class RecordedSpace:
    """A space and one recorded latency per schedule (seconds; inf or nan = failed), and
    which revision of the workload's generator line made each measured kernel (None: every
    one revision 1, model.family.FIRST_REVISION)."""

    space: FamilySpace
    latency_s: np.ndarray
    revisions: np.ndarray | None = None

    def revision_of_rows(self) -> np.ndarray:
        """Each row's generator revision (FIRST_REVISION where none was recorded)."""
        if self.revisions is None:
            return np.full(len(self.latency_s), FIRST_REVISION, dtype=np.int64)
        return np.asarray(self.revisions, dtype=np.int64)

    def rows(self, keep: np.ndarray) -> RecordedSpace:
        """The recorded space of the rows where `keep` is True (a boolean mask)."""
        index = np.flatnonzero(keep)
        revisions = None if self.revisions is None else np.asarray(self.revisions)[index]
        return RecordedSpace(self.space.subset(index), self.latency_s[index], revisions)

    @property
    def throughput(self) -> np.ndarray:
        return throughput_of(self.latency_s)

    @property
    def optimum(self) -> float:
        return float(self.throughput.max())

    def result(self, row: int) -> MeasureResult:
        lat = float(self.latency_s[row])
        if np.isfinite(lat) and lat > 0:
            return MeasureResult(status="ok", latency_us=lat * 1e6, runner="replay")
        return MeasureResult(status="runtime_error", error="recorded as failed", runner="replay")


def run_offline(
    recorded: RecordedSpace,
    strategy: str,
    seed: int,
    budget: int,
    batch: int = 8,
    prior: PriorMean | None = None,
    early: int = 0,
) -> np.ndarray:
    """Space rows of the trials, in the order their results came in (the order a session
    proposed them, but for `early`: each batch proposed while the last `early` trials of the
    batch before it are unmeasured, as the service's early proposals)."""
    session = TuningSession(
        recorded.space.workload,
        recorded.space.gpu,
        strategy,
        seed,
        budget,
        space=recorded.space,
        prior=prior,
    )
    trials: list[int] = []

    def measure(schedules: list[Any]) -> None:
        rows = [recorded.space.index(s) for s in schedules]
        session.observe([(s, recorded.result(r)) for s, r in zip(schedules, rows, strict=True)])
        trials.extend(rows)

    propose_and_measure(session.propose, measure, session.remaining, batch, early)
    return np.array(trials, dtype=np.int64)
