"""Schema migrations (Alembic, configured in code) and the start-up schema check.

The service never runs on a schema that differs from its ORM: at start it compares the
database's Alembic revision with the newest one and refuses to start, naming
`pipetune db upgrade`, unless the database is brand new and the caller allowed building it.
"""

from __future__ import annotations

import functools
import shlex
import threading
from pathlib import Path
from urllib.parse import quote

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from pipetune.model.errors import PipetuneError
from pipetune.service.db import make_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class SchemaError(PipetuneError, RuntimeError):
    """The database's schema is not the one this version of pipetune needs."""


def alembic_config(url: str) -> Config:
    config = Config()
    # Ini options interpolate '%': an install under a path holding one (".../100% disk/...")
    # made every start fail with configparser's "invalid interpolation syntax".
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    # Passed as an attribute, not an ini option: URLs may hold '%' (ini interpolation).
    config.attributes["url"] = url
    return config


@functools.cache  # (the installed migrations do not change while the process runs)
def head_revision() -> str:
    """The newest revision of the installed migrations: read once per process (reading the
    scripts cost each service start and each schema check some milliseconds)."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def known_revisions() -> list[str]:
    """Every revision this pipetune has, newest first."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [s.revision for s in script.walk_revisions()]


def current_revision(engine: Engine) -> str | None:
    return schema_snapshot(engine)[0]


def schema_snapshot(engine: Engine) -> tuple[str | None, list[str]]:
    """The database's revision and its table names (sorted), read in one transaction.

    Read apart, a replica building the same empty database (docker-compose runs `pipetune db
    upgrade` in each) could commit between the two: the revision read first said none, the
    tables read second were pipetune's, and the second replica exited 1 calling them
    "tables of something else". One snapshot (REPEATABLE READ on PostgreSQL, one read
    transaction on SQLite) sees the upgrade whole or not at all; the tables are read first
    so that, even without it, seeing them means their revision is committed too."""
    # A read-only transaction: on SQLite a plain one is BEGIN IMMEDIATE (service.db), and a
    # command that only asks the revision queued behind any writer for 30 s, then failed.
    options: dict = {"pipetune_readonly": True}
    if engine.dialect.name == "postgresql":
        options["isolation_level"] = "REPEATABLE READ"
    with engine.execution_options(**options).connect() as conn, conn.begin():
        names = sorted(inspect(conn).get_table_names())
        heads = MigrationContext.configure(conn).get_current_heads()
    if len(heads) > 1:
        # (Alembic's own words were "please use get_current_heads()", exit 1.)
        raise SchemaError(
            f"the database's alembic_version holds {len(heads)} revisions "
            f"({', '.join(sorted(heads))}) where pipetune's history is one line: a newer "
            "pipetune with branched migrations, another program or a hand edit wrote them"
        )
    return (heads[0] if heads else None), names


def other_tables(names: list[str]) -> list[str]:
    """Of a database's table names, all but Alembic's own (which a downgrade to base
    leaves): where it has no pipetune revision, another program's tables, or pipetune's
    written without its migrations."""
    return [t for t in names if t != "alembic_version"]


# Tables every pipetune schema has held since its first revision: a database at an Alembic
# revision without any of them is another program's that uses Alembic too.
PIPETUNE_TABLES = frozenset({"workloads", "tasks", "jobs"})


def unowned_tables(current: str | None, names: list[str]) -> list[str]:
    """What revision_problem takes as `tables`. Without a revision, every table the database
    holds. At a revision, another program's schema: the tables of a database whose revision
    holds none of pipetune's tables, else []. Its revision alone read as "a newer pipetune
    wrote it", or, where it happened to be one of pipetune's, as a schema behind, whose
    upgrade then failed; where it was pipetune's newest (zero-padded ids are common: 0010),
    as pipetune's schema damaged, to be restored from a backup over the other program's
    data."""
    tables = other_tables(names)
    if current is None:
        return tables
    return [] if PIPETUNE_TABLES & set(tables) else tables


