"""When the worker daemon sends a heartbeat.

A heartbeat tells the service that the worker lives and how busy it is, and extends by one
lease TTL the leases it holds. The daemon's heartbeat thread wakes every `--heartbeat`
seconds (5 by default). While the worker holds jobs (measuring them, or leased ahead) it
sends one at every wake-up. While it holds none there is nothing to extend: it sends one
when it has just gone idle (so the service's count of its busy jobs drops at once), then
one every IDLE_EVERY wake-ups (30 s at the default), well within the service's default lease
TTL of 120 s: a worker heard from within a TTL is one whose name a second process is told
may be in use when it registers under it. Idle, a fleet of a thousand daemons sent two
hundred heartbeats a second, each about as dear to the service as a result
(benchmarks/RESULTS.md, "heartbeats of an idle fleet").
"""

from __future__ import annotations

IDLE_EVERY = 6  # wake-ups between an idle worker's heartbeats


def heartbeat_due(holding: bool, busy: int, last_busy: int | None, wakeups: int) -> bool:
    """Whether to send a heartbeat at this wake-up. `holding`: the worker holds a lease or
    measures a job; `busy`: its busy jobs now; `last_busy`: those the last heartbeat the
    service took said (None: none yet); `wakeups`: wake-ups since that heartbeat, this one
    included."""
    return holding or busy != last_busy or wakeups >= IDLE_EVERY
