"""The worker token `serve` generates when none is configured: kept in a file only its
owner can read (never printed or logged), and reused at the next start so the workers
started with it keep working after a restart."""

from __future__ import annotations

import errno
import os
import secrets
import shlex
from pathlib import Path

from pipetune.model.wire import TOKEN_ENV
from pipetune.service.settings import generated_token_path


def read_generated_token(path: Path | None = None) -> str | None:
    """The token `serve` generated on this machine (for this user), if there is one; an
    unreadable file is an error (OSError), not a missing token."""
    try:
        return (path or generated_token_path()).read_text().strip() or None
    except FileNotFoundError:
        return None


def _keep_private(path: Path) -> None:
    """Make a kept token file readable by its owner only again (0600), as `serve` says it
    is: one made readable by others (a copy, a chmod, a umask of a restore) was reused and
    announced as "readable only by you". OSError where it is another user's."""
    status = path.stat()
    if not status.st_mode & 0o077:
        return
    if status.st_uid != os.getuid():
        raise OSError(
            errno.EPERM,
            f"{path} is readable by others and belongs to another user (remove it to make "
            "a new token)",
        )
    os.chmod(path, 0o600)


def generated_worker_token(path: Path | None = None) -> tuple[str, Path]:
    """(token, file): the file's token (the file made 0600 again where others could read
    it), or a new one written there with mode 0600."""
    path = path or generated_token_path()
    token = read_generated_token(path)
    if token:
        _keep_private(path)
        return token, path
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    # Created 0600 from the start (no window in which others could read it), then renamed
    # into place so a reader never sees a half-written file.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.replace(temporary, path)
    return token, path


def announcement(path: Path, reused: bool) -> str:
    """What `serve` prints of the token it uses: the file, never the token (console output
    ends up in logs), and whether it was made now or kept from an earlier start."""
    how = "kept from an earlier start" if reused else "generated"
    return (
        f"worker token: {how}, in {path} (readable only by you); workers take it as "
        f"{TOKEN_ENV}=$(cat {shlex.quote(str(path))}). Set PIPETUNE_WORKER_TOKENS "
        "to choose your own."
    )
