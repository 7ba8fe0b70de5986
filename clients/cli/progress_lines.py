"""Progress said into a log: where stderr is no terminal (a CI job, `2> file`), rich draws no
live bar, and a command waiting on tasks showed nothing of them, moving or not, until it
ended. There a plain line is printed when the tasks move, at most every EVERY_S, and at the
end."""

from __future__ import annotations

import math
import time
from collections.abc import Hashable

from rich.console import Console

EVERY_S = 10.0


class ProgressLines:
    def __init__(self, console: Console, every_s: float = EVERY_S) -> None:
        self.console = console
        self.every_s = every_s
        self._said_at = -math.inf
        self._said: Hashable = None

    def see(self, where: Hashable, line: str, final: bool) -> None:
        """Print `line` if the tasks moved (`where` differs from the last line's) and the
        last line is EVERY_S old, or if they are finished (`final`), once."""
        if where == self._said:
            return
        now = time.monotonic()
        if final or now - self._said_at >= self.every_s:
            # One line whatever the terminal's width: a log's reader greps for it.
            self.console.print(line, soft_wrap=True)
            self._said_at, self._said = now, where
