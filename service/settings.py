"""Service settings, read from the environment (prefix ``PIPETUNE_``) or passed in.

PIPETUNE_DATABASE_URL    sqlite:///path.db (default: a file under the user data dir)
                         or postgresql+psycopg://user@host/db
PIPETUNE_WORKER_TOKENS   comma-separated tokens workers authenticate with
PIPETUNE_API_KEYS        comma-separated keys for the user routes (unset: open)
PIPETUNE_CORS_ORIGINS    comma-separated browser origins allowed to call the API, each
                         as a browser sends it (https://host[:port], no path)
                         (unset: none; CORS stays off)
PIPETUNE_ALLOWED_HOSTS   comma-separated Host names to answer ("*": any; unset: any, but
                         only localhost, 127.0.0.1 and ::1 on loopback without API keys)
PIPETUNE_LEASE_TTL_S     seconds a leased job stays with its worker without a result
PIPETUNE_MAX_ATTEMPTS    expired leases before a job is given up as `lost`
PIPETUNE_BATCH_SIZE      trials a task proposes per round, unless it asks for its own
PIPETUNE_LEASE_POLL_S    how long a waiting lease request goes without looking at the
                         queue when no wake-up comes (the fallback; default 5 s)
PIPETUNE_LEASE_WAIT_CAP_S  the longest a lease request is held waiting (default 30 s)
PIPETUNE_SWEEP_INTERVAL_S  seconds between upkeep sweeps (expired leases; 0: off)
PIPETUNE_PROPOSE_EARLY   share of a batch still out when the next is proposed (0: off)
PIPETUNE_PROPOSER_THREADS  tasks a replica proposes for at once (default 4)
PIPETUNE_MAX_BODY_BYTES  a request body's cap (default 1 MB)
PIPETUNE_REQUEST_READ_TIMEOUT_S  seconds a request may take to arrive whole (default 60)
PIPETUNE_DB_POOL_SIZE    connections per pool (a replica opens up to 3 x this + 3)
PIPETUNE_DB_STATEMENT_DEADLINE_S  seconds the service waits for the database to answer a
                         statement before it gives up, closes that connection and answers
                         503 (PostgreSQL; default 30, at least 1)
Every duration is at most a week (model.wire.MAX_SECONDS).
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from pathlib import Path
from typing import Annotated
from urllib.parse import quote, unquote, urlsplit

import platformdirs
from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from pipetune.model.errors import PipetuneError
from pipetune.model.wire import MAX_BATCH_SIZE, MAX_SECONDS, secret_char_ok

MAX_ATTEMPTS = 1000  # a job's expired leases before it is lost (past it: a crash loop)
MIN_STATEMENT_DEADLINE_S = 1.0  # the shortest wait for a statement that is not a stall
MAX_BODY_BYTES = 1 << 30  # a request body's cap can be raised to a GiB, no further
MAX_POOL_SIZE = 1000  # connections per pool (PostgreSQL's max_connections bounds it anyway)
MAX_PROPOSER_THREADS = 64

# The database backends the service runs on (service/db.py, the two queue stores).
DATABASE_BACKENDS = ("sqlite", "postgresql")
DATABASE_URL_FORMS = "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
MAX_PORT = 65535


class SettingsError(PipetuneError, ValueError):
    """A setting that cannot be used; the message names the option or variable."""


def default_database_url() -> str:
    """The embedded default: one SQLite file in the user's data directory."""
    return sqlite_url(Path(platformdirs.user_data_dir("pipetune")) / "pipetune.db")


def sqlite_url(path: Path) -> str:
    """The SQLite URL of the file at `path`. Quoted: SQLAlchemy reads a URL's `?` as its
    query and decodes `%XX`, so a path with `?` or `%20` in it named another file."""
    return f"sqlite:///{quote(str(path), safe='/')}"


