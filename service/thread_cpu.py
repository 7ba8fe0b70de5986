"""CPU time of a replica's threads by what they do, as a Prometheus counter.

A replica spends its CPU in a few threads with distinct jobs: the event loop (HTTP, routing,
the queue's statements), the proposer (the tuner's advances, service/proposer.py), the
NOTIFY listener (service/wakeup.py) and the thread pool of the synchronous routes and
dependencies. The process's CPU alone does not say which of them a fleet's load lands on;
`pipetune_thread_cpu_seconds_total{role=...}` does, at every scrape, and the load benchmark
reports it per result (benchmarks/bench_load.py).

Read from Linux's /proc/self/task/<tid>/stat (clock ticks, usually 10 ms): no profiler, no
cost between scrapes. Elsewhere the family is empty. A thread that ended counts with what
it had used at the last reading (its last moments are not seen), so the counter never goes
back; it may lag the process's CPU by a pool thread's last slice.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

# The names the service gives its threads (service/proposer.py, service/app.py), and the
# prefix of AnyIO's worker threads (the thread pool of synchronous routes and dependencies).
PROPOSER_THREAD = "pipetune-proposer"
LISTENER_THREAD = "pipetune-listener"
POOL_THREAD_PREFIX = "AnyIO worker thread"
# Thread name (or its prefix) -> role.
ROLE_OF_NAME = {
    PROPOSER_THREAD: "proposer",
    LISTENER_THREAD: "listener",
    POOL_THREAD_PREFIX: "thread_pool",
}
EVENT_LOOP = "event_loop"
OTHER = "other"
ROLES = (EVENT_LOOP, *ROLE_OF_NAME.values(), OTHER)

_TASKS = Path("/proc/self/task")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def stat_cpu_s(stat: str) -> float:
    """User plus system CPU seconds in the text of a Linux /proc/<pid>/stat (or
    /proc/<pid>/task/<tid>/stat) file."""
    # After the command name (which may hold spaces, inside parentheses): state is field 3,
    # utime and stime fields 14 and 15.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _thread_cpu_s(native_id: int) -> float | None:
    """User plus system CPU seconds of one of this process's threads; None if it is gone
    (or there is no /proc)."""
    try:
        return stat_cpu_s((_TASKS / str(native_id) / "stat").read_text())
    except OSError:
        return None


class ThreadCpu(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop_ident: int | None = None
        # Per live thread, (ident, native id) -> (role, CPU seconds at the last reading).
        self._last: dict[tuple[int, int], tuple[str, float]] = {}
        self._ended: Counter[str] = Counter()  # what threads that ended had used, by role

    def mark_event_loop(self) -> None:
        """Called on the thread that runs the service's event loop (its lifespan)."""
        self._loop_ident = threading.get_ident()

    def role(self, thread: threading.Thread) -> str:
        if thread.ident is not None and thread.ident == self._loop_ident:
            return EVENT_LOOP
        for name, role in ROLE_OF_NAME.items():
            if thread.name.startswith(name):
                return role
        return OTHER

    def seconds(self) -> dict[str, float]:
        """CPU seconds by role since the process started (threads that ended included)."""
        with self._lock:
            now: dict[tuple[int, int], tuple[str, float]] = {}
            for thread in threading.enumerate():
                if thread.ident is None or thread.native_id is None:
                    continue
                used = _thread_cpu_s(thread.native_id)
                if used is not None:
                    now[(thread.ident, thread.native_id)] = (self.role(thread), used)
            for key, (role, used) in self._last.items():
                if key not in now:
                    self._ended[role] += used
            self._last = now
            totals = Counter(self._ended)
            for role, used in now.values():
                totals[role] += used
        return {role: totals[role] for role in ROLES if role in totals}

    def collect(self) -> Iterator[Metric]:
        if not _TASKS.is_dir():
            return
        family = CounterMetricFamily(
            "pipetune_thread_cpu_seconds",
            f"CPU seconds used by this replica's threads, by role ({', '.join(ROLES)})",
            labels=["role"],
        )
        for role, used in self.seconds().items():
            family.add_metric([role], used)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())
