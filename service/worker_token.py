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
from pipetune.service.settings import generated_token_path, secret_problem


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
    it), or a new one written there with mode 0600. Two processes making it at once (two
    `serve` starting together) both end with the one token the file holds."""
    path = path or generated_token_path()
    token = read_generated_token(path)
    if token:
        if problem := secret_problem(token):
            # (Kept and announced, it left `serve --local-workers` serving with no worker:
            # each refused to send it.)
            raise OSError(
                errno.EINVAL,
                f"the token it holds {problem.replace('holds', 'has', 1)}; remove the file "
                "to make a new one",
            )
        _keep_private(path)
        return token, path
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    # Created 0600 from the start (no window in which others could read it), and written
    # whole before it is published, so a reader never sees a half-written file.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(token + "\n")
        if _publish(temporary, path):
            return token, path
        # Another process published its token since this one read "no file": its token is
        # the file's, the one its workers will read. (Replaced, as os.replace did, this
        # process's token won the file and the other one accepted a token nobody could read.)
        theirs = read_generated_token(path)
        if theirs:
            _keep_private(path)
            return theirs, path
        # An empty file (not another process's: they publish whole files): replaced, as a
        # missing one is made.
        os.replace(temporary, path)
        return token, path
    finally:
        temporary.unlink(missing_ok=True)


# What os.link raises where the file system has no hard links (FAT, some network mounts).
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def _publish(temporary: Path, path: Path) -> bool:
    """Put the written temporary file in place as `path` unless `path` exists (whole: a
    hard link, atomic). False where it exists (another process published first)."""
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        # No hard links here: created exclusively, then the content copied in (a process
        # reading in between finds an empty file: the narrow window the link closes).
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(temporary.read_text(encoding="utf-8"))
    return True


def announcement(path: Path, reused: bool) -> str:
    """What `serve` prints of the token it uses: the file, never the token (console output
    ends up in logs), and whether it was made now or kept from an earlier start."""
    how = "kept from an earlier start" if reused else "generated"
    return (
        f"worker token: {how}, in {path} (readable only by you); workers take it as "
        f"{TOKEN_ENV}=$(cat {shlex.quote(str(path))}). Set PIPETUNE_WORKER_TOKENS "
        "to choose your own."
    )
