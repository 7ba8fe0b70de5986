"""The worker token `serve` generates when none is configured, made by two processes at once
(two `pipetune serve` starting together on one machine): both must end up with the token the
file holds. Each read "no file" and wrote its own through os.replace: the last one's stayed
in the file, and the other process accepted a token nobody could read (its workers, started
with `$(cat FILE)`, were refused). The race is played deterministically: the other process
publishes its token between this one's read and its publish."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from pipetune.service import worker_token
from pipetune.service.worker_token import generated_worker_token, read_generated_token

THEIRS = "token-of-the-other-process"


def _other_process_publishes_after_the_read(monkeypatch, path: Path) -> None:
    """This process reads "no file"; then, before it publishes, the other one has (its file
    complete and 0600, as it writes it)."""
    real = worker_token.read_generated_token
    calls = {"n": 0}

    def read(p: Path | None = None) -> str | None:
        calls["n"] += 1
        if calls["n"] == 1:
            found = real(p)
            assert found is None
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(THEIRS + "\n")
            return found
        return real(p)

    monkeypatch.setattr(worker_token, "read_generated_token", read)


def _leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_a_token_published_by_another_process_meanwhile_is_the_one_used(tmp_path, monkeypatch):
    path = tmp_path / "pipetune" / "worker-token"
    path.parent.mkdir()
    _other_process_publishes_after_the_read(monkeypatch, path)
    token, where = generated_worker_token(path)
    assert where == path
    # Theirs, which the file holds (this process's own token was never published).
    assert token == THEIRS
    assert read_generated_token(path) == THEIRS
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _leftovers(path) == []  # its temporary file is gone


def test_a_new_token_is_published_whole_and_private(tmp_path):
    path = tmp_path / "pipetune" / "worker-token"
    token, _ = generated_worker_token(path)
    assert token and path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _leftovers(path) == []
    assert generated_worker_token(path) == (token, path)  # kept at the next start


def test_an_empty_token_file_is_replaced(tmp_path):
    path = tmp_path / "worker-token"
    path.write_text("\n")
    path.chmod(0o600)
    token, _ = generated_worker_token(path)
    assert token and read_generated_token(path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _leftovers(path) == []


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP])
def test_a_file_system_without_hard_links_still_gets_a_token(tmp_path, monkeypatch, code):
    def no_links(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(worker_token.os, "link", no_links)
    path = tmp_path / "worker-token"
    token, _ = generated_worker_token(path)
    assert token and read_generated_token(path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _leftovers(path) == []
