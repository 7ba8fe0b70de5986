"""Entry point of the `pipetune` console script."""

from __future__ import annotations

import typer

from clients.cli.model_cmds import model_app

app = typer.Typer(
    name="pipetune",
    help="pipetune: analytical-model-guided autotuning of pipelined GPU tensor kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(model_app, name="model")


def run() -> None:
    app()
