"""Engines, transactions and the database clock, for SQLite and PostgreSQL.

SQLite: WAL (readers do not block the writer), a busy timeout, foreign keys on, and write
transactions opened with ``BEGIN IMMEDIATE``. pysqlite's own deferred BEGIN would let two
transactions read the same row and then fail (or, worse, both decide) when they write; with
IMMEDIATE the write lock is taken up front, so a read-then-update inside ``Database.write``
is a compare-and-set. Read-only sessions keep a deferred BEGIN and run beside the writer.

PostgreSQL: an ordinary pool; row locks (``FOR UPDATE [SKIP LOCKED]``) where it matters. The
queue's hot paths run plain SQL through the driver itself, on connections of their own kept
in autocommit (``Database.driver_statement``, service/driver_pool.py). Measured on a lease
plus a result (single thread, benchmarks/bench_queue_sql.py, RESULTS.md): SQLAlchemy Core
statements built per call, several per path, cost about 6 ms of the client's CPU; the same
work as one statement through SQLAlchemy's cached ``text()`` 1.1-1.3 ms; that statement
through psycopg 0.9-1.0 ms. The statement count is most of the gain; the driver takes
SQLAlchemy's execution and result machinery off the rest. Everything off the hot paths
keeps SQLAlchemy (ORM and Core): clearer, and cheap enough there.

Lease expiry is judged by the database's clock only (``Database.now``): replicas and
workers may disagree about the time, the database is the one clock they share.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import psycopg
import pydantic_core
from psycopg.conninfo import make_conninfo
from psycopg.rows import namedtuple_row
from sqlalchemy import (
    Connection,
    DateTime,
    Engine,
    create_engine,
    event,
    func,
    text,
    type_coerce,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator

from pipetune.service.driver_pool import DriverConnections
from pipetune.service.settings import sqlite_path

SQLITE_NOW_FORMAT = "%Y-%m-%d %H:%M:%f"
# Seconds a new PostgreSQL connection may take (libpq's connect_timeout; its least is 2).
CONNECT_TIMEOUT_S = 10
# How an open PostgreSQL connection finds its server's host gone (crashed, cut off by the
# network): TCP keepalives after 30 s of silence, and data unacknowledged for 30 s. With the
# kernel's defaults a statement waited over two hours for an answer that would never come,
# and a lease's or a result's waits on the event loop (routers/jobs.py), every request of the
# replica with it. (A server that is up and never answers is found by neither: its kernel
# still acknowledges.) A value in the URL wins.
TCP_LIVENESS = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # milliseconds
}
# The longest the client waits for the server to answer one statement (or a COMMIT, a
# ROLLBACK) on a connection that is open, by default (PIPETUNE_DB_STATEMENT_DEADLINE_S). A
# server that is up and never answers (stopped by a signal, its storage hung in fsync) is
# found by neither TCP_LIVENESS nor a server-side statement_timeout (a stopped server runs
# no timer); the service's statements waited for it without end, and a lease's on the event
# loop held every request of the replica. 30 s: as TCP_LIVENESS finds a vanished host.
STATEMENT_DEADLINE_S = 30.0
# A stalled database's probe (Database.probe).
PROBE_SQL = "SELECT txid_current()"
# SQLite's "database or disk is full" (its primary result code) and PostgreSQL's disk_full.
SQLITE_FULL = 13
PG_DISK_FULL = "53100"
# SQLite's "attempt to write a readonly database" (a file or mount made read-only while it
# served) and PostgreSQL's read_only_sql_transaction (a standby, or default_transaction_read_only).
SQLITE_READONLY = 8
PG_READ_ONLY = "25006"
# SQLite's "database disk image is malformed" and "file is not a database" (a file damaged on
# disk, or overwritten while it served), and PostgreSQL's data_corrupted and index_corrupted.
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26
PG_CORRUPT = ("XX001", "XX002")
# How long after a write failed for a full disk (or a read-only database) /healthz still says
# so (Database.write_problem).
DISK_FULL_WINDOW_S = 30.0

log = logging.getLogger(__name__)


class StatementDeadlineError(psycopg.OperationalError):
    """The server did not answer a statement within its connection's deadline; the
    connection was closed (what the statement did is unknown: it may still commit)."""


class DeadlineConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server (a statement, its results, a
    COMMIT or ROLLBACK) gives up after `deadline_s`, closes the connection and raises
    StatementDeadlineError (an OperationalError: a 503 to the client; SQLAlchemy discards a
    closed connection from its pool, as does DriverConnections).

    Why this way: psycopg runs each operation as a generator consumed by Connection.wait,
    whose `timeout` its C wait loop (wait_c) already honours (`_WaitTimeout`); a timeout
    given here costs nothing measurable on a statement that answers (one Python call more:
    `SELECT 1` in autocommit measured 12.6 us of the client's CPU against 13.3 without, the
    noise larger than the difference). The alternatives, not taken: an async connection
    under asyncio.wait_for would put every hot statement through the event loop's task
    machinery (and the threads' statements through a loop of their own), more per statement
    than the whole wait; a watchdog thread closing a socket another thread waits on is a
    race (the fd may be reused meanwhile; psycopg notes that its epoll wait hangs on a fd
    closed under it). A server-side statement_timeout cannot help: a stopped server runs
    no timer.

    Closing is the only sound way out: the statement's outcome is unknown, the connection
    may be mid-protocol, and a cancel request would wait on the same silent server. Each of
    the service's writes is safe to have committed unseen: a hot statement commits alone
    (a lease no one received expires by its TTL and is requeued; a result is idempotent per
    lease, and the worker retries it), and an ORM transaction not yet committed is rolled
    back by the server when it finds the client gone.

    Explicit timeouts (psycopg's own: notifies(timeout=...)) are kept as given."""

    deadline_s: float | None = None
    # Called (from the waiting thread) when a wait misses the deadline.
    on_deadline: Any = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None or self.deadline_s is None:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, self.deadline_s)
        except psycopg.errors._WaitTimeout:
            self.close()
            if self.on_deadline is not None:
                self.on_deadline()
            raise StatementDeadlineError(
                f"no answer from the database within {self.deadline_s:g} s "
                "(PIPETUNE_DB_STATEMENT_DEADLINE_S); connection closed"
            ) from None


