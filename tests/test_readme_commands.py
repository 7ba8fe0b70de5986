"""Every `pipetune COMMAND ... --option` the README and docs/architecture.md show is a
command of the CLI that takes that option: users copy these lines as they are."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from pipetune.clients.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/architecture.md")
# `pipetune` and the words after it, to the end of the command as the docs write it.
MENTION = re.compile(r"pipetune((?: [a-z][a-z0-9_-]*)+)([^`\n|;)]*)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _options(command: Any) -> set[str]:
    names: set[str] = {"--help"}
    for p in command.params:
        names.update(p.opts)
        names.update(p.secondary_opts)
    return names


def mentions(text: str) -> Iterator[tuple[str, list[str], Any, list[str]]]:
    """(the line as written, the command's path, the options it gives) for each mention
    that names a command; one that stops at a group before a placeholder (`pipetune tune
    ... --budget`) names no command and is passed over."""
    root = typer.main.get_command(app)
    for match in MENTION.finditer(text.replace("\\\n", " ")):
        words = match.group(1).split()
        command, path = root, []
        for word in words:
            if word not in getattr(command, "commands", {}):
                break
            command = command.commands[word]
            path.append(word)
        rest = " ".join(words[len(path) :]) + match.group(2)
        if not path or (hasattr(command, "commands") and not rest.lstrip().startswith("--")):
            continue
        yield match.group(0), path, command, OPTION.findall(rest)


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_line_in_the_docs_has_its_options(doc: str):
    text = (ROOT / doc).read_text()
    found = list(mentions(text))
    assert len(found) > 3  # (the scan sees the commands)
    wrong = [
        f"{line.strip()}: no {option}"
        for line, _, command, given in found
        for option in given
        if option not in _options(command)
    ]
    assert wrong == []


def test_a_misspelt_option_is_found():
    ((_, path, command, given),) = mentions("`pipetune tune gemm --m 1 --budjet 3`")
    assert path == ["tune", "gemm"] and given == ["--m", "--budjet"]
    assert "--m" in _options(command) and "--budjet" not in _options(command)
