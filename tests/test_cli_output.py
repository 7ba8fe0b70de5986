"""Tables printed into a pipe or a file keep each row on one line: at the fixed 140 columns
the CLI used when piped, `pipetune tasks | cat` wrapped a workload over three lines and split
its timestamps in two, which a line-by-line reader (grep, awk) cannot put back."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
from rich.table import Table
from pipetune.clients.cli.output import console
table = Table("workload", "strategy", "updated")
table.add_row("conv2d n64 56x56x64->64 3x3 s1 p1 " * 6, "analytical+xgb (prior: task 4)",
              "2026-12-02 07:49:21")
console.print(table)
"""


def _piped(script: str) -> subprocess.CompletedProcess[str]:
    """`script` run with stdout and stderr into pipes, on a 40-column terminal's setting."""
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "40", "PATH": "/usr/bin:/bin"},
    )


def test_a_table_printed_into_a_pipe_keeps_each_row_on_one_line():
    shown = _piped(SCRIPT).stdout
    rows = [line for line in shown.splitlines() if "conv2d" in line]
    assert len(rows) == 1, shown
    assert "analytical+xgb (prior: task 4)" in rows[0] and "2026-12-02 07:49:21" in rows[0]
    assert len({len(line) for line in shown.splitlines()}) == 1  # (a table, not wrapped text)


NOTE = """
from pipetune.clients.cli.output import stderr_console
stderr_console.print("interrupted: task 27 goes on at the service; see its progress with "
                     "`pipetune curve 27 --server http://127.0.0.1:18100`")
"""


def test_a_note_on_stderr_into_a_log_keeps_its_command_on_one_line():
    """At 80 columns the suggested command broke across two lines of a log."""
    shown = _piped(NOTE).stderr
    assert shown.splitlines() == [
        "interrupted: task 27 goes on at the service; see its progress with "
        "`pipetune curve 27 --server http://127.0.0.1:18100`"
    ]


def _dataset_naming(tmp_path, device_name: str):
    repo = Path(__file__).resolve().parents[1]
    with gzip.open(repo / "benchmarks/data/h100/BMM_BERT_QK.t4.json.gz") as f:
        doc = json.load(f)
    doc["metadata"]["pipetune"]["device_name"] = device_name
    # A file name that is not UTF-8 reaches Python as lone surrogates too.
    path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/\xff.t4.json"))
    path.write_text(json.dumps(doc), encoding="utf-8")  # (json escapes the surrogate as \\ud800)
    return path


def test_a_table_of_text_no_encoding_holds_is_printed_escaped(tmp_path):
    # A JSON file may name its device with a lone surrogate: the table printed it strictly
    # and `pipetune dataset info` failed with UnicodeEncodeError, exit 1.
    path = _dataset_naming(tmp_path, "H100\ud800")
    done = subprocess.run(
        [sys.executable, "-m", "pipetune.clients.cli", "dataset", "info", path],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    shown = done.stdout.decode()
    assert "H100\\ud800" in shown and "\\udcff.t4.json" in shown
