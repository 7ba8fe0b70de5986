"""Entry point of the `pipetune` console script."""

from __future__ import annotations

import inspect
import io
import sys

import typer

import pipetune
from pipetune.clients.cli import (
    campaign_cmds,
    client_cmds,
    export_cmds,
    fleet_cmds,
    service_cmds,
    worker_cmds,
)
from pipetune.clients.cli.bench_cmds import bench_app
from pipetune.clients.cli.dataset_cmds import dataset_app
from pipetune.clients.cli.kernel_cmds import kernel_app
from pipetune.clients.cli.model_cmds import model_app
from pipetune.clients.cli.sweep_cmds import calibrate, sweep_app
from pipetune.tuner.allocator import keep_freed_blocks

app = typer.Typer(
    name="pipetune",
    help="pipetune: analytical-model-guided autotuning of pipelined GPU tensor kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(model_app, name="model")
app.add_typer(sweep_app, name="sweep")
app.add_typer(dataset_app, name="dataset")
app.command("calibrate")(calibrate)
app.add_typer(bench_app, name="bench")
app.add_typer(kernel_app, name="kernel")
service_cmds.register(app)  # serve, db
client_cmds.register(app)  # schedule, tune, tasks, curve, tune-model
worker_cmds.register(app)  # worker
fleet_cmds.register(app)  # workers
campaign_cmds.register(app)  # campaign (the GPU campaign)
export_cmds.register(app)  # export


def _one_line_summaries(group: typer.Typer) -> None:
    """Each command's entry in its group's --help list as its docstring's first paragraph on
    one line, and its own --help with each paragraph as one: this typer keeps the
    docstring's line breaks, so `pipetune --help` broke summaries mid-sentence ("GB/s for
    memory-intensive" / "operators) found after each trial.") wherever the source wrapped
    them, and `pipetune serve --help` its description ("... the command exits instead of
    serving with no" / "worker."). The terminal wraps each paragraph to its width."""
    for command in group.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if not doc:
            continue
        paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n")]
        if command.short_help is None:
            command.short_help = paragraphs[0]
        if command.help is None:
            command.help = "\n\n".join(paragraphs)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _one_line_summaries(sub.typer_instance)


_one_line_summaries(app)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"pipetune {pipetune.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """pipetune: analytical-model-guided autotuning of pipelined GPU tensor kernels."""
    keep_freed_blocks()  # the command owns its process (tuner/allocator.py)


def _print_what_cannot_be_encoded_escaped() -> None:
    """Text that no encoding of the terminal holds is printed with backslash escapes.

    A dataset's device name or label may hold a lone surrogate (JSON allows one), and a file
    name that is not UTF-8 reaches Python as one: printed strictly, a table naming either
    failed the whole command with UnicodeEncodeError after its work was done."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def run() -> None:
    _print_what_cannot_be_encoded_escaped()
    app()
