"""Run functions in a persistent child process, so that a crash or a hang kills only it.

:class:`IsolatedWorker` keeps one ``spawn`` child (a fresh interpreter: no inherited CUDA
context, which ``fork`` would corrupt) that runs picklable functions sent over a pipe, one
call at a time, each with a timeout. The child is reused call after call (setting up CUDA
and the workload's buffers costs seconds; a trial milliseconds) and replaced only when it
died, overran its timeout, or the caller asks (after a CUDA error, which poisons the
context for good).

Each call returns a :class:`CallOutcome`:

- ``ok``: the function returned; ``value`` is its result;
- ``error``: the function raised; the child is still alive; ``error`` says what;
- ``crashed``: the child died during the call (a segfault, ``os._exit``, the OOM killer);
- ``timeout``: no answer within the timeout; the child was killed.

The next call after a crash or a timeout starts a fresh child (``generation`` counts them).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from types import TracebackType
from typing import Any, Literal, Self

from pipetune.model.errors import PipetuneError

OutcomeKind = Literal["ok", "error", "crashed", "timeout"]
PARENT_GONE_EXIT = 70  # the child's exit code when it ended because its parent died


class WorkerStartError(PipetuneError, RuntimeError):
    """The child could not be started or its initializer failed."""


@dataclass(frozen=True)
class CallOutcome:
    kind: OutcomeKind
    value: Any = None
    error: str | None = None
    exitcode: int | None = None
    elapsed_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _exit_with_parent() -> None:
    """In the child, a thread's body: end the process as soon as the parent is gone.

    ``daemon=True`` stops the child only at the parent's orderly exit, and a child waiting in
    ``recv()`` ends on its own at EOF; a child in a call that never returns (a hung kernel, a
    simulated hang) did not: a worker killed with SIGKILL left it running, re-parented to
    init, with its resource tracker and its GPU, for as long as the hang lasted. The parent
    process's sentinel (the spawn pipe's other end, closed only when the parent dies) wakes
    this thread."""
    parent = mp.parent_process()
    if parent is None:  # (not a multiprocessing child)
        return
    parent.join()
    os._exit(PARENT_GONE_EXIT)


# What a terminal's Ctrl-C and a service manager's stop send to a whole process group.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def _child_main(
    conn: Connection, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]
) -> None:
    threading.Thread(target=_exit_with_parent, name="pipetune-parent-watch", daemon=True).start()
    # The parent decides when the child stops (a message, or SIGKILL past a timeout). A
    # Ctrl-C, or a service manager's SIGTERM to the whole process group, reached the child
    # too and killed the trial in flight, which was then reported as a runtime error while
    # the parent drained its jobs in hand.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Blocked by the parent from before the spawn (IsolatedWorker.start): one that came
    # while the interpreter started is discarded now that it is ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        info = initializer(*initargs) if initializer is not None else None
    except BaseException as exc:
        conn.send(("init_error", _describe(exc), traceback.format_exc()))
        return
    conn.send(("ready", info))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message is None:
            return  # orderly shutdown
        fn, args, kwargs = message
        try:
            reply: tuple = ("ok", fn(*args, **kwargs))
        except Exception as exc:
            reply = ("error", _describe(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # the result would not pickle
            conn.send(("error", f"result could not be sent back: {_describe(exc)}"))


class IsolatedWorker:
    """One persistent spawn child that runs calls with timeouts (see the module doc)."""

    def __init__(
        self,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        start_timeout_s: float = 120.0,
        name: str = "pipetune-isolated",
    ):
        self._ctx = mp.get_context("spawn")
        self._initializer = initializer
        self._initargs = initargs
        self.start_timeout_s = start_timeout_s
        self.name = name
        self._process: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self.generation = 0  # how many children have been started
        self.info: Any = None  # what the initializer of the current child returned
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> Any:
        """Start a child if none is alive; returns the initializer's result."""
        if self._closed:
            raise WorkerStartError("the worker is closed")
        if self.alive:
            return self.info
        self._discard()
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_child_main,
            args=(child_end, self._initializer, self._initargs),
            name=self.name,
            daemon=True,  # never outlive the parent
        )
        # The child ignores Ctrl-C and SIGTERM once _child_main runs, but spawn re-imports
        # the main module first (the pipetune CLI: about a second): a signal to the process
        # group then killed it, and a good schedule was reported as a runtime error. Blocked
        # in this thread around the spawn, they stay blocked in the child (a signal mask
        # survives fork and exec) until it ignores them; here they are delivered after.
        # (The resource tracker first: started inside, it unblocks them itself before the
        # spawn, in this thread, and the first child of a process was left unguarded.)
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_end.close()  # the parent keeps one end, so EOF means the child is gone
        self._process, self._conn = process, parent_end
        self.generation += 1
        ready = wait([parent_end, process.sentinel], self.start_timeout_s)
        try:
            message = parent_end.recv() if parent_end in ready else None
        except (EOFError, OSError):
            message = None
        if message is None or message[0] != "ready":
            process.join(1)
            exitcode = process.exitcode
            self._kill()
            if message is not None:
                raise WorkerStartError(message[1])
            if not ready:
                raise WorkerStartError(f"the child did not start within {self.start_timeout_s} s")
            raise WorkerStartError(f"the child died while starting ({describe_exit(exitcode)})")
        self.info = message[1]
        return self.info

    def call(
        self, fn: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any
    ) -> CallOutcome:
        """Run fn(*args, **kwargs) in the child; see CallOutcome for what comes back."""
        self.start()
        assert self._conn is not None and self._process is not None
        started = time.perf_counter()
        try:
            self._conn.send((fn, args, kwargs))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return self._crashed(started)
        ready = wait([self._conn, self._process.sentinel], timeout_s)
        if self._conn in ready:
            try:
                kind, *payload = self._conn.recv()
            except (EOFError, OSError):
                return self._crashed(started)
            elapsed = time.perf_counter() - started
            if kind == "ok":
                return CallOutcome("ok", value=payload[0], elapsed_s=elapsed)
            return CallOutcome("error", error=payload[0], elapsed_s=elapsed)
        if ready:  # only the sentinel: the child died without answering
            return self._crashed(started)
        self._kill()
        return CallOutcome(
            "timeout",
            error=f"no answer within {timeout_s:g} s; the child process was killed",
            elapsed_s=time.perf_counter() - started,
        )

    def _crashed(self, started: float) -> CallOutcome:
        assert self._process is not None
        self._process.join(5)
        exitcode = self._process.exitcode
        self._discard()
        return CallOutcome(
            "crashed",
            error=f"the child process died ({describe_exit(exitcode)})",
            exitcode=exitcode,
            elapsed_s=time.perf_counter() - started,
        )

    def restart(self) -> Any:
        """Replace the child now (after a CUDA error has poisoned its context)."""
        self.stop()
        return self.start()

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(10)
        self._discard()

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._process is not None and not self._process.is_alive():
            self._process.close()
        self._process, self._conn, self.info = None, None, None

    def stop(self) -> None:
        """Ask the child to exit (kill it if it does not); the next call starts a new one."""
        if self._process is not None and self._process.is_alive() and self._conn is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):
                self._conn.send(None)
            self._process.join(5)
        self._kill()

    def close(self) -> None:
        self.stop()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        with contextlib.suppress(Exception):
            self.stop()
