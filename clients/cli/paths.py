"""Output and archive paths checked before a command does any work.

A command that measures for minutes and then finds it cannot write its file has wasted the
minutes; these checks refuse such a path first, as a usage mistake (exit 2, one line naming
the option), so the write at the end only fails for reasons nobody could foresee.
"""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
from pathlib import Path

import typer

from pipetune.clients.cli.errors import CliError, one_line


def _nearest_existing(folder: Path) -> Path | None:
    # A link to nothing is there too (exists() is False for it): mkdir fails on it.
    return next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), None)


def _check_writable(folder: Path, option: str) -> None:
    """A folder the command writes in (or makes a folder in): this user may. The atomic
    writes make a temporary file beside the output, so the folder itself must be writable
    (a read-only one failed with a PermissionError naming the temporary file)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{option}: cannot write in {folder} (permission denied)", 2)
    # os.access says yes to root everywhere on a writable mount, /proc and /sys included
    # (and cannot know a read-only or full file system): a file made and removed says.
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".pipetune-check-"):
            pass
    except OSError as exc:
        raise CliError(f"{option}: cannot write in {folder} ({exc.strerror or exc})", 2) from None


def _check_creatable(folder: Path, option: str) -> None:
    """The folder exists as a directory or can be made: its nearest existing ancestor is a
    directory (mkdir under a file fails with NotADirectoryError only after the work) that
    this user may write in."""
    found = _nearest_existing(folder)
    if found is not None and found.is_symlink() and not found.exists():
        # mkdir failed with FileExistsError, after the work, through the unexpected-error path.
        raise CliError(
            f"{option}: {found} is a broken symbolic link (to {os.readlink(found)}, "
            "which does not exist)",
            2,
        )
    if found is not None and not found.is_dir():
        raise CliError(f"{option}: {found} is not a directory", 2)
    if found is not None:
        _check_writable(found, option)


def _check_regular(path: Path, option: str) -> None:
    """An existing output is a regular file (or a link to one): the atomic write replaces
    the path with a new file, which would turn a device, a FIFO or a socket into a file
    (it made /dev/full a JSON file)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return  # a new file (or a link to one), or under a file: the folder checks say so
    except OSError as exc:  # a loop of links, a name too long, ...
        raise CliError(f"{option}: {path}: {exc.strerror or exc}", 2) from None
    if not stat.S_ISREG(mode):
        raise CliError(f"{option}: {path} is not a regular file", 2)


def output_file(text: str) -> Path:
    """An output file option's value (typer's `parser`): refused where it ends in a path
    separator, which names a folder. Made a Path, the separator was dropped, and `--out
    newd/` wrote a file named newd."""
    if text.endswith(("/", os.sep)):
        raise typer.BadParameter(f"{text!r} names a folder (it ends in /): give the file's path")
    return Path(text)


def check_output_file(path: Path, option: str, *, create_parent: bool = False) -> None:
    """Refuse a file output that cannot be written: a directory, something other than a
    regular file, or a parent folder that is missing (unless ``create_parent``: the command
    makes it), is not a directory, or is not this user's to write in."""
    if path.is_dir():
        raise CliError(f"{option}: {path} is a directory", 2)
    _check_regular(path, option)
    # A link is written through: its target's folder is where the file is made.
    parent = path.resolve().parent if path.is_symlink() else path.parent
    if create_parent:
        _check_creatable(parent, option)
    elif not parent.exists():
        raise CliError(f"{option}: directory {parent} does not exist", 2)
    elif not parent.is_dir():
        raise CliError(f"{option}: {parent} is not a directory", 2)
    else:
        _check_writable(parent, option)


def check_output_dir(path: Path, option: str) -> None:
    """Refuse a directory output that exists as something else (a file); a missing one is
    fine when the command creates it, as long as it can be created."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{option}: {path} is not a directory", 2)
    _check_creatable(path, option)


def check_tar_archive(path: Path, option: str) -> None:
    """Refuse a file that tarfile cannot read to its end, in one line. tarfile's own error
    for a non-archive lists every compression it tried, one per line."""
    if not path.exists():
        raise CliError(f"{option}: {path}: no such file", 2)
    if path.is_dir():
        raise CliError(f"{option}: {path} is a directory, not an archive", 2)
    opened = False
    try:
        with tarfile.open(path, "r:*") as tar:
            opened = True
            # Read every header: a truncated or corrupt archive fails here, not mid-run.
            tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CliError(f"{option}: {path} {_why_unreadable(exc, opened)}", 2) from None


def _why_unreadable(exc: BaseException, opened: bool) -> str:
    reason = one_line(exc) or type(exc).__name__
    if opened:
        return f"is not a readable tar archive ({reason})"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or reason})"
    # tarfile tried every compression, and its message lists each on a line of its own.
    return "is not a tar archive (not gzip, bzip2, xz or plain tar)"
