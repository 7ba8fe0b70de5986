"""`python -m pipetune.clients.cli ...` runs the `pipetune` command (spawns local workers),
through the console script's own entry point."""

from pipetune._cli_entry import run

run()
