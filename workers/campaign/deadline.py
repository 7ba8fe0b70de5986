"""The campaign's clock: a call has ``--minutes``; work stops cleanly before they are up."""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    """``minutes`` from now, less ``reserve_s`` kept for writing the summary and the archive."""

    def __init__(
        self, minutes: float, reserve_s: float, clock: Callable[[], float] = time.monotonic
    ):
        if not minutes > 0:
            raise ValueError("minutes must be positive")
        self._clock = clock
        self.started = clock()
        self.end = self.started + minutes * 60.0 - reserve_s

    def left(self) -> float:
        return self.end - self._clock()

    def elapsed(self) -> float:
        return self._clock() - self.started

    def allows(self, seconds: float) -> bool:
        """Whether work estimated at ``seconds`` ends before the deadline."""
        return self.left() >= seconds
