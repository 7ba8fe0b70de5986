"""Every `PIPETUNE_*` environment variable pipetune reads is named in the README, and every
one the README names is read: a user reads the README to learn what can be set. The service
read PIPETUNE_LEASE_WAIT_CAP_S, the cupy runner PIPETUNE_REFERENCE_CACHE, `pipetune worker`
PIPETUNE_SIMULATED_FAULTS and the CLI PIPETUNE_DEBUG, and the README named none of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pipetune.clients.cli.environment import (
    TESTS_ONLY,
    TESTS_PREFIX,
    known_variables,
    unknown_variable_warnings,
)
from pipetune.service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "tuner", "workers", "service", "clients", "migrations")
NAME = re.compile(r"PIPETUNE_[A-Z0-9_]+")
# Settings fields that are not a user's to set: `serve` passes it itself.
NOT_SETTINGS = {"create_empty_schema"}
# Named in the README and read by the tests, not by pipetune (`make test`'s PostgreSQL).
README_ONLY = {"PIPETUNE_TEST_PG_ADMIN_URL"}


def read_by_pipetune() -> set[str]:
    """The settings' variables, and every string constant that is a variable's whole name
    (os.environ.get("PIPETUNE_X"), ENV = "PIPETUNE_X", typer's envvar="PIPETUNE_X"), but
    the tests' own, which clients/cli/environment.py names to leave them unwarned."""
    names = {f"PIPETUNE_{f.upper()}" for f in Settings.model_fields if f not in NOT_SETTINGS}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and NAME.fullmatch(value):
                    names.add(value)
    return {n for n in names if not n.startswith(TESTS_PREFIX) and n not in TESTS_ONLY}


def test_the_warning_s_list_is_every_variable_pipetune_reads():
    """`serve` and `worker` warn of a PIPETUNE_ variable nothing reads: a variable read
    somewhere and missing from that list would be warned of wrongly."""
    assert known_variables() == read_by_pipetune()


def test_a_misspelt_variable_is_warned_of_with_the_name_it_meant():
    """PIPETUNE_DATABASE_URI left a replica on its own SQLite file, without a word."""
    environ = {
        "PIPETUNE_DATABASE_URI": "postgresql+psycopg://db/fleet",
        "PIPETUNE_DB_POOLSIZE": "2",
        "PIPETUNE_ENTIRELY_ELSE": "1",
        "PIPETUNE_DATABASE_URL": "sqlite:///x.db",  # read: no warning
        "PIPETUNE_TEST_PG_ADMIN_URL": "postgresql://t",  # the tests': no warning
        "PIPETUNE_db_pool_size": "7",  # read: pydantic-settings takes any case
        "HOME": "/root",
    }
    assert unknown_variable_warnings(environ) == [
        "warning: PIPETUNE_DATABASE_URI is set, but pipetune reads no such variable "
        "(did you mean PIPETUNE_DATABASE_URL?)",
        "warning: PIPETUNE_DB_POOLSIZE is set, but pipetune reads no such variable "
        "(did you mean PIPETUNE_DB_POOL_SIZE?)",
        "warning: PIPETUNE_ENTIRELY_ELSE is set, but pipetune reads no such variable",
    ]


def named_in_readme() -> set[str]:
    text = (ROOT / "README.md").read_text()
    return set(NAME.findall(text)) - README_ONLY


def test_every_variable_pipetune_reads_is_in_the_readme():
    read = read_by_pipetune()
    assert len(read) > 20  # (the walk finds them)
    assert sorted(read - named_in_readme()) == []


def test_every_variable_the_readme_names_is_read():
    assert sorted(named_in_readme() - read_by_pipetune()) == []
