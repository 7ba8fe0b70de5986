"""Every option of every `pipetune` command says what it does in --help (a script's author
reads it there): `--json` on four commands, `--profile`, `--budgets`, `--seeds`, `--host` and
`--port` had no text, nor the operators' shape options (--m, --n, --k, --dtype, ...: now
the workload models' field descriptions, which the API schema shows too)."""

from __future__ import annotations

from typing import Any

import typer

from pipetune.clients.cli.main import app


def _options_without_help(command: Any, path: str) -> list[str]:
    # (Duck-typed: typer carries its own copy of click's classes.)
    if hasattr(command, "commands"):
        return [
            found
            for name, sub in command.commands.items()
            for found in _options_without_help(sub, f"{path} {name}")
        ]
    return [
        f"{path} {'/'.join(p.opts)}"
        for p in command.params
        if p.param_type_name == "option" and not p.hidden and not (p.help or "").strip()
    ]


def test_every_option_of_every_command_has_help_text():
    root = typer.main.get_command(app)
    assert len(root.commands) > 5  # (the walk sees the commands)
    assert _options_without_help(root, "pipetune") == []


def _envvars_said_twice(command: Any, path: str) -> list[str]:
    if hasattr(command, "commands"):
        return [
            found
            for name, sub in command.commands.items()
            for found in _envvars_said_twice(sub, f"{path} {name}")
        ]
    found = []
    for p in command.params:
        if p.param_type_name != "option" or not p.envvar or not p.show_envvar:
            continue
        names = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar)
        if any(name in (p.help or "") for name in names):
            found.append(f"{path} {'/'.join(p.opts)}")
    return found


def test_no_help_text_names_the_environment_variable_that_help_shows_anyway():
    """`worker --help` read "the pipetune service (env PIPETUNE_SERVER) [env var:
    PIPETUNE_SERVER]": typer shows each option's variable itself."""
    assert _envvars_said_twice(typer.main.get_command(app), "pipetune") == []
