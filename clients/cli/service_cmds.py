"""`pipetune serve` (the tuning service) and `pipetune db ...` (its database).

    pipetune serve                                  # embedded SQLite, 127.0.0.1:8000
    pipetune serve --local-workers 3 --runner simulated
    pipetune serve --db postgresql+psycopg://user@host/pipetune --host 0.0.0.0
    pipetune db upgrade [--db URL]
    pipetune db current [--db URL]
    pipetune db import-optimum DATASET [--db URL]
    pipetune db import-dataset DATASET [--db URL]

Without --db the URL comes from PIPETUNE_DATABASE_URL, else the embedded default (a SQLite
file under the user data directory). A brand-new empty database gets the schema when
`serve` starts; a database whose schema is behind is refused until `pipetune db upgrade`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pipetune.clients.cli.environment import unknown_variable_warnings
from pipetune.clients.cli.errors import CliError, Terminated, interrupted, one_line, reported
from pipetune.clients.cli.hosts import is_loopback_host
from pipetune.clients.cli.output import console, print_json
from pipetune.model.wire import TOKEN_ENV
from pipetune.service.local_workers import (
    RUNNERS,
    WORKERS_PER_CPU,
    local_workers_problem,
    preflight,
    start_workers,
    stop_workers,
)

if TYPE_CHECKING:
    from pipetune.service.settings import Settings

# service.settings and service.migrate (Alembic) load inside the commands that use them, so
# `pipetune worker` and every other command start without them.

db_app = typer.Typer(help="The service database: migrations and reference optima.")

_DB = typer.Option(
    None, "--db", help="database URL (default: PIPETUNE_DATABASE_URL, else embedded SQLite)"
)


# Idle keep-alive connections are closed by the client before the server: with uvicorn's
# 5 s default equal to httpx's, a request sent on a connection idle ~5 s could meet the
# server's close and fail (seen under load). 75 s also outlasts a load balancer's usual 60 s.
KEEP_ALIVE_S = 75


def _settings(db: str | None, **overrides: object) -> Settings:
    """The service's settings with --db; a bad --db (or PIPETUNE_ variable) is exit 2."""
    from pipetune.service.settings import SettingsError, load_settings

    try:
        return load_settings(db, **overrides)
    except SettingsError as exc:
        raise CliError(str(exc), 2) from None


@contextlib.contextmanager
def _database_errors(url: str) -> Iterator[None]:
    """A database that cannot be reached or read: one line naming it, exit 1 (the URL was
    checked already; what is left is the server or the file, not the command line)."""
    from sqlalchemy.exc import SQLAlchemyError

    from pipetune.service.db import (
        DatabaseGoneError,
        is_corrupt,
        refuses_url_options,
        unavailable_reason,
    )
    from pipetune.service.migrate import SchemaError, redact, sqlite_access_hint

    try:
        yield
    except SchemaError as exc:
        raise CliError(str(exc), 1) from None
    except DatabaseGoneError as exc:  # (its class name and a traceback's hint, it printed)
        raise CliError(exc.detail, 1) from None
    except SQLAlchemyError as exc:
        reason = unavailable_reason(exc)
        if refuses_url_options(exc):  # (the URL's own options: bad input, not the server)
            raise CliError(f"--db: {redact(url)}: {reason}", 2) from None
        hint = (
            sqlite_access_hint(url, reason)
            or lock_timeout_hint(reason)
            or (" (the database is corrupt: restore it from a backup)" if is_corrupt(exc) else "")
        )
        raise CliError(f"the database {redact(url)} failed: {reason}{hint}", 1) from None
    except OSError as exc:  # a SQLite file's folder that cannot be made (the crash line, it was)
        where = f" ({exc.filename})" if exc.filename else ""
        raise CliError(
            f"the database {redact(url)} failed: {exc.strerror or exc}{where}", 1
        ) from None


def lock_timeout_hint(reason: str) -> str:
    """For PostgreSQL's lock timeout (a migration gives up on a table's lock after
    migrations/env.py's lock_timeout), who holds it and what to do: its own words name
    neither."""
    if "lock timeout" not in reason:
        return ""
    return (
        " (another session holds a lock on a table the upgrade alters, a running `pipetune "
        "serve` or a long transaction: the upgrade changed nothing; stop it, or run the "
        "upgrade again when it is done)"
    )


