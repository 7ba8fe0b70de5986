"""When the worker daemon sends a heartbeat.

A heartbeat tells the service that the worker lives and how busy it is, and extends by one
lease TTL the leases it lists. The daemon's heartbeat thread wakes every `--heartbeat`
seconds (5 by default) and sends one only when it has something to say:
- a lease it holds will have lived RENEW_AT of its TTL since it was granted or last extended
  by the next wake-up (its jobs wait behind long trials, or a trial runs long): extended
  with at least half its TTL to spare whatever the wake-ups' interval (a rule that waited
  for the half itself let a lease granted just after a wake-up expire where the interval
  was more than a quarter of the TTL: a 5 s interval and an 8 s TTL, say); a heartbeat that
  fails is tried again at every wake-up;
- a lease whose TTL the service did not say (a service from before `lease_ttl_s`): at every
  wake-up, as the daemon always did;
- the worker went from holding nothing to holding jobs or back (the service's count of its
  busy jobs follows at once), or nothing was sent yet;
- otherwise, once every IDLE_EVERY wake-ups (30 s at the default), well within the service's
  default lease TTL of 120 s: a worker heard from within a TTL is one whose name a second
  process is told may be in use when it registers under it. Where the service's TTL is
  shorter (its registration answer says it), within half of it (`idle_every`): at 10 s, an
  idle worker heartbeating every 30 s was listed silent, and `tune` said no worker was live.
A fleet of a thousand daemons that sent one at every wake-up sent two hundred heartbeats a
second, busy or idle, each about as dear to the service as a result: with trials of a few
seconds, more than its results (benchmarks/RESULTS.md, "heartbeats of a fleet").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

IDLE_EVERY = 6  # wake-ups between heartbeats that only say the worker lives
RENEW_AT = 0.5  # of a lease's TTL: from then on, a heartbeat extends it
# How far past its TTL, since the last time it was granted or extended, a lease is taken to
# have expired at the service for certain: the service's clock ran from a little after the
# worker's (an answer's way back), so a lease's end is known only to within that.
EXPIRED_MARGIN = 0.1  # of its TTL
EXPIRED_MARGIN_S = 2.0  # and this much more


@dataclass
class HeldTerm:
    """A lease the worker holds: its token, the TTL it was granted for, and when (on the
    worker's monotonic clock) it is due to be extended."""

    token: str
    ttl_s: float | None  # None: the service did not say
    renew_at: float
    last_at: float = 0.0  # when it was granted or last extended (the worker's clock)

    @classmethod
    def granted(cls, token: str, ttl_s: float | None, now: float) -> HeldTerm:
        """A lease received at `now` (granted a little before: RENEW_AT leaves the margin)."""
        term = cls(token, ttl_s, now)
        term.extended(now)
        return term

    def due(self, now: float, wait_s: float) -> bool:
        """Whether to extend it at this wake-up, the next being `wait_s` away: it would have
        lived RENEW_AT of its TTL by then."""
        return self.ttl_s is None or now + wait_s >= self.renew_at

    def extended(self, at: float) -> None:
        """A heartbeat sent at `at` extended it (the service's clock ran from no earlier)."""
        self.last_at = at
        if self.ttl_s is not None:
            self.renew_at = at + RENEW_AT * self.ttl_s

    def expired(self, now: float) -> bool:
        """Whether the lease has expired at the service for certain (its heartbeats failed
        for longer than its TTL): measured, its result is refused as stale."""
        if self.ttl_s is None:
            return False
        return now > self.last_at + self.ttl_s * (1 + EXPIRED_MARGIN) + EXPIRED_MARGIN_S


class Doorbell:
    """The heartbeat thread's wait between wake-ups: `wait` returns True once `set` (stop),
    and ends early, returning False, when `ring` asks for a heartbeat now (a measuring thread
    that must know whether a held job's task was cancelled before it starts it)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopped = self._rung = False

    def wait(self, timeout: float) -> bool:
        with self._cond:
            if not (self._stopped or self._rung):
                self._cond.wait(timeout)
            self._rung = False
            return self._stopped

    def ring(self) -> None:
        with self._cond:
            self._rung = True
            self._cond.notify_all()

    def set(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


def idle_every(interval_s: float, live_ttl_s: float | None) -> int:
    """Wake-ups (`interval_s` apart) between heartbeats that only say the worker lives:
    IDLE_EVERY, or as many as fit in half the service's lease TTL where that is fewer."""
    if live_ttl_s is None:
        return IDLE_EVERY
    return max(1, min(IDLE_EVERY, int(live_ttl_s / 2 / interval_s)))


def heartbeat_due(
    active: bool, last_active: bool | None, wakeups: int, expiring: bool, every: int = IDLE_EVERY
) -> bool:
    """Whether to send a heartbeat at this wake-up. `active`: the worker holds a lease or
    measures a job now; `last_active`: whether it did at the last heartbeat the service took
    (None: none yet); `wakeups`: wake-ups since that heartbeat, this one included;
    `expiring`: a lease it holds is due to be extended (HeldTerm.due); `every`: idle_every."""
    return expiring or active != last_active or wakeups >= every
