"""How the CLI reports failures: one line on stderr and a documented exit code.

Exit 2: the user's input is wrong (bad sizes, unknown GPU, malformed file).
Exit 1: the operation failed for another reason (service down, measurement failed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import typer

from pipetune.clients.cli.environment import DEBUG_ENV
from pipetune.model.hardware import UNKNOWN_GPU, HardwareError
from pipetune.model.space import ScheduleError
from pipetune.model.workloads import WorkloadError

USAGE_ERRORS: tuple[type[Exception], ...] = (WorkloadError, HardwareError, ScheduleError)


class CliError(Exception):
    """A failure to report as one line with the given exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def one_line(text: object) -> str:
    """Text as one line: other libraries' messages (tarfile, Alembic, NVRTC, zlib) wrap."""
    return " ".join(str(text).split())


def runner_failure(exc: Exception) -> CliError:
    """A runner's error as a CliError: exit 2 where it says its user set it up wrongly (the
    runner errors that are also ValueErrors: a malformed setting, a dataset of another
    workload), exit 1 where it could not run (no GPU, the measurement failed)."""
    return CliError(one_line(exc), 2 if isinstance(exc, ValueError) else 1)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job's time limit, `kill`, a container's stop) while a command waits."""


SIGTERM_EXIT = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated, a KeyboardInterrupt: a wait that says
    on Ctrl-C what goes on without it says so on SIGTERM too (it ended without a word, killed
    by the signal). Only the first signal (SIGTERM or Ctrl-C) interrupts: later ones, until
    the block ends, are ignored, so the message the block's own handler says is said whole
    (`timeout` sends SIGTERM to the process and again to its group; the second signal killed
    the command silently, or a second Ctrl-C cut the message off). The caller says it inside
    the block. The main thread only, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def interrupt(signum: int, frame: object) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def interrupted(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What ended a wait, in words, and the exit code: Ctrl-C 130, SIGTERM 143."""
    return ("terminated", SIGTERM_EXIT) if isinstance(exc, Terminated) else ("interrupted", 130)


def fail(message: str, code: int) -> NoReturn:
    print(f"error: {one_line(message)}", file=sys.stderr)
    raise typer.Exit(code)


def reported(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn known errors into one-line messages and exit codes instead of tracebacks."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except USAGE_ERRORS as exc:
            message = str(exc)
            if isinstance(exc, HardwareError) and message.startswith(UNKNOWN_GPU):
                # Every command names its GPU with --gpu (--prior-gpu's own check says its
                # name): the one line names the option, as every other usage error does.
                message = f"--gpu: {message}"
            fail(message, 2)
        except CliError as exc:
            fail(str(exc), exc.code)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            # stdout's reader left (`| true`, a consumer that failed): click ends the command
            # without a word, exit 1, as where rich met it first; not "error: BrokenPipeError".
            raise
        except Exception as exc:
            if os.environ.get(DEBUG_ENV):
                traceback.print_exc()
            fail(f"{_in_words(exc)} (set {DEBUG_ENV}=1 for the traceback)", 1)

    return wrapper


def _in_words(exc: Exception) -> str:
    """An unexpected error in one line. A database's error without its statement and
    parameters (SQLAlchemy's str() has both: a screenful of SQL, and values such as a
    worker's token hash), and a corrupt database named as such with what to do."""
    if not type(exc).__module__.startswith("sqlalchemy"):
        return f"{type(exc).__name__}: {exc}"
    from pipetune.service.db import is_corrupt, unavailable_reason  # (only where one failed)

    reason = unavailable_reason(exc)
    if is_corrupt(exc):
        return f"the database is corrupt ({reason}): restore it from a backup"
    return f"the database failed: {reason}"
