"""A proposer thread whose advance outlasts stop()'s wait stays the proposer's: a start()
after it counts that thread among its own, so no more than the configured number of threads
advance tasks at once. stop() forgot it, and start() made a full set of threads beside it,
the straggler going on taking tasks once its advance ended."""

from __future__ import annotations

import threading

from test_proposer_threads import WAIT_S, SlowDriver
from worker_support import wait_until

from pipetune.service.proposer import Proposer


def _proposer_threads(proposer: Proposer, *known: threading.Thread) -> set[threading.Thread]:
    return {t for t in (*proposer._threads, *known) if t.is_alive()}


def test_a_start_after_a_stop_that_gave_up_on_a_thread_counts_it_as_one_of_its_own():
    driver = SlowDriver(slow={1})
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
        assert driver.most_at_once_overall == 1
        assert straggler.is_alive()
    finally:
        driver.release.set()
        proposer.stop()
    assert not _proposer_threads(proposer, straggler)


def test_a_straggler_leaves_once_its_advance_ends_and_start_then_makes_its_place_anew():
    driver = SlowDriver(slow={1})
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
