"""Alembic environment for the pipetune service database.

Configured programmatically by service.migrate (no alembic.ini): the database URL, or an open
connection, arrives in ``config.attributes``. The target metadata is the ORM's, so
autogenerate and the migration test compare against exactly what the service uses.
"""

from __future__ import annotations

import sys

from alembic import context

from pipetune.service.db import make_engine
from pipetune.service.orm import Base

config = context.config
target_metadata = Base.metadata
# PostgreSQL: how long a migration waits for a table's lock.
SET_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"
# PostgreSQL: one upgrade at a time on a database. Replicas that all run `pipetune db upgrade`
# at start (docker-compose) each read the old revision in their own transaction and applied
# the same steps: every second one failed (DuplicateColumn, or a duplicate type in pg_type).
# Taken before the revision is read (run_migrations) and before the lock timeout is set, so
# the second waits for the first to commit and then finds nothing to do.
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(7370616964)"  # (the key: "pipetune" in digits)
# The same lock if free now (true), else false: a migration that must wait says so first (it
# waited without a word, with no time limit, while another session held the lock).
MIGRATION_LOCK_NOW = "SELECT pg_try_advisory_xact_lock(7370616964)"


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # One transaction for the whole upgrade on SQLite too: Alembic's SQLite default is no
        # transactional DDL (each revision committed on its own), so a failure, or the foreign
        # key check below, left the database at a revision in between, already committed.
        # SQLite does run DDL inside a transaction (service.db's BEGIN IMMEDIATE).
        transactional_ddl=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=config.attributes["url"],
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _set_sqlite_foreign_keys(connection, on: bool) -> None:
    # On the driver's connection, outside any transaction: inside one SQLite ignores the
    # pragma, and the SQLAlchemy connection would begin one (BEGIN IMMEDIATE) to run it.
    cursor = connection.connection.driver_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON" if on else "PRAGMA foreign_keys=OFF")
    finally:
        cursor.close()


def _dangling(connection) -> set[tuple]:
    """SQLite's foreign key violations: (table, rowid, parent table) each. Not the key's
    index SQLite also gives: a rebuilt table numbers its keys anew (0002 added `prior_task`
    as the first key of `tasks`, and `workload_id`'s went from 0 to 1), and an old violation
    then read as one the migration made."""
    rows = connection.exec_driver_sql("PRAGMA foreign_key_check")
    return {(table, rowid, parent) for table, rowid, parent, _key in rows}


def _migrate(connection) -> None:
    """Run the migrations on `connection` in one transaction.

    On SQLite a batch operation rebuilds a table: it copies it, drops the old one and renames
    the copy. With foreign keys enforced (the service's connections enforce them), dropping
    `tasks` deleted its rows one by one, and ON DELETE CASCADE took every job and, through
    them, every lease with it: 0001 -> 0002 emptied a database of its trials. So, as
    Alembic's batch-mode documentation advises, foreign keys are off while the tables are
    rebuilt, and checked as a whole before the transaction commits (a violation the
    migration made fails it; one the database held before is left as it was)."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        _set_sqlite_foreign_keys(connection, on=False)
    try:
        _configure(connection)
        with context.begin_transaction():
            # Rows that pointed nowhere before (written with foreign keys off by something
            # else) are not the migration's doing: only new ones fail it.
            before = _dangling(connection) if sqlite else set()
            if connection.dialect.name == "postgresql":
                if not connection.exec_driver_sql(MIGRATION_LOCK_NOW).scalar():
                    print(
                        "waiting for another migration of this database (a `pipetune db "
                        "upgrade` or a starting service) to finish; Ctrl-C stops waiting, "
                        "changing nothing",
                        file=sys.stderr,
                        flush=True,
                    )
                    connection.exec_driver_sql(MIGRATION_LOCK)
                # A migration's ALTER TABLE waits for every open transaction on the table,
                # and every query of the service then queues behind it: give up instead,
                # and let `pipetune db upgrade` say so (it can be run again).
                connection.exec_driver_sql(SET_LOCK_TIMEOUT)
            context.run_migrations()
            if sqlite:
                broken = sorted(_dangling(connection) - before)
                if broken:  # raised inside the transaction: nothing of it is kept
                    raise RuntimeError(
                        f"the migration left {len(broken)} rows whose foreign keys point "
                        f"nowhere (first: table {broken[0][0]}, row {broken[0][1]})"
                    )
    finally:
        if sqlite:
            _set_sqlite_foreign_keys(connection, on=True)


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = make_engine(config.attributes["url"], pool_size=1)
    try:
        with engine.connect() as conn:
            _migrate(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
