"""Placeholder: commands are added by register() as their issue lands."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `pipetune` app."""
