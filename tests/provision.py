"""What the tests need that pip does not install, set up idempotently on a Debian machine:
Debian's chromium (the dashboard tests drive it headless), PostgreSQL (the service tests
run on SQLite and on PostgreSQL), and python3-venv where `make` has no virtualenv yet and
Python cannot make one.

    python tests/provision.py            # what `make test` runs first
    python tests/provision.py --dry-run  # say what it would do

PostgreSQL: when nothing answers at 127.0.0.1:5432, start the installed clusters; if there
are no server binaries, install Debian's `postgresql` package (which creates a cluster) and
start it. Where the server that answers then does not accept the tests' connection
(postgres@127.0.0.1:5432/test, trust auth), the tests run a private throwaway server from the
installed binaries instead (tests/conftest.py), so the binaries are what must be there.

Installing and starting system services needs root: as a user with `sudo` (without a
password prompt) it runs the commands through sudo; otherwise it prints the command to run
first and exits 2 without doing anything. A machine that needs nothing is left untouched.

Stdlib only: it runs before, and independently of, the project's virtualenv.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_PATHS = ("/usr/bin/chromium",)
PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_WAIT_S = 30.0


@dataclass(frozen=True)
class Cluster:
    """A Debian PostgreSQL cluster (pg_lsclusters)."""

    version: str
    name: str
    online: bool


@dataclass(frozen=True)
class Facts:
    """What the machine has, as far as the tests are concerned."""

    chromium: bool
    venv: bool  # the virtualenv exists, or this Python can create one (ensurepip)
    pg_answers: bool
    pg_binaries: bool  # initdb and pg_ctl: a private server can run
    clusters: tuple[Cluster, ...]
    root: bool
    sudo: bool  # sudo works without a password prompt
    apt: bool


@dataclass
class Plan:
    """Commands to run (each as root), or the reason to stop with what to run by hand."""

    commands: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stop: str | None = None


APT_UPDATE = ["apt-get", "update", "-qq"]


def apt_install(package: str) -> list[str]:
    return ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", package]


def plan(facts: Facts) -> Plan:
    """What to do on a machine with these facts: the decision logic, without side effects."""
    result = Plan()
    privileged = facts.root or facts.sudo
    installs: list[str] = []
    if not facts.venv:
        installs.append("python3-venv")
    if not facts.chromium:
        installs.append("chromium")
    if not facts.pg_binaries:
        # Even where a server answers (another container's): the tests that restart
        # PostgreSQL run a private server of their own, from the binaries here.
        installs.append("postgresql")
    if installs:
        if not facts.apt:
            result.stop = (
                f"the tests need {' and '.join(installs)}, and this is not a Debian machine "
                "(no apt-get): install them with the system's package manager first"
            )
            return result
        if not privileged:
            result.stop = (
                f"the tests need {' and '.join(installs)}, and installing needs root: run "
                f"`sudo apt-get install -y {' '.join(installs)}` first"
            )
            return result
        result.commands.append(APT_UPDATE)
        result.commands.extend(apt_install(p) for p in installs)
        return result  # the facts change: gather them again, then start what is there
    if facts.pg_answers:
        return result
    stopped = [c for c in facts.clusters if not c.online]
    if stopped and privileged:
        result.commands.extend(
            ["pg_ctlcluster", "--skip-systemctl-redirect", c.version, c.name, "start"]
            for c in stopped
        )
    elif stopped:
        result.notes.append(
            "PostgreSQL is installed but stopped, and starting it needs root "
            f"(`sudo pg_ctlcluster --skip-systemctl-redirect {stopped[0].version} "
            f"{stopped[0].name} start`): the tests run a private server instead"
        )
    else:
        result.notes.append(
            "no PostgreSQL cluster answers on 127.0.0.1:5432: the tests run a private server"
        )
    return result


# ---- the machine ---------------------------------------------------------------------


def _run(command: Sequence[str], timeout_s: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout_s, check=False
    )


def pg_answers(host: str = PG_HOST, port: int = PG_PORT) -> bool:
    """Whether a PostgreSQL server accepts connections there (pg_isready, else a socket)."""
    if shutil.which("pg_isready"):
        return _run(["pg_isready", "-q", "-h", host, "-p", str(port)]).returncode == 0
    with socket.socket() as s:
        s.settimeout(3)
        return s.connect_ex((host, port)) == 0


def pg_binaries() -> bool:
    found = shutil.which("pg_config")
    if found:
        bindir = Path(_run([found, "--bindir"]).stdout.strip())
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return True
    return any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))


def clusters() -> tuple[Cluster, ...]:
    """Debian's clusters (none where pg_lsclusters is missing)."""
    if not shutil.which("pg_lsclusters"):
        return ()
    out = _run(["pg_lsclusters", "--no-header"]).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            found.append(Cluster(parts[0], parts[1], parts[3].startswith("online")))
    return tuple(found)


def sudo_works() -> bool:
    return bool(shutil.which("sudo")) and _run(["sudo", "-n", "true"]).returncode == 0


def venv_possible() -> bool:
    root = Path(__file__).resolve().parents[1]
    return (root / ".venv" / "bin" / "python").exists() or importlib.util.find_spec(
        "ensurepip"
    ) is not None


def gather() -> Facts:
    return Facts(
        chromium=bool(shutil.which("chromium")) or any(Path(p).exists() for p in CHROMIUM_PATHS),
        venv=venv_possible(),
        pg_answers=pg_answers(),
        pg_binaries=pg_binaries(),
        clusters=clusters(),
        root=os.geteuid() == 0,
        sudo=os.geteuid() != 0 and sudo_works(),
        apt=bool(shutil.which("apt-get")),
    )


def as_root(command: list[str], facts: Facts) -> list[str]:
    return command if facts.root else ["sudo", "-n", *command]


def wait_for_postgres(timeout_s: float = PG_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pg_answers():
            return True
        time.sleep(0.5)
    return pg_answers()


def provision(dry_run: bool = False, say: Callable[[str], None] = print) -> int:
    """Set up what is missing; 0 when the tests can run, 2 when something must be done by
    hand first (said in one line), 1 when a command failed."""
    for _ in range(3):  # install, then start what the install brought
        facts = gather()
        todo = plan(facts)
        if todo.stop:
            say(f"make test: {todo.stop}")
            return 2
        if not todo.commands:
            for note in todo.notes:
                say(f"make test: {note}")
            if not todo.notes:
                say("make test: chromium is installed; PostgreSQL answers on 127.0.0.1:5432")
            return 0
        for command in todo.commands:
            full = as_root(command, facts)
            say(f"make test: running {' '.join(full)}")
            if dry_run:
                continue
            done = _run(full, timeout_s=1800)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                say(f"make test: `{' '.join(full)}` failed: {' / '.join(tail)}")
                return 1
        if dry_run:
            return 0
        if any(c[0] == "pg_ctlcluster" for c in todo.commands) and not wait_for_postgres():
            say("make test: PostgreSQL did not answer within 30 s; the tests run a private server")
            return 0
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="say what it would do")
    args = parser.parse_args(argv)
    return provision(args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
