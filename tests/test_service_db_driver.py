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


def test_names_become_sql_literals_and_nothing_else_does():
    """The driver's statements name its states and strategies as literals (a Python list
    bound as a parameter is dumped element by element at every execution)."""
    from pipetune.model.states import ACTIVE_TASK_STATES, OUTSTANDING_JOB_STATES
    from pipetune.service.db import sql_names
    from pipetune.service.driver import COMMIT_BATCH_SQL, READ_TASK_SQL

    assert sql_names(["running", "queued", "queued"]) == "'queued', 'running'"
    assert sql_names(["analytical+xgb"]) == "'analytical+xgb'"
    for bad in (["it's"], ["a', 'b"], [], ["Queued"]):
        with pytest.raises(ValueError, match="plain names"):
            sql_names(bad)
    assert f"j.state IN ({sql_names(OUTSTANDING_JOB_STATES)})" in READ_TASK_SQL
    assert f"state IN ({sql_names(ACTIVE_TASK_STATES)})" in COMMIT_BATCH_SQL
    assert "{" not in READ_TASK_SQL