def _missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL that does not exist (None otherwise): commands that only
    read must not create it (SQLite creates the file, and the engine its folder, on the
    first connection)."""
    from pipetune.service.settings import sqlite_path

    path = sqlite_path(url)
    return path if path is not None and not path.exists() else None


def _check_profiles() -> None:
    """Every GPU's hardware profile the service will read (the user's own, PIPETUNE_PROFILE_DIR's
    or the shipped one) parses, before it serves: one that did not answered every schedule and
    task request of that GPU 500, found at the first request."""
    from pipetune.model.hardware import HardwareError, get_gpu, gpu_keys

    for key in gpu_keys():
        try:
            get_gpu(key)
        except HardwareError as exc:
            # (A profile's own problem names its file; the folder's is every GPU's.)
            said = f"{key}: {exc}" if str(exc).startswith("profile") else str(exc)
            raise CliError(said, 2) from None


def _check_local_workers(n: int, runner: str, dataset: Path | None) -> str | None:
    """What `preflight` says of the local workers, as the CLI's errors: a dataset that does
    not read is exit 2, no usable GPU exit 1. The replay dataset's GPU, for replay."""
    if not n:
        return None
    from pipetune.workers.daemon.gpu import DetectionError
    from pipetune.workers.datasets import DatasetError
    from pipetune.workers.runners.base import RunnerSettingError

    try:
        return preflight(runner, dataset)
    except (DatasetError, OSError) as exc:
        raise CliError(f"--dataset: {one_line(exc)}", 2) from None
    except RunnerSettingError as exc:  # (a variable the workers read: it names itself)
        raise CliError(one_line(exc), 2) from None
    except DetectionError as exc:
        raise CliError(f"--runner {runner}: {one_line(exc)}", 1) from None


def _server_class(processes: list, on_stop):  # type: ignore[no-untyped-def]
    """A uvicorn Server whose SIGTERM/SIGINT first ends pending lease polls and stops the
    local workers (so they still report the trials in hand), then shuts the server down.
    Unlike uvicorn's own handler it does not re-raise the signal after a clean shutdown:
    `serve` then exits 0."""
    import uvicorn

    class Server(uvicorn.Server):
        stopping = False
        signalled: int | None = None  # the first signal, SIGINT or SIGTERM

        def handle_exit(self, sig: int, frame: object) -> None:
            if self.signalled is None:
                self.signalled = sig
            if self.stopping:  # a second signal: stop now, without waiting for requests
                self.force_exit = self.should_exit
                self.should_exit = True
                return
            self.stopping = True
            on_stop()
            if not processes:
                self.should_exit = True
                return

            def stop_then_exit() -> None:
                stop_workers(processes)
                self.should_exit = True

            threading.Thread(target=stop_then_exit, name="stop-local-workers").start()

        @contextlib.contextmanager
        def capture_signals(self):  # type: ignore[no-untyped-def]
            with super().capture_signals():
                yield
            # uvicorn put back the handlers from before it, serve's _end_before_serving: a
            # Ctrl-C in asyncio's teardown said "the service did not start" and exited at
            # once, the local workers left running. The service has run: Python's own now.
            _signals_raise_again()

    return Server


def _signal_words(sig: int) -> tuple[str, int]:
    """A signal's word and exit code (errors.interrupted): SIGINT's "interrupted" and 130,
    SIGTERM's "terminated" and 143."""
    return interrupted(Terminated() if sig == signal.SIGTERM else KeyboardInterrupt())


def _end_before_serving(sig: int, frame: object) -> None:
    """SIGINT or SIGTERM while serve prepares (its imports, the schema, the app), before
    uvicorn takes the signals: one line, and the exit at once (130; 143). Not by raising
    KeyboardInterrupt: raised where CPython was running a weakref callback or a finalizer
    (SQLAlchemy's pools and engines make many), it was printed as "Exception ignored" and
    lost, and the service started anyway; raised in an import, it was a screen of traceback.
    Nothing is served yet and no local worker started: nothing is left to stop, and what
    serve wrote (the schema, the token) is whole or rolled back by its database."""
    what, code = _signal_words(sig)
    with contextlib.suppress(Exception):  # (a write the signal cut into cannot be flushed)
        sys.stdout.flush()
    os.write(2, f"{what}: the service did not start\n".encode())
    os._exit(code)


def _signals_end_startup(func):  # type: ignore[no-untyped-def]
    """`serve` with _end_before_serving for SIGINT and SIGTERM until uvicorn takes them (it
    puts these back when it stops: serve then hands them back to Python's own), and the
    process's own handlers again when it returns (in-process callers: the tests)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return func(*args, **kwargs)
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, _end_before_serving) for sig in handled}
        try:
            return func(*args, **kwargs)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return wrapper


def _signals_raise_again() -> None:
    """Python's own handlers (Ctrl-C a KeyboardInterrupt, SIGTERM the default) once uvicorn
    has stopped: what is left (stopping the local workers) is not "the service did not
    start"."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging, with the service's own loggers (pipetune.*) beside its: at
    --log-level, each line with its level. Unconfigured, they fell through to Python's
    last-resort handler: bare messages without a level, WARNING and above whatever the
    level, none of the service's INFO lines (a task ended, leases expired)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["pipetune"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    return config


