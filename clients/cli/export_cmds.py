"""`pipetune export`: what was tuned, as files.

    pipetune export --gpu h100 --out-dir DIR [--server URL | --db URL]
    pipetune export --task ID --format t4 --out FILE [--server URL | --db URL]

The first writes, for every workload tuned on the GPU, its CUDA source, its cubin for the
GPU's architecture and its launch description (JSON), plus `pipetune_tuned.h` (the tuned
parameters as #defines, Kernel Tuner's convention) and `index.json`. The second writes one
task's trials as a T4 results file (gzipped when FILE ends in .gz). Without --server (or
PIPETUNE_SERVER) the local database is read directly. See clients/library/exports.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
from rich.table import Table

from pipetune.clients.cli.errors import CliError, reported
from pipetune.clients.cli.output import console, print_json, stderr_console
from pipetune.clients.cli.paths import check_output_dir, check_output_file, output_file
from pipetune.clients.cli.remote import (
    api_key_option,
    db_option,
    read_server_option,
    reader,
    service_errors,
)
from pipetune.clients.library.labels import SIMULATED_LABEL
from pipetune.model.errors import InvalidArgumentError
from pipetune.model.hardware import gpu_keys, resolve_gpu_key
from pipetune.model.wire import ID_MAX

FORMATS = ("t4",)
MODES = "give --gpu and --out-dir (tuned kernels) or --task, --format t4 and --out (trials)"


def _check_modes(
    gpu: str | None, out_dir: str | None, task: int | None, fmt: str | None, out: Path | None
) -> None:
    if task is not None:
        if not 1 <= task <= ID_MAX:  # (the library's check says task_id, not the option)
            raise CliError(f"--task: must be within 1..{ID_MAX}, got {task}", 2)
        if gpu is not None or out_dir is not None:
            raise CliError(f"--task: exports one task's trials, not a GPU's kernels; {MODES}", 2)
        if out is None:
            raise CliError("--out: give the T4 file to write the task's trials to", 2)
        if fmt not in (None, *FORMATS):
            raise CliError(f"--format: a task's trials are written as {', '.join(FORMATS)}", 2)
        check_output_file(out, "--out")
        return
    if out is not None or fmt is not None:
        raise CliError(f"--out and --format go with --task; {MODES}", 2)
    if gpu is None or out_dir is None:
        raise CliError(MODES, 2)
    if not out_dir:
        # Taken as a Path, "" was "." (an unset shell variable exported into the current
        # folder and removed the files an index.json there listed).
        raise CliError("--out-dir: empty: give the folder to export to ('.' for this one)", 2)
    check_output_dir(Path(out_dir), "--out-dir")


def _out_dir_refused(exc: InvalidArgumentError) -> CliError:
    """The library's refusal of the folder, in the option's name (exit 2, bad input)."""
    return CliError(f"--out-dir: {exc.reason}", 2)


def _files_cell(row: dict) -> str:
    """A row's files as the export wrote them (index.json's per-kernel "files"), shortened to
    `stem.{cu,sm_90a.cubin,...}`. Each kernel's own list: its cubin's architecture can be an
    arch-specific target (sm_90a) rather than the GPU's, and some kernels have a file more
    (a Hopper kernel's tensor-map header)."""
    stem, names = row["stem"], list(row["files"].values())
    prefix = f"{stem}."
    if not all(name.startswith(prefix) for name in names):  # no common stem: list them
        return ", ".join(names)
    return f"{stem}.{{{','.join(name[len(prefix) :] for name in names)}}}"


def _print_index(index: dict, out_dir: Path) -> None:
    rows = index["workloads"]
    # Said on screen, not only in index.json: a tuned workload missing from the export
    # without a word reads as one that was never tuned.
    for left in index["not_exported"]:
        # (no schedule where every trial of the workload failed)
        schedule = f" ({left['schedule_id']})" if left["schedule_id"] else ""
        stderr_console.print(
            f"not exported: {left['label']}{schedule}: {left['reason']}", markup=False
        )
    if not rows:
        what = "no kernel to export" if index["not_exported"] else "no workload tuned"
        console.print(
            f"{what} on {index['gpu']} in {index['source']}: wrote an empty "
            f"{out_dir / 'index.json'} and header"
        )
        return
    table = Table(
        title=f"{len(rows)} tuned kernels for {index['gpu']} ({index['arch']}) in {out_dir}"
    )
    for col in ("workload", "schedule", "µs", "runner"):
        table.add_column(col, justify="right" if col == "µs" else None)
    # Folded, not cut short with an ellipsis, where the terminal is narrow: a file name with
    # its end missing names no file.
    table.add_column("files", overflow="fold")
    # Times of kernels an older generator revision made (index.json's latency_label says
    # so): they were shown as this export's kernels' own.
    older = [row for row in rows if "latency_label" in row and not row["simulated"]]
    for row in rows:
        table.add_row(
            row["label"],
            row["schedule_id"],
            f"{row['latency_us']:.2f}" + ("*" if row in older else ""),
            row["runner"] or "-",
            _files_cell(row),
        )
    console.print(table)
    if older:
        more = f" (and {len(older) - 1} more: index.json's latency_label)" if older[1:] else ""
        console.print(f"* {older[0]['latency_label']}{more}", soft_wrap=True)
    console.print(f"header {out_dir / index['header']}, index {out_dir / 'index.json'}")
    # Quoted for the shell: pasted, a folder with a space was `cd: too many arguments`.
    console.print(f"build them: cd {shlex.quote(str(out_dir))} && {index['nvcc']}")
    if index["simulated"]:
        console.print(f"runner simulated: those latencies are {SIMULATED_LABEL}")


@reported
def export(
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"export every workload tuned on this GPU: {', '.join(gpu_keys())}"
    ),
    # A str, not a Path: Path("") is Path("."), and an empty --out-dir must be refused.
    out_dir: str | None = typer.Option(
        None,
        "--out-dir",
        metavar="DIR",
        help="where the kernels go (an earlier export there is replaced, other files stay; "
        "a folder whose index.json no export wrote is refused)",
    ),
    task: int | None = typer.Option(None, "--task", help="export this task's trials"),
    fmt: str | None = typer.Option(None, "--format", help="the trials' format: t4"),
    out: Path | None = typer.Option(
        None, "--out", parser=output_file, help="the T4 file (.t4.json[.gz])"
    ),
    as_json: bool = typer.Option(False, "--json", help="print what was written as JSON"),
    server: str | None = read_server_option(),
    api_key: str | None = api_key_option(),
    db: str | None = db_option(),
) -> None:
    """Tuned kernels of a GPU as files (source, cubin, launch JSON, pipetune_tuned.h,
    index.json), or a task's trials as a T4 file."""
    _check_modes(gpu, out_dir, task, fmt, out)
    from pipetune.clients.library import exports  # NVRTC, SQLAlchemy: only when exporting

    if out_dir is not None:
        # What the folder holds (a foreign index.json, a folder where a file goes), before
        # the database or the service is read.
        try:
            exports.check_export_dir(out_dir)
        except InvalidArgumentError as exc:
            raise _out_dir_refused(exc) from None

    if task is not None and out is not None:
        with service_errors(), reader(server, api_key, db) as c:
            try:
                dataset = exports.export_task_t4(c, task, out)
            except exports.NothingToExportError as exc:  # a state, not bad input: exit 1
                raise CliError(str(exc), 1) from None  # (a refused argument: exit 2)
        info = dataset.metadata["pipetune"]
        if as_json:
            print_json({"task": task, "path": str(out), "trials": len(dataset), **info})
            return
        console.print(f"wrote {len(dataset)} trials of task {task} to {out} (T4)")
        if "simulated" in str(info.get("runner")):
            console.print(f"runner simulated: those latencies are {SIMULATED_LABEL}")
        return
    assert gpu is not None and out_dir is not None  # _check_modes
    key = resolve_gpu_key(gpu)
    with service_errors(), reader(server, api_key, db) as c:
        try:
            index = exports.export_tuned(c, key, out_dir)
        except InvalidArgumentError as exc:
            if exc.argument != "out_dir":
                raise
            raise _out_dir_refused(exc) from None  # (a kernel's file name: a folder there)
    if as_json:
        print_json(index)
    else:
        _print_index(index, Path(out_dir))


def register(app: typer.Typer) -> None:
    """Add `export` to the `pipetune` app."""
    app.command("export")(export)
