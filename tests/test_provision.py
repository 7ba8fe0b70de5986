"""`make test`'s set-up (tests/provision.py): its decisions, and its loop on a fake machine
(nothing here installs or starts anything on the real one)."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import provision
import pytest
from provision import APT_UPDATE, Cluster, Facts, apt_install, plan

READY = Facts(
    chromium=True,
    venv=True,
    pg_answers=True,
    pg_binaries=True,
    clusters=(Cluster("15", "main", True),),
    root=False,
    sudo=False,
    apt=True,
)
START_15 = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start"]


def test_a_ready_machine_needs_nothing_and_no_root():
    todo = plan(READY)
    assert (todo.commands, todo.notes, todo.stop) == ([], [], None)


@pytest.mark.parametrize("privilege", [{"root": True}, {"sudo": True}])
def test_missing_chromium_is_installed_from_debian(privilege):
    todo = plan(replace(READY, chromium=False, **privilege))
    assert todo.stop is None
    assert todo.commands == [APT_UPDATE, apt_install("chromium")]


def test_without_root_it_says_what_to_run_first_and_stops():
    todo = plan(replace(READY, chromium=False, pg_binaries=False, pg_answers=False))
    assert todo.commands == []
    assert todo.stop is not None
    assert "`sudo apt-get install -y chromium postgresql` first" in todo.stop


def test_not_debian_stops_with_a_reason():
    todo = plan(replace(READY, chromium=False, apt=False, root=True))
    assert todo.commands == [] and "not a Debian machine" in (todo.stop or "")


def test_a_stopped_cluster_is_started():
    facts = replace(READY, pg_answers=False, clusters=(Cluster("15", "main", False),), root=True)
    assert plan(facts).commands == [START_15]


def test_a_stopped_cluster_without_root_leaves_the_tests_a_private_server():
    facts = replace(READY, pg_answers=False, clusters=(Cluster("15", "main", False),))
    todo = plan(facts)
    assert todo.commands == [] and todo.stop is None
    assert "private server" in todo.notes[0] and "sudo pg_ctlcluster" in todo.notes[0]


def test_no_server_binaries_installs_postgresql_even_when_a_server_answers():
    # The tests that restart the database run a private server from the local binaries.
    todo = plan(replace(READY, pg_binaries=False, clusters=(), sudo=True))
    assert todo.commands == [APT_UPDATE, apt_install("postgresql")]


class FakeMachine:
    """What provision sees and does, without touching this machine: installing a package
    makes it present (postgresql with a stopped cluster, as in a container), starting the
    cluster makes the server answer."""

    def __init__(self, facts: Facts):
        self.facts = facts
        self.ran: list[list[str]] = []

    def gather(self) -> Facts:
        return self.facts

    def run(self, command, timeout_s: float = 20) -> subprocess.CompletedProcess[str]:
        command = list(command)
        self.ran.append(command)
        bare = command[2:] if command[:2] == ["sudo", "-n"] else command
        if bare[-1] == "chromium":
            self.facts = replace(self.facts, chromium=True)
        elif bare[-1] == "python3-venv":
            self.facts = replace(self.facts, venv=True)
        elif bare[-1] == "postgresql":
            cluster = Cluster("15", "main", False)
            self.facts = replace(self.facts, pg_binaries=True, clusters=(cluster,))
        elif bare[0] == "pg_ctlcluster":
            cluster = Cluster("15", "main", True)
            self.facts = replace(self.facts, pg_answers=True, clusters=(cluster,))
        return subprocess.CompletedProcess(command, 0, "", "")


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    def install(facts: Facts) -> FakeMachine:
        fake = FakeMachine(facts)
        monkeypatch.setattr(provision, "gather", fake.gather)
        monkeypatch.setattr(provision, "_run", fake.run)
        monkeypatch.setattr(provision, "pg_answers", lambda: fake.facts.pg_answers)
        return fake

    return install


def test_a_fresh_machine_gets_everything_then_nothing_more(machine):
    fresh = Facts(
        chromium=False,
        venv=False,
        pg_answers=False,
        pg_binaries=False,
        clusters=(),
        root=False,
        sudo=True,
        apt=True,
    )
    fake = machine(fresh)
    said: list[str] = []
    assert provision.provision(say=said.append) == 0
    sudo = ["sudo", "-n"]
    assert fake.ran == [
        [*sudo, *APT_UPDATE],
        [*sudo, *apt_install("python3-venv")],
        [*sudo, *apt_install("chromium")],
        [*sudo, *apt_install("postgresql")],
        [*sudo, *START_15],
    ]
    assert said[-1] == "make test: chromium is installed; PostgreSQL answers on 127.0.0.1:5432"
    # Idempotent: run again, nothing runs.
    fake.ran.clear()
    assert provision.provision(say=said.append) == 0
    assert fake.ran == []


def test_a_user_without_root_is_told_the_command_and_nothing_runs(machine):
    fake = machine(replace(READY, chromium=False))
    said: list[str] = []
    assert provision.provision(say=said.append) == 2
    assert fake.ran == []
    assert said == [
        "make test: the tests need chromium, and installing needs root: run "
        "`sudo apt-get install -y chromium` first"
    ]


def test_a_failed_install_is_reported_with_its_error(machine, monkeypatch):
    fake = machine(replace(READY, chromium=False, root=True))

    def broken(command, timeout_s: float = 20):
        fake.ran.append(list(command))
        return subprocess.CompletedProcess(command, 100, "", "E: Unable to locate package")

    monkeypatch.setattr(provision, "_run", broken)
    said: list[str] = []
    assert provision.provision(say=said.append) == 1
    assert "failed: E: Unable to locate package" in said[-1]
