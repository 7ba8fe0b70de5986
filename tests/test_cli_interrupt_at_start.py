"""Ctrl-C or SIGTERM while the `pipetune` command is still loading (its imports take a second
or more) ends it with one line and exit 130 or 143, as the command does later (a wait's
"interrupted: ..."), not a KeyboardInterrupt traceback (Ctrl-C) or no word at all (SIGTERM).

The signal reaches a real `pipetune` process while it is known to be importing, every run:
Python's import profiler (PYTHONPROFILEIMPORTTIME) writes a line to stderr as each module is
loaded, and stderr is a pipe of one page that the test stops reading at a chosen module. The
command can then load only as many more modules as a page of lines holds before its next
write waits, well short of the end of its imports; the signal is sent, the test reads on,
and the command meets the signal in the middle of loading.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipetune import _cli_entry
from pipetune.clients.cli import main

CONSOLE_SCRIPT = [str(Path(sys.executable).with_name("pipetune")), "--version"]
MODULE = [sys.executable, "-m", "pipetune.clients.cli", "--version"]
IMPORT_LINE = b"import time:"
PAGE = 4096  # the smallest pipe Linux makes: some 50 profiler lines
LIMIT_S = 120  # a hung command is killed after this (a loaded machine is slow, not stuck)

SIGNALS = pytest.mark.parametrize(
    ("sig", "code", "line"),
    [
        (signal.SIGINT, 130, "interrupted: the command did not start"),
        (signal.SIGTERM, 143, "terminated: the command did not start"),
    ],
    ids=["SIGINT", "SIGTERM"],
)


def _imported(line: bytes) -> str | None:
    """The module an import-profiler line names ("import time: 12 | 34 | name")."""
    if not line.startswith(IMPORT_LINE):
        return None
    return line.rsplit(b"|", 1)[-1].strip().decode()


def _one_page_pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PAGE)
    return read_end, write_end


def _ignoring(sig: int) -> Callable[[], None]:
    """A child's set-up that starts it with `sig` ignored (as `cmd &` in a script does)."""
    return lambda: signal.signal(sig, signal.SIG_IGN)


def _signal_while_loading(
    argv: list[str], sig: int, loading: str, ignored: int | None = None
) -> tuple[int, str, list[str]]:
    """Start the command (with the signal `ignored` ignored, where given), send `sig` once the
    module `loading` is imported (the command a page of stderr further at most), and return
    its exit code, stdout, and stderr without the profiler's lines."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    read_end, write_end = _one_page_pipe()
    command = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=write_end,
        env={**environ, "PYTHONPROFILEIMPORTTIME": "1"},
        preexec_fn=None if ignored is None else _ignoring(ignored),
    )
    os.close(write_end)
    watchdog = threading.Timer(LIMIT_S, command.kill)
    watchdog.start()
    try:
        with open(read_end, "rb", buffering=0) as stderr:  # (unbuffered: no read-ahead)
            lines = []
            while (line := stderr.readline()) and _imported(line) != loading:
                lines.append(line)
            assert line, f"{argv} never imported {loading}: {b''.join(lines)[-2000:]!r}"
            command.send_signal(sig)
            lines.extend(stderr.read().splitlines(keepends=True))
        out, _ = command.communicate(timeout=LIMIT_S)
    finally:
        watchdog.cancel()
    said = [line.decode().rstrip("\n") for line in lines if not line.startswith(IMPORT_LINE)]
    return command.returncode, out.decode(), said


@SIGNALS
@pytest.mark.parametrize("loading", ["httpx", "pipetune.clients.cli.service_cmds"])
def test_a_signal_while_the_console_script_loads_says_one_line(sig, code, line, loading):
    """httpx: the SDK's client, early among the command's imports; service_cmds: one of the
    command's own modules, late among them."""
    assert _signal_while_loading(CONSOLE_SCRIPT, sig, loading) == (code, "", [line])


@SIGNALS
@pytest.mark.parametrize("loading", ["typer", "pipetune.clients.cli.service_cmds"])
def test_a_signal_while_python_m_loads_the_command_says_one_line(sig, code, line, loading):
    """`python -m pipetune.clients.cli` imports its package (and so the SDK) before its
    `__main__` runs: typer is the first of the command's own imports after that."""
    assert _signal_while_loading(MODULE, sig, loading) == (code, "", [line])


def test_the_command_runs_with_the_handlers_from_before(monkeypatch):
    """Once loaded, the command meets a signal as it always did: its waits turn Ctrl-C into
    their own message (a KeyboardInterrupt), which the loading handler would cut short."""
    running_with: list[object] = []

    def record_handlers() -> None:
        running_with.extend(signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM))

    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    monkeypatch.setattr(main, "run", record_handlers)
    _cli_entry.run()
    assert running_with == before
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before


@SIGNALS
def test_a_signal_ignored_where_the_command_started_stays_ignored(sig, code, line):
    """`pipetune worker &` in a script starts with SIGINT ignored: a Ctrl-C at the terminal
    never ended it, nor does one while it loads (the loading handler is not installed)."""
    returncode, out, said = _signal_while_loading(CONSOLE_SCRIPT, sig, "httpx", ignored=sig)
    assert (returncode, said) == (0, []) and out.startswith("pipetune "), (returncode, out, said)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry's os._exit as a SystemExit with its code, in this process."""

    def exit_code(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(_cli_entry.os, "_exit", exit_code)


def test_ctrl_c_before_the_commands_own_handling_says_one_line(monkeypatch, capfd, exits):
    """Typer builds the command (a tenth of a second) before its own handling of Ctrl-C
    begins: a KeyboardInterrupt there is said in one line, its word alone (a second signal
    while a command ends reaches the same place, after the command ran)."""

    def interrupted_while_building() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(main, "run", interrupted_while_building)
    with pytest.raises(SystemExit) as ended:
        _cli_entry.run()
    assert ended.value.code == 130
    assert capfd.readouterr().err == "interrupted\n"


def test_ctrl_c_as_the_loading_handler_gives_way_says_one_line(monkeypatch, capfd, exits):
    """A SIGINT just after Python's handler is back, as the loading block ends, is raised
    there, before the command runs: it was a traceback."""

    @contextlib.contextmanager
    def interrupted_as_it_ends() -> Iterator[None]:
        yield
        raise KeyboardInterrupt

    monkeypatch.setattr(_cli_entry, "_signals_end_loading", interrupted_as_it_ends)
    with pytest.raises(SystemExit) as ended:
        _cli_entry.run()
    assert ended.value.code == 130
    assert capfd.readouterr().err == "interrupted\n"
