"""`pipetune dataset ...`: inspect and convert recorded search spaces (T4 results files and
Kernel Tuner caches, gzipped or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, one_line, reported
from pipetune.clients.cli.output import console, print_json
from pipetune.clients.cli.paths import check_output_file, output_file
from pipetune.workers.datasets import Dataset, DatasetError, load_dataset, summary, write_t4

dataset_app = typer.Typer(help="Recorded search spaces: T4 results files, Kernel Tuner caches.")

_ALLOW_OPEN = typer.Option(
    False, "--allow-open", help="read a Kernel Tuner cache left open by an interrupted session"
)


def _load(path: Path, allow_open: bool) -> Dataset:
    try:
        return load_dataset(path, allow_open=allow_open)
    except DatasetError as exc:
        raise CliError(one_line(exc), 2) from None


def _value(value: Any) -> str:
    if isinstance(value, dict) and value:
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "-" if value is None or value == {} else str(value)


@dataset_app.command("info")
@reported
def info(
    path: Path = typer.Argument(..., help="a .t4.json(.gz) file or a Kernel Tuner cache"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    allow_open: bool = _ALLOW_OPEN,
) -> None:
    """How many configurations a dataset holds, how many failed, and the best one."""
    doc = summary(_load(path, allow_open))
    if as_json:
        print_json(doc)
        return
    table = Table(title=str(path), show_header=False)
    table.add_column("key")
    table.add_column("value")
    for key, value in doc.items():
        if key != "path":
            table.add_row(key, _value(value))
    console.print(table)


@dataset_app.command("convert")
@reported
def convert(
    source: Path = typer.Argument(..., help="a T4 file or a Kernel Tuner cache"),
    target: Path = typer.Argument(
        ..., parser=output_file, help="the T4 file to write (.t4.json.gz)"
    ),
    allow_open: bool = _ALLOW_OPEN,
) -> None:
    """Write any readable dataset as a T4 results file (atomically)."""
    # A missing parent folder is made (write_t4 does), as convert always did.
    check_output_file(target, "TARGET", create_parent=True)
    if target.exists() and source.exists() and source.samefile(target):
        # (It wrote the T4 over the Kernel Tuner cache it read, which was gone.)
        raise CliError(f"TARGET: {target} is the SOURCE file; give another path to write", 2)
    dataset = _load(source, allow_open)
    write_t4(dataset, target)
    console.print(f"wrote {len(dataset)} configurations to {target}")
