"""`Database.driver_statement` on PostgreSQL: one statement, its own transaction (autocommit),
on a connection of the driver's own pool (service/driver_pool.py), used again after a failing
statement too, never after the database dropped it."""

from __future__ import annotations

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from pipetune.service.db import Database, is_unavailable
from pipetune.service.driver_pool import DriverConnections

pytest_plugins = ["service_fixtures"]


def _backend_pid(db: Database) -> int:
    with db.driver_statement() as cur:
        cur.execute("SELECT pg_backend_pid() AS pid")
        return cur.fetchone().pid


def test_a_statement_commits_on_its_own_on_a_connection_that_is_used_again(pg_url):
    db = Database(pg_url, pool_size=1)  # one idle connection kept: every use is the same one
    try:
        first = _backend_pid(db)
        with db.driver_statement() as cur:
            cur.execute("CREATE TEMP TABLE probe (x int)")
        with db.driver_statement() as cur:
            cur.execute("INSERT INTO probe VALUES (1) RETURNING x")
            assert cur.fetchone().x == 1
            # No transaction is open around the statement: it is already committed.
            assert cur.connection.info.transaction_status.name == "IDLE"
        with pytest.raises(sa_exc.DBAPIError) as refused, db.driver_statement() as cur:
            cur.execute("INSERT INTO probe VALUES ('not a number')")
        assert not is_unavailable(refused.value)  # a bad statement, not an outage
        with db.driver_statement() as cur:  # the failure left nothing half-open
            cur.execute("SELECT count(*) AS n FROM probe")
            assert cur.fetchone().n == 1
        assert _backend_pid(db) == first  # (the temporary table lives on it)
        # The ORM's transactions are transactions (SQLAlchemy's pool, never in autocommit).
        with db.engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is False
    finally:
        db.dispose()


def test_a_connection_the_database_dropped_fails_one_statement_as_unavailable(pg_url):
    """A database restart (here: the backend terminated) fails the statement that finds it,
    answered as an outage (503), and the next statement runs on a new connection."""
    db = Database(pg_url, pool_size=1)
    try:
        dropped = _backend_pid(db)
        with db.engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": dropped})
        with pytest.raises(sa_exc.DBAPIError) as failed, db.driver_statement() as cur:
            cur.execute("SELECT 1")
        assert failed.value.connection_invalidated and is_unavailable(failed.value)
        assert _backend_pid(db) != dropped
        assert db._driver_connections().idle_count() == 1
    finally:
        db.dispose()


def test_the_driver_connections_are_bounded_retired_with_age_and_closed_on_dispose(pg_url):
    db = Database(pg_url, pool_size=1)
    try:
        connect = db._connect_driver
        pool = DriverConnections(connect, keep=1, limit=1, timeout_s=0.2)
        held = pool.take()
        with pytest.raises(sa_exc.TimeoutError) as waited:
            pool.take()  # the one allowed is in use
        assert is_unavailable(waited.value)
        pool.give_back(*held)
        again = pool.take()
        assert again[0] is held[0]  # kept idle and used again
        pool.give_back(*again)

        young = DriverConnections(connect, keep=1, limit=2, max_age_s=0.0)
        conn, opened = young.take()
        young.give_back(conn, opened)
        assert conn.closed and young.idle_count() == 0  # too old to keep

        pid = _backend_pid(db)
        kept = db._driver_connections().idle_count()
        db.dispose()
        assert kept == 1 and db._driver_connections().idle_count() == 0
        assert _backend_pid(db) != pid  # usable after a dispose, on a new connection
        pool.close()
    finally:
        db.dispose()


def test_a_connection_that_aged_while_idle_is_not_handed_out(pg_url):
    """max_age_s was checked when a connection was given back only: one kept idle past its
    age (a quiet night, a proxy that drops idle connections) was handed out all the same."""
    import time

    db = Database(pg_url, pool_size=1)
    try:
        pool = DriverConnections(db._connect_driver, keep=1, limit=1, max_age_s=0.5)
        conn, opened = pool.take()
        pool.give_back(conn, opened)
        assert pool.idle_count() == 1  # young enough to keep
        time.sleep(0.6)
        again, reopened = pool.take()
        assert again is not conn and conn.closed and reopened > opened
        pool.give_back(again, reopened)
        pool.close()
    finally:
        db.dispose()


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


def test_a_server_that_accepts_and_never_answers_fails_within_the_connect_timeout(monkeypatch):
    """A PostgreSQL that accepted connections and never answered (stopped, overloaded) held
    every request that needed a new connection, /healthz included, without end: the engine's
    and the driver's own connections now give up after CONNECT_TIMEOUT_S (an
    OperationalError: a 503 to the client)."""
    import socket
    import time

    import psycopg
    from sqlalchemy.exc import OperationalError

    from pipetune.service import db as db_module

    monkeypatch.setattr(db_module, "CONNECT_TIMEOUT_S", 2)
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)  # connections complete in the backlog; nothing ever answers
        url = f"postgresql+psycopg://nobody@127.0.0.1:{mute.getsockname()[1]}/none"
        database = db_module.Database(url, 1)
        try:
            began = time.monotonic()
            with pytest.raises(OperationalError), database.engine.connect():
                pass
            assert time.monotonic() - began < 8
            began = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                database._connect_driver()
            assert time.monotonic() - began < 8
        finally:
            database.dispose()


