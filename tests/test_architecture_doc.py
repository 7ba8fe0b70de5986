"""docs/architecture.md, checked against the code where it names commands: every `pipetune
...` command it names exists, and the CLI commands it says read a local database without a
service are those that can (it said `pipetune tune` embeds the service, which needs one)."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from pipetune.clients.cli.main import app

DOC = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
COMMAND = re.compile(r"`pipetune ([a-z][a-z-]*)")


def _leaves(command, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], set[str]]:
    """Every runnable command of the CLI, by its path, with its option names."""
    subs = getattr(command, "commands", None)
    if not subs:
        return {path: {o for p in command.params for o in getattr(p, "opts", [])}}
    found = {}
    for name, sub in subs.items():
        found |= _leaves(sub, (*path, name))
    return found


LEAVES = _leaves(typer.main.get_command(app))


def test_every_command_the_page_names_exists():
    named = set(COMMAND.findall(DOC))
    assert {"tune", "serve"} <= named  # (the pattern finds them)
    top = {path[0] for path in LEAVES}
    assert sorted(named - top) == []


def test_the_readers_it_names_are_the_commands_that_read_a_local_database():
    section = DOC.split("The CLI's readers (", 1)[1].split(")", 1)[0]
    named = set(COMMAND.findall(section))
    readers = {path[0] for path, options in LEAVES.items() if {"--db", "--server"} <= options}
    assert named == readers
    assert "tune" not in readers
