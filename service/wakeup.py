"""Wake-ups for lease requests that found no job, so that nobody polls an idle queue.

A lease request that finds nothing waits on a `Wakeup` until jobs of its kind are enqueued
(a task created or advanced, expired leases requeued), then claims again; a slow fallback
poll (`PIPETUNE_LEASE_POLL_S`) bounds how long a missed signal can keep a job waiting. The
signal names what was enqueued: the arch, the GPU and how many jobs, so that it wakes at
most that many waiting requests, and only those whose worker may take them (its arch and
GPU: a worker measures for its own GPU only).

Within one replica the driver and the queue signal directly. Across replicas the signal
travels as a PostgreSQL NOTIFY on the service's channel (`channel_of` its schema), sent in
the transaction that enqueued the jobs (delivered when it commits), and every replica
LISTENs (`listen`). A replica also remembers, per kind of worker, that the queue was empty
and that no signal came since: the next request of that kind skips the claim until then
(or until the fallback interval passes), which makes an idle fleet's requests cost no
database work. It trusts that memory only while it hears the other replicas (its listener
is connected), or when there are none to hear (SQLite: one process serves the database).

The same channel carries four more messages. Two are the proposer's (service/proposer.py):
`advance_payload`, from a replica that took the last result of a batch for a task whose session
another replica holds, asks that replica to advance it (`on_advance`); `held_payload` is the
holder's answer, so the asker does not adopt the task (`on_held`). The third,
`worker_payload`, sent in the transaction that re-registers a worker, tells the other replicas
to forget what they cached of it (`on_worker`, service/queue.py). The fourth,
`stopping_payload`, says that a worker is stopping (`POST /v1/workers/{id}/stopping`): every
replica answers that worker's waiting lease requests empty at once, and its later ones for
STOPPING_MEMORY_S (or until it registers again), so that no job is leased into a poll whose
worker will not read the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Select, func, select

from pipetune.service.db import Database, deadline_connect, libpq_defaults

log = logging.getLogger(__name__)

CHANNEL = "pipetune_jobs"  # the channel of a service whose tables are in schema public
RECONNECT_S = (0.5, 10.0)  # the listener's first and longest wait between connection tries
LISTEN_TICK_S = 0.5  # how often the listener looks whether it should stop
MAX_EMPTY_KINDS = 1024  # memories of an empty queue kept, one per kind of worker
# How long a worker that said it stops is answered no jobs (unless it registers again): longer
# than any lease request sent before its notice can take to arrive, and bounded so that a
# client that said so and went on leasing is not refused for good.
STOPPING_MEMORY_S = 60.0
MAX_STOPPING = 4096  # stopping workers remembered at once (the oldest are forgotten first)


@dataclass(frozen=True)
class WorkerKind:
    """Which jobs a worker may take: its arch and its GPU's. Not any GPU of the arch: an H100
    and an H200 are both sm_90, and one's timings recorded as the other's are wrong data."""

    arch: str
    gpu: str
    # One workload's jobs only (a replay worker), and its runner kind (a task may be for one
    # runner). Signals name the runner their jobs are for, not the workload: a bound worker
    # is woken by any job of its arch, GPU and runner, and its claim finds whether one is
    # its; the memory of an empty queue is per kind.
    workload_hash: str | None = None
    runner: str | None = None

    def takes(self, arch: str, gpu: str, runner: str | None = None) -> bool:
        """Whether jobs of (arch, gpu) for `runner` (None: any runner) may be this kind's.
        The runner counts: a cupy-only task's signal woke simulated workers, which found
        nothing, and the GPU worker waited for the fallback poll (5 s a batch)."""
        return arch == self.arch and gpu == self.gpu and (runner is None or runner == self.runner)


@dataclass(frozen=True)
class Woken:
    """Why a waiting request was woken: jobs for workers of `runner` (None: any) were
    enqueued; or, `jobs` False, none were announced, but it should claim again (the listener
    connected again: what the other replicas enqueued meanwhile was not heard). `count`: how
    many of the announced jobs the signal woke it for, which no other waiting request was
    woken for (none for a bound worker: it uses up none); a request that leaves before it
    claims passes them on (Queue.lease)."""

    runner: str | None = None
    jobs: bool = True
    count: int = 0


RECHECK = Woken(jobs=False)


class Wakeup:
    """Waiting lease requests (futures on the service's event loop) and the signals that
    wake them. `signal` may be called from any thread; `wait` runs on the event loop."""

    def __init__(self, shared: bool, channel: str = CHANNEL) -> None:
        # shared: other processes enqueue jobs too (PostgreSQL); their signals arrive only
        # through the listener, so the memory of an empty queue needs it connected.
        self.shared = shared
        self.channel = channel  # (channel_of: this service's schema's)
        self.origin = uuid.uuid4().hex  # this replica's NOTIFYs, which its listener skips
        self.listening = False
        # Counts the listener's connections: what a replica remembers while it listens it may
        # trust only within the connection it heard through (a message may be lost between).
        self.epoch = 0
        # Bumped by every signal (next() of a count is atomic: signals come from threads).
        self._generations = itertools.count(1)
        self.generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        # Each waiting request: its worker's kind, how many jobs it asks for, and its worker.
        self._waiters: OrderedDict[
            asyncio.Future[Woken | None], tuple[WorkerKind, int, int | None]
        ] = OrderedDict()
        # Workers that said they stop: worker id -> when it was heard (time.monotonic()).
        self._stopping: OrderedDict[int, float] = OrderedDict()
        self._stopping_lock = threading.Lock()  # (the listener's thread and the loop's write)
        self._empty: dict[WorkerKind, tuple[int, float]] = {}
        # Signals that woke fewer requests than they had jobs for, by what they announced:
        # (arch, gpu, runner) -> the number of the last such wake-up (`_wakes`). A request
        # claiming off the event loop meanwhile (SQLite, a stalled database) was not waiting,
        # and its claim may have read the queue before those jobs were committed: it looks
        # here (`missed`) before it waits, or the jobs waited out its fallback poll.
        self._wakes = 0
        self._unspent: dict[tuple[str, str, str | None], int] = {}
        self._closed = False
        # Called (from the listener's thread) with a task another replica asks to advance,
        # and with a task another replica says it holds.
        self.on_advance: Callable[[int], None] | None = None
        self.on_held: Callable[[int], None] | None = None
        # Called (from the listener's thread) with a worker another replica re-registered.
        self.on_worker: Callable[[int], None] | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._closed = False

    # ---- signals (any thread) -----------------------------------------------------------

    def signal(self, arch: str, gpu: str, count: int, runner: str | None = None) -> None:
        """`count` jobs for (arch, gpu) were enqueued (and committed), for workers of
        `runner` only (None: any)."""
        self.bump()
        self._call_soon(self._wake, arch, gpu, count, runner)

    def bump(self) -> None:
        """Forget every memory of an empty queue."""
        self.generation = next(self._generations)

    def payload(self, arch: str, gpu: str, count: int, runner: str | None = None) -> str:
        """The NOTIFY payload of a signal (what `listen` turns back into one)."""
        return json.dumps(
            {"origin": self.origin, "arch": arch, "gpu": gpu, "count": count, "runner": runner}
        )

    def advance_payload(self, task_id: int) -> str:
        """The NOTIFY payload asking the replica that holds a task's session to advance it
        (`on_advance` on the others)."""
        return json.dumps({"origin": self.origin, "advance": task_id})

    def held_payload(self, task_id: int) -> str:
        """The answer of a replica that holds the task's session (`on_held` on the others):
        the asker need not adopt the task."""
        return json.dumps({"origin": self.origin, "held": task_id})

    def worker_payload(self, worker_id: int) -> str:
        """The NOTIFY payload of a re-registered worker (`on_worker` on the others)."""
        return json.dumps({"origin": self.origin, "worker": worker_id})

    def stopping_payload(self, worker_id: int) -> str:
        """The NOTIFY payload of a worker that stops (`stop_worker` on the others)."""
        return json.dumps({"origin": self.origin, "stopping": worker_id})

    # ---- stopping workers (any thread) ---------------------------------------------------

    def stop_worker(self, worker_id: int) -> None:
        """The worker stops: its waiting lease requests are answered (they claim nothing,
        Queue.lease), and `stopping` says so for STOPPING_MEMORY_S."""
        with self._stopping_lock:
            self._stopping.pop(worker_id, None)
            self._stopping[worker_id] = time.monotonic()
            while len(self._stopping) > MAX_STOPPING:
                self._stopping.popitem(last=False)
        self._call_soon(self._wake_worker, worker_id)

    def stopping(self, worker_id: int) -> bool:
        """Whether the worker said it stops, less than STOPPING_MEMORY_S ago, and has not
        registered again since."""
        since = self._stopping.get(worker_id)
        return since is not None and time.monotonic() - since < STOPPING_MEMORY_S

    def forget_stopping(self, worker_id: int) -> None:
        """The worker registered again (a restart under its name): it leases again."""
        with self._stopping_lock:
            self._stopping.pop(worker_id, None)

    @property
    def hears_all(self) -> bool:
        """Whether every other replica's message reaches this one: it listens now, or there
        are no others (SQLite)."""
        return not self.shared or self.listening

    def heard_again(self) -> None:
        """The listener is connected (again): what the other replicas enqueued while it was
        not is found by claiming again. Forget every memory of an empty queue (before it is
        trusted again), and wake every waiting request to claim: their jobs' NOTIFY was
        lost, and they slept on until their fallback poll (5 s)."""
        self.epoch += 1
        self.bump()
        self.listening = True
        self._call_soon(self._wake_all, RECHECK)

    def close(self) -> None:
        """Answer every waiting request now, and any later one at once (the service stops)."""
        self._closed = True
        self._call_soon(self._wake_all, None)

    def _call_soon(self, callback: Callable[..., None], *args: object) -> None:
        """Run `callback(*args)` on the event loop (from any thread), if it still runs."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                loop.call_soon_threadsafe(callback, *args)

    # ---- waiting (event loop) -----------------------------------------------------------

    def known_empty(self, kind: WorkerKind, fresh_s: float, new: bool = True) -> bool:
        """Whether the queue held nothing for this kind of worker when last claimed, no
        signal came since, and that was less than `fresh_s` ago; or, for a `new` request,
        requests of this kind are waiting already (a signal wakes them first: the new one
        joins them rather than claim what they will)."""
        if not self.hears_all:
            return False
        if new and any(k == kind for k, _, _ in self._waiters.values()):
            return True
        seen = self._empty.get(kind)
        return (
            seen is not None and seen[0] == self.generation and time.monotonic() - seen[1] < fresh_s
        )

    def found_empty(self, kind: WorkerKind, generation: int) -> None:
        """A claim found nothing; `generation` is the one read before the claim began (a
        signal during the claim then keeps the memory from being trusted)."""
        if len(self._empty) >= MAX_EMPTY_KINDS:
            # Only memories of this generation can be trusted (known_empty): the others go.
            # (One per kind of worker ever seen, bound ones by workload, was kept for good.)
            self._empty = {k: v for k, v in self._empty.items() if v[0] == self.generation}
            if len(self._empty) >= MAX_EMPTY_KINDS:
                self._empty.clear()  # (a memory lost costs one claim)
        self._empty[kind] = (generation, time.monotonic())

    async def wait(self, kind: WorkerKind, timeout_s: float, wants: int = 1) -> bool:
        """Until a signal for this kind of worker, or `timeout_s`; True when signalled."""
        return await self.woken(kind, timeout_s, wants) is not None

    async def woken(
        self, kind: WorkerKind, timeout_s: float, wants: int = 1, worker_id: int | None = None
    ) -> Woken | None:
        """`wait`, answering what woke the request (None: the timeout, or the service stops).
        `wants`: the jobs the request asks for (a signal of n jobs wakes requests that ask
        for n between them, not every waiting one). `worker_id`: the worker that waits,
        whose `stop_worker` wakes it (RECHECK)."""
        if self._closed or timeout_s <= 0:
            return None
        future: asyncio.Future[Woken | None] = asyncio.get_running_loop().create_future()
        self._waiters[future] = (kind, wants, worker_id)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return None
        finally:
            self._waiters.pop(future, None)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def wakes(self) -> int:
        """A mark to pass to `missed` (event loop)."""
        return self._wakes

    def missed(self, kind: WorkerKind, since: int) -> bool:
        """Whether, since the mark `since`, a signal for this kind of worker came with jobs
        left over for no waiting request (event loop)."""
        return since < self._wakes and any(
            at > since and kind.takes(*announced) for announced, at in self._unspent.items()
        )

    def _wake(self, arch: str, gpu: str, count: int, runner: str | None = None) -> None:
        woken = 0  # jobs the woken requests ask for
        for future, (kind, wants, _) in list(self._waiters.items()):
            if woken >= count:
                break
            if not future.done() and kind.takes(arch, gpu, runner):
                # A bound worker (one workload's jobs) is woken by any job of its kind, and
                # its claim may find none of these: counted, it used up a signal of one job,
                # and the unbound worker behind it waited for the fallback poll (4.5 s).
                counted = min(wants, count - woken) if kind.workload_hash is None else 0
                future.set_result(Woken(runner, count=counted))
                del self._waiters[future]
                woken += counted
        if woken < count:  # jobs for requests that were not waiting (claiming, say)
            self._wakes += 1
            if len(self._unspent) >= MAX_EMPTY_KINDS:
                self._unspent.clear()  # (what a request then misses waits for its poll)
            self._unspent[(arch, gpu, runner)] = self._wakes

    def _wake_worker(self, worker_id: int) -> None:
        """Wake the worker's waiting requests to look again (and find it stopping)."""
        for future, (_, _, waiter) in list(self._waiters.items()):
            if waiter == worker_id and not future.done():
                future.set_result(RECHECK)
                del self._waiters[future]

    def _wake_all(self, woken: Woken | None) -> None:
        """Answer every waiting request: `woken`, to claim again; None, to stop."""
        for future in list(self._waiters):
            if not future.done():
                future.set_result(woken)
        self._waiters.clear()

    # ---- across replicas (PostgreSQL) ---------------------------------------------------

    def deliver(self, payload: str) -> None:
        """A NOTIFY received from the channel: a signal, unless this replica sent it."""
        try:
            message = json.loads(payload)
            if message["origin"] == self.origin:
                return
            hooks = (
                ("advance", self.on_advance),
                ("held", self.on_held),
                ("worker", self.on_worker),
            )
            if "stopping" in message:
                self.stop_worker(int(message["stopping"]))
                return
            for key, hook in hooks:
                if key in message:
                    if hook is not None:
                        hook(int(message[key]))
                    return
            runner = message.get("runner")  # (absent from an older replica's: any runner)
            self.signal(
                str(message["arch"]),
                str(message["gpu"]),
                int(message["count"]),
                None if runner is None else str(runner),
            )
        # Anything may be sent on the channel, by any session of the database: what a bad
        # message raises must not reach the listener, whose thread it ended (for good: the
        # replica then heard no other). A number past an integer's range (1e999 is JSON's
        # infinity) raises OverflowError; nesting too deep to parse, RecursionError.
        except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
            log.warning("ignored a malformed %s notification", self.channel)


def channel_of(schema: str) -> str:
    """The NOTIFY channel of the service whose tables are in `schema` (PostgreSQL's
    current_schema()). A channel is the database's, not a schema's: two services that share
    a database in schemas of their own (a search_path in the URL) shared one channel, and
    each obeyed the other's messages: a worker of one that said it stops was answered no
    jobs in the other, where a worker had the same id. Schema public keeps the name earlier
    releases listen on (their replicas beside these during an upgrade hear them); another
    schema's is named by a digest of its name (a channel name has at most 63 bytes)."""
    if schema == "public":
        return CHANNEL
    return f"{CHANNEL}_{hashlib.sha256(schema.encode()).hexdigest()[:16]}"


CURRENT_SCHEMA_SQL = "SELECT current_schema()"


def service_channel(db: Database) -> str:
    """The channel of the service on `db` (CHANNEL on SQLite, which has no channels)."""
    if db.is_sqlite:
        return CHANNEL
    with db.driver_statement() as cur:
        cur.execute(CURRENT_SCHEMA_SQL)
        (schema,) = cur.fetchone()
    return channel_of(schema)


def listen_statement(channel: str) -> sql.Composed:
    """LISTEN on `channel`: an identifier, which no statement parameter can stand for, so
    quoted by psycopg.sql's Identifier (no string is formatted into the statement)."""
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


# A message sent on its own (an advance request, a holder's answer), not in a transaction that
# enqueues jobs: one statement through the driver in autocommit (Database.driver_statement),
# one round trip where a transaction of its own takes three (BEGIN, the NOTIFY, COMMIT).
NOTIFY_SQL = "SELECT pg_notify(%(channel)s, %(payload)s)"


def notify_replicas(db: Database, channel: str, payload: str) -> None:
    """Send a message to the other replicas on its own (PostgreSQL NOTIFY, one autocommit
    statement; with one process on SQLite there is nobody to tell)."""
    if db.is_sqlite:
        return
    with db.driver_statement() as cur:
        cur.execute(NOTIFY_SQL, {"channel": channel, "payload": payload})


def notify_statement(channel: str, payload: str) -> Select:
    """The NOTIFY that carries a signal to the other replicas (sent in the transaction that
    enqueued the jobs: PostgreSQL delivers it when that transaction commits)."""
    return select(func.pg_notify(channel, payload))


def listen(
    wakeup: Wakeup, conninfo: str, stop: threading.Event, deadline_s: float | None = None
) -> None:
    """LISTEN on the channel and deliver what arrives, reconnecting after any failure, until
    `stop` (a thread's body: psycopg waits in select(), outside the GIL). While it is not
    connected `wakeup.listening` is False and requests fall back to claiming and polling.
    `deadline_s`: the LISTEN's deadline (service/db.py, DeadlineConnection); waiting for
    notifications has its own tick."""
    wait_s = RECONNECT_S[0]
    # A listener whose server's host vanished would otherwise wait on in select() for hours,
    # its replica hearing nothing and trusting its caches (service/db.py, TCP_LIVENESS).
    liveness = libpq_defaults(conninfo_to_dict(conninfo), connect_timeout=5)
    while not stop.is_set():
        try:
            with deadline_connect(
                conninfo, deadline_s=deadline_s, autocommit=True, **liveness
            ) as conn:
                conn.execute(listen_statement(wakeup.channel))
                wakeup.heard_again()
                wait_s = RECONNECT_S[0]
                while not stop.is_set():
                    for note in conn.notifies(timeout=LISTEN_TICK_S):
                        wakeup.deliver(note.payload)
        except psycopg.Error as exc:
            if not stop.is_set():
                log.warning("%s listener: %s; reconnecting", wakeup.channel, type(exc).__name__)
        finally:
            wakeup.listening = False
        stop.wait(wait_s)
        wait_s = min(2 * wait_s, RECONNECT_S[1])
