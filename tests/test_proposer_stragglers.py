"""A proposer thread whose advance outlasts stop()'s wait stays the proposer's: a start()
after it counts that thread among its own, so no more than the configured number of threads
advance tasks at once. stop() forgot it, and start() made a full set of threads beside it,
the straggler going on taking tasks once its advance ended."""

from __future__ import annotations

import threading

from worker_support import wait_until

from pipetune.service.proposer import Proposer

WAIT_S = 10.0  # generous: the machine running the tests may be loaded


class BlockingDriver:
    """Stands in for the driver: advancing a task in `blocked` waits until it is released;
    counts the advances running at once, over every task."""

    wakeup = None

    def __init__(self, blocked: set[int]) -> None:
        self.blocked = blocked
        self.release = threading.Event()
        self.started = {t: threading.Event() for t in blocked}
        self.advanced: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def advance(self, task_id: int) -> bool:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            if task_id in self.blocked:
                self.started[task_id].set()
                assert self.release.wait(WAIT_S)
            with self._lock:
                self.advanced.append(task_id)
            return True
        finally:
            with self._lock:
                self.running -= 1

    def advance_if_current(self, task_id: int) -> bool:
        return self.advance(task_id)


def _proposer_threads(proposer: Proposer, *known: threading.Thread) -> set[threading.Thread]:
    return {t for t in (*proposer._threads, *known) if t.is_alive()}


def test_a_start_after_a_stop_that_gave_up_on_a_thread_counts_it_as_one_of_its_own():
    driver = BlockingDriver(blocked={1})
    proposer = Proposer(driver, threads=1)
    proposer.start()
    try:
        proposer.request(1)
        assert driver.started[1].wait(WAIT_S)
        (straggler,) = proposer._threads
        proposer.stop(timeout_s=0.01)  # task 1's advance outlasts it
        assert straggler.is_alive()
        proposer.start()
        # One thread, the straggler: not it and a new one beside it.
        assert _proposer_threads(proposer, straggler) == {straggler}
        assert proposer._threads == [straggler]
        proposer.request(2)
        driver.release.set()
        # Its advance over, the straggler takes the next task, as the started thread would.
        assert wait_until(lambda: driver.advanced == [1, 2], WAIT_S)
        assert driver.most_at_once == 1
        assert straggler.is_alive()
    finally:
        driver.release.set()
        proposer.stop()
    assert not _proposer_threads(proposer, straggler)


def test_a_straggler_leaves_once_its_advance_ends_and_start_then_makes_its_place_anew():
    driver = BlockingDriver(blocked={1})
    proposer = Proposer(driver, threads=2)
    proposer.start()
    try:
        proposer.request(1)
        assert driver.started[1].wait(WAIT_S)
        first = list(proposer._threads)
        proposer.stop(timeout_s=0.01)
        # The idle one leaves; task 1's stays, known.
        assert wait_until(lambda: len(_proposer_threads(proposer, *first)) == 1, WAIT_S)
        assert len(proposer._threads) == 1
        driver.release.set()
        assert wait_until(lambda: not _proposer_threads(proposer, *first), WAIT_S)
        proposer.start()
        assert len(_proposer_threads(proposer)) == 2
        proposer.request(2)
        assert wait_until(lambda: driver.advanced == [1, 2], WAIT_S)
    finally:
        driver.release.set()
        proposer.stop()
