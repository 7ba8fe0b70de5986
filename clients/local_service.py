"""A pipetune service in a child process on a loopback port: `pipetune serve` started,
waited for (/healthz) and stopped with SIGTERM. Used by `make demo` (clients.demo) and by
the tests that need a live service."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from pipetune.model.errors import PipetuneError

STOP_TIMEOUT_S = 30.0


class ServiceStartError(PipetuneError, RuntimeError):
    """`pipetune serve` exited or did not answer /healthz in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pipetune_command() -> list[str]:
    """The `pipetune` console script of this interpreter's environment (or its module)."""
    script = Path(sys.executable).with_name("pipetune")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pipetune.clients.cli"]


def _local_workers(parent: int) -> dict[int, bytes]:
    """pid -> command line of the `pipetune worker` children of `parent` (Linux /proc)."""
    found: dict[int, bytes] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"worker" in cmdline.split(b"\0"):
            found[int(stat.parent.name)] = cmdline
    return found


def _stop_orphans(workers: dict[int, bytes], timeout_s: float) -> None:
    """SIGTERM the local workers that outlived the service (a serve killed before it could
    stop them), checking each pid still runs the same command before signalling it."""

    def alive(pid: int, cmdline: bytes) -> bool:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline
        except OSError:
            return False

    left = {pid: cmd for pid, cmd in workers.items() if alive(pid, cmd)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {pid: cmd for pid, cmd in left.items() if alive(pid, cmd)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class LocalService:
    """`pipetune serve --host 127.0.0.1 --port PORT [extra...]` in a child process, on the
    database URL given (in its environment, PIPETUNE_DATABASE_URL: on its command line, as
    `--db URL`, any user of the machine could read a password in it with `ps`).

    Output goes to `log_path` (a file, so the child never blocks on a full pipe).
    """

    def __init__(
        self,
        database_url: str,
        log_path: Path,
        *,
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        inherit_settings: bool = True,
    ):
        """`env` is added to this process's environment; with inherit_settings=False the
        service sees no PIPETUNE_* variable but those in `env` (a benchmark's settings)."""
        self.database_url = database_url
        self.log_path = log_path
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        inherited = {
            k: v for k, v in os.environ.items() if inherit_settings or not k.startswith("PIPETUNE_")
        }
        self.env = {**inherited, **(env or {}), "PIPETUNE_DATABASE_URL": database_url}
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> Self:
        command = [
            *pipetune_command(),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )
        self.wait_healthy(timeout_s)
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServiceStartError(
                    f"`pipetune serve` exited with status {self.process.returncode}:\n"
                    + self.log_tail()
                )
            try:
                # (Not through a proxy the environment names: it cannot reach this loopback.)
                health = httpx.get(f"{self.url}/healthz", timeout=2.0, trust_env=False)
                if health.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise ServiceStartError(
            f"the service at {self.url} did not answer /healthz within {timeout_s:g} s:\n"
            + self.log_tail()
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then wait; SIGKILL only if it does not stop in time. The exit status
        (uvicorn re-raises the SIGTERM it handled, so a clean stop reads -15)."""
        process, self.process = self.process, None
        code = None
        if process is not None:
            workers = _local_workers(process.pid)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = None
            _stop_orphans(workers, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> None:
        """SIGKILL: the service dies as in a crash (no shutdown, connections cut). Its local
        workers, if any, are left running, as they would be."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