def libpq_defaults(given: Iterable[str], connect_timeout: float | None = None) -> dict[str, Any]:
    """libpq parameters for a connection whose URL or conninfo names `given`: the liveness
    settings and the connect timeout, each unless given."""
    defaults: dict[str, Any] = dict(TCP_LIVENESS)
    defaults["connect_timeout"] = CONNECT_TIMEOUT_S if connect_timeout is None else connect_timeout
    named = set(given)
    return {k: v for k, v in defaults.items() if k not in named}


def connect_timeout_within(deadline_s: float | None) -> int | None:
    """The connect timeout for connections whose statements have a deadline: no longer than
    it (a stalled server's probe opened a connection and waited CONNECT_TIMEOUT_S, not the
    deadline), and at least libpq's least, 2 s; None (CONNECT_TIMEOUT_S) without one."""
    if deadline_s is None:
        return None
    return max(2, min(CONNECT_TIMEOUT_S, math.ceil(deadline_s)))


def is_unavailable(exc: BaseException) -> bool:
    """Whether an error means the database cannot be reached right now (restarting, failing
    over, out of connections, busy) rather than a bug: OperationalError and InterfaceError
    are the DB-API's classes for those, and any error that cut the connection counts too."""
    if isinstance(exc, sa_exc.TimeoutError | DatabaseGoneError):  # (no free connection;
        return True  # a SQLite file gone: the upkeep and proposer say so in one line)
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return True
    if isinstance(exc, sa_exc.DBAPIError) and refusal_cause(exc) in ("read-only", "corrupt"):
        # (A standby's ReadOnlySqlTransaction is an InternalError: each write answered 500;
        # a corrupt SQLite file's DatabaseError a 500 "Internal Server Error" and a traceback.)
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


def _error_codes(exc: BaseException) -> tuple[int | None, str | None]:
    """A database error's SQLite primary result code (the extended codes keep it in the low
    byte) and PostgreSQL SQLSTATE, None where the driver gave none."""
    orig = getattr(exc, "orig", None)
    error = orig if orig is not None else exc
    code = getattr(error, "sqlite_errorcode", None)
    return (code & 0xFF if isinstance(code, int) else None), getattr(error, "sqlstate", None)


