"""Fixtures of the service tests, loaded with `pytest_plugins = ["service_fixtures"]`.

Databases: every test gets an empty, migrated database, on SQLite (a copy of a migrated
template file) and on the local PostgreSQL (one fresh database per test session, created
as pipetune_bench_<random>, tables truncated between tests, dropped at the end). Without a
PostgreSQL the PostgreSQL variant fails with the reason (conftest.py): it never skips.

A TRUNCATE costs PostgreSQL 0.1-0.2 s of wall whatever the tables hold (new files for every
table, index and sequence), and many tests write nothing (a refused request, a read): the
tables are truncated only when a test may have written to them, which leaves the same
state as truncating always (empty tables, unused sequences).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_support import PG_ADMIN_URL, TestClient, client_for, require_pg
from sqlalchemy import Engine, create_engine, text

from benchmarks.harness import pg_database
from pipetune.service.migrate import upgrade
from pipetune.service.orm import Base


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    require_pg()
    with pg_database(PG_ADMIN_URL) as url:
        upgrade(url)
        try:
            yield url
        finally:
            cleaner = _cleaners.pop(url, None)
            if cleaner is not None:
                cleaner.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own with no tables at all (no schema), on each dialect: for the
    tests of migrations and of databases in unexpected states."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    request.getfixturevalue("pg_url")  # fails when there is no PostgreSQL
    with pg_database(PG_ADMIN_URL) as url:
        yield url


# Whether any of the service's tables may hold a row, or any sequence gave out a number,
# since the last TRUNCATE: a table's heap file is empty until a row is written (one rolled
# back included), and a sequence's last value is NULL until nextval runs.
_WRITTEN_SQL = text(
    """
    SELECT EXISTS (
        SELECT 1 FROM pg_class
        WHERE relnamespace = current_schema()::regnamespace
          AND ((relkind = 'r' AND relname = ANY(:tables) AND pg_relation_size(oid) > 0)
               OR (relkind = 'S' AND pg_sequence_last_value(oid) IS NOT NULL))
    )
    """
)


# One connection per session database for emptying it between tests (pg_url disposes it);
# pinged before each use, as a test may have cut it.
_cleaners: dict[str, Engine] = {}


def _truncate(url: str) -> None:
    """Empty every table and restart their sequences, when a test may have written."""
    engine = _cleaners.get(url)
    if engine is None:
        engine = _cleaners[url] = create_engine(url, pool_size=1, pool_pre_ping=True)
    names = [t.name for t in Base.metadata.sorted_tables]
    with engine.begin() as conn:
        if conn.execute(_WRITTEN_SQL, {"tables": names}).scalar_one():
            conn.execute(text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty migrated database, on each dialect."""
    if request.param == "sqlite":
        template = request.getfixturevalue("sqlite_template")
        path = tmp_path / "pipetune.db"
        shutil.copy(template, path)
        return f"sqlite:///{path}"
    return request.getfixturevalue("pg")


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> str:
    """An empty migrated PostgreSQL database (the session's, truncated): for what only
    PostgreSQL has (its statements' plans, its locks)."""
    url = request.getfixturevalue("pg_url")
    _truncate(url)
    return url


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with client_for(db_url) as c:
        yield c
