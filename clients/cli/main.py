"""Entry point of the `pipetune` console script."""

from __future__ import annotations

import typer

import pipetune
from pipetune.clients.cli import campaign_cmds, client_cmds, export_cmds, service_cmds, worker_cmds
from pipetune.clients.cli.bench_cmds import bench_app
from pipetune.clients.cli.dataset_cmds import dataset_app
from pipetune.clients.cli.kernel_cmds import kernel_app
from pipetune.clients.cli.model_cmds import model_app
from pipetune.clients.cli.sweep_cmds import calibrate, sweep_app

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
campaign_cmds.register(app)  # campaign (the GPU campaign)
export_cmds.register(app)  # export


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


def run() -> None:
    app()
