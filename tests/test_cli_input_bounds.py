"""Bad input the CLI took: `serve --local-workers` without an upper
bound (100000 started 100000 worker processes), and a server URL with a control character
or a space (a trailing newline from a file), which passed the URL check and failed inside
httpx (exit 1). Both are usage errors: one line naming the option, exit 2, nothing started
or sent."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.local_service import free_port
from pipetune.service import local_workers

runner = CliRunner()
CPUS = 2  # the cap below: local_workers.WORKERS_PER_CPU per CPU
FC = ["--m", "1024", "--n", "64", "--k", "2048"]


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY", "PIPETUNE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


def _one_error_line(result, prefix: str) -> None:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {prefix}"), result.stderr


class NoServiceError(Exception):
    """create_app reached: the options were accepted (nothing is served in the test)."""


APPS_MADE: list[object] = []


@pytest.fixture
def cap(monkeypatch: pytest.MonkeyPatch) -> int:
    """CPUS CPUs here; no worker process can start, and serve stops where the app is made
    (so that an unbounded --local-workers cannot start anything, even unfixed)."""
    monkeypatch.setattr(local_workers.os, "cpu_count", lambda: CPUS)

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker process was started")

    def no_app(*args: object, **kwargs: object) -> None:
        APPS_MADE.append(args)
        raise NoServiceError

    monkeypatch.setattr(local_workers.subprocess, "Popen", no_process)
    monkeypatch.setattr("pipetune.service.app.create_app", no_app)
    monkeypatch.setenv("PIPETUNE_WORKER_TOKENS", "wtok")  # (no token file written)
    APPS_MADE.clear()
    return local_workers.WORKERS_PER_CPU * CPUS


def test_the_local_workers_cap_is_per_cpu(cap):
    assert local_workers.max_local_workers() == cap
    assert local_workers.local_workers_problem(0) is None
    assert local_workers.local_workers_problem(cap) is None
    assert local_workers.local_workers_problem(cap + 1) is not None


@pytest.mark.parametrize("n", [CPUS * local_workers.WORKERS_PER_CPU + 1, 100000, -1])
def test_serve_refuses_local_workers_out_of_bounds_before_anything(cap, tmp_path, n):
    db = tmp_path / "s.db"
    args = ["serve", "--db", f"sqlite:///{db}", "--port", str(free_port())]
    result = runner.invoke(app, [*args, "--local-workers", str(n)])
    assert result.exit_code == 2, (result.output, result.exception)
    _one_error_line(result, f"--local-workers: must be within 0..{cap} here (4 per CPU), got {n}")
    assert not db.exists() and not APPS_MADE  # refused before the database was made


def test_serve_takes_local_workers_up_to_the_cap(cap, tmp_path):
    db = tmp_path / "s.db"
    args = ["serve", "--db", f"sqlite:///{db}", "--port", str(free_port())]
    result = runner.invoke(app, [*args, "--local-workers", str(cap)])
    # Past every check: the app was being made.
    assert "NoServiceError" in result.stderr and len(APPS_MADE) == 1, result.output


def test_start_workers_starts_none_past_the_cap(monkeypatch):
    monkeypatch.setattr(local_workers.os, "cpu_count", lambda: CPUS)
    started: list[object] = []
    monkeypatch.setattr(
        local_workers.subprocess,
        "Popen",
        lambda *a, **k: started.append(a) or subprocess.CompletedProcess(a, 0),
    )
    most = local_workers.max_local_workers()
    with pytest.raises(ValueError, match=rf"must be within 0\.\.{most}"):
        local_workers.start_workers(most + 1, "http://127.0.0.1:1", "t", "simulated")
    assert started == []


# ---- a server URL with a control character or a space -----------------------------------

URL = "http://127.0.0.1:18601"
BAD_SERVERS = [URL + "\n", URL + "\r\n", URL + "\t", URL + " ", URL + "/\x01", URL + "/a\x7fb"]
COMMANDS = [["tasks", "--limit", "1"], ["schedule", "gemm", *FC, "--gpu", "h100"]]


@pytest.mark.parametrize("server", BAD_SERVERS, ids=repr)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_server_option_with_a_control_character_exits_2(server, command):
    result = runner.invoke(app, [*command, "--server", server])
    assert result.exit_code == 2, (result.output, result.exception)
    _one_error_line(result, f"--server: not an http(s) URL: {server!r}")


@pytest.mark.parametrize("server", BAD_SERVERS, ids=repr)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_server_variable_with_a_control_character_exits_2(server, command):
    result = runner.invoke(app, command, env={"PIPETUNE_SERVER": server})
    assert result.exit_code == 2, (result.output, result.exception)
    # (Named as the variable the value came from: no --server was typed.)
    _one_error_line(result, "PIPETUNE_SERVER: not an http(s) URL: ")


def test_a_trailing_newline_says_to_strip_it():
    result = runner.invoke(app, ["tasks", "--server", URL + "\n"])
    assert result.exit_code == 2, result.output
    assert "ends with a newline (read from a file? strip it)" in result.stderr


@pytest.mark.parametrize(
    ("server", "why"),
    [
        ("http://127.0.0.1:99999", "(port out of range 0-65535)"),
        ("http://127.0.0.1:80a", "(port could not be cast to integer value)"),
        ("http://[::1:8000", "(invalid ipv6 url)"),
    ],
)
def test_a_server_whose_port_cannot_be_says_why(server, why):
    """It said only "not an http(s) URL" of a port past 65535."""
    result = runner.invoke(app, ["tasks", "--server", server])
    assert result.exit_code == 2, result.output
    _one_error_line(result, f"--server: not an http(s) URL: {server!r} {why}")


def test_a_worker_server_with_a_trailing_newline_exits_2():
    worker = ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t"]
    result = runner.invoke(app, [*worker, "--register-timeout", "0", "--server", URL + "\n"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--server: not an http(s) URL")
