"""`Database.driver_statement` on PostgreSQL: one statement, its own transaction (autocommit),
on a pooled connection that goes back as it came, after a failing statement too."""

from __future__ import annotations

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from pipetune.service.db import Database

pytest_plugins = ["service_fixtures"]


def test_a_statement_commits_on_its_own_and_leaves_the_pool_as_it_was(pg_url):
    db = Database(pg_url, pool_size=1)  # one connection: every use below is the same one
    try:
        with db.driver_statement() as cur:
            cur.execute("CREATE TEMP TABLE probe (x int)")
        with db.driver_statement() as cur:
            cur.execute("INSERT INTO probe VALUES (1) RETURNING x")
            assert cur.fetchone().x == 1
            # No transaction is open around the statement: it is already committed.
            assert cur.connection.info.transaction_status.name == "IDLE"
        with pytest.raises(sa_exc.DBAPIError), db.driver_statement() as cur:
            cur.execute("INSERT INTO probe VALUES ('not a number')")
        with db.driver_statement() as cur:  # the failure left nothing half-open
            cur.execute("SELECT count(*) AS n FROM probe")
            assert cur.fetchone().n == 1
        # The ORM's transactions on the same pooled connection are transactions again.
        with db.engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is False
            conn.execute(text("INSERT INTO probe VALUES (2)"))
            conn.rollback()
            assert conn.execute(text("SELECT count(*) FROM probe")).scalar() == 1
    finally:
        db.engine.dispose()
