"""A replica's schema check while another replica builds the same empty database.

docker-compose runs `pipetune db upgrade` in every replica at start, and `serve` checks the
schema before it starts. The check read the revision and the tables in two transactions: when
the other replica's upgrade committed between them, it saw pipetune's tables with no revision
and exited 1 calling them "tables of something else" (about one start in 120 on PostgreSQL).
Here the other replica's whole upgrade runs right after the check's first read, every time.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.service import migrate
from pipetune.service.db import make_engine

pytest_plugins = ["service_fixtures"]


def _other_replica_upgrades_after_the_first_read(monkeypatch: pytest.MonkeyPatch, url: str):
    """The first engine the schema check makes runs the other replica's upgrade (to its
    commit) as soon as its first read (not its BEGIN) has been answered."""
    if url.startswith("sqlite:///"):  # an empty file: `db upgrade` skips a missing one's check
        open(url.removeprefix("sqlite:///"), "x", encoding="utf-8").close()
    done: list[bool] = []
    made: list[bool] = []

    def engine_with_a_rival(*args, **kwargs):
        engine = make_engine(*args, **kwargs)
        if made:  # (the upgrade's own engines: the rival has had its turn)
            return engine
        made.append(True)

        @event.listens_for(engine, "after_cursor_execute")
        def _rival(_conn, _cursor, statement, *_):
            if not done and not statement.lstrip().upper().startswith("BEGIN"):
                done.append(True)
                migrate.upgrade(url)  # its own engine and transaction: committed on return

        return engine

    monkeypatch.setattr(migrate, "make_engine", engine_with_a_rival)
    # (`db upgrade` makes its engine from service.db, where the schema check imports it.)
    monkeypatch.setattr("pipetune.service.db.make_engine", engine_with_a_rival)
    return done


def test_a_schema_check_during_another_replicas_upgrade_finds_the_schema(empty_url, monkeypatch):
    rival = _other_replica_upgrades_after_the_first_read(monkeypatch, empty_url)
    assert migrate.check_schema(empty_url, create_if_empty=True) == migrate.head_revision()
    assert rival == [True]  # (the other replica's upgrade did run inside the check)


def test_db_upgrade_during_another_replicas_upgrade_succeeds(empty_url, monkeypatch):
    rival = _other_replica_upgrades_after_the_first_read(monkeypatch, empty_url)
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", empty_url])
    assert result.exit_code == 0, result.output
    assert f"is at revision {migrate.head_revision()}" in result.output
    assert rival == [True]
