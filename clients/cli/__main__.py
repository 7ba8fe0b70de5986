"""`python -m pipetune.clients.cli ...` runs the `pipetune` command (spawns local workers)."""

from pipetune.clients.cli.main import run

run()