def _http_protocol(read_timeout_s: float) -> Any:
    """httptools with a head size limit and a read timeout (service/http_protocol.py);
    uvicorn's h11 where httptools is not installed (h11 limits the head itself)."""
    try:
        from pipetune.service.http_protocol import protocol_with
    except ImportError:
        return "h11"
    return protocol_with(read_timeout_s)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _url_host(host: str) -> str:
    """--host as a URL writes it: an IPv6 address in brackets (http://::1:8000 is no URL;
    the local workers refused it)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _check_address(host: str, port: int) -> None:
    """Bind --host and --port as uvicorn will (asyncio's create_server: every address the
    host resolves to) and let go. uvicorn logs a bind failure among its start and shutdown
    lines and calls sys.exit(3); the address is the user's input: one line, exit 2."""
    import asyncio
    import errno
    import socket

    async def bind() -> None:
        server = await asyncio.get_running_loop().create_server(
            asyncio.Protocol, host=host, port=port
        )
        server.close()
        await server.wait_closed()

    try:
        asyncio.run(bind())
    except OSError as exc:
        reason = exc.strerror or str(exc)
        flag = "--host"
        if isinstance(exc, socket.gaierror):
            reason = f"the host name does not resolve ({reason})"
        elif exc.errno == errno.EADDRINUSE:
            flag, reason = "--port", "the port is already in use"
        elif exc.errno == errno.EADDRNOTAVAIL:
            reason = "not an address of this machine"
        elif exc.errno == errno.EACCES:
            flag, reason = "--port", "permission denied (ports below 1024 need privileges)"
        raise CliError(f"{flag}: cannot bind {host}:{port}: {one_line(reason)}", 2) from None


