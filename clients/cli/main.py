"""Entry point of the `pipetune` console script."""

from __future__ import annotations

import typer

from clients.cli import client_cmds, service_cmds, worker_cmds
from clients.cli.bench_cmds import bench_app
from clients.cli.dataset_cmds import dataset_app
from clients.cli.kernel_cmds import kernel_app
from clients.cli.model_cmds import model_app
from clients.cli.sweep_cmds import calibrate, sweep_app

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


def run() -> None:
    app()
