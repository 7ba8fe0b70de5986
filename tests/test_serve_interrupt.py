"""Ctrl-C while `pipetune serve` is still starting stops it with one line and exit 130.

Before uvicorn takes the signals, a KeyboardInterrupt raised where CPython was running a
weakref callback (SQLAlchemy makes many) was printed as "Exception ignored" and lost: the
service started anyway (elsewhere in serve's preparation it ended with exit 130 and no
word). In uvicorn's own start (its lifespan, the bind) serve stopped with exit 0 and no
word, as though it had served. The signal is sent at each of these moments by the command
itself (a patched step of its start), so each case is met every run, not by a race with a
timer. After the service says it serves, a signal is a clean stop, exit 0
(test_service_cli.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import uvicorn
from typer.testing import CliRunner

from pipetune.clients.cli.main import app

# `pipetune serve` in a child process (its exit is os._exit), whose preparation sends it
# SIGINT from inside a weakref callback, where an exception is ignored.
DRIVER = """
import signal, sys, weakref
from pipetune.clients.cli import service_cmds
from pipetune.clients.cli.main import app

check_profiles = service_cmds._check_profiles

class Collected:
    pass

def prepare():
    gone = Collected()
    ref = weakref.ref(gone, lambda _: signal.raise_signal(signal.SIGINT))
    del gone
    check_profiles()

service_cmds._check_profiles = prepare
app(["serve", "--db", sys.argv[1], "--port", "0", "--log-level", "warning"])
"""


def test_ctrl_c_in_a_weakref_callback_while_serve_prepares_is_not_lost(tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    run = subprocess.Popen(
        [sys.executable, "-c", DRIVER, f"sqlite:///{tmp_path / 'srv.db'}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, "XDG_DATA_HOME": str(tmp_path)},
    )
    try:
        out, err = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # the interrupt was lost: it serves on
        run.kill()
        out, err = run.communicate()
        pytest.fail(f"still serving after Ctrl-C; stdout {out!r}, stderr {err!r}")
    assert (run.returncode, err) == (130, "interrupted: the service did not start\n"), out
    assert "pipetune service on" not in out


@pytest.mark.parametrize(
    ("sig", "code", "word"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_signal_in_uvicorns_start_is_said_and_not_exit_0(tmp_path, monkeypatch, sig, code, word):
    """(In this process: uvicorn's own handler takes the signal here, and it raises
    nothing.)"""
    startup = uvicorn.Server.startup

    async def signalled_start(self, sockets=None):  # type: ignore[no-untyped-def]
        signal.raise_signal(sig)
        await startup(self, sockets)

    monkeypatch.setattr(uvicorn.Server, "startup", signalled_start)
    for name in [n for n in os.environ if n.startswith("PIPETUNE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    result = CliRunner().invoke(
        app, ["serve", "--db", url, "--port", "0", "--log-level", "warning"]
    )
    assert result.exit_code == code, result.output
    assert result.stderr == f"{word}: the service stopped before it started serving\n"
    assert "pipetune service on" not in result.stdout
    # The process's own handlers are back.
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_once_uvicorn_lets_the_signals_go_they_are_pythons_own(tmp_path, monkeypatch):
    """After uvicorn's serve (asyncio's teardown, the local workers stopped), a Ctrl-C is a
    KeyboardInterrupt: uvicorn put back serve's "did not start" handler, which exited at once
    with the wrong words and left the local workers running."""
    serve = uvicorn.Server.serve
    after_serve: list[object] = []

    async def serve_then_look(self, sockets=None):  # type: ignore[no-untyped-def]
        await serve(self, sockets)
        after_serve.append(signal.getsignal(signal.SIGINT))

    async def signalled_start(self, sockets=None):  # type: ignore[no-untyped-def]
        signal.raise_signal(signal.SIGINT)  # (the quickest way to a stopped server)
        await startup(self, sockets)

    startup = uvicorn.Server.startup
    monkeypatch.setattr(uvicorn.Server, "serve", serve_then_look)
    monkeypatch.setattr(uvicorn.Server, "startup", signalled_start)
    for name in [n for n in os.environ if n.startswith("PIPETUNE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    result = CliRunner().invoke(
        app, ["serve", "--db", url, "--port", "0", "--log-level", "warning"]
    )
    assert result.exit_code == 130, result.output
    assert after_serve == [signal.default_int_handler]
