"""How a launch is timed, one loop for every timer in pipetune.

``warmup`` untimed launches, then timed ones: each after an L2 flush, with an event pair
around the launch alone (the flush is outside the pair). With adaptive repeats the loop
times ``min_repeats`` launches, stops if their spread ((p90 - p10) / median, as
:func:`~workers.runners.base.summarise` defines it) is at most ``settle``, and otherwise
times another ``min_repeats`` at a time up to ``max_repeats``. One synchronisation per round,
so the launches of a round queue up on the GPU back to back.

The loop is written against a small :class:`Clock` (events that are created, recorded,
synchronised and compared) so that the cupy child (CuPy events), the vendor-library
baselines (CuPy or PyTorch events), the simulated child (a model clock) and the CPU tests
(a fake clock) all run this same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from pipetune.workers.runners.base import MeasureSettings, summarise


class Clock(Protocol):
    def pair(self) -> tuple[Any, Any]:
        """A fresh (start, end) event pair."""

    def record(self, event: Any) -> None:
        """Record the event on the stream the launches go to."""

    def synchronize(self, event: Any) -> None:
        """Wait until the event has completed."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two completed events."""


@dataclass(frozen=True)
class RepeatPolicy:
    """The timing part of MeasureSettings, as the child process receives it (picklable).

    max_repeats = 0 means verify only: no launch is timed. ``check_again`` (verify only):
    launch the kernel a second time on the same inputs, its output NaN again and its
    workspaces as the first run left them (as the timed runs find them), and check that
    output too, so a kernel right only on a clean workspace fails where it is verified and
    not on every timed trial after (:meth:`verify_twice`; one launch more per kernel).
    """

    warmup: int
    min_repeats: int
    max_repeats: int
    settle: float
    check_again: bool = False

    @classmethod
    def of(cls, settings: MeasureSettings) -> RepeatPolicy:
        return cls(
            warmup=settings.warmup,
            min_repeats=settings.fewest_repeats,
            max_repeats=settings.repeats,
            settle=settings.settle,
        )

    @classmethod
    def verify_only(cls) -> RepeatPolicy:
        return cls(warmup=0, min_repeats=0, max_repeats=0, settle=0.0)

    @classmethod
    def verify_twice(cls) -> RepeatPolicy:
        """Verify only, then launch once more and check again (the correctness phase's)."""
        return cls(warmup=0, min_repeats=0, max_repeats=0, settle=0.0, check_again=True)

    @property
    def timed(self) -> bool:
        return self.max_repeats > 0

    @property
    def second_run(self) -> bool:
        """Whether a trial launches once more, untimed, to check again (a timed trial's
        output is checked after its timed runs instead)."""
        return self.check_again and not self.timed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_launches(
    launch: Callable[[], None],
    flush: Callable[[], None],
    clock: Clock,
    policy: RepeatPolicy,
    hold: Callable[[], None] | None = None,
) -> list[float]:
    """Milliseconds of each timed launch (between min_repeats and max_repeats of them).

    ``hold``, where given, queues GPU work between the flush and the start event (a spin
    kernel): while the GPU runs it, the host dispatches the launch, so a library call whose
    dispatch outlasts the flush is timed on the GPU alone and not with the host's gap."""
    if not policy.timed:
        return []
    for _ in range(policy.warmup):
        launch()
    samples: list[float] = []
    target = max(1, policy.min_repeats)
    while True:
        pairs = [clock.pair() for _ in range(target - len(samples))]
        for start, end in pairs:
            flush()
            if hold is not None:
                hold()
            clock.record(start)
            launch()
            clock.record(end)
        clock.synchronize(pairs[-1][1])
        samples.extend(clock.elapsed_ms(start, end) for start, end in pairs)
        if len(samples) >= policy.max_repeats or summarise(samples)[1] <= policy.settle:
            return samples
        target = min(policy.max_repeats, len(samples) + max(1, policy.min_repeats))
