"""The driver's own connections for the hot paths' one-statement transactions (PostgreSQL).

Every hot path is one statement run in autocommit (`Database.driver_statement`). Borrowed
from SQLAlchemy's pool, each statement also paid for the pool's checkout and checkin (its
reset-on-return included) and for switching the connection into autocommit and back (the
ORM's transactions share that pool): 88-93 us of the client's CPU for a trivial statement,
against 60-69 on these connections, kept in autocommit (benchmarks/RESULTS.md, "the driver's
own connections"). psycopg_pool's ConnectionPool measured 62-78 us for its checkout and the
statement alone (it checks and resets each connection it takes back, and runs maintenance
threads), so this is a list under a lock, written here: these statements need no more.

What a pool must still do, and how:
* At most `limit` connections at once; a caller that waits longer than `timeout_s` gets
  SQLAlchemy's TimeoutError, which the service answers as "database unavailable" (503), as
  it answers a pool without a free connection.
* A connection broken by a failed statement or a database restart is closed, never handed
  out again; one left in a transaction (it cannot be, in autocommit, but a bug must not leak
  it) is closed too.
* Connections are retired after `max_age_s` (as SQLAlchemy's pool_recycle: a proxy may drop
  idle ones), and `close()` closes every idle one (`Database.dispose`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import exc as sa_exc

_Idle = tuple[psycopg.Connection, float]  # an idle connection, and when it was opened


class DriverConnections:
    def __init__(
        self,
        connect: Callable[[], psycopg.Connection],
        keep: int,
        limit: int,
        timeout_s: float = 30.0,
        max_age_s: float = 1800.0,
    ):
        """`connect` opens a connection in autocommit; up to `keep` idle ones are kept, at
        most `limit` are in use at once."""
        self._connect = connect
        self._keep = keep
        self._limit = limit
        self._timeout_s = timeout_s
        self._max_age_s = max_age_s
        # One lock for the idle list and the count in use (a threading.Semaphore is a second
        # lock and a condition in Python: it cost as much as the rest of a checkout).
        self._lock = threading.Condition(threading.Lock())
        self._in_use = 0
        self._idle: list[_Idle] = []

    def take(self) -> tuple[psycopg.Connection, float]:
        """A connection in autocommit for the caller alone, and when it was opened (for
        `give_back`, which the caller must call whatever happens). Errors to connect are
        psycopg's own (the caller wraps them)."""
        with self._lock:
            if self._in_use >= self._limit and not self._lock.wait_for(
                lambda: self._in_use < self._limit, timeout=self._timeout_s
            ):
                raise sa_exc.TimeoutError(
                    f"no free database connection of the driver within {self._timeout_s:g} s"
                )
            self._in_use += 1
            kept, aged = self._fresh_idle()
        try:
            for conn, _ in aged:
                conn.close()
            return kept if kept is not None else (self._connect(), time.monotonic())
        except BaseException:
            self._release(None, 0.0)
            raise

    def _young(self, opened: float) -> bool:
        """Whether a connection opened at `opened` may still be used (max_age_s)."""
        return time.monotonic() - opened < self._max_age_s

    def _fresh_idle(self) -> tuple[_Idle | None, list[_Idle]]:
        """(Under the lock.) The most recently used idle connection still young enough (its
        statements prepared), and those that aged while idle, to close. Checked when given
        back only, a connection idle past its age was handed out all the same, to a proxy
        that may have dropped it (SQLAlchemy's pool_recycle checks at checkout)."""
        aged: list[_Idle] = []
        while self._idle:
            entry = self._idle.pop()
            if self._young(entry[1]):
                return entry, aged
            aged.append(entry)
        return None, aged

    def give_back(self, conn: psycopg.Connection, opened: float) -> None:
        sound = (
            not conn.closed
            and not conn.broken
            and conn.pgconn.transaction_status == TransactionStatus.IDLE
            and self._young(opened)
        )
        if not self._release(conn if sound else None, opened):
            conn.close()

    def _release(self, conn: psycopg.Connection | None, opened: float) -> bool:
        """One use ended; `conn` kept idle if there is room (returns whether it was)."""
        with self._lock:
            self._in_use -= 1
            self._lock.notify()
            if conn is not None and len(self._idle) < self._keep:
                self._idle.append((conn, opened))
                return True
        return False

    def close(self) -> None:
        """Close the idle connections (the pool itself stays usable: those in use come back
        to it, and new ones are opened as needed)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)
