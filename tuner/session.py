"""TuningSession: propose schedules, observe their measurements, within a trial budget.

A session's proposals depend only on its seed and the sequence of propose/observe calls, so
any service replica can rebuild it from the database by replaying the recorded batches
(`TuningSession.replay`). Where the record was made by another version of the tuner (the
service was upgraded while the task ran), a rebuilt session adopts the recorded batches
(`adopt`) and proposes on from them.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from pipetune.model.errors import PipetuneError
from pipetune.model.family import FamilySpace, family_of, parse_any_workload
from pipetune.model.hardware import GPUSpec, get_gpu
from pipetune.model.plain_numbers import plain_integer
from pipetune.model.trials import MeasureResult
from pipetune.tuner.bo import PriorMean
from pipetune.tuner.strategies import DEFAULT_STRATEGY, Observation, make_strategy


class SessionError(PipetuneError, ValueError):
    """A call that does not fit the session's state (e.g. observing an unproposed schedule)."""


class TuningSession:
    def __init__(
        self,
        workload: Any,
        gpu: GPUSpec,
        strategy: str = DEFAULT_STRATEGY,
        seed: int = 0,
        budget: int = 50,
        space: FamilySpace | Any | None = None,
        prior: PriorMean | None = None,
    ):
        budget = _whole_number("budget", budget, least=1)
        seed = _whole_number("seed", seed, least=0)
        if isinstance(gpu, str):  # a GPU's name, as the rest of the API takes it
            gpu = get_gpu(gpu)
        elif not isinstance(gpu, GPUSpec):
            raise SessionError(f"gpu must be a GPU's name or a GPUSpec, got {type(gpu).__name__}")
        if isinstance(workload, Mapping):  # a workload document, {"op": "gemm", ...}
            workload = parse_any_workload(dict(workload))
        self.workload = workload
        self.gpu = gpu
        # The workload's family enumerates its space (a recorded space may be given instead).
        self.space = space if space is not None else family_of(workload).enumerate(workload, gpu)
        self.budget = budget
        self.seed = seed
        self.strategy_name = strategy  # as asked for ("auto" names what it chose otherwise)
        self.strategy = make_strategy(strategy, self.space, seed, prior=prior)
        self.history: list[Observation] = []
        self.results: list[MeasureResult] = []
        self.pending: list[int] = []
        # Every row proposed so far (observed or pending): what a strategy must not propose
        # again, kept rather than rebuilt from the history at every batch. Strategies read it.
        self._proposed: set[int] = set()

    @property
    def remaining(self) -> int:
        """Trials the budget still allows, counting proposals not yet observed."""
        return max(0, min(self.budget, len(self.space)) - len(self.history) - len(self.pending))

    @property
    def done(self) -> bool:
        return not self.pending and self.remaining == 0

    def propose(self, n: int) -> list[Any]:
        asked = _whole_number("propose's n", n, least=1)
        n = min(asked, self.remaining)
        if n == 0:
            return []
        # The batch asked for, cut to the budget: a strategy's batch may depend on its size
        # (annealing stops early by it, an epsilon-greedy pick draws once a pick), and a
        # task's first k trials then depended on its budget (xgb's read off a longer run,
        # as `bench tuner` reads a smaller budget, were not what a run of k trials measured).
        whole = min(asked, len(self.space) - len(self._proposed))
        rows = self.strategy.next_batch(whole, self._proposed, self.history)[:n]
        self.pending.extend(rows)
        self._proposed.update(rows)
        return [self.space[r] for r in rows]

    def _row(self, schedule: Any) -> int:
        # One lookup (index answers membership too), not a test and then the lookup: the
        # service's driver maps every observed schedule back to its row.
        try:
            return self.space.index(schedule)
        except (KeyError, AttributeError):  # (AttributeError: not a schedule at all)
            if not hasattr(schedule, "id"):
                raise SessionError(
                    f"{reprlib.repr(schedule)} is not a schedule: give the schedules that "
                    "propose returned"
                ) from None
            raise SessionError(f"schedule {schedule.id} is not in this session's space") from None

    def adopt(self, proposed: Sequence[Any], recorded: Sequence[Any]) -> None:
        """Take a recorded batch in place of the one this session just proposed: its
        schedules become the pending ones (in the record's order), and the session's own
        proposals are forgotten (they may be proposed again). A task whose batches another
        version of the tuner made continues from what it measured instead of failing (the
        service's driver adopts where a rebuilt session does not replay the record)."""
        rows = [self._row(schedule) for schedule in recorded]
        mine = [self.space.index(schedule) for schedule in proposed]
        if self.pending[len(self.pending) - len(mine) :] != mine:
            raise SessionError("only the batch proposed last can be replaced")
        distinct = set(rows)
        if len(distinct) != len(rows) or (self._proposed - set(mine)) & distinct:
            raise SessionError("the recorded batch repeats a schedule already proposed")
        if len(rows) > len(mine) + self.remaining:
            raise SessionError(
                f"the recorded batch of {len(rows)} exceeds the budget: {len(mine)} proposed "
                f"and {self.remaining} more allowed"
            )
        del self.pending[len(self.pending) - len(mine) :]
        self._proposed -= set(mine)
        self.strategy.forget()
        self.pending.extend(rows)
        self._proposed.update(rows)

    def observe(self, results: Sequence[tuple[Any, MeasureResult]]) -> None:
        """Record measurements of proposed schedules; failures count against the budget.
        Every pair is checked before any is recorded: a bad one leaves the session as it was
        (a result of the wrong kind midway had dropped the proposals before it from pending
        and recorded none of them, and the budget was overrun by the schedules proposed in
        their place)."""
        rows = []
        for i, pair in enumerate(results):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise SessionError(f"results[{i}]: a (schedule, MeasureResult) pair")
            schedule, result = pair
            if not isinstance(result, MeasureResult):
                raise SessionError(
                    f"results[{i}]: a MeasureResult, got {type(result).__name__} "
                    "(MeasureResult.model_validate makes one of a dict)"
                )
            row = self._row(schedule)
            if row not in self.pending or row in rows:
                raise SessionError(
                    f"schedule {schedule.id} was not proposed or is already observed"
                )
            rows.append(row)
        for row, (_, result) in zip(rows, results, strict=True):
            self.pending.remove(row)
            latency = result.latency_us * 1e-6 if result.ok and result.latency_us else None
            self.history.append(Observation(row=row, latency_s=latency, failed=latency is None))
            self.results.append(result)

    @property
    def best(self) -> tuple[Any, MeasureResult] | None:
        ok = [(o, r) for o, r in zip(self.history, self.results, strict=True) if not o.failed]
        if not ok:
            return None
        o, r = min(ok, key=lambda pair: pair[0].latency_s)
        return self.space[o.row], r

    @classmethod
    def replay(
        cls,
        workload: Any,
        gpu: GPUSpec,
        strategy: str,
        seed: int,
        budget: int,
        batches: Sequence[Sequence[tuple[Any, MeasureResult]]],
        space: FamilySpace | Any | None = None,
        prior: PriorMean | None = None,
        *,
        seen_by: Sequence[Sequence[int | None]] | None = None,
        batch_size: int | None = None,
    ) -> TuningSession:
        """Rebuild a session from its recorded batches, checking each replays identically.

        `seen_by[i][j]`: the batch whose proposal first saw the result of batch i's j-th
        trial (None: none did). By default each batch was measured whole before the next was
        proposed (i + 1). A batch proposed early, while results of the one before were still
        out (the service's early proposals, `bench tuner --early`), replays only with the
        order its proposal saw them in: a model-guided strategy believes the trials still
        out, and its batch depends on which results had come (the service records it per job,
        `service.driver.first_seen_by` of `jobs.seen_at`). `batch_size`: the batch each
        proposal was asked for (default: the longest recorded; give it where the budget cut
        every batch, the one of a budget under it)."""
        if seen_by is None:
            order = [[i + 1] * len(b) for i, b in enumerate(batches)]
        else:
            order = _seen_by_order(seen_by)
        if len(order) != len(batches) or any(
            len(o) != len(b) for o, b in zip(order, batches, strict=False)
        ):
            raise SessionError("seen_by: one entry per trial of each batch")
        for i, batch_order in enumerate(order):
            if any(k is not None and k <= i for k in batch_order):
                raise SessionError(
                    f"seen_by: a result of batch {i} cannot be seen by the proposal of batch "
                    f"{i} or an earlier one"
                )
        session = cls(workload, gpu, strategy, seed, budget, space=space, prior=prior)
        whole = batch_size if batch_size is not None else max(map(len, batches), default=1)
        recorded_trials = sum(map(len, batches))
        if recorded_trials > min(session.budget, len(session.space)):
            raise SessionError(
                f"{recorded_trials} recorded trials exceed the session's budget of {session.budget}"
            )
        for i, batch in enumerate(batches):
            # In trial order, as the service observes them (the history's order matters).
            due = [
                trial
                for j in range(i)
                for trial, k in zip(batches[j], order[j], strict=True)
                if k == i
            ]
            if due:
                session.observe(due)
            # Each batch as it was proposed: asked whole, cut to the budget (propose).
            proposed = session.propose(whole)
            recorded = [s for s, _ in batch]
            if proposed != recorded:
                hint = (
                    " (or batches were proposed before the one before them was measured "
                    "whole: give seen_by)"
                    if seen_by is None and i > 0
                    else ""
                )
                raise SessionError(
                    f"batch {i} does not replay: the history was not made by this strategy and "
                    f"seed from these results{hint}"
                )
        late = [
            trial
            for j, batch in enumerate(batches)
            for trial, k in zip(batch, order[j], strict=True)
            if k is None or k >= len(batches)
        ]
        if late:
            session.observe(late)
        return session