def sqlite_uri_url(path: Path, **options: str) -> str:
    """The URL of the file at `path` in SQLite's URI form, with `options` (mode=ro,
    immutable=1). Its path is quoted twice: SQLite reads '#', '?' and '%XX' in a URI's path as
    its own (a folder "x#2" opened, and created, a database "x" beside it), and SQLAlchemy
    decodes '%XX' once before SQLite sees the URI."""
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"sqlite:///file:{quote(quote(str(path), safe='/'), safe='/')}?{query}&uri=true"


def generated_token_path() -> Path:
    """Where `serve` keeps the worker token it generated (when none is configured)."""
    return Path(platformdirs.user_data_dir("pipetune")) / "worker-token"


def token_hash(token: str) -> str:
    """Tokens are kept and compared only as sha256 digests (never the token itself)."""
    return hashlib.sha256(token.encode()).hexdigest()


def database_url_problem(url: str) -> str | None:
    """Why `url` is not a database URL the service can use, in a few words; None if it is.
    Checked up front so that a typo reads as one line naming the URL's problem, not as an
    SQLAlchemy exception raised when the first connection is made."""
    # SQLAlchemy loads only where a URL is checked (the service's settings), not at import.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # (ValueError: a port that is not a number)
        # The URL itself stays out of the message: it may hold a password.
        return f"not a database URL (expected {DATABASE_URL_FORMS})"
    if parsed.port is not None and not 1 <= parsed.port <= MAX_PORT:
        # (libpq refused 70000 only when connecting, an exit 1, and took 0 for its default.)
        return f"the port must be 1..{MAX_PORT}, got {parsed.port}"
    backend = parsed.get_backend_name()
    if backend not in DATABASE_BACKENDS:
        return f"not a database URL pipetune can use ({backend!r}; expected {DATABASE_URL_FORMS})"
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Each connection gets an empty database of its own: the schema built on one was not
        # there for the next ("no such table: tasks"; `db upgrade` answered "revision None").
        return (
            "an in-memory SQLite database lasts only as long as one connection, and pipetune "
            "opens several: name a file (sqlite:///path.db)"
        )
    try:
        parsed.get_dialect().import_dbapi()
    except (NoSuchModuleError, ImportError) as exc:
        return f"no driver for {parsed.drivername} here ({exc}; expected {DATABASE_URL_FORMS})"
    return None


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None: another backend, or an in-memory database)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if str(parsed.query.get("uri", "")).lower() in ("true", "1") and parsed.database.startswith(
        "file:"
    ):
        # A SQLite URI (sqlite:///file:/srv/p.db?mode=ro&uri=true, a read-only database):
        # SQLite opens its path part. Read as a file name, `db current` found "no database
        # file at file:/srv/p.db" beside an up-to-date database, and the engine made a folder
        # "file:" in the working directory for it.
        if parsed.query.get("mode") == "memory":
            return None
        path = unquote(urlsplit(parsed.database).path)
        return None if path in ("", ":memory:") else Path(path)
    return Path(parsed.database).expanduser()


def database_file_problem(url: str) -> str | None:
    """Why the file of a SQLite URL cannot be the database (a directory, or a file of
    another kind); None if it can (also when it does not exist yet: it is created)."""
    path = sqlite_path(url)
    if path is None:
        return None
    if not path.exists():
        # The folders it is made in: one that is a file failed only when the file was made,
        # "File exists (FOLDER)", exit 1 (and `db current` said `db upgrade` creates it).
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            return f"{above} is not a folder (the database file would be made under it)"
        return None
    if path.is_dir():
        return f"{path} is a directory, not a database file"
    if not os.access(path, os.R_OK):
        return f"cannot read {path} (Permission denied)"
    if _sqlite_says_not_a_database(path):
        return f"{path} is not a SQLite database file"
    return None


