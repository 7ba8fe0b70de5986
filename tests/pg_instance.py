"""The tests' PostgreSQL: where it is, whether it answers, and a private server of our own.

The service tests run on the server at PIPETUNE_TEST_PG_ADMIN_URL (by default the local
one, 127.0.0.1:5432, database `test`, trust auth, as `make test` sets it up). Where none
answers there, conftest.py starts a private throwaway server for the run (PostgresInstance,
from the installed server binaries). Tests that must stop and restart the database get a
private server of their own too; the shared one is never restarted.

initdb refuses to run as root; as root the server runs as the `postgres` system user, from
a data directory under /tmp that user can reach.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path

ADMIN_URL_ENV = "PIPETUNE_TEST_PG_ADMIN_URL"
DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# Set by conftest.py when no PostgreSQL can be had: why, in one line (the tests that need
# one fail with it).
UNAVAILABLE_ENV = "PIPETUNE_TEST_PG_UNAVAILABLE"


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def admin_url() -> str:
    return os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL)


def connection_problem(url: str, timeout_s: int = 3) -> str | None:
    """Why a PostgreSQL URL cannot be used (its first line), or None when it answers."""
    import psycopg  # only the tests that use PostgreSQL pay for the import

    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        with psycopg.connect(dsn, connect_timeout=timeout_s):
            return None
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        return lines[0] if lines else type(exc).__name__


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

    @classmethod
    def started(cls) -> PostgresInstance:
        """A new server, running (destroyed again if it cannot start)."""
        pg = cls()
        try:
            pg.init()
            pg.start()
        except BaseException:
            pg.destroy()
            raise
        return pg

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

    def server_pids(self) -> list[int]:
        """The postmaster (first) and its children: every backend and auxiliary process."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    def destroy(self) -> None:
        if self.running():
            # A test may have left it stopped (SIGSTOP): pg_ctl stop would wait on it.
            with contextlib.suppress(ProcessLookupError, OSError, ValueError):
                for pid in self.server_pids():
                    os.kill(pid, signal.SIGCONT)
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


def settle(environ: MutableMapping[str, str], default_url: str = DEFAULT_ADMIN_URL):
    """Decide the tests' PostgreSQL, recording it in `environ` for every test (and every
    process they start): the server at ADMIN_URL_ENV when that is set (used as given);
    else `default_url` when it answers; else a private throwaway server, started here and
    returned (the caller destroys it at the end). When none can be had, UNAVAILABLE_ENV
    says why in one line, and the tests that need PostgreSQL fail with it."""
    if environ.get(ADMIN_URL_ENV) or environ.get(UNAVAILABLE_ENV):
        return None  # given, or settled by an outer run (a pytest started by a test)
    problem = connection_problem(default_url)
    if problem is None:
        return None
    try:
        pg = PostgresInstance.started()
    except (PostgresUnavailableError, subprocess.SubprocessError, OSError, KeyError) as exc:
        environ[UNAVAILABLE_ENV] = (
            f"no PostgreSQL answers at {default_url} ({problem}) and no private server "
            f"could start ({type(exc).__name__}: {exc})"
        )
        return None
    environ[ADMIN_URL_ENV] = pg.url
    return pg
