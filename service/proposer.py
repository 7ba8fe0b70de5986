"""The proposer loop: tasks are advanced (their next batch proposed) by one thread of their
own, outside the event loop and outside request handling.

A result that may have made its task ready asks for an advance (`request`, which returns at
once); the loop takes the tasks in the order they were asked for, each once however often
it was asked meanwhile, and runs the driver's advance. A request the loop never gets to
(the replica stops) is not lost: every replica's upkeep advances whatever tasks are ready.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from pipetune.service.db import is_unavailable, unavailable_reason
from pipetune.service.driver import Driver

log = logging.getLogger(__name__)


class Proposer:
    def __init__(self, driver: Driver):
        self.driver = driver
        self._asked: OrderedDict[int, None] = OrderedDict()
        self._cv = threading.Condition()
        self._stopping = False
        self._busy = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pipetune-proposer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the advance in progress (the ones asked for are left to upkeep)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def request(self, task_id: int) -> None:
        """Ask for the task to be advanced (if it is ready by the time its turn comes)."""
        with self._cv:
            if task_id not in self._asked:
                self._asked[task_id] = None
                self._cv.notify()

    def idle(self) -> bool:
        """Nothing asked for and nothing in progress."""
        with self._cv:
            return not self._asked and not self._busy

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._asked and not self._stopping:
                    self._busy = False
                    self._cv.wait()
                if self._stopping:
                    self._busy = False
                    return
                task_id, _ = self._asked.popitem(last=False)
                self._busy = True
            try:
                self.driver.advance(task_id)
            except Exception as exc:  # the next request, or upkeep, tries again
                if is_unavailable(exc):
                    log.warning(
                        "advance of task %s skipped: database unavailable: %s",
                        task_id,
                        unavailable_reason(exc),
                    )
                else:
                    log.exception("advance of task %s failed", task_id)
