"""Every option of every `pipetune` command says what it does in --help (a script's author
reads it there): `--json` on four commands, `--profile`, `--budgets`, `--seeds`, `--host` and
`--port` had no text, nor the operators' shape options (--m, --n, --k, --dtype, ...: now
the workload models' field descriptions, which the API schema shows too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from pipetune.clients.cli.main import app


def _options(command: Any, path: str = "pipetune") -> Iterator[tuple[str, Any]]:
    """Every visible option of every command under `command`, with the command's path.
    (Duck-typed: typer carries its own copy of click's classes.)"""
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _options(sub, f"{path} {name}")
        return
    for p in command.params:
        if p.param_type_name == "option" and not p.hidden:
            yield f"{path} {'/'.join(p.opts)}", p


def test_every_option_of_every_command_has_help_text():
    root = typer.main.get_command(app)
    assert len(root.commands) > 5  # (the walk sees the commands)
    assert [where for where, p in _options(root) if not (p.help or "").strip()] == []


def _names_its_envvar(option: Any) -> bool:
    if not option.envvar or not option.show_envvar:
        return False
    names = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar)
    return any(name in (option.help or "") for name in names)


def test_no_help_text_names_the_environment_variable_that_help_shows_anyway():
    """`worker --help` read "the pipetune service (env PIPETUNE_SERVER) [env var:
    PIPETUNE_SERVER]": typer shows each option's variable itself."""
    root = typer.main.get_command(app)
    assert [where for where, p in _options(root) if _names_its_envvar(p)] == []


def test_an_operators_command_help_is_its_whole_first_sentence_as_written():
    # `reduce`'s read "Row reduction: out = sum or max of x (one float16 per row; a row
    # holding a": its summary's first line alone, and rich markup took "[r]" and "[r, :]".
    from typer.testing import CliRunner

    for command in (["tune", "reduce"], ["model", "rank", "reduce"], ["schedule", "reduce"]):
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        text = " ".join(result.stdout.split())
        assert "out[r] = sum or max of x[r, :]" in text, text
        assert "a row holding a NaN gives NaN, as torch.sum and torch.amax do)" in text, text


def _groups(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if hasattr(command, "commands"):
        yield path
        for name, sub in command.commands.items():
            yield from _groups(sub, (*path, name))


def test_a_group_lists_each_command_s_summary_on_one_line():
    # `pipetune --help` broke `curve`'s "(TFLOP/s, GB/s for memory-intensive" / "operators)
    # found after each trial." where its docstring's source line ended, and five more.
    from typer.testing import CliRunner

    root = typer.main.get_command(app)
    groups = list(_groups(root))
    assert () in groups and ("model",) in groups and len(groups) > 5
    for path in groups:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"})
        assert result.exit_code == 0, result.output
        listing = result.stdout.split("Commands")[1].splitlines()[1:]
        rows = [line.strip("│ ") for line in listing if line.startswith("│")]
        names = set(root.commands if not path else _subcommands(root, path))
        assert rows and all(row.split()[0] in names for row in rows), (path, rows)


def _subcommands(root: Any, path: tuple[str, ...]) -> list[str]:
    command = root
    for name in path:
        command = command.commands[name]
    return list(command.commands)


def test_a_command_s_help_wraps_its_paragraphs_at_the_terminal_not_at_the_source():
    """`serve --help` kept its docstring's line breaks: "... the command exits instead of
    serving with no" / "worker." at any terminal width."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert (
        "With --local-workers, what the workers need (the --dataset of replay, a GPU for cupy) "
        "is checked before the service starts: the command exits instead of serving with no "
        "worker."
    ) in lines
