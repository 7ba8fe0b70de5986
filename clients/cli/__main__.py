"""`python -m clients.cli ...` runs the `pipetune` command (used to spawn local workers)."""

from clients.cli.main import run

run()