# Each cause of refused work (Database.write_problem, the service's 503s): the SQLite result
# codes and PostgreSQL SQLSTATEs that say it, in the order they are told apart, what the
# database is, whether the SQLite file's folder (its disk) or the file itself is named, what
# fails, what to do. corrupt: a file damaged or overwritten, data or index corrupted (what
# reads them fails until restored: no retry helps); full: the database answers, and refuses
# what would grow it; read-only: a read-only SQLite file or mount, a PostgreSQL standby (it
# answers reads, and refuses every write).
_WRITE_REFUSALS = {
    "corrupt": (
        (SQLITE_CORRUPT, SQLITE_NOTADB),
        PG_CORRUPT,
        "the database is corrupt",
        False,
        "statements",
        "stop the service and restore the database from a backup",
    ),
    "full": (
        (SQLITE_FULL,),
        (PG_DISK_FULL,),
        "the database's disk is full",
        True,
        "writes",
        "free space on it",
    ),
    "read-only": (
        (SQLITE_READONLY,),
        (PG_READ_ONLY,),
        "the database is read-only",
        False,
        "writes",
        "make it writable (a read-only mount or file, a standby after a failover)",
    ),
}


def refusal_cause(exc: BaseException) -> str | None:
    """Which cause of refused work (_WRITE_REFUSALS: corrupt, full, read-only) a database
    error says, None for any other error."""
    sqlite_code, sqlstate = _error_codes(exc)
    for cause, (codes, states, *_) in _WRITE_REFUSALS.items():
        if sqlite_code in codes or sqlstate in states:
            return cause
    return None


def is_corrupt(exc: BaseException) -> bool:
    return refusal_cause(exc) == "corrupt"


def unavailable_reason(exc: BaseException) -> str:
    """One line naming the error class and the driver's own short message, with no SQL or
    parameters in it (SQLAlchemy's str() of the error has both: a worker's token hash among
    them). The class alone said "OperationalError" of a locked file, a read-only one and a
    table that already exists alike."""
    orig = getattr(exc, "orig", None)
    error = orig if orig is not None else exc
    name = type(error).__name__
    # psycopg: the primary message (its DETAIL, which may quote values, is left out);
    # sqlite3: its message, which names a table or column at most.
    diag = getattr(error, "diag", None)
    message = getattr(diag, "message_primary", None) if diag is not None else None
    if message is None and type(error).__module__ == "sqlite3" and error.args:
        message = str(error.args[0])
    if message is None and diag is not None and error.args:
        # psycopg failing to connect has no server diagnostic: its own first line says why
        # (refused, no such database, authentication), with no SQL or value in it.
        lines = str(error.args[0]).strip().splitlines()
        message = lines[0] if lines else None
    if message is None and isinstance(error, DatabaseGoneError):
        message = error.detail
    if not message:
        return name
    return f"{name}: {' '.join(str(message).split())[:200]}"


def refuses_url_options(exc: BaseException) -> bool:
    """Whether the driver refused the URL's own connection options before reaching any
    server (psycopg's ProgrammingError with no SQLSTATE: `?connect_timeout=abc`,
    `?bogus=1`): bad input in the URL, not a database that failed. Errors from a server
    (a missing privilege, a missing table) carry a SQLSTATE."""
    orig = getattr(exc, "orig", None)
    return (
        orig is not None
        and type(orig).__module__.startswith("psycopg")
        and type(orig).__name__ == "ProgrammingError"
        and getattr(orig, "sqlstate", None) is None
    )


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on both dialects (SQLite stores naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        if isinstance(value, dt.datetime):
            return value.astimezone(dt.UTC)
        return value


def sql_names(values: Iterable[str]) -> str:
    """Names of the project's own (states, strategy names) as a SQL list of string literals,
    for statements built once at import: a Python list bound as a parameter is walked by
    psycopg's array dumper at every execution, 12-35 us a statement on the test VM, and the
    task driver's reads run several times per batch. Only plain names are taken: this is
    never for what a request says."""
    names = sorted({str(v) for v in values})
    bad = [n for n in names if not re.fullmatch(r"[a-z0-9_+-]+", n)]
    if not names or bad:
        raise ValueError(f"not a list of plain names: {bad or names}")
    return ", ".join(f"'{n}'" for n in names)


def json_param(value: Any) -> str:
    """A value as the JSON text a statement's parameter takes (the results statement's
    reports, a batch's jobs): pydantic-core's encoder, about eight times as fast as json.dumps
    on eight reports of twenty samples, with the same values (floats in their shortest
    round-trip form; NaN and Infinity written as json.dumps writes them, which PostgreSQL
    refuses either way)."""
    return pydantic_core.to_json(value).decode()


# The hot paths' statements run on the event loop (Queue.hot), where a wait stops every
# request of the replica, /healthz and the dashboard's page too: there a statement waits for
# a row or table lock another session holds (an open admin transaction, CREATE INDEX, a
# migration) at most this long, then fails, and Queue.hot runs it again in a thread.
# Longer than the queue's own statements hold their rows (a few ms). Once one has given up,
# the loop's statements wait BRIEF_LOCK_TIMEOUT_MS for a while (Queue.hot): those that need
# the lock go to threads at once, the others (a heartbeat, another task's lease) are answered
# on the loop as before, and a flood of results for a locked task costs the loop little.
LOOP_LOCK_TIMEOUT_MS = 100
BRIEF_LOCK_TIMEOUT_MS = 5
# The lock timeout of the statements run now, in ms, where they are the event loop's own
# (on_event_loop); 0: they are not.
_ON_LOOP: ContextVar[int] = ContextVar("pipetune_loop_lock_timeout_ms", default=0)
# The statements of the loop's current work that finished (on_event_loop's list): a work that
# gives up on a lock after one of them may have committed part of itself, and is not run again.
_LOOP_DONE: ContextVar[list[int] | None] = ContextVar("pipetune_loop_done", default=None)
# SET (LOCAL, for the transaction alone, where `local`), as a function that takes parameters.
_SET_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :ms, :local)")