def _sqlite_says_not_a_database(path: Path) -> bool:
    """Whether SQLite finds no database in the file (an empty one is an empty database).

    Asked of SQLite, not read with open(): closing any descriptor of a file drops every
    POSIX lock this process holds on it, SQLite's for its open connections included (SQLite's
    "How To Corrupt", 2.2). The library checks the file before every call, so one thread's
    check dropped another thread's locks, another process took the database as unused, reset
    its write-ahead log, and committed tunings were lost. SQLite keeps a descriptor of a file
    its connections lock open until the locks go. Any other failure (busy, no -shm in a
    read-only folder) is left to the connection that follows, which says what it is."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=0)
    except sqlite3.Error:
        return False
    try:
        conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as exc:
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB
    finally:
        conn.close()
    return False


def validated_settings(**overrides: object) -> Settings:
    """The settings from the environment with `overrides`; SettingsError naming the PIPETUNE_
    variable that is wrong (pydantic's ValidationError is several lines, none of which names
    it, and no PipetuneError: the library's calls raised it as it was)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise SettingsError(f"PIPETUNE_{field.upper()}: {message}") from None


def settings_variables() -> frozenset[str]:
    """The environment variables the settings read (PIPETUNE_ and each field's name, but
    create_empty_schema's, which `serve` passes itself)."""
    fields = [name for name in Settings.model_fields if name != "create_empty_schema"]
    return frozenset(f"PIPETUNE_{name.upper()}" for name in fields)


def load_settings(db: str | None = None, **overrides: object) -> Settings:
    """The settings, with `db` (a --db option) as the database URL where given; SettingsError
    naming --db or the PIPETUNE_ variable that is wrong."""
    if db is not None:  # (checked first, so that the error names --db; its file below)
        problem = database_url_problem(db)
        if problem:
            raise SettingsError(f"--db: {problem}")
        overrides["database_url"] = db
    settings = validated_settings(**overrides)
    problem = database_file_problem(settings.database_url)
    if problem:
        raise SettingsError(f"{'--db' if db is not None else 'PIPETUNE_DATABASE_URL'}: {problem}")
    return settings


def origin_problem(origin: str) -> str | None:
    """Why `origin` is not a browser origin as CORS matches it (exactly, as the browser's
    Origin header writes it: scheme://host[:port], lowercase, no path); None if it is, or
    is "*". One with a trailing slash, a path or no scheme matched no request, silently."""
    if origin == "*":
        return None
    parts = urlsplit(origin)
    written = f"{parts.scheme}://{parts.netloc}".lower()
    if parts.scheme.lower() in ("http", "https") and parts.netloc and origin == written:
        return None
    web = parts.scheme.lower() in ("http", "https") and parts.netloc
    hint = f" ({written!r}?)" if web else ""
    return (
        f"{origin!r} is not an origin as a browser sends it: scheme://host[:port], lowercase, "
        f"no path{hint}"
    )


# A Host header's value: a name or IPv4 address, or an IPv6 one (bracketed or bare), with an
# optional port.
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*|[A-Za-z0-9._-]+)(:[0-9]+)?")


def host_problem(host: str) -> str | None:
    """Why `host` is not a Host name PIPETUNE_ALLOWED_HOSTS can match ("*" is any); None
    if it is. http://tuner.lan was read as the name "http", and every request refused."""
    if host == "*" or _HOST.fullmatch(host):
        return None
    name = urlsplit(host if "//" in host else f"//{host}").hostname
    hint = f" ({name!r}?)" if name and _HOST.fullmatch(name) else ""
    return (
        f"{host!r} is not a host name as a request's Host writes it: a name or address, "
        f"with an optional port, no scheme, path or wildcard (* alone: any){hint}"
    )


# A path prefix as a proxy writes it: segments of unreserved and sub-delimiter characters
# (no query, fragment, percent-escape or empty segment).
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@-]+")


def root_path_problem(root_path: str) -> str | None:
    """Why `root_path` is not the path prefix a reverse proxy serves the service under
    (e.g. /pipetune); None if it is, or is empty (served at the root)."""
    if root_path == "":
        return None
    segments = root_path.split("/")
    if (
        segments[0] == ""
        and len(segments) > 1
        and all(_PATH_SEGMENT.fullmatch(seg) and seg not in (".", "..") for seg in segments[1:])
    ):
        return None
    hint = f" ({'/' + root_path.strip('/')!r}?)" if root_path.strip("/") else ""
    return (
        f"{root_path!r} is not a path prefix: /name[/name...], no trailing slash, query or "
        f"escape; empty for none{hint}"
    )


