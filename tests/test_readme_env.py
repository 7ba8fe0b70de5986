"""Every `PIPETUNE_*` environment variable pipetune reads is named in the README, and every
one the README names is read: a user reads the README to learn what can be set. The service
read PIPETUNE_LEASE_WAIT_CAP_S, the cupy runner PIPETUNE_REFERENCE_CACHE, `pipetune worker`
PIPETUNE_SIMULATED_FAULTS and the CLI PIPETUNE_DEBUG, and the README named none of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
    (os.environ.get("PIPETUNE_X"), ENV = "PIPETUNE_X", typer's envvar="PIPETUNE_X")."""
    names = {f"PIPETUNE_{f.upper()}" for f in Settings.model_fields if f not in NOT_SETTINGS}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and NAME.fullmatch(value):
                    names.add(value)
    return names


def named_in_readme() -> set[str]:
    text = (ROOT / "README.md").read_text()
    return set(NAME.findall(text)) - README_ONLY


def test_every_variable_pipetune_reads_is_in_the_readme():
    read = read_by_pipetune()
    assert len(read) > 20  # (the walk finds them)
    assert sorted(read - named_in_readme()) == []


def test_every_variable_the_readme_names_is_read():
    assert sorted(named_in_readme() - read_by_pipetune()) == []
