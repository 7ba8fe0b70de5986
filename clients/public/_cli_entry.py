"""The `pipetune` command's entry point: the console script and `python -m pipetune.clients.cli`.

The command's imports (the SDK, typer, the model, the workers' modules) take a second or
more. Ctrl-C there printed a screen of KeyboardInterrupt traceback, and SIGTERM ended the
command without a word, where later the command says one line and exits 130 or 143
(errors.interrupted). Here, before those imports, SIGINT and SIGTERM end it with one line and
that exit code; the command then runs with the handlers from before. This module lives in
the top `pipetune` package, not under clients/, because importing anything under
pipetune.clients loads the SDK first; stdlib only, so nothing precedes the handlers but the
interpreter's start and `import pipetune` (the version). (`python -m pipetune.clients.cli`
imports that package, and so the SDK, before its `__main__` comes here: a signal then, the
first half second, is Python's to report.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import NoReturn

_HANDLED = (signal.SIGINT, signal.SIGTERM)
# What errors.interrupted says for each (that module is among the imports this guards).
_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _end_while_loading(signum: int, frame: object) -> None:
    """One line and the exit at once, 128 + the signal (130; 143), as a shell reports a
    process the signal ended. Not by raising KeyboardInterrupt: raised in an import it is a
    traceback, and raised where CPython runs a weakref callback it is ignored and lost.
    Nothing has run yet, so there is nothing to stop or flush."""
    for sig in _HANDLED:  # a second signal does not say the line again
        signal.signal(sig, signal.SIG_IGN)
    _say_and_exit(signum)


def _say_and_exit(signum: int, what: str = ": the command did not start") -> NoReturn:
    """The one line (where stderr can take it: a closed pipe is no reason for a traceback)
    and the exit, 128 + the signal."""
    with contextlib.suppress(OSError):
        os.write(2, f"{_WORDS[signal.Signals(signum)]}{what}\n".encode())
    os._exit(128 + signum)


@contextlib.contextmanager
def _signals_end_loading() -> Iterator[None]:
    """_end_while_loading for SIGINT and SIGTERM while the block runs, then the handlers from
    before again (a later Ctrl-C is the command's to handle). The main thread only, where
    Python runs signal handlers and where signal.signal may be called."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal ignored where the command was started (`cmd &` in a script, a supervisor's
    # choice) stays ignored: the command did not end on it before either.
    previous = {
        sig: signal.signal(sig, _end_while_loading)
        for sig in _HANDLED
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run() -> None:
    """Load the command, a signal meanwhile said in one line, then run it."""
    try:
        with _signals_end_loading():
            from pipetune.clients.cli import main
        main.run()
    except KeyboardInterrupt as exc:
        # Outside typer's own handling: as the loading handler gives way to Python's, while
        # typer builds the command (a tenth of a second), or a second signal while a command
        # ends. Said in its word alone: the command may have run.
        signum = signal.SIGTERM if type(exc).__name__ == "Terminated" else signal.SIGINT
        _say_and_exit(signum, "")
