"""Databases that are not where this pipetune expects them, on SQLite and PostgreSQL: one of
another program's, one a newer pipetune wrote, one another writer holds, one whose tables a
migration must wait for. Each gets a line that says which, not advice that makes it worse."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from urllib.parse import quote

import pytest
from service_support import require_pg, table_names
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.service.db import make_engine, switch_to_wal
from pipetune.service.migrate import SchemaError, check_schema, head_revision, upgrade
from pipetune.service.settings import sqlite_uri_url, sqlite_url

pytest_plugins = ["service_fixtures"]
runner = CliRunner()


def _execute(url: str, *statements: str) -> None:
    engine = make_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def test_another_programs_database_is_named_so_and_not_written_into(empty_url):
    """It was "no pipetune schema: run `pipetune db upgrade`", which then wrote pipetune's
    tables in beside the other program's."""
    _execute(empty_url, "CREATE TABLE users (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaError, match=r"holds tables of something else \(users\)"):
        check_schema(empty_url, create_if_empty=True)
    current = runner.invoke(app, ["db", "current", "--db", empty_url, "--json"])
    assert current.exit_code == 0, current.output
    doc = json.loads(current.stdout)
    assert (doc["state"], doc["other_tables"]) == ("other_tables", ["users"])

    refused = runner.invoke(app, ["db", "upgrade", "--db", empty_url])
    assert refused.exit_code == 1, refused.output
    assert "tables of something else (users)" in refused.stderr
    assert "--into-existing" in refused.stderr
    assert table_names(empty_url) == {"users"}

    added = runner.invoke(app, ["db", "upgrade", "--db", empty_url, "--into-existing"])
    assert added.exit_code == 0, added.output
    assert {"users", "tasks", "jobs", "alembic_version"} <= table_names(empty_url)
    assert check_schema(empty_url) == head_revision()


def test_a_clash_with_another_programs_table_says_what_the_database_said(empty_url):
    """The line was "cannot open the database ...: OperationalError" (SQLite) for a database
    that opened, and named no cause."""
    _execute(empty_url, "CREATE TABLE jobs (id INTEGER PRIMARY KEY)")
    result = runner.invoke(app, ["db", "upgrade", "--db", empty_url, "--into-existing"])
    assert result.exit_code == 1, result.output
    line = result.stderr.strip()
    assert "failed:" in line and "jobs" in line and "already exists" in line
    assert "INSERT" not in line and "CREATE" not in line  # no SQL in the line
    assert table_names(empty_url) == {"jobs"}  # the migration's transaction left nothing behind


def test_a_newer_pipetunes_database_asks_for_a_newer_pipetune(empty_url):
    """It was "behind: run `pipetune db upgrade`", and the upgrade then failed with Alembic's
    "Can't locate revision"."""
    upgrade(empty_url)
    _execute(empty_url, "UPDATE alembic_version SET version_num = '0099'")
    with pytest.raises(SchemaError, match="revision 0099, which this pipetune does not know"):
        check_schema(empty_url)
    doc = json.loads(runner.invoke(app, ["db", "current", "--db", empty_url, "--json"]).stdout)
    assert doc["state"] == "newer"
    said = runner.invoke(app, ["db", "current", "--db", empty_url]).stdout
    assert "a newer pipetune wrote it" in said and "behind" not in said
    refused = runner.invoke(app, ["db", "upgrade", "--db", empty_url])
    assert refused.exit_code == 1
    assert "a newer pipetune wrote it; upgrade pipetune" in refused.stderr


def test_asking_the_revision_does_not_wait_for_a_sqlite_writer(tmp_path):
    """`db current` (and every command's schema check) began a write transaction to read
    the revision: behind another writer it waited 30 s, then failed."""
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    upgrade(url)
    writer = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE alembic_version SET version_num = version_num")
    try:
        started = time.monotonic()
        result = runner.invoke(app, ["db", "current", "--db", url, "--json"])
        waited = time.monotonic() - started
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["up_to_date"] is True
        assert check_schema(url) == head_revision()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert waited < 20  # (30 s and an error before)


@pytest.mark.parametrize("empty_url", ["postgresql"], indirect=True)
def test_a_postgresql_migration_gives_up_on_a_table_another_session_holds(empty_url):
    """`db upgrade` waited for ever behind an open transaction on a table, and every query
    of the service queued behind the waiting ALTER TABLE. (SQLite's writers queue on its
    busy timeout instead.)"""
    upgrade(empty_url, "0003")
    holder = create_engine(empty_url)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.connect() as conn, conn.begin():
            conn.execute(text("LOCK TABLE jobs IN ACCESS SHARE MODE"))
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(30)
        started = time.monotonic()
        result = runner.invoke(app, ["db", "upgrade", "--db", empty_url])
        waited = time.monotonic() - started
    finally:
        release.set()
        thread.join()
        holder.dispose()
    assert result.exit_code == 1, result.output
    assert "lock" in result.stderr and waited < 40
    current = runner.invoke(app, ["db", "current", "--db", empty_url, "--json"]).stdout
    assert json.loads(current)["current"] == "0003"  # nothing half-done
    assert runner.invoke(app, ["db", "upgrade", "--db", empty_url]).exit_code == 0  # once free


def test_a_read_only_sqlite_database_is_refused_at_start(tmp_path):
    """The service started on it, answered reads, and every write with 503 "retry shortly"
    for ever. (A read-only URI stands in for a file without write permission, which the
    tests' root user would write anyway.)"""
    from service_support import settings

    from pipetune.service.app import create_app
    from pipetune.service.migrate import check_writable

    upgrade(sqlite_url(tmp_path / "ro.db"))
    read_only = sqlite_uri_url(tmp_path / "ro.db", mode="ro")
    with pytest.raises(SchemaError, match=r"cannot be written .*readonly database"):
        create_app(settings(read_only))
    check_writable(f"sqlite:///{tmp_path / 'ro.db'}")  # the same file, writable: no error
    assert check_schema(read_only) == head_revision()  # reading it is fine


def test_a_database_that_cannot_be_reached_says_why():
    """PostgreSQL refusing the connection and a database that does not exist both said
    "failed: OperationalError": the driver's first line now says which."""
    from sqlalchemy.engine import make_url

    url = make_url(require_pg()).set(database="pipetune_no_such_db")
    missing = runner.invoke(
        app, ["db", "current", "--db", url.render_as_string(hide_password=False)]
    )
    assert missing.exit_code == 1, missing.output
    assert 'database "pipetune_no_such_db" does not exist' in missing.stderr
    refused = runner.invoke(app, ["tasks", "--db", "postgresql+psycopg://postgres@127.0.0.1:1/x"])
    assert refused.exit_code == 1, refused.output
    assert "port 1 failed: Connection refused" in refused.stderr


def test_serve_refused_for_a_read_only_database_writes_no_worker_token(tmp_path):
    """It wrote (and announced) its generated worker token, then said the database cannot
    be written: a serve that exits must leave nothing of its own behind."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app

    upgrade(sqlite_url(tmp_path / "ro.db"))
    read_only = sqlite_uri_url(tmp_path / "ro.db", mode="ro")
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "PIPETUNE_WORKER_TOKENS": ""}
    result = CliRunner().invoke(app, ["serve", "--db", read_only, "--port", "0"], env=env)
    assert result.exit_code == 1, result.output
    assert "cannot be written" in result.stderr and "-wal and -shm" in result.stderr
    assert "worker token" not in result.output
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "revision",
    ["ae1027a6acf", "0003", head_revision()],
    ids=["unknown", "pipetune's", "pipetune's newest"],
)
def test_another_programs_alembic_database_is_called_so(empty_url, revision):
    """Its revision alone said "a newer pipetune wrote it; upgrade pipetune" (which would not
    help), or, at a revision of pipetune's own name, "behind: run db upgrade", whose upgrade
    then failed on a table that is not there; at pipetune's newest (zero-padded ids are
    common), "lacks workers.id, ...: restore it from a backup", over the other's data."""
    from sqlalchemy import text
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.service.db import make_engine

    engine = make_engine(empty_url, pool_size=1)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (id INTEGER PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(text(f"INSERT INTO alembic_version VALUES ('{revision}')"))
    engine.dispose()
    said = f"tables of something else (users), at its own Alembic revision {revision},"
    with pytest.raises(SchemaError, match=re.escape(said)):
        check_schema(empty_url)
    for command in (["db", "upgrade"], ["db", "upgrade", "--into-existing"]):
        result = CliRunner().invoke(app, [*command, "--db", empty_url])
        assert result.exit_code == 1, (command, result.output)
        assert said in result.stderr and "--into-existing" not in result.stderr
    current = CliRunner().invoke(app, ["db", "current", "--db", empty_url, "--json"])
    doc = json.loads(current.stdout)
    assert (doc["state"], doc["other_tables"], doc["current"]) == (
        "other_tables",
        ["users"],
        revision,
    )
    assert set(table_names(empty_url)) == {"users", "alembic_version"}  # nothing written
    engine = make_engine(empty_url, pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            assert [tuple(r) for r in rows] == [(revision,)]
    finally:
        engine.dispose()


def test_a_sqlite_path_under_the_home_folder_is_the_one_used(tmp_path, monkeypatch):
    """sqlite:///~/...: `db current` and the folder made for the file read the home's, and
    SQLite opened "~/..." under the working directory: `db upgrade` made the home's folder,
    then failed "unable to open database file" (or, beside a folder named "~", wrote there)."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    url = "sqlite:///~/dbs/p.db"
    upgraded = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert upgraded.exit_code == 0, upgraded.output
    assert (home / "dbs" / "p.db").is_file()
    assert list(work.iterdir()) == []
    current = runner.invoke(app, ["db", "current", "--db", url, "--json"])
    assert json.loads(current.stdout)["state"] == "up_to_date", current.output


def test_a_sqlite_uri_is_read_as_the_file_it_names(tmp_path, monkeypatch):
    """sqlite:///file:PATH?mode=ro&uri=true (a read-only database): `db current` said "no
    database file at file:PATH" of an up-to-date database (`--check`: exit 1), and the
    engine made a folder "file:" in the working directory for it."""
    monkeypatch.chdir(tmp_path)
    upgrade(sqlite_url(tmp_path / "p.db"))
    for url in (
        sqlite_uri_url(tmp_path / "p.db", mode="ro"),
        f"sqlite:///file://{quote(quote(str(tmp_path / 'p.db')))}?uri=true",
    ):
        current = runner.invoke(app, ["db", "current", "--db", url, "--check"])
        assert current.exit_code == 0, current.output
        assert "up to date" in current.stdout
    assert not (tmp_path / "file:").exists()


def test_a_look_at_another_programs_sqlite_file_leaves_its_journal_mode(tmp_path):
    """`db current`, `db upgrade` and the schema check of `serve` and `db import-dataset`
    put another program's database in WAL mode (a change its file keeps) before refusing it;
    `db current` made an empty file a 4 KiB WAL database."""
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    before = foreign.read_bytes()
    url = f"sqlite:///{foreign}"
    looked = runner.invoke(app, ["db", "current", "--db", url])
    assert looked.exit_code == 0 and "something else (users)" in looked.stdout, looked.output
    assert runner.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 1
    with pytest.raises(SchemaError, match="something else"):
        check_schema(url, create_if_empty=True)
    assert foreign.read_bytes() == before
    with sqlite3.connect(foreign) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    empty = tmp_path / "empty.db"
    empty.touch()
    assert runner.invoke(app, ["db", "current", "--db", f"sqlite:///{empty}"]).exit_code == 0
    assert empty.stat().st_size == 0
    # Where pipetune's database is to be made (a file not there yet, or empty), WAL from the
    # first connection, as before.
    made = tmp_path / "made.db"
    assert check_schema(f"sqlite:///{made}", create_if_empty=True) == head_revision()
    with sqlite3.connect(made) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


class _LockedCursor:
    """A cursor whose journal-mode switch meets another connection's lock `times` times."""

    def __init__(self, times: int):
        self.times = times
        self.tries = 0

    def execute(self, sql: str) -> None:
        assert sql == "PRAGMA journal_mode=WAL"
        self.tries += 1
        if self.tries <= self.times:
            raise sqlite3.OperationalError("database is locked")


def test_a_wal_switch_that_meets_a_lock_is_tried_again_within_the_busy_timeout():
    """SQLite answers a journal-mode switch that would deadlock with another connection
    "database is locked" at once, without waiting: one of two `serve`s starting together on
    a new file exited 1 in most such starts."""
    cursor = _LockedCursor(times=3)
    switch_to_wal(cursor)
    assert cursor.tries == 4
    stuck = _LockedCursor(times=10**6)
    began = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        switch_to_wal(stuck, busy_s=0.2)
    assert 0.2 <= time.monotonic() - began < 2


def test_two_revisions_in_alembic_version_are_named_not_alembics_advice(empty_url):
    """A newer pipetune with branched migrations (or a hand edit) leaves two rows; every
    command said Alembic's "please use get_current_heads()", exit 1."""
    upgrade(empty_url)
    _execute(empty_url, "INSERT INTO alembic_version VALUES ('0999')")
    words = f"holds 2 revisions ({head_revision()}, 0999) where pipetune's history is one line"
    result = runner.invoke(app, ["db", "current", "--db", empty_url])
    assert result.exit_code == 1 and words in result.stderr, result.output
    assert "get_current_heads" not in result.output
    with pytest.raises(SchemaError, match=re.escape(words)):
        check_schema(empty_url)
