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


def test_json_parameters_carry_the_values_json_dumps_wrote():
    """The statements' JSON parameters are written by pydantic-core's encoder now (json.dumps
    took 136 us for eight reports of twenty samples): the same values, and the same words
    for what PostgreSQL must refuse."""
    import json
    import math

    from pipetune.service.db import json_param

    values = [
        {"i": 0, "samples_us": [0.1, 1 / 3, 5e-324, 1e300, -0.0], "error": "ptxas: é \u0000"},
        {"schedule": {"chunk": 2, "smem_stages": 3}, "predicted_us": 12.345678901234567},
        {"n": 3, "steps": [[0, 31.5], [2, 12.25]]},
        None,
    ]
    for value in values:
        assert json.loads(json_param(value)) == value
    special = json.loads(json_param([math.nan, math.inf, -math.inf]))
    assert math.isnan(special[0]) and special[1:] == [math.inf, -math.inf]
    assert "\\u0000" in json_param("a\u0000b")  # escaped, as json.dumps did
