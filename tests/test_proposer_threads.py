"""A replica proposes for several tasks at once (service/proposer.py), never for one task in
two threads. With one proposer thread, a slow advance (a long task's session rebuilt by
replaying its batches: about a minute at 1,650 trials) held the next batch of every other
task of the replica, and their workers idle, until it was done."""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import threadpoolctl
from pydantic import ValidationError
from service_support import client_for, service_of
from worker_support import wait_until

from pipetune.service.proposer import Proposer
from pipetune.service.settings import Settings
from pipetune.service.thread_cpu import PROPOSER_THREAD

WAIT_S = 10.0  # generous: the machine running the tests may be loaded


class SlowDriver:
    """Stands in for the driver: advancing a task in `slow` waits until it is released;
    counts the advances running at once, of each task and over all (`most_at_once_overall`)."""

    wakeup = None

    def __init__(self, slow: set[int]):
        self.slow = slow
        self.release = threading.Event()
        self.advanced: list[int] = []
        self.running: Counter[int] = Counter()
        self.most_at_once: Counter[int] = Counter()
        self.most_at_once_overall = 0
        self.started = {t: threading.Event() for t in slow}
        self._lock = threading.Lock()

    def advance(self, task_id: int) -> bool:
        with self._lock:
            self.running[task_id] += 1
            self.most_at_once[task_id] = max(self.most_at_once[task_id], self.running[task_id])
            overall = sum(self.running.values())
            self.most_at_once_overall = max(self.most_at_once_overall, overall)
        try:
            if task_id in self.slow:
                self.started[task_id].set()
                assert self.release.wait(WAIT_S)
            with self._lock:
                self.advanced.append(task_id)
            return True
        finally:
            with self._lock:
                self.running[task_id] -= 1

    def advance_if_current(self, task_id: int) -> bool:
        return self.advance(task_id)


def _until(condition) -> bool:
    return wait_until(condition, WAIT_S)


@pytest.fixture
def slow_driver():
    driver = SlowDriver(slow={1})
    yield driver
    driver.release.set()


@contextmanager
def advancing_task_1(driver: SlowDriver, threads: int) -> Iterator[Proposer]:
    """A started proposer of `threads` threads, one of them in task 1's (slow) advance."""
    proposer = Proposer(driver, threads=threads)
    proposer.start()
    try:
        proposer.request(1)
        assert driver.started[1].wait(WAIT_S)
        yield proposer
    finally:
        proposer.stop()


def test_a_slow_advance_holds_only_its_own_thread(slow_driver):
    with advancing_task_1(slow_driver, threads=2) as proposer:
        proposer.request(2)
        proposer.request(3)
        # Tasks 2 and 3 are proposed for while task 1's advance still runs.
        assert _until(lambda: sorted(slow_driver.advanced) == [2, 3])
        assert proposer.has(1) and not proposer.idle()
        slow_driver.release.set()
        assert _until(proposer.idle)
        assert sorted(slow_driver.advanced) == [1, 2, 3]


def test_a_task_asked_for_again_while_advanced_waits_for_that_advance(slow_driver):
    """Asked for again meanwhile (a late result of its batch), the task is advanced once
    more after the advance in progress, not beside it in another thread."""
    with advancing_task_1(slow_driver, threads=3) as proposer:
        proposer.request(1)
        proposer.request(2)
        assert _until(lambda: slow_driver.advanced == [2])
        time.sleep(0.2)  # (another thread free to take task 1 again has had its chance)
        assert slow_driver.running[1] == 1 and proposer.has(1)
        slow_driver.release.set()
        assert _until(lambda: slow_driver.advanced.count(1) == 2)
        assert _until(proposer.idle)
        assert slow_driver.most_at_once[1] == 1


def test_the_threads_are_named_for_the_proposer_and_stop_together(slow_driver):
    """Named so that `pipetune_thread_cpu_seconds_total` counts them as the proposer's."""
    proposer = Proposer(slow_driver, threads=3)
    proposer.start()
    threads = list(proposer._threads)
    assert len(threads) == 3 and all(t.is_alive() for t in threads)
    assert all(t.name.startswith(PROPOSER_THREAD) for t in threads)
    proposer.stop()
    assert not any(t.is_alive() for t in threads)


def test_the_proposals_run_on_one_blas_thread_each(slow_driver):
    """A round's own limit saved and restored BLAS's process-wide thread count: two rounds
    overlapping, the first to finish gave the other every core's threads back."""
    threadpoolctl.threadpool_limits(limits=2, user_api="blas")  # (as a process starts)
    proposer = Proposer(slow_driver, threads=2)
    proposer.start()
    try:
        blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas)
    finally:
        proposer.stop()


def test_the_number_of_threads_is_a_setting_with_bounds():
    assert Settings(proposer_threads=8).proposer_threads == 8
    assert Settings().proposer_threads == 4
    for bad in (0, 65):
        with pytest.raises(ValidationError, match="proposer_threads"):
            Settings(proposer_threads=bad)
    with pytest.raises(ValueError, match="at least one thread"):
        Proposer(SlowDriver(slow=set()), threads=0)


def test_a_space_asked_for_by_several_threads_at_once_is_built_once(tmp_path):
    """The proposer's threads starting tasks of one workload on one GPU at once each built
    its space (enumerated and evaluated: up to about 0.8 GB for the largest) and kept one."""
    url = f"sqlite:///{tmp_path / 'pipetune.db'}"
    with client_for(url, create_empty_schema=True) as client:
        driver = service_of(client).driver
        builds, release = [], threading.Event()

        def build() -> object:
            builds.append(1)
            assert release.wait(WAIT_S)
            return object()

        cache: OrderedDict = OrderedDict()
        got: list[object] = []
        threads = [
            threading.Thread(target=lambda: got.append(driver._cached(cache, "key", build)))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        assert _until(lambda: len(builds) >= 1)
        time.sleep(0.2)  # (the other threads have asked meanwhile)
        release.set()
        for thread in threads:
            thread.join(WAIT_S)
        assert len(builds) == 1 and len(got) == 4 and len({id(g) for g in got}) == 1
        assert list(cache) == ["key"] and not driver._building
