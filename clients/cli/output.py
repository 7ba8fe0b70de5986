"""Printing helpers shared by the commands: JSON documents on stdout, rich tables for people."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# Tables are read whole: never squeeze columns to 80 characters. Piped (a file, `| grep`),
# each line as long as it is: at a fixed 140 the widest tables wrapped cells over several
# lines (a workload, a timestamp split in two), which a line-by-line reader cannot put back.
# No markup: what is printed holds data from workers, datasets and errors ("cupy:[/]" as a
# runner ended `pipetune tasks` in a MarkupError); a style is given as rich Text, never in
# brackets.
PIPED_WIDTH = 100_000
_probe = Console()
console = Console(width=max(_probe.width, 140) if _probe.is_terminal else PIPED_WIDTH, markup=False)
# Progress and notes beside a result: stderr, so that --json keeps stdout a document. Into
# a file or a pipe, each line as long as it is, as on stdout: at 80 columns a note's
# suggested command (`pipetune curve 27 --server ...`) broke across two lines of a log.
_stderr_probe = Console(stderr=True)
stderr_console = Console(
    stderr=True, markup=False, width=None if _stderr_probe.is_terminal else PIPED_WIDTH
)


def print_json(document: Any) -> None:
    # Plain print: rich would wrap long lines and break the document for machines. No NaN or
    # Infinity, which JSON does not have and strict parsers refuse: a number that comes out
    # so is a fault to fix where it is made, not a document to hand on.
    sys.stdout.write(json.dumps(document, indent=2, allow_nan=False) + "\n")


def rate_figure(value: float | None, unit: str) -> str:
    """A throughput's figure as every command shows it, its unit aside (a table's column
    names it): GB/s without decimals, TFLOP/s with one, and two significant digits where
    those would show 0 (a tiny GEMM's 0.0052 TFLOP/s read "0.0"; the dashboard's rate()
    keeps the same rule); "-" for none."""
    if value is None:
        return "-"
    decimals = 0 if unit == "GB/s" else 1
    if 0 < value < 0.5 * 10**-decimals:
        return f"{value:.2g}"
    return f"{value:.{decimals}f}"


def format_rate(value: float | None, unit: str) -> str:
    """A throughput with its unit (rate_figure's figure)."""
    return "-" if value is None else f"{rate_figure(value, unit)} {unit}"
