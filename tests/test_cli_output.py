"""Tables printed into a pipe or a file keep each row on one line: at the fixed 140 columns
the CLI used when piped, `pipetune tasks | cat` wrapped a workload over three lines and split
its timestamps in two, which a line-by-line reader (grep, awk) cannot put back."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from rich.table import Table
from pipetune.clients.cli.output import console
table = Table("workload", "strategy", "updated")
table.add_row("conv2d n64 56x56x64->64 3x3 s1 p1 " * 6, "analytical+xgb (prior: task 4)",
              "2026-12-02 07:49:21")
console.print(table)
"""


def test_a_table_printed_into_a_pipe_keeps_each_row_on_one_line():
    shown = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "40", "PATH": "/usr/bin:/bin"},
    ).stdout
    rows = [line for line in shown.splitlines() if "conv2d" in line]
    assert len(rows) == 1, shown
    assert "analytical+xgb (prior: task 4)" in rows[0] and "2026-12-02 07:49:21" in rows[0]
    assert len({len(line) for line in shown.splitlines()}) == 1  # (a table, not wrapped text)