def _whole_number(name: str, value: Any, least: int) -> int:
    """An int argument checked where it is given: a float, a string or None failed deep
    inside (a slice, numpy's seeding) with a message that named neither."""
    number = plain_integer(value)  # (NumPy's integers are the ints they hold)
    if isinstance(number, bool) or not isinstance(number, int):
        raise SessionError(f"{name} must be a whole number, got {reprlib.repr(value)}")
    if number < least:
        raise SessionError(f"{name} must be at least {least}, got {number}")
    return number


def _seen_by_order(seen_by: Any) -> list[list[int | None]]:
    """`replay`'s seen_by as lists of batch numbers (None: no proposal saw it); a value of
    another kind was never matched (1.5: the result silently left out) or a bare TypeError."""
    if isinstance(seen_by, str | bytes) or not isinstance(seen_by, Sequence):
        raise SessionError("seen_by: a list per batch of batch numbers (or None)")
    order: list[list[int | None]] = []
    for batch in seen_by:
        if isinstance(batch, str | bytes) or not isinstance(batch, Sequence):
            raise SessionError("seen_by: a list per batch of batch numbers (or None)")
        for k in batch:
            if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
                raise SessionError(f"seen_by: {k!r} is not a batch number (or None)")
        order.append(list(batch))
    return order
