"""The proposer loop: tasks are advanced (their next batch proposed) by a few threads of
their own, outside the event loop and outside request handling.

A result that may have made its task ready asks for an advance (`request`, which returns at
once); the loop takes the tasks in the order they were asked for, each once however often
it was asked meanwhile, and runs the driver's advance. A request the loop never gets to
(the replica stops) is not lost: every replica's upkeep advances whatever tasks are ready.

Several threads advance tasks at once (PIPETUNE_PROPOSER_THREADS), never one task in two of
them: with one, a slow advance (a session rebuilt by replaying a long task's batches, about
a minute at 1,650 trials) held every other task of the replica, its workers idle, until it
was done. (Whether the threads also propose side by side on a host with more cores depends
on how much of a proposal holds the GIL: not measured.)

With several replicas on one PostgreSQL, a task of a model-guided strategy is advanced by
the replica that holds its session (the one that made its newest batch). Another replica
that finds the task ready asks for the holder (a NOTIFY); the holder answers that it holds
the task (the listener does, at once, however busy its proposer is) and advances it in its
turn. If no answer comes within ADOPT_AFTER_S (the holder stopped, or the task was never
held: a restart), the asker adopts the task and replays its batches. Without this, every
replica that took a task's results replayed the batches it had missed, so each proposal was
made once per replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from pipetune.service.db import is_unavailable, unavailable_reason
from pipetune.service.driver import Driver
from pipetune.service.thread_cpu import PROPOSER_THREAD
from pipetune.tuner.bo import one_blas_thread_per_caller

log = logging.getLogger(__name__)

# How long a replica waits for the holder of a task's session to answer before it adopts
# the task: an answer is one NOTIFY each way (milliseconds), so this is ample.
ADOPT_AFTER_S = 1.0


class Proposer:
    def __init__(
        self,
        driver: Driver,
        shared: bool = False,
        adopt_after_s: float = ADOPT_AFTER_S,
        threads: int = 1,
    ):
        """`shared`: other replicas serve the same database (PostgreSQL), so a task may be
        held by another one. `threads`: how many tasks are advanced at once."""
        if threads < 1:
            raise ValueError(f"a proposer needs at least one thread, got {threads}")
        self.driver = driver
        self.shared = shared
        self.adopt_after_s = adopt_after_s
        self.threads = threads
        self._asked: OrderedDict[int, bool] = OrderedDict()  # task -> adopt if held elsewhere
        self._adopt_at: dict[int, float] = {}  # task -> when to adopt it, unless a holder answers
        self._cv = threading.Condition()
        self._stopping = False
        self._current: set[int] = set()  # the tasks being advanced
        # The threads that have not left the loop (under _cv): those started and not yet
        # stopped, and a straggler that stop() gave up waiting for, still in its advance.
        self._threads: list[threading.Thread] = []
        self._started = 0  # threads ever started (their names' numbers)

    def start(self) -> None:
        """Start the threads, as many as `threads` with any straggler of the last stop():
        one still in its advance goes on as one of them once the advance ends (it takes the
        next task asked for). stop() forgot such a thread and start() made a full set beside
        it, so more than `threads` advances ran at once."""
        # The advances' linear algebra runs on one BLAS thread each (a session's own limit
        # saved and restored the process-wide count: two sessions overlapping, one left the
        # other with every core's threads, and sums that are not reproducible).
        one_blas_thread_per_caller()
        with self._cv:
            self._stopping = False
            new = [
                threading.Thread(
                    target=self._run, name=f"{PROPOSER_THREAD}-{self._started + i}", daemon=True
                )
                for i in range(self.threads - len(self._threads))
            ]
            self._started += len(new)
            self._threads.extend(new)
        for thread in new:
            thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop after the advances in progress (the ones asked for are left to upkeep). A
        thread whose advance outlasts `timeout_s` stays known: it leaves once the advance
        ends, unless start() came first, which counts it as one of its threads."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def request(self, task_id: int) -> None:
        """Ask for the task to be advanced (if it is ready by the time its turn comes)."""
        with self._cv:
            # With nobody else to hold the task (SQLite), this replica always adopts it.
            self._asked[task_id] = self._asked.get(task_id, False) or not self.shared
            self._cv.notify()

    def request_if_held(self, task_id: int) -> None:
        """Another replica asks for the holder of the task's session: answer, and advance."""
        wakeup = self.driver.wakeup
        if not self.driver.holds(task_id) or wakeup is None:
            return
        self.request(task_id)
        try:  # (on the listener's thread, which must survive a database outage)
            self.driver.notify_replicas(wakeup.held_payload(task_id))
        except Exception as exc:  # the asker adopts the task: a replay, nothing lost
            log.warning("could not answer for task %s: %s", task_id, type(exc).__name__)

    def held_elsewhere(self, task_id: int) -> None:
        """Another replica holds the task's session: no need to adopt it."""
        with self._cv:
            self._adopt_at.pop(task_id, None)

    def has(self, task_id: int) -> bool:
        """Whether the task is asked for, being advanced, or waiting for its holder's answer:
        this loop will see to it, and upkeep need not (at 400 tasks upkeep advanced, in the
        thread pool, the tasks this loop had yet to reach: each advance made twice)."""
        with self._cv:
            return task_id in self._asked or task_id in self._adopt_at or task_id in self._current

    def idle(self) -> bool:
        """Nothing asked for, nothing in progress, no adoption due later."""
        with self._cv:
            return not self._asked and not self._current and not self._adopt_at

    def _next(self, done: int | None) -> tuple[int, bool] | None:
        """The next task to advance, and whether to adopt it; None to stop. `done`: the task
        this thread has just advanced. Waits for a request, for the first adoption that
        falls due, or for a task asked for again while it was being advanced to be free."""
        with self._cv:
            if done is not None:
                self._current.discard(done)
                if done in self._asked:  # asked for again meanwhile: another thread may take it
                    self._cv.notify()
            while True:
                if self._stopping:
                    # Leaves the loop: decided under the lock start() counts the threads by.
                    self._threads.remove(threading.current_thread())
                    return None
                now = time.monotonic()
                for task_id, when in list(self._adopt_at.items()):
                    if when <= now:
                        del self._adopt_at[task_id]
                        self._asked[task_id] = True
                # The first task asked for that no other thread is advancing (one asked for
                # again meanwhile waits for that advance: the driver would only wait on its
                # lock, a thread held idle).
                task_id = next((t for t in self._asked if t not in self._current), None)
                if task_id is not None:
                    self._current.add(task_id)
                    return task_id, self._asked.pop(task_id)
                self._cv.wait(min(self._adopt_at.values()) - now if self._adopt_at else None)

    def _run(self) -> None:
        try:
            self._advance_in_turn()
        finally:  # (left by an error of the loop's own: start() makes another in its place)
            with self._cv:
                if threading.current_thread() in self._threads:
                    self._threads.remove(threading.current_thread())

    def _advance_in_turn(self) -> None:
        task_id: int | None = None
        while (item := self._next(task_id)) is not None:
            task_id, adopt = item
            try:
                if adopt:
                    self.driver.advance(task_id)
                elif self.driver.advance_if_current(task_id) is None:
                    # Perhaps held by another replica: ask; adopt the task if none answers.
                    with self._cv:
                        self._adopt_at.setdefault(task_id, time.monotonic() + self.adopt_after_s)
                        self._cv.notify_all()  # (the idle threads wait for the earliest due)
                    if self.driver.wakeup is not None:
                        self.driver.notify_replicas(self.driver.wakeup.advance_payload(task_id))
            except Exception as exc:  # the next request, or upkeep, tries again
                if is_unavailable(exc):
                    log.warning(
                        "advance of task %s skipped: database unavailable: %s",
                        task_id,
                        unavailable_reason(exc),
                    )
                else:
                    log.exception("advance of task %s failed", task_id)