def secret_problem(secret: str) -> str | None:
    """Why a worker token or API key cannot be sent in an HTTP header as pipetune's workers,
    CLI and SDK send it (model.wire.secret_char_ok: visible ASCII, no space); None if it
    can. Never quotes the secret."""
    if all(map(secret_char_ok, secret)):
        return None
    return (
        "holds a space, a control or a non-ASCII character: no worker or client sends such a "
        "secret (visible ASCII only)"
    )


# A secret shorter than this is a password someone picked, guessed by trying (16 random
# characters of the 94 a secret may hold are over 100 bits; `secrets.token_urlsafe(16)` is 22).
MIN_SECRET_CHARS = 16


def short_secret_warnings(settings: Settings) -> list[str]:
    """A warning for each API key and worker token shorter than MIN_SECRET_CHARS (counted,
    never quoted). Warned, not refused: on a loopback address, or behind a proxy that checks
    its own credentials, a short one is the user's choice."""
    warnings = []
    for variable, secrets in (
        ("PIPETUNE_API_KEYS", settings.api_keys),
        ("PIPETUNE_WORKER_TOKENS", settings.worker_tokens),
    ):
        what = "key" if variable == "PIPETUNE_API_KEYS" else "token"
        for i, secret in enumerate(secrets, 1):
            if len(secret) < MIN_SECRET_CHARS:
                warnings.append(
                    f"warning: {variable}: {what} {i} (of {len(secrets)}) has {len(secret)} "
                    f"characters, few enough to be guessed by trying; use {MIN_SECRET_CHARS} or "
                    "more random ones (python -c "
                    "'import secrets; print(secrets.token_urlsafe(24))')"
                )
    return warnings


def _split(value: object) -> object:
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",") if part.strip()]
        if value.strip() and not parts:
            # (" , " was read as no key at all: the user routes open, or any Host answered,
            # where a template that lost its values meant to close them.) Empty is unset.
            raise ValueError(
                f"{value!r} names nothing (only commas and spaces); leave it unset or empty "
                "for none"
            )
        return parts
    return value


