"""The replica's CPU by thread role (service/thread_cpu.py): what each thread used counts
under its role, keeps counting after the thread ends, and reaches /metrics and the load
benchmark's reading of it."""

from __future__ import annotations

import threading
import time

import pytest
from service_support import metric_value

from benchmarks.harness import cpu_counters
from pipetune.service.metrics import Metrics
from pipetune.service.thread_cpu import (
    EVENT_LOOP,
    OTHER,
    POOL_THREAD_PREFIX,
    PROPOSER_THREAD,
    ThreadCpu,
    _thread_cpu_s,
)

pytest_plugins = ["service_fixtures"]

pytestmark = pytest.mark.skipif(
    _thread_cpu_s(threading.get_native_id()) is None, reason="needs Linux /proc"
)


def _spin(seconds: float) -> None:
    """Use `seconds` of CPU (not wall time: a busy machine stretches it)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_threads_cpu_counts_under_its_role_and_after_it_ends():
    counter = ThreadCpu()
    before = counter.seconds().get("proposer", 0.0)
    started, release = threading.Event(), threading.Event()

    def body() -> None:
        _spin(0.3)
        started.set()
        release.wait(10)

    thread = threading.Thread(target=body, name=PROPOSER_THREAD)
    thread.start()
    assert started.wait(30)
    alive = counter.seconds()["proposer"]
    assert alive - before >= 0.25  # 0.3 s, in 10 ms ticks
    release.set()
    thread.join()
    # Ended: what it had used at the last reading stays (a counter never goes back).
    assert counter.seconds()["proposer"] >= alive


def test_the_event_loop_is_the_thread_that_marked_itself_and_unnamed_threads_are_other():
    counter = ThreadCpu()
    me = threading.current_thread()
    assert counter.role(me) == OTHER
    counter.mark_event_loop()
    assert counter.role(me) == EVENT_LOOP
    pool = threading.Thread(target=lambda: None, name=f"{POOL_THREAD_PREFIX}-1")
    assert counter.role(pool) == "thread_pool"


def test_the_exposition_reaches_the_benchmarks_reading():
    metrics = Metrics()
    metrics.proposal_cpu.labels("auto").inc(0.25)
    metrics.proposal_cpu.labels("bo").inc(0.5)
    metrics.thread_cpu.mark_event_loop()
    before = cpu_counters(metrics.render().decode())
    _spin(0.1)
    figures = cpu_counters(metrics.render().decode())
    assert figures["proposal"] == 0.75
    assert figures["thread:event_loop"] - before["thread:event_loop"] >= 0.08


def test_a_replica_reports_its_event_loops_and_its_proposers_cpu(client):
    """The app marks the thread its lifespan runs on (the event loop) when it starts, and its
    proposer thread is known by its name (a renamed thread would count as `other`)."""
    for _ in range(3):
        client.get("/healthz")
    text = client.get("/metrics").text
    for role in (EVENT_LOOP, "proposer"):
        assert metric_value(text, "pipetune_thread_cpu_seconds_total", role=role) is not None