def missing_columns(engine: Engine) -> list[str]:
    """The ORM's columns (``table.column``) that the database lacks. A database at
    the newest revision has them all, unless something changed it behind the migrations'
    back: a released revision edited later (as 0002 and 0005 once were: migration 0006) or
    a hand-made change. Its revision alone cannot tell."""
    from pipetune.service.orm import Base

    with engine.execution_options(pipetune_readonly=True).connect() as conn:
        inspector = inspect(conn)
        present = set(inspector.get_table_names())
        lacking = []
        for table in Base.metadata.sorted_tables:
            # A table that is not there lacks every column (it was skipped: `db current`
            # said "up to date" of a database without `leases`, whose every lease failed).
            names = (
                {c["name"] for c in inspector.get_columns(table.name)}
                if table.name in present
                else set()
            )
            lacking += [f"{table.name}.{c.name}" for c in table.columns if c.name not in names]
        return lacking


def columns_problem(missing: list[str], url: str) -> str:
    """The message for a database at the newest revision without every column."""
    shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
    return (
        f"the database {redact(url)} is at revision {head_revision()} but lacks {shown}: its "
        "schema was changed outside pipetune's migrations; restore it from a backup (or add "
        "the columns as the ORM in service/orm.py defines them)"
    )


def revision_problem(current: str | None, tables: list[str] | None = None) -> str | None:
    """What is wrong with a database at revision `current` for this pipetune (None: it is at
    the newest); `tables`: what unowned_tables found."""
    head = head_revision()
    if tables:  # (first: another program's schema can be at a revision named as pipetune's)
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        whose = "" if current is None else f", at its own Alembic revision {current},"
        return (
            f"the database holds tables of something else ({shown}){whose} and no pipetune "
            "schema: point --db at an empty database or at one pipetune made"
        )
    if current == head:
        return None
    if current is not None and current not in known_revisions():
        return (
            f"the database is at revision {current}, which this pipetune does not know (its "
            f"newest is {head}): a newer pipetune wrote it; upgrade pipetune to use it"
        )
    return None  # behind: `pipetune db upgrade` brings it to the newest


# Alembic's commands install and remove a module-global proxy (`alembic.context`): two at
# once in one process (two threads' first `pipetune.tune` on a new database) removed it twice,
# and one of them died with a bare KeyError: 'config'. One at a time; an upgrade that waited
# finds the schema made and does nothing.
_ALEMBIC = threading.Lock()


def upgrade(url: str, revision: str = "head") -> None:
    with _ALEMBIC:
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    with _ALEMBIC:
        command.downgrade(alembic_config(url), revision)


def revision(message: str) -> None:
    """Autogenerate a new revision from the ORM (a developer tool; review the file)."""
    from pipetune.service.settings import Settings

    with _ALEMBIC:
        command.revision(alembic_config(Settings().database_url), message, autogenerate=True)


def check_schema(url: str, *, create_if_empty: bool = False) -> str:
    """The database's revision when it is the newest; builds an empty database if allowed.

    Raises SchemaError (a one-line message naming the command to run) otherwise.
    """
    if create_if_empty:
        with _creation_lock(url):  # (another thread's creation is seen whole, or not begun)
            return _check_schema(url, create_if_empty)
    return _check_schema(url, create_if_empty)


_CREATING: dict[str, threading.Lock] = {}
_CREATING_GUARD = threading.Lock()


def _creation_lock(url: str) -> threading.Lock:
    """One lock per database for check_schema's look and creation: a database that does not
    answer (a connect timeout) holds up only the threads creating that one."""
    with _CREATING_GUARD:
        return _CREATING.setdefault(url, threading.Lock())


