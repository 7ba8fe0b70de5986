"""A pipetune SQLite database in a folder SQLite may not write (a read-only mount, a share) is
read all the same: SQLite keeps a WAL database's -shm file beside it even to read, and every
read command failed with "unable to open database file". The folder cannot be made read-only
for the tests' root user, so SQLite's refusal is stood in for; the URLs it falls back to are
real SQLite and read the real file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import pipetune
from pipetune.clients.library import store
from pipetune.clients.library.store import LocalDatabaseError, LocalStore, read_only_sqlite_url
from pipetune.service.settings import sqlite_path, sqlite_url

FC = {"op": "gemm", "m": 256, "n": 256, "k": 256}
REFUSED = "OperationalError: unable to open database file"


# A share's folder may be named anything: SQLite's URI form reads '#', '?' and '%XX' in its
# path as its own (the read-only URL of ".../team #2/t.db" opened, and made, ".../team ").
FOLDERS = ["results", "team #2 100% é?"]


@pytest.fixture(params=FOLDERS, ids=["plain folder", "folder with #, ?, % in its name"])
def tuned(tmp_path, monkeypatch, request):
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")
    (tmp_path / request.param).mkdir()
    url = sqlite_url(tmp_path / request.param / "t.db")
    pipetune.tune(FC, "h100", budget=2, runner="simulated", db=url)
    return url


def _opens(url: str) -> tuple[Path | None, dict]:
    return sqlite_path(url), dict(make_url(url).query)


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_checkpointed_database_is_read_as_immutable_and_one_with_its_wal_read_only(
    tmp_path, folder
):
    (tmp_path / folder).mkdir()
    db = tmp_path / folder / "t.db"
    db.write_bytes(b"")
    url = sqlite_url(db)
    assert _opens(read_only_sqlite_url(url, REFUSED)) == (db, {"immutable": "1", "uri": "true"})
    (tmp_path / folder / "t.db-wal").write_bytes(b"")
    assert read_only_sqlite_url(url, REFUSED) is None  # its changes need the -shm it cannot make
    (tmp_path / folder / "t.db-shm").write_bytes(b"")
    assert _opens(read_only_sqlite_url(url, REFUSED)) == (db, {"mode": "ro", "uri": "true"})
    assert read_only_sqlite_url(url, "OperationalError: database is locked") is None
    assert read_only_sqlite_url(sqlite_url(tmp_path / "none.db"), REFUSED) is None


def test_a_database_sqlite_cannot_open_for_writing_is_read_through_its_read_only_url(
    tuned, monkeypatch
):
    real = store.check_schema

    def refuse_plain_opens(url, **kwargs):
        if "uri=true" not in url:  # SQLite in a read-only folder: no -shm, no open
            raise OperationalError("open", {}, sqlite3.OperationalError(REFUSED.split(": ")[1]))
        return real(url, **kwargs)

    monkeypatch.setattr(store, "check_schema", refuse_plain_opens)
    with LocalStore(tuned) as local:
        (task,) = local.tasks()
        assert task.state == "done" and local.where == tuned
    assert pipetune.best_schedule(FC, "h100", db=tuned).source == "measured"
    folder = sqlite_path(tuned).parent
    assert list(folder.parent.iterdir()) == [folder]  # (no database made beside it)


def test_a_database_that_cannot_be_opened_at_all_says_what_to_check(tuned, monkeypatch):
    def refuse(url, **kwargs):
        raise OperationalError("open", {}, sqlite3.OperationalError(REFUSED.split(": ")[1]))

    monkeypatch.setattr(store, "check_schema", refuse)
    with pytest.raises(LocalDatabaseError, match="unable to open database file") as caught:
        LocalStore(tuned).tasks()
    assert "-wal and -shm" in str(caught.value) and "read-only mount" in str(caught.value)