# Where the hard limit on open files is unlimited (macOS), the soft limit is raised to this:
# macOS refuses more than OPEN_MAX for files whatever the hard limit says.
UNLIMITED_FILES_CAP = 10240


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise the soft limit on open files to the hard limit; (old, new) where it was raised.

    A replica holds a file descriptor per worker connection (each worker keeps one open and
    long-polls on it) besides its database connections, and many hosts give a process a soft
    limit of 1024 (or less) under a much higher hard one. Past the soft limit uvloop accepts
    each new connection and closes it at once (clients read "server disconnected"), SQLite
    cannot open a connection (503s) and a request that reads a file fails (500s): at a soft
    limit of 256, 400 long-polling workers left 222 of them unable to register. The hard
    limit is the operator's (it is never exceeded, and a limit is never lowered); the soft
    one only guards programs that use select(), which nothing in the service does (uvloop
    and asyncio use epoll, psycopg poll). As Go's runtime and nginx's worker_rlimit_nofile do.
    """
    try:
        import resource
    except ImportError:  # no such limits here (Windows)
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_FILES_CAP if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # refused (a platform's own cap): serve with what there is
        return None
    return soft, target


def _launch_when_started(server, start) -> threading.Thread:  # type: ignore[no-untyped-def]
    def wait_then_start() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started and not server.should_exit:
            start()

    thread = threading.Thread(target=wait_then_start, name="local-workers", daemon=True)
    thread.start()
    return thread


@reported
@_signals_end_startup
def serve(
    db: str | None = _DB,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8000, "--port", help="TCP port to listen on"),
    local_workers: int = typer.Option(
        0,
        "--local-workers",
        help="start N worker processes (simulated: spread over the GPU kinds, h100 first; "
        f"at most {WORKERS_PER_CPU} per CPU)",
    ),
    runner: str = typer.Option("simulated", "--runner", help="simulated | replay | cupy"),
    dataset: Path | None = typer.Option(None, "--dataset", help="recorded space (replay)"),
    log_level: str = typer.Option(
        "info", "--log-level", help="critical | error | warning | info | debug | trace"
    ),
    root_path: str | None = typer.Option(
        None,
        "--root-path",
        help="the path prefix a reverse proxy serves the service under, e.g. /pipetune "
        "(PIPETUNE_ROOT_PATH)",
    ),
) -> None:
    """Run the tuning service (API v1, dashboard at /dashboard, metrics at /metrics).

    With --local-workers, what the workers need (the --dataset of replay, a GPU for cupy)
    is checked before the service starts: the command exits instead of serving with no
    worker."""
    import uvicorn
    from uvicorn.config import LOG_LEVELS

    from pipetune.service.app import create_app
    from pipetune.service.migrate import redact
    from pipetune.service.settings import root_path_problem

    if runner not in RUNNERS:
        raise CliError(f"--runner: must be one of {', '.join(RUNNERS)}, got {runner!r}", 2)
    if problem := local_workers_problem(local_workers):  # (each one a process)
        raise CliError(f"--local-workers: {problem}", 2)
    if runner == "replay" and local_workers and dataset is None:
        raise CliError("--runner replay needs --dataset", 2)
    if dataset is not None and not (runner == "replay" and local_workers):
        # (It was ignored without a word: a user who meant replay workers got none.)
        why = "--local-workers is 0" if runner == "replay" else f"--runner is {runner}"
        raise CliError(f"--dataset: only for the local workers of --runner replay ({why})", 2)
    if not host.strip():
        # (asyncio binds an empty host to every interface: the service listened on all of
        # them, open to anyone without API keys, and named itself http://:PORT.)
        raise CliError(
            "--host: must be an address or name; 0.0.0.0 (or ::) listens on every interface",
            2,
        )
    if not 0 <= port <= 65535:
        raise CliError(f"--port: must be 0..65535, got {port}", 2)
    log_level = log_level.lower()  # uvicorn's own spelling; it looks the name up lowercased
    if log_level not in LOG_LEVELS:
        raise CliError(f"--log-level: must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", 2)
    overrides: dict[str, object] = {"create_empty_schema": True}
    if root_path is not None:
        if problem := root_path_problem(root_path):
            raise CliError(f"--root-path: {problem}", 2)
        overrides["root_path"] = root_path
    settings = _settings(db, **overrides)
    loopback = is_loopback_host(host, resolve=True)  # (127.1 or a name: what the bind takes)
    if not settings.allowed_hosts and not settings.api_keys and loopback:
        # Open routes on a laptop: only requests addressed to its loopback names (a page the
        # user opens could reach them through DNS rebinding, and read the answers), and to
        # the loopback address it listens on (--host 127.0.0.2: its own address, its local
        # workers' too, was refused as a foreign Host).
        settings.allowed_hosts = list(dict.fromkeys([*LOOPBACK_NAMES, host.strip("[]")]))
    # Where the local workers reach the service (a loopback address when it listens on all).
    local_host = "127.0.0.1" if host in ("0.0.0.0", "::") else _url_host(host)
    if local_workers and settings.allowed_hosts and "*" not in settings.allowed_hosts:
        # (With PIPETUNE_ALLOWED_HOSTS naming a proxy's host, they were refused, 400.)
        settings.allowed_hosts = [*settings.allowed_hosts, local_host]
    # Before create_app: nothing (no database file, no token) is made for a serve that exits.
    replay_gpu = _check_local_workers(local_workers, runner, dataset)
    _check_profiles()
    _check_address(host, port)
    # The schema before the token: a serve refused for its database wrote the secret file.
    new_file = _missing_sqlite_file(settings.database_url)
    _check_schema(
        settings.database_url, create_if_empty=settings.create_empty_schema, writable=True
    )
    if not settings.worker_tokens:
        from pipetune.service.settings import generated_token_path
        from pipetune.service.worker_token import (
            announcement,
            generated_worker_token,
            read_generated_token,
        )

        try:
            reused = read_generated_token() is not None  # ("generated" at every start, it said)
            token, token_file = generated_worker_token()
        except OSError as exc:  # a read-only or unreadable data directory: one line, exit 2
            if new_file is not None:  # (made by this serve: it exits as if it had not started)
                for leftover in (new_file, *(Path(f"{new_file}{s}") for s in ("-wal", "-shm"))):
                    leftover.unlink(missing_ok=True)
            raise CliError(
                f"cannot keep a generated worker token in {generated_token_path()}: "
                f"{exc.strerror or exc}; set PIPETUNE_WORKER_TOKENS to tokens of your own",
                2,
            ) from None
        settings.worker_tokens = [token]
        print(announcement(token_file, reused), flush=True)
        if os.environ.get(TOKEN_ENV):
            # (A worker's variable, set for the fleet: workers sent it and were refused, 401,
            # told to set the variable they had set.)
            print(
                f"warning: {TOKEN_ENV} is set (what a worker sends) but not "
                "PIPETUNE_WORKER_TOKENS (what the service takes): the service takes only the "
                f"token above; set PIPETUNE_WORKER_TOKENS to the value of {TOKEN_ENV} for "
                "workers that send it",
                file=sys.stderr,
                flush=True,
            )
    if raised := raise_open_file_limit():
        print(
            f"open files: soft limit raised from {raised[0]} to {raised[1]} (the hard limit; "
            "a worker's connection takes one)",
            flush=True,
        )
    with _database_errors(settings.database_url):
        app = create_app(settings)
    processes: list = []
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=_log_config(log_level),
        timeout_keep_alive=KEEP_ALIVE_S,
        http=_http_protocol(settings.request_read_timeout_s),
    )
    server = _server_class(processes, app.state.service.queue.stop_polling)(config)
    announced = threading.Event()  # the "pipetune service on" line was printed

    def started() -> None:
        bound = server.servers[0].sockets[0].getsockname()[1]  # the real one for --port 0
        print(
            f"pipetune service on http://{_url_host(host)}:{bound} (dashboard: /dashboard)",
            flush=True,
        )
        announced.set()
        if local_workers:
            url = f"http://{local_host}:{bound}"
            token = settings.worker_tokens[0]
            processes.extend(start_workers(local_workers, url, token, runner, dataset, replay_gpu))

    launcher = _launch_when_started(server, started)
    print(f"database: {redact(settings.database_url)}", flush=True)
    for line in unknown_variable_warnings():
        print(line, file=sys.stderr, flush=True)
    from pipetune.service.settings import default_database_url, short_secret_warnings

    if settings.database_url == default_database_url() and not loopback:
        # A replica beside others on the built-in file (no --db, no PIPETUNE_DATABASE_URL, or
        # a misspelt one) holds tasks and workers the fleet's database never sees.
        print(
            "warning: the built-in SQLite database (no --db or PIPETUNE_DATABASE_URL): "
            "replicas of one fleet need one database they share, e.g. PostgreSQL",
            file=sys.stderr,
            flush=True,
        )
    if not loopback:
        # (A 1-character key was taken without a word on a public address.)
        for line in short_secret_warnings(settings):
            print(line, file=sys.stderr, flush=True)
    if not settings.api_keys and not loopback:
        # The user routes are open without keys (README, "Tokens"): fine on a laptop, not on
        # an address others reach, where anyone could create and cancel tasks.
        print(
            f"warning: no API keys (PIPETUNE_API_KEYS): anyone who reaches {host}:{port} can "
            "create, read and cancel tasks",
            file=sys.stderr,
            flush=True,
        )
    try:
        server.run()
    except SystemExit:
        # uvicorn exits (3) when its startup fails, e.g. the address is taken in the moment
        # since _check_address: the line below says so, not a bare status 3.
        if server.started:
            raise
    finally:
        _signals_raise_again()
        server.should_exit = True  # (a start that failed: the launcher waits for either)
        launcher.join()
        stop_workers(processes)
    if server.signalled is not None and not announced.is_set():
        # A signal in uvicorn's own start (its lifespan, the bind): it stopped without a
        # word and exit 0, as though it had served and been stopped.
        what, code = _signal_words(server.signalled)
        print(f"{what}: the service stopped before it started serving", file=sys.stderr)
        raise typer.Exit(code)
    if not server.started:
        raise CliError(f"the server did not start on {host}:{port}", 1)


@db_app.command("upgrade")
@reported
def db_upgrade(
    db: str | None = _DB,
    revision: str = typer.Option(
        "head", "--revision", help="target revision: head, a revision id, +N, or REV+N/REV-N"
    ),
    into_existing: bool = typer.Option(
        False,
        "--into-existing",
        help="add pipetune's tables to a database that holds other tables (and no pipetune "
        "schema yet): refused without it, as a --db pointing at the wrong database",
    ),
) -> None:
    """Migrate the database schema (to the newest revision by default)."""
    from alembic.util.exc import CommandError

    from pipetune.service.migrate import (
        columns_problem,
        redact,
        revision_problem,
        upgrade,
    )

    url = _settings(db).database_url
    _check_revision(revision)  # before the database is touched (a SQLite file created)
    missing = _missing_sqlite_file(url)
    with _database_errors(url):
        current, tables, _ = (None, [], []) if missing else _schema_state(url, making=True)
        # (Only beside tables of no Alembic history: another program's alembic_version is
        # not pipetune's to write.)
        if tables and into_existing and current is None:
            tables = []
        if problem := revision_problem(current, tables):
            # (A newer pipetune's revision was Alembic's "Can't locate revision"; a database
            # of another program's had pipetune's tables written in beside its own.)
            fits = tables and current is None
            hint = " (or pass --into-existing to add pipetune's tables to it)" if fits else ""
            raise CliError(problem + hint, 1)
        # Again from the database's revision, which relative targets (+1) count from.
        _check_revision(revision, current)
        passed = _below(revision, current)
        try:
            upgrade(url, revision)
        except CommandError as exc:  # e.g. a database at a revision this pipetune lacks
            raise CliError(one_line(exc), 1) from None
        current, _, lacking = _schema_state(url)
    if lacking:  # at the newest revision, and still not the schema the service needs
        raise CliError(columns_problem(lacking, url), 1)
    console.print(f"database {redact(url)} is at revision {current}")
    if passed:
        # Nothing to do, as for a target reached (scripts that pin one run it again); but a
        # user who meant to go back read only the revision, and took it as done.
        console.print(
            f"note: {revision!r} is below it: an upgrade never goes down (restore the backup "
            "taken before the upgrade to undo one)"
        )


def _below(revision: str, current: str | None) -> bool:
    """Whether `revision` names one below the database's `current` (0005, base, head-2 at
    0012): an upgrade to it does nothing."""
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RevisionError

    from pipetune.service.migrate import alembic_config

    if current is None:
        return False
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    try:
        # What a downgrade to it would undo: nothing where it is the current one or above.
        return bool(list(script.iterate_revisions(current, revision, select_for_downgrade=True)))
    except (RevisionError, AssertionError):
        return False


# +N or -N (after an optional branch@): steps from the database's revision, not from a named
# one as in head-1 or 0002+1.
_STEPS_FROM_CURRENT = re.compile(r"(?:[^@]*@)?[+-]\d+")


def _check_revision(revision: str, current: str | None = None) -> None:
    """A --revision that an upgrade from `current` (None: an empty database) cannot reach:
    exit 2. It names no migration of this pipetune, is empty, steps down (-1) or steps
    outside the history (head+1, +9). A `current` this pipetune does not know is left to
    the upgrade, which refuses it (exit 1: the database, not the option, is at fault)."""
    from alembic.script import ScriptDirectory
    from alembic.script.revision import ResolutionError, RevisionError

    from pipetune.service.migrate import alembic_config

    if not revision.strip():
        raise CliError(
            "--revision: must name a revision (head, a revision id, +N, REV+N or REV-N), got ''",
            2,
        )
    if _STEPS_FROM_CURRENT.fullmatch(revision) and int(revision.rpartition("@")[2]) <= 0:
        # Alembic says "Relative revision -1 didn't produce 1 migrations", which hides why.
        raise CliError(
            f"--revision: {revision!r} does not go up from the database's revision "
            "(an upgrade takes +N with N at least 1, a revision id or head)",
            2,
        )
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    known = [s.revision for s in script.walk_revisions()]  # newest first
    if current is not None and current not in known:
        return
    try:
        # What `alembic upgrade` walks (ScriptDirectory._upgrade_revs), without running it.
        list(script.iterate_revisions(revision, current, implicit_base=True))
    except ResolutionError as exc:  # the message Alembic's own commands give for it
        raise CliError(
            f"--revision: Can't locate revision identified by {exc.argument!r}", 2
        ) from None
    except (RevisionError, AssertionError):
        # Alembic asserts, with no message, when a walk from a named revision leaves the
        # history (head+1, head-9) or the target is empty; a RevisionError when +N does.
        where = f" from the database's revision {current}" if current is not None else ""
        raise CliError(
            f"--revision: {revision!r} steps outside this pipetune's revisions "
            f"({known[-1]}..{known[0]}){where}",
            2,
        ) from None


def _schema_state(url: str, *, making: bool = False) -> tuple[str | None, list[str], list[str]]:
    """The database's revision; where it has none, the tables it holds (where it is another
    program's Alembic revision, its tables: migrate.unowned_tables); where it is the
    newest, the ORM's columns it lacks (migrate.missing_columns). `making`: a look before
    the database is made or upgraded (`db upgrade`)."""
    from pipetune.service.db import make_engine
    from pipetune.service.migrate import (
        head_revision,
        missing_columns,
        not_made_yet,
        schema_snapshot,
        unowned_tables,
    )

    # WAL mode (kept in the file) only where pipetune's database is about to be made, as
    # migrate.check_schema sets it: a look switched another program's database to WAL.
    engine = make_engine(url, pool_size=1, wal=making and not_made_yet(url))
    try:
        current, names = schema_snapshot(engine)
        tables = unowned_tables(current, names)
        # (Not of another program's schema at a revision that happens to be pipetune's newest.)
        at_head = current == head_revision() and not tables
        lacking = missing_columns(engine) if at_head else []
        return current, tables, lacking
    finally:
        engine.dispose()


@db_app.command("current")
@reported
def db_current(
    db: str | None = _DB,
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    check: bool = typer.Option(
        False,
        "--check",
        help="exit 1 unless the database is up to date (behind, missing, newer or not "
        "pipetune's): for a deploy script to run before `serve`",
    ),
) -> None:
    """The database's schema revision and the newest one this pipetune has (a SQLite file
    that does not exist is not created: its revision is none)."""
    from pipetune.service.migrate import (
        columns_problem,
        head_revision,
        redact,
        revision_problem,
    )

    url = _settings(db).database_url
    missing = _missing_sqlite_file(url)
    with _database_errors(url):
        current, tables, lacking = (None, [], []) if missing else _schema_state(url)
    doc = {"database": redact(url), "current": current, "head": head_revision()}
    doc["up_to_date"] = doc["current"] == doc["head"] and not lacking and not tables
    problem = revision_problem(current, tables)
    if lacking:
        # At the newest revision without every column: the revision alone said "up to date"
        # while every task query failed.
        doc["state"] = "missing_columns"
        doc["missing_columns"] = lacking
        problem = columns_problem(lacking, url)
    elif doc["up_to_date"]:
        doc["state"] = "up_to_date"
    elif tables:
        doc["state"] = "other_tables"
    else:  # a revision this pipetune does not know, or one behind it (none: empty)
        doc["state"] = "newer" if problem else "behind"
    if tables:
        doc["other_tables"] = tables
    _show_current(doc, missing, problem, as_json)
    if check and not doc["up_to_date"]:
        raise typer.Exit(1)  # (what is wrong is printed above)


def _show_current(doc: dict, missing: Any, problem: str | None, as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    if missing:
        console.print(
            f"{doc['database']}: no database file at {missing} (newest revision "
            f"{doc['head']}; `pipetune db upgrade` or `pipetune serve` creates it)"
        )
        return
    if problem:  # not pipetune's, or a newer pipetune's: `db upgrade` is not the answer
        console.print(f"{doc['database']}: {problem}")
        return
    state = "up to date" if doc["up_to_date"] else "behind: run `pipetune db upgrade`"
    # An empty database (a new PostgreSQL database, an empty SQLite file) has no revision.
    revision = "no pipetune schema" if doc["current"] is None else f"revision {doc['current']}"
    console.print(f"{doc['database']}: {revision} (newest {doc['head']}, {state})")


def _pipetune_dataset(path: Path) -> tuple[Any, Any]:
    """A pipetune dataset file and its checked provenance; exit 2 naming what is wrong."""
    from pipetune.workers.datasets import DatasetError, check_pipetune, load_dataset

    try:
        data = load_dataset(path)
        return data, check_pipetune(data)
    except (DatasetError, OSError) as exc:
        raise CliError(str(exc), 2) from None


def _check_schema(url: str, *, create_if_empty: bool = False, writable: bool = False) -> None:
    """The database has this pipetune's schema (exit 1 otherwise). A SQLite file that does
    not exist is refused without creating it, unless the command may create the database.
    `writable`: and can be written (the service's check, made here before `serve` writes
    anything of its own: a serve refused for a read-only file wrote its worker token first)."""
    from pipetune.service.migrate import (
        SchemaError,
        check_schema,
        check_writable,
        head_revision,
        redact,
    )

    if not create_if_empty and (missing := _missing_sqlite_file(url)) is not None:
        # (It said "the database has no pipetune schema" of a file that is not there: a
        # mistyped --db looked like a database to upgrade.)
        raise CliError(
            f"no database file at {missing} (this pipetune needs "
            f"revision {head_revision()}): `pipetune db upgrade --db "
            f"{shlex.quote(redact(url))}` creates it",
            1,
        )
    with _database_errors(url):
        try:
            check_schema(url, create_if_empty=create_if_empty)
            if writable:
                check_writable(url)
        except SchemaError as exc:
            raise CliError(str(exc), 1) from None


@db_app.command("import-optimum")
@reported
def db_import_optimum(
    dataset: Path = typer.Argument(..., help="an exhaustive pipetune sweep (T4 file)"),
    db: str | None = _DB,
    force: bool = typer.Option(
        False, "--force", help="replace an optimum of the other kind (simulated or measured)"
    ),
) -> None:
    """Record a sweep's best latency as the optimum that best-in-k curves normalise to. The
    sweep must hold every valid schedule of its workload on its GPU (`pipetune sweep`
    without --limit): the best of part of the space is not the optimum. Simulated sweeps
    are accepted, as by import-dataset (and said so). A workload keeps one optimum per GPU,
    and it normalises the curves of tasks of its own kind only (simulated or measured; those
    of the other kind normalise to their own tasks' best): replacing a measured optimum by a
    simulated one, or the other way round, needs --force."""
    from pipetune.model.trials import is_simulated
    from pipetune.service.db import Database
    from pipetune.service.imports import storable_source_name, sweep_coverage
    from pipetune.service.orm import ReferenceOptimumRow
    from pipetune.service.records import set_reference_optimum, workload_id

    url = _settings(db).database_url
    data, info = _pipetune_dataset(dataset)
    best = data.best()
    if best is None or best.time_ms is None:
        raise CliError(f"{dataset}: no successful configuration to take the optimum from", 2)
    covered, valid = sweep_coverage(data, info)
    if covered < valid:
        raise CliError(
            f"{dataset}: not an exhaustive sweep: it holds {covered} of the {valid} valid "
            f"schedules of {info.workload.label()} on {info.gpu} (sweep without --limit)",
            2,
        )
    _check_schema(url)
    database = Database(url, pool_size=1)
    try:
        with _database_errors(url), database.write() as s:
            held = s.get(ReferenceOptimumRow, (workload_id(s, info.workload), info.gpu))
            kind = {False: "measured", True: "simulated"}
            held_kind = None if held is None or held.runner is None else is_simulated(held.runner)
            if held_kind is not None and held_kind != is_simulated(info.runner) and not force:
                raise CliError(
                    f"{info.workload.label()} on {info.gpu} has a {kind[held_kind]} optimum "
                    f"(from {held.source}); this sweep is {kind[not held_kind]} and would "
                    "replace it (pass --force)",
                    2,
                )
            set_reference_optimum(
                s,
                info.workload,
                info.gpu,
                best.time_ms * 1e3,
                len(data),
                # (A file name that is not UTF-8 failed here with UnicodeEncodeError, exit 1.)
                storable_source_name(str(dataset)),
                info.runner,
            )
    finally:
        database.dispose()
    runner = f" ({info.runner} runner)" if info.runner else ""
    console.print(
        f"{info.workload.label()} on {info.gpu}: optimum {best.time_ms * 1e3:.2f} µs "
        f"over {len(data)} configurations{runner}"
    )


@db_app.command("import-dataset")
@reported
def db_import_dataset(
    dataset: Path = typer.Argument(..., help="a pipetune dataset (T4 file) of one workload"),
    db: str | None = _DB,
    as_json: bool = typer.Option(False, "--json", help="print the task document"),
) -> None:
    """Record a dataset's trials as a finished task (measured elsewhere, not tuned here): a
    task on another GPU can then warm-start from it (--prior-task), and the service's best
    schedule for that workload and GPU knows of it. Importing trials that are already
    imported (the same records of the same workload and GPU, from this file or a copy)
    writes nothing and answers with the task they became, exit 0: an import script can be
    run again."""
    from pipetune.service.db import Database
    from pipetune.service.errors import InputError
    from pipetune.service.imports import import_once
    from pipetune.service.views import get_task_doc

    url = _settings(db).database_url
    data, info = _pipetune_dataset(dataset)
    if not len(data):
        raise CliError(f"{dataset}: the dataset holds no configuration", 2)
    _check_schema(url, create_if_empty=True)
    database = Database(url, pool_size=1)
    try:
        with _database_errors(url):
            # Looked up in the transaction that writes the import (on SQLite, whose writers
            # queue, two imports of one file at once then make one task).
            with database.write() as s:
                try:
                    task_id, written = import_once(s, data, info, str(dataset), database.now())
                except InputError as exc:  # a value no trial row holds (as a worker's 422)
                    _, record, *field = exc.loc
                    where = f"record {record}'s {'.'.join(map(str, field))}"
                    raise CliError(f"{dataset}: {where}: {exc.reason}", 2) from None
            with database.read() as s:
                doc = get_task_doc(s, task_id)
    finally:
        database.dispose()
    assert doc is not None
    if as_json:
        print_json(doc.model_dump(mode="json"))
        return
    best = f", best {doc.best.latency_us:.2f} µs" if doc.best else ", none succeeded"
    runner = f" ({info.runner} runner)" if info.runner else ""
    if not written:
        console.print(
            f"task {task_id}: already imported (from {doc.imported_from}): "
            f"{info.workload.label()} on {info.gpu}, {doc.trials_done} trials{best}{runner}; "
            f"nothing written. Warm-start a task on another GPU with --prior-task {task_id}"
        )
        return
    console.print(
        f"task {task_id}: {info.workload.label()} on {info.gpu}, {doc.trials_done} trials "
        f"({doc.trials_failed} failed){best}{runner}, imported from {dataset}; warm-start a "
        f"task on another GPU with --prior-task {task_id}"
    )


def register(app: typer.Typer) -> None:
    """Add `serve` and `db` to the `pipetune` app."""
    app.command("serve")(serve)
    app.add_typer(db_app, name="db")