class Settings(BaseSettings):
    # hide_input_in_errors: a ValidationError's text quotes the value it refused, and the
    # database URL refused may hold a password (Settings() is built outside load_settings
    # too: create_app, the library's LocalStore, whose callers see the error as it is).
    model_config = SettingsConfigDict(
        env_prefix="PIPETUNE_", extra="ignore", hide_input_in_errors=True
    )

    database_url: str = Field(default_factory=default_database_url)
    # Secrets: kept out of repr() (and so out of any log line that prints the settings).
    worker_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)
    # Browser origins allowed cross-origin access; empty: no CORS headers at all.
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The Host names requests may be addressed to ("*": any); empty: any, except that `serve`
    # on a loopback address without API keys answers only localhost, 127.0.0.1 and ::1
    # (service/middleware.HostGuard: DNS rebinding).
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The path prefix a reverse proxy serves the service under (/pipetune: the proxy's
    # https://host/pipetune/v1/... is the service's /v1/...), whether the proxy strips it
    # or passes it on; /docs and the OpenAPI document name it. Empty: served at the root.
    # (The dashboard's links are relative to its page: it needs no prefix of its own.)
    root_path: str = ""
    # Upper bounds on every number (and no NaN or infinity, which were told "less than or
    # equal to 604800"): each is refused at start with the variable named, where
    # one past what anything means (inf, 1e12) was taken and broke later (a lease with no
    # expiry, an upkeep that overflowed a SQLite integer at every sweep).
    lease_ttl_s: float = Field(120.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    max_attempts: int = Field(3, ge=1, le=MAX_ATTEMPTS)
    # A task's batch size unless it asks for its own (TaskCreate.batch_size).
    batch_size: int = Field(8, ge=1, le=MAX_BATCH_SIZE)
    # A model-guided task proposes its next batch once at most this share of its batch is
    # still being measured, the rest believed at its predictions (driver.py, "early
    # proposals"): workers do not wait on a batch's slowest trials. Off by default: at equal
    # trials it costs about 0.005 of best-in-k; where trials take different times and the
    # fleet sets the pace it gave 17-53% more results/s (benchmarks/RESULTS.md, "early
    # proposals"). 0: whole batches.
    propose_early: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False)
    # Tasks whose next batch a replica proposes at once (service/proposer.py): one slow
    # proposal (a long task's session rebuilt) holds only its own thread. An advance holds a
    # database connection for its reads and its write, and while it builds a task's prior
    # from recorded trials (its first advance), not while it proposes.
    proposer_threads: int = Field(4, ge=1, le=MAX_PROPOSER_THREADS)
    # A lease request that found nothing waits for a wake-up (jobs of its kind enqueued, in
    # this replica or, on PostgreSQL, another: service/wakeup.py); this is the fallback, how
    # long it waits before it looks at the queue again without one. Then the longest a
    # lease request is held (below a proxy's idle timeout; short in tests: workers drain
    # when their poll returns).
    lease_poll_s: float = Field(5.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    lease_wait_cap_s: float = Field(30.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    # Background upkeep (expired leases, tasks whose batch completed): seconds, 0 = off.
    sweep_interval_s: float = Field(2.0, ge=0, le=MAX_SECONDS, allow_inf_nan=False)
    max_body_bytes: int = Field(1_000_000, ge=1024, le=MAX_BODY_BYTES)
    # Seconds a request may take to arrive whole (head and body) from its first byte, or a
    # new connection to send one: then the connection is closed (service/http_protocol.py).
    request_read_timeout_s: float = Field(60.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    # Build the schema when the database is empty (`serve` on a fresh install).
    create_empty_schema: bool = False
    db_pool_size: int = Field(10, ge=1, le=MAX_POOL_SIZE)
    # Seconds the service waits for PostgreSQL to answer one statement (service/db.py,
    # DeadlineConnection): a server that is up and never answers (stopped, storage hung)
    # held a replica's every request. Longer than any statement the service sends (its
    # floor: _deadline).
    db_statement_deadline_s: float = Field(30.0, le=MAX_SECONDS, allow_inf_nan=False)

    @field_validator("db_statement_deadline_s")
    @classmethod
    def _deadline(cls, value: float) -> float:
        # 0.0001 s was taken: the replica started, gave up on every statement and answered
        # 503 for ever, /healthz blaming a stopped database or hung storage.
        if value < MIN_STATEMENT_DEADLINE_S:
            raise ValueError(
                f"at least {MIN_STATEMENT_DEADLINE_S:g} s, got {value:g}: shorter, the "
                "service gives up on a loaded database's ordinary statements and answers 503 "
                "as if it had stopped"
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        problem = database_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("root_path")
    @classmethod
    def _root_path(cls, value: str) -> str:
        if problem := root_path_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("worker_tokens", "api_keys", "cors_origins", "allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split(value)

    @field_validator("worker_tokens", "api_keys")
    @classmethod
    def _secrets(cls, value: list[str], info: ValidationInfo) -> list[str]:
        what = "token" if info.field_name == "worker_tokens" else "key"
        for i, secret in enumerate(value, 1):
            if problem := secret_problem(secret):
                raise ValueError(f"{what} {i} (of {len(value)}) {problem}")
        return value

    @field_validator("allowed_hosts", "cors_origins")
    @classmethod
    def _names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        problem_of = host_problem if info.field_name == "allowed_hosts" else origin_problem
        for name in value:
            if problem := problem_of(name):
                raise ValueError(problem)
        return value

    @property
    def worker_token_hashes(self) -> list[str]:
        return [token_hash(t) for t in self.worker_tokens]

    @property
    def api_key_hashes(self) -> list[str]:
        return [token_hash(k) for k in self.api_keys]
