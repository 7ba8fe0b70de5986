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