@contextmanager
def on_event_loop(lock_timeout_ms: int = LOOP_LOCK_TIMEOUT_MS) -> Iterator[list[int]]:
    """Mark the statements run inside as the event loop's own, each waiting for a lock at
    most `lock_timeout_ms` (LOOP_LOCK_TIMEOUT_MS or BRIEF_LOCK_TIMEOUT_MS); yields a list
    whose length counts the transactions that finished inside (see _LOOP_DONE)."""
    done: list[int] = []
    token, counter = _ON_LOOP.set(lock_timeout_ms), _LOOP_DONE.set(done)
    try:
        yield done
    finally:
        _LOOP_DONE.reset(counter)
        _ON_LOOP.reset(token)


def _finished_on_loop() -> None:
    done = _LOOP_DONE.get()
    if done is not None:
        done.append(1)


class DatabaseGoneError(Exception):
    """The database the service opened is not the one at its address any more (a SQLite
    file deleted or replaced while serving): what it would read or write there is not its
    database's, so every transaction is refused (a 503) until a restart."""

    status_code = 503

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether a database error is a lock wait given up (PostgreSQL's lock_timeout)."""
    return isinstance(getattr(exc, "orig", exc), psycopg.errors.LockNotAvailable)


def _wrapped(exc: psycopg.Error, broken: bool) -> sa_exc.DBAPIError:
    """A driver's error as SQLAlchemy's (what the service's error handling reads)."""
    return sa_exc.DBAPIError.instance(None, None, exc, psycopg.Error, connection_invalidated=broken)


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def deadline_connect(
    conninfo: str = "",
    deadline_s: float | None = None,
    on_deadline: Any = None,
    **kwargs: Any,
) -> DeadlineConnection:
    """psycopg.connect, for a DeadlineConnection with `deadline_s` (None: none)."""
    conn = DeadlineConnection.connect(conninfo, **kwargs)
    conn.deadline_s = deadline_s
    conn.on_deadline = on_deadline
    return conn


# How long a SQLite connection waits for another's lock before it gives up.
SQLITE_BUSY_S = 30


def switch_to_wal(cursor: Any, busy_s: float = SQLITE_BUSY_S) -> None:
    """Put a SQLite file in WAL mode, waiting out other connections' locks. SQLite answers a
    switch that would deadlock with another connection (both hold the file's shared lock,
    as two replicas starting together on a new file do) "database is locked" at once,
    without waiting: one of two `serve`s exited 1 in most such starts. Tried again until the
    busy timeout has passed."""
    deadline = time.monotonic() + busy_s
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def make_engine(
    url: str,
    pool_size: int = 10,
    deadline_s: float | None = None,
    on_deadline: Any = None,
    *,
    wal: bool = True,
) -> Engine:
    """`deadline_s`: every statement's client-side deadline (DeadlineConnection), PostgreSQL
    only; None (migrations, tools): none, a long CREATE INDEX must not be cut short. `wal`:
    SQLite connections put the file in WAL mode (see _configure); False for a look at a file
    that may not be pipetune's."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # No pre-ping: it costs a round trip per transaction on the hot paths. A connection
        # broken by a database restart fails one request, and SQLAlchemy then replaces the
        # whole pool; pool_recycle retires connections a proxy might have dropped.
        # Its overflow is one pool size: the hot paths' statements have their own connections
        # (up to another pool size, DriverConnections), within the 3 x pool size per replica
        # that the README tells operators to plan for.
        # A connection attempt gives up after CONNECT_TIMEOUT_S (a 503), unless the URL says
        # otherwise: a server that accepted the connection and never answered (stopped,
        # overloaded) held the request, /healthz included, without end.
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_recycle=1800,
            connect_args=libpq_defaults(parsed.query, connect_timeout_within(deadline_s)),
        )
        if deadline_s is not None:

            @event.listens_for(engine, "do_connect")
            def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
                # The dialect's own connect is psycopg.connect (Connection.connect) with the
                # same arguments; SQLAlchemy's on-connect setup runs on what this returns.
                return deadline_connect(
                    *cargs, deadline_s=deadline_s, on_deadline=on_deadline, **cparams
                )

        return engine
    if (path := sqlite_path(url)) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if parsed.database.startswith("~"):
            # SQLite opens the name as written: sqlite:///~/p.db was a folder "~" in the
            # working directory, while the folder made above and every check of the file
            # (settings.sqlite_path, `db current`, Database.file_problem) read the home's.
            parsed = parsed.set(database=str(path))
    engine = create_engine(
        parsed,
        # (sqlite3's timeout is SQLite's busy timeout: no PRAGMA busy_timeout besides.)
        connect_args={"timeout": SQLITE_BUSY_S, "check_same_thread": False},
        pool_size=pool_size,
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see below)
        cursor = dbapi_connection.cursor()
        if wal:
            # Persistent, in the file: set only where pipetune's database is meant. A look
            # before a refusal switched another program's database to WAL (and made an empty
            # file a 4 KiB database).
            switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        readonly = connection.get_execution_options().get("pipetune_readonly", False)
        connection.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def database_now(is_sqlite: bool) -> ColumnElement[dt.datetime]:
    """Database.now's expression, for code that holds a session rather than the Database
    (service/views.py reads the workers' ages by it)."""
    if is_sqlite:
        return type_coerce(func.strftime(SQLITE_NOW_FORMAT, "now"), UTCDateTime)
    return type_coerce(func.statement_timestamp(), UTCDateTime)


def database_now_plus(is_sqlite: bool, seconds: float) -> ColumnElement[dt.datetime]:
    """Database.now_plus's expression, for code that holds a session (as database_now)."""
    if is_sqlite:
        modifier = f"{float(seconds):+.3f} seconds"  # a bound parameter, not SQL text
        return type_coerce(func.strftime(SQLITE_NOW_FORMAT, "now", modifier), UTCDateTime)
    # make_interval's seconds, not a timedelta: psycopg sends -120 s as '-1 day +23:58:00',
    # whose day PostgreSQL takes as a calendar day of the session's time zone, 23 or 25 hours
    # across a daylight-saving change (for a day after each, every worker read silent, or a
    # dead one live an hour longer). (Positional: years .. mins, then secs.)
    interval = func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))
    return type_coerce(func.statement_timestamp() + interval, UTCDateTime)


