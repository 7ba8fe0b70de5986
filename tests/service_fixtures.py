"""Fixtures of the service tests, loaded with `pytest_plugins = ["service_fixtures"]`.

Databases: every test gets an empty, migrated database, on SQLite (a copy of a migrated
template file) and on the local PostgreSQL (one fresh database per test session, created
as pipetune_bench_<random>, tables truncated between tests, dropped at the end). Without a
PostgreSQL the PostgreSQL variant fails with the reason (conftest.py): it never skips.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_support import PG_ADMIN_URL, TestClient, client_for, require_pg
from sqlalchemy import create_engine, text

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
        yield url


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


def _truncate(url: str) -> None:
    engine = create_engine(url)
    tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


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
    """An empty migrated PostgreSQL database (the module's, truncated): for what only
    PostgreSQL has (its statements' plans, its locks)."""
    url = request.getfixturevalue("pg_url")
    _truncate(url)
    return url


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with client_for(db_url) as c:
        yield c
