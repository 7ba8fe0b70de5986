"""A private PostgreSQL server for tests that must stop and restart the database (the
shared server at 127.0.0.1:5432 serves every other test and is never restarted).

initdb refuses to run as root; as root the server runs as the `postgres` system user, from
a data directory under /tmp that user can reach.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if versions:
        return versions[0].parent
    raise PostgresUnavailableError("no PostgreSQL server binaries (initdb) found")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresInstance:
    """initdb + pg_ctl on a free loopback port; trust auth for the `postgres` role."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="pipetune-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout_s: float = 60.0) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=timeout_s)

    def init(self) -> PostgresInstance:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        return self

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c fsync=off"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        """`immediate`: like a crash (clients' connections cut, recovery at next start)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        if self.running():
            with contextlib.suppress(subprocess.SubprocessError):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"PostgreSQL did not listen on {self.port}")