class Database:
    """An engine plus the two kinds of transaction the service uses."""

    def __init__(
        self, url: str, pool_size: int = 10, statement_deadline_s: float = STATEMENT_DEADLINE_S
    ):
        self.url = url
        self.pool_size = pool_size
        # Every statement's client-side deadline (DeadlineConnection), and since when the
        # database has missed one with none of its probes answered since (monotonic; None:
        # it answers). While it is stalled, the driver's statements (the hot paths, the
        # proposer's, the upkeep's) go one at a time: that one is the probe, whose answer
        # ends the stall; the rest fail at once (a 503), not each after a deadline of its
        # own. The hot paths then run off the event loop (Queue.hot), /healthz answers 503
        # naming the stall and `pipetune_database_up` reads 0 (service/metrics.py).
        self.deadline_s = statement_deadline_s
        self._stalled_since: float | None = None
        self._probe = threading.Lock()  # held by the one probe in flight
        self.engine = make_engine(url, pool_size, statement_deadline_s, self._missed_deadline)
        # The hot paths' connections (PostgreSQL), opened at their first use; the event
        # loop's own, per lock timeout (on_event_loop), wait for a lock at most that long.
        self._driver_pool: DriverConnections | None = None
        self._loop_pools: dict[int, DriverConnections] = {}
        self._driver_pool_lock = threading.Lock()
        self.dialect = self.engine.dialect.name
        self._write = sessionmaker(self.engine, expire_on_commit=False)
        self._reader = self.engine.execution_options(pipetune_readonly=True)
        self._read = sessionmaker(self._reader, expire_on_commit=False)
        # The SQLite file the service opened (device, inode), to tell when it is deleted or
        # replaced while serving: the open connections go on reading and writing the old
        # file (unlinked, or no longer at the path), so every write looked successful and
        # was lost at the next start.
        self._file = self._sqlite_file()
        self._file_id = _file_id(self._file) if self._file is not None else None
        # Per cause of refused writes (_WRITE_REFUSALS), when a write last failed for it
        # (monotonic) and why. Reads go on working then, so /healthz's SELECT 1 answered
        # healthy while every task, result and lease was refused (reproduced on a full
        # tmpfs). Not cleared by the next write that succeeds: a small one can, in pages the
        # WAL already holds, while a result cannot, and /healthz flapped with them.
        self._writes_refused: dict[str, tuple[float, str]] = {}
        self.disk_full_window_s = DISK_FULL_WINDOW_S
        event.listen(self.engine, "handle_error", self._seen_error)

    def _sqlite_file(self) -> Path | None:
        if not self.is_sqlite:
            return None
        name = self.engine.url.database
        if not name or name == ":memory:" or name.startswith("file:"):
            return None
        # The URL's own path, not resolved: SQLite opens it through a symlink at each new
        # connection, and os.stat follows it the same way (resolved at start, a symlink moved
        # to another file went unseen, and one whose file was renamed under it refused all).
        return Path(name).expanduser().absolute()

    def file_problem(self) -> str | None:
        """Why the SQLite file the service opened is no longer the one at its path (deleted,
        or replaced by another file), or None (and always None on PostgreSQL)."""
        if self._file is None or self._file_id is None:
            return None
        now = _file_id(self._file)
        if now is None:
            return f"the database file {self._file} was deleted while it was open"
        if now != self._file_id:
            return f"the database file {self._file} was replaced while it was open"
        return None

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def _seen_error(self, context: Any) -> None:
        """Every error of the engine's statements and commits (SQLAlchemy's handle_error)."""
        self.note_error(context.original_exception)

    def note_error(self, exc: BaseException) -> None:
        if (cause := refusal_cause(exc)) is not None:
            self._writes_refused[cause] = (time.monotonic(), unavailable_reason(exc))

    def write_problem(self) -> str | None:
        """Why writes fail (a full disk, a read-only database; statements of a corrupt one),
        where one did within disk_full_window_s, in one line (None otherwise): /healthz
        answers 503 with it and `pipetune_database_up` reads 0 while reads still answer. (A
        read-only database answered 503 "unavailable; retry shortly" of each write beside a
        healthy /healthz; a corrupt one 500 and a traceback beside it.)"""
        now = time.monotonic()
        for cause, (_, _, words, at_folder, what, remedy) in _WRITE_REFUSALS.items():
            noted = self._writes_refused.get(cause)
            if noted is None or now - noted[0] > self.disk_full_window_s:
                continue
            at, reason = noted
            place = self._file.parent if at_folder and self._file is not None else self._file
            where = f" ({place})" if place is not None else ""
            return (
                f"{words}{where}: {what} fail ({reason}), the last {now - at:.0f} s ago; {remedy}"
            )
        return None

    def _missed_deadline(self) -> None:
        """A statement found no answer within the deadline (from the thread that waited)."""
        if self._stalled_since is None:
            self._stalled_since = time.monotonic()

    @property
    def stalled(self) -> bool:
        """Whether a statement missed its deadline and no probe has answered since."""
        return self._stalled_since is not None

    def stall_problem(self) -> str | None:
        """Why the database is taken for stalled, in one line (None: it is not)."""
        since = self._stalled_since
        if since is None:
            return None
        return (
            f"the database has not answered within {self.deadline_s:g} s "
            f"(PIPETUNE_DB_STATEMENT_DEADLINE_S), {time.monotonic() - since:.0f} s since the "
            "first statement that waited; it may be stopped or its storage hung, or another "
            "session may hold a lock that long (an open transaction, a migration)"
        )

    def probe(self) -> None:
        """A stalled database's probe (/healthz, the sweep), one statement with the
        deadline; its answer ends the stall. txid_current() takes a transaction id, so its
        commit inserts a WAL record: where a storage hang has blocked WAL insertion (WAL
        buffers full behind a writer stuck in fsync) it does not answer, where `SELECT 1`
        would. It is not a full write: PostgreSQL commits a transaction that wrote nothing
        else without waiting for the flush, so a hang that blocks the flush alone still
        answers it (the next hot statement then waits a deadline, on the event loop, and
        the database is stalled again). It writes no row."""
        with self.driver_statement() as cur:
            cur.execute(PROBE_SQL)

    def _before_transaction(self) -> None:
        """Before an ORM session's or a Core connection's first statement.

        On SQLite, refused where the file was deleted or replaced (file_problem). Only
        /healthz said so: writes answered 201 into the old file or a new one, new
        connections opened the file at the path beside the old one's WAL, ids were handed
        out twice, tasks were lost and the restored file was corrupted.

        While the database is stalled, the engine's statements take their turn as the
        probe, as the driver's do (driver_statement): one at a time, the others a 503 at
        once. Each waited a deadline of its own in a worker thread, and a burst of reads (a
        dashboard's, the task list's) held the thread pool that the stall's hot paths and
        /healthz run in. The probe, where it answers, ends the stall, and the session goes
        on as usual: a replica with only these requests still finds its database answering
        again."""
        if self._file_id is not None and (problem := self.file_problem()) is not None:
            raise DatabaseGoneError(problem)
        if self._stalled_since is not None:  # (one attribute read when it is not)
            self.probe()

    def _bound_loop_lock_waits(self, target: Session | Connection) -> None:
        """On the event loop (on_event_loop), this transaction's lock waits are bounded as
        the loop's driver connections' are (an upkeep or a worker look-up the hot paths
        run there). One more round trip, where the loop runs ORM work: rarely."""
        if (ms := _ON_LOOP.get()) and not self.is_sqlite:
            target.execute(_SET_LOCK_TIMEOUT, {"ms": str(ms), "local": True})

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction that may write: committed on success, rolled back on error."""
        self._before_transaction()
        with self._write.begin() as session:
            self._bound_loop_lock_waits(session)
            yield session
        _finished_on_loop()

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction (never committed)."""
        self._before_transaction()
        with self._read() as session:
            self._bound_loop_lock_waits(session)
            yield session
        _finished_on_loop()

    @contextmanager
    def write_conn(self) -> Iterator[Connection]:
        """A Core connection in one write transaction (the queue's hot paths: no ORM)."""
        self._before_transaction()
        with self.engine.begin() as conn:
            self._bound_loop_lock_waits(conn)
            yield conn
        _finished_on_loop()

    @contextmanager
    def read_conn(self) -> Iterator[Connection]:
        self._before_transaction()
        with self._reader.connect() as conn:
            self._bound_loop_lock_waits(conn)
            yield conn
        _finished_on_loop()

    @contextmanager
    def driver_statement(self) -> Iterator[psycopg.Cursor]:
        """A cursor of the driver (psycopg, rows as named tuples) on a connection of the
        driver's own pool (service/driver_pool.py), for ONE statement, which is its own
        transaction (PostgreSQL only).

        Every hot path is one statement (a data-modifying CTE where it writes), atomic on its
        own; run in autocommit, it costs one round trip instead of three (BEGIN, the
        statement, COMMIT): 55-80 against 170-190 us of the client's CPU for a trivial one,
        and less work for the server. Those connections stay in autocommit; the ORM's
        transactions have SQLAlchemy's pool.

        The driver's errors come out as SQLAlchemy's (OperationalError for a database that
        cannot be reached), so the service answers them as it answers every other database
        error (a 503 for an outage); a connection the error broke is closed, not reused."""
        probing = False
        if self._stalled_since is not None:  # (one attribute read when it is not)
            if not self._probe.acquire(blocking=False):
                stall = StatementDeadlineError(self.stall_problem() or "the database stalled")
                raise _wrapped(stall, broken=False)
            probing = True
        try:
            ms = _ON_LOOP.get()
            pool = self._loop_connections(ms) if ms else self._driver_connections()
            try:
                conn, opened = pool.take()
            except psycopg.Error as exc:  # it could not connect
                raise _wrapped(exc, broken=True) from exc
            try:
                with self._cursor(conn) as cursor:
                    yield cursor
                _finished_on_loop()
                if probing:
                    since, self._stalled_since = self._stalled_since, None  # answered in time
                    if since is not None:
                        log.warning(
                            "the database answers again, after %.0f s stalled",
                            time.monotonic() - since,
                        )
            finally:
                pool.give_back(conn, opened)
        finally:
            if probing:
                self._probe.release()

    @contextmanager
    def session_cursor(self, session: Session) -> Iterator[psycopg.Cursor]:
        """A cursor of the driver (rows as named tuples) on an ORM session's own connection,
        in its transaction (PostgreSQL only): for a statement of the driver's (a data-
        modifying CTE) that must commit or roll back with the session's ORM work. Its errors
        come out as driver_statement's do: as SQLAlchemy's (a 503 for an outage, a full
        disk noted for /healthz), not as the driver's, which the service answered 500."""
        with self._cursor(session.connection().connection.driver_connection) as cursor:
            yield cursor

    @contextmanager
    def _cursor(self, conn: psycopg.Connection) -> Iterator[psycopg.Cursor]:
        """A cursor (rows as named tuples) of a driver connection, its errors raised as
        SQLAlchemy's: what the service's handlers answer (a 503 for an outage)."""
        try:
            with conn.cursor(row_factory=namedtuple_row) as cursor:
                yield cursor
        except psycopg.Error as exc:
            self.note_error(exc)  # (they bypass the engine's handle_error)
            # (A connection closed at its deadline is broken too.)
            raise _wrapped(exc, broken=conn.broken or conn.closed) from exc

    def _driver_connections(self) -> DriverConnections:
        pool = self._driver_pool
        if pool is None:
            with self._driver_pool_lock:
                if self._driver_pool is None:
                    # As many as the pool size: the event loop runs one statement at a
                    # time, and besides it only the proposer and the upkeep use them.
                    self._driver_pool = DriverConnections(
                        self._connect_driver, keep=self.pool_size, limit=self.pool_size
                    )
                pool = self._driver_pool
        return pool

    def _loop_connections(self, lock_timeout_ms: int) -> DriverConnections:
        """The event loop's own driver connection whose statements wait for a lock at most
        `lock_timeout_ms`: it runs one statement at a time, so one is kept, and none more
        (never waited for: should a statement ever run inside another's, a TimeoutError, a
        503, rather than the loop held)."""
        pool = self._loop_pools.get(lock_timeout_ms)
        if pool is None:
            with self._driver_pool_lock:
                pool = self._loop_pools.get(lock_timeout_ms)
                if pool is None:
                    connect = functools.partial(self._connect_loop_driver, lock_timeout_ms)
                    pool = self._loop_pools[lock_timeout_ms] = DriverConnections(
                        connect, keep=1, limit=1, timeout_s=0.0
                    )
        return pool

    def _connect_loop_driver(self, lock_timeout_ms: int) -> psycopg.Connection:
        conn = self._connect_driver()
        try:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", [str(lock_timeout_ms)])
        except BaseException:
            conn.close()
            raise
        return conn

    def listener_conninfo(self) -> str:
        """The engine's connection parameters (the dialect's, as `_connect_driver` takes
        them) as one libpq conninfo string, for the LISTEN connection (service/wakeup.py).
        The URL re-rendered was not the same connection: a password or database name with a
        space made a conninfo libpq refuses (the listener thread died, printing the
        password), and %20 in a query value came back as +."""
        cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
        # (Less the dialect's psycopg arguments that are no libpq parameter: `context`, its
        # adapters; the listener reads notifications' text only.)
        libpq = {k: v for k, v in cparams.items() if isinstance(v, str | int)}
        return make_conninfo(*cargs, **libpq)

    def _connect_driver(self) -> psycopg.Connection:
        """A connection as the engine's (the dialect's arguments: its adapters too), in
        autocommit."""
        cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
        # As the engine's (make_engine).
        cparams.update(libpq_defaults(cparams, connect_timeout_within(self.deadline_s)))
        return deadline_connect(
            *cargs,
            deadline_s=self.deadline_s,
            on_deadline=self._missed_deadline,
            **cparams,
            autocommit=True,
        )

    def now(self) -> ColumnElement[dt.datetime]:
        """The database's current time, as a SQL expression.

        PostgreSQL: the statement's start, not now() (the transaction's start). A lease
        transaction that began before another reclaimed an expired lease, and claims the
        requeued job after it, must be stamped after that lease ended and run its full TTL;
        its claim statement can only see the job once the reclaim committed."""
        return database_now(self.is_sqlite)

    def now_plus(self, seconds: float) -> ColumnElement[dt.datetime]:
        """The database's time plus a number of seconds, as a SQL expression."""
        return database_now_plus(self.is_sqlite, seconds)

    def dispose(self) -> None:
        for pool in (self._driver_pool, *self._loop_pools.values()):
            if pool is not None:
                pool.close()
        self.engine.dispose()