def _check_schema(url: str, create_if_empty: bool) -> str:
    head = head_revision()
    # WAL mode, persistent in the file, is set only where pipetune's database is about to be
    # made: a check that may create it, of a SQLite file not there yet or empty (WAL from the
    # first connection, so that another replica's upgrade can commit while this check
    # reads). Anywhere else the file may not be pipetune's: `serve` and `import-dataset` on
    # another program's database switched it to WAL, then refused it. (A pipetune database
    # is in WAL mode already, from its making.)
    engine = make_engine(url, pool_size=1, wal=create_if_empty and not_made_yet(url))
    try:
        current, names = schema_snapshot(engine)
        tables = unowned_tables(current, names)
        if current == head and not tables:
            if missing := missing_columns(engine):
                raise SchemaError(columns_problem(missing, url))
            return head
        if current is None and create_if_empty and not names:
            upgrade(url)
            return head
    finally:
        engine.dispose()
    if problem := revision_problem(current, tables):
        raise SchemaError(problem)
    where = "has no pipetune schema" if current is None else f"is at revision {current}"
    raise SchemaError(
        f"the database {where}, this pipetune needs {head}: "
        f"run `pipetune db upgrade --db {shlex.quote(redact(url))}`"
    )


def not_made_yet(url: str) -> bool:
    """Whether the URL's SQLite file is missing or empty (False for any other database)."""
    from pipetune.service.db import sqlite_path

    path = sqlite_path(url)
    return path is not None and (not path.exists() or path.stat().st_size == 0)


def check_writable(url: str) -> None:
    """SchemaError where the database cannot be written (a SQLite file or folder without
    write permission, a read-only URI). The service writes on every request: on such a file
    it started, answered reads, and answered every write with 503 "retry shortly", for ever.
    PostgreSQL refuses a read-only role's writes per statement, as it should: not probed."""
    from sqlalchemy.exc import OperationalError

    from pipetune.service.db import is_sqlite, unavailable_reason

    if not is_sqlite(url):
        return
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn, conn.begin() as transaction:
            # A write that changes nothing, rolled back: SQLite refuses it on a read-only
            # file (BEGIN IMMEDIATE alone succeeds there).
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
            transaction.rollback()
    except OperationalError as exc:
        reason = unavailable_reason(exc)
        if "readonly" not in reason and "read-only" not in reason:
            raise
        raise SchemaError(
            f"the database {redact(url)} cannot be written ({reason}): the service needs "
            "write access to the file, its folder and its -wal and -shm files where they are "
            "there (SQLite keeps its journal beside it)"
        ) from None
    finally:
        engine.dispose()


# What SQLite says of a file it may not open or write, whatever the cause (permissions, a
# read-only mount, a folder it may not write its journal into).
_SQLITE_ACCESS_ERRORS = ("unable to open database file", "attempt to write a readonly database")


def sqlite_access_hint(url: str, reason: str) -> str:
    """For SQLite's access errors, what to check (its own words name no cause)."""
    if not url.startswith("sqlite") or not any(e in reason for e in _SQLITE_ACCESS_ERRORS):
        return ""
    return (
        " (SQLite needs to read the file and, to write it, to write the file and its folder, "
        "where it keeps its journal, and its -wal and -shm files where they are there: check "
        "them, and that they are not on a read-only mount)"
    )


# libpq takes a password in the query too (postgresql://user@host/db?password=...), which
# SQLAlchemy hands to the driver as it does the one in the URL's user info, and which
# render_as_string(hide_password=True) shows as it shows every query parameter.
SECRET_QUERY_KEYS = frozenset({"password", "sslpassword"})
HIDDEN = "***"  # (what SQLAlchemy shows for the user info's password)


def redact(url: str) -> str:
    """The URL without its passwords (the user info's and the query's), for messages."""
    from sqlalchemy.engine import make_url

    from pipetune.model.trials import readable_os_text

    # (A SQLite path that is not UTF-8 failed every command that names its database with
    # UnicodeEncodeError, exit 1, after `db upgrade` had done its work.)
    given = readable_os_text(url)
    parsed = make_url(given)
    hidden = {k: HIDDEN for k in parsed.query if k.lower() in SECRET_QUERY_KEYS}
    if not hidden and parsed.password is None:
        # Nothing to hide: as given. Rendered, a path's % and \ came back URL-quoted
        # (a%25b.db), naming a file that does not exist.
        return given
    if not hidden:
        return parsed.render_as_string(hide_password=True)
    shown = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return shown.replace(quote(HIDDEN, safe=""), HIDDEN)  # (the query's value is URL-quoted)
