"""Schema migrations (Alembic, configured in code) and the start-up schema check.

The service never runs on a schema that differs from its ORM: at start it compares the
database's Alembic revision with the newest one and refuses to start, naming
`pipetune db upgrade`, unless the database is brand new and the caller allowed building it.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from pipetune.service.db import make_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class SchemaError(RuntimeError):
    """The database's schema is not the one this version of pipetune needs."""


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Passed as an attribute, not an ini option: URLs may hold '%' (ini interpolation).
    config.attributes["url"] = url
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def revision(message: str) -> None:
    """Autogenerate a new revision from the ORM (a developer tool; review the file)."""
    from pipetune.service.settings import Settings

    command.revision(alembic_config(Settings().database_url), message, autogenerate=True)


def _is_empty(engine: Engine) -> bool:
    return not inspect(engine).get_table_names()


def check_schema(url: str, *, create_if_empty: bool = False) -> str:
    """The database's revision when it is the newest; builds an empty database if allowed.

    Raises SchemaError (a one-line message naming the command to run) otherwise.
    """
    head = head_revision()
    engine = make_engine(url, pool_size=1)
    try:
        current = current_revision(engine)
        if current == head:
            return head
        if current is None and create_if_empty and _is_empty(engine):
            upgrade(url)
            return head
    finally:
        engine.dispose()
    where = "has no pipetune schema" if current is None else f"is at revision {current}"
    raise SchemaError(
        f"the database {where}, this pipetune needs {head}: "
        f"run `pipetune db upgrade --db {redact(url)}`"
    )


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