def _tcp_liveness(fileno: int) -> tuple[int, int, int]:
    """SO_KEEPALIVE, TCP_KEEPIDLE and TCP_USER_TIMEOUT of a connection's socket."""
    import socket

    sock = socket.socket(fileno=fileno)
    try:
        return (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        )
    finally:
        sock.detach()  # (the connection's socket: not to be closed here)


def test_every_postgresql_connection_finds_a_vanished_server_host_within_a_minute(
    pg_url, monkeypatch
):
    """An open connection whose server's host crashed or was cut off waited for its answer as
    long as the kernel's TCP defaults let it (over two hours), and a lease waits on the event
    loop: the engine's, the driver's and the listener's connections now use TCP keepalives
    after 30 s and a 30 s limit on unacknowledged data (libpq's keepalives_* and
    tcp_user_timeout); a value in the URL wins."""
    import threading

    from pipetune.service import wakeup as wakeup_module

    for url, expected in [
        (pg_url, (1, 30, 30_000)),
        (pg_url + "?keepalives_idle=45&tcp_user_timeout=5000", (1, 45, 5_000)),  # the URL's
    ]:
        db = Database(url, pool_size=1)
        try:
            with db.engine.connect() as conn:
                assert _tcp_liveness(conn.connection.dbapi_connection.fileno()) == expected
            with db.driver_statement() as cur:
                assert _tcp_liveness(cur.connection.fileno()) == expected
        finally:
            db.dispose()

    # The listener (service/wakeup.py) connects on its own, from a conninfo.
    seen: list[tuple[int, int, int]] = []
    stop = threading.Event()
    connect = wakeup_module.deadline_connect

    def recording(*args, **kwargs):
        conn = connect(*args, **kwargs)
        seen.append(_tcp_liveness(conn.fileno()))
        stop.set()
        return conn

    monkeypatch.setattr(wakeup_module, "deadline_connect", recording)
    conninfo = pg_url.replace("postgresql+psycopg://", "postgresql://")
    wakeup_module.listen(wakeup_module.Wakeup(shared=True), conninfo, stop)
    assert seen == [(1, 30, 30_000)]


def test_a_statement_past_its_deadline_gives_up_and_the_database_counts_as_stalled(pg_url):
    """A statement the server does not answer within the deadline (pg_sleep stands in for a
    stopped server: tests/test_db_stall.py stops one) fails with an OperationalError (a 503)
    after the deadline, on the driver's and on the ORM's connections, and the connection is
    closed (discarded by both pools). The database then counts as stalled: the driver's
    statements go one at a time, the probe, the others failing at once; a probe answered ends
    the stall."""
    import threading
    import time

    db = Database(pg_url, pool_size=2, statement_deadline_s=1)
    try:
        began = time.monotonic()
        with pytest.raises(sa_exc.OperationalError) as caught, db.driver_statement() as cur:
            cur.execute("SELECT pg_sleep(3)")
        assert 0.9 < time.monotonic() - began < 2.5
        assert caught.value.connection_invalidated and is_unavailable(caught.value)
        assert "within 1 s" in str(caught.value.orig)
        assert db.stalled and "has not answered within 1 s" in (db.stall_problem() or "")

        began = time.monotonic()
        with pytest.raises(sa_exc.OperationalError) as caught, db.read() as session:
            session.execute(text("SELECT pg_sleep(3)"))
        assert 0.9 < time.monotonic() - began < 2.5
        assert caught.value.connection_invalidated

        # A probe in flight: another driver statement fails at once, not after a deadline.
        failures: list[BaseException] = []

        def slow() -> None:
            try:
                with db.driver_statement() as cur:
                    cur.execute("SELECT pg_sleep(3)")
            except sa_exc.OperationalError as exc:
                failures.append(exc)

        probing = threading.Thread(target=slow)

        probing.start()
        time.sleep(0.3)
        began = time.monotonic()
        with pytest.raises(sa_exc.OperationalError) as caught, db.driver_statement():
            pass
        assert time.monotonic() - began < 0.2
        assert "has not answered" in str(caught.value.orig)
        probing.join()
        assert len(failures) == 1  # the probe itself, after its deadline

        db.probe()  # answered: no longer stalled
        assert not db.stalled
        with db.driver_statement() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() is not None
        with db.read() as session:
            assert session.execute(text("SELECT 1")).scalar() == 1
    finally:
        db.dispose()
