"""The local database read without a service: the same queries and the same documents the
service answers with (service.records, service.views, service.curves), so a command or a
library call gets from the database file exactly what `pipetune serve` on that file would
have answered.

`LocalStore` has the reading methods of the SDK's `Client` (best_schedule, task, tasks,
all_trials, curve, workers, worker_list), so callers can take either. The database is the one
`pipetune serve` uses by default (PIPETUNE_DATABASE_URL, else a SQLite file under the user
data dir) unless a URL is given. Reading never creates anything: a database file that does not
exist yet reads as empty (no tasks, no workers; schedules come from the model).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from pipetune.clients.library.inputs import as_gpu, as_workload
from pipetune.clients.sdk import Client, PipetuneError
from pipetune.clients.sdk.client import TASK_STATES, WORKER_STATES
from pipetune.model.errors import InvalidArgumentError, InvalidArgumentTypeError
from pipetune.model.family import family_of, generator_revision_of
from pipetune.model.hardware import get_gpu
from pipetune.model.states import WorkerState
from pipetune.model.wire import (
    ID_MAX,
    MAX_BUDGET,
    MAX_TASK_PAGE,
    MAX_WORKER_PAGE,
    TASK_PAGE,
    WORKER_PAGE,
    Curve,
    ScheduleResponse,
    TaskDoc,
    TrialDoc,
    WorkerDoc,
    WorkerList,
)
from pipetune.service.curves import task_curve
from pipetune.service.db import Database, refuses_url_options, unavailable_reason
from pipetune.service.migrate import (
    SchemaError,
    check_schema,
    check_writable,
    redact,
    sqlite_access_hint,
)
from pipetune.service.priors import learned_model_of_tasks, learned_pick, prior_from_tasks
from pipetune.service.records import measured_or_failures, measuring_device, schedule_response
from pipetune.service.settings import (
    Settings,
    database_file_problem,
    database_url_problem,
    sqlite_path,
    sqlite_uri_url,
    validated_settings,
)
from pipetune.service.views import (
    get_task_doc,
    list_task_docs,
    list_trial_docs,
    list_worker_docs,
    task_work,
)


class LocalDatabaseError(PipetuneError):
    """The local database cannot be read: unreachable, or its schema is not this version's."""


class DatabaseArgumentError(LocalDatabaseError, InvalidArgumentError):
    """A `db` argument that is not a database URL: bad input, a ValueError naming `db` in
    `.argument` as every other argument's is (it was a LocalDatabaseError alone, which the
    documented `except ValueError` missed)."""


class DatabaseArgumentTypeError(LocalDatabaseError, InvalidArgumentTypeError):
    """A `db` argument that is not a string."""


class LocalNotFoundError(LocalDatabaseError):
    """No such task in the local database."""


class LocalInputError(InvalidArgumentError):
    """An argument the service would have refused with a 422 (e.g. an unknown task state);
    `argument` names it."""


def _check_task_id(task_id: int) -> None:
    """The service's bound on an id (a 422 there): past it, the database's driver raised
    an OverflowError (SQLite) or a DataError with the statement (PostgreSQL)."""
    if not 1 <= task_id <= ID_MAX:
        raise LocalInputError("task_id", f"must be within 1..{ID_MAX}, got {task_id}")


def database_url(db: str | None = None) -> str:
    """`db`, else the database `pipetune serve` uses by default (DatabaseArgumentError when
    `db` is not a database URL: a file path was SQLAlchemy's ArgumentError)."""
    if db is None:
        # model_validate: the settings' defaults come from the environment, as `serve` does.
        return validated_settings().database_url
    if not isinstance(db, str):
        raise DatabaseArgumentTypeError("db", f"expected a database URL, got {type(db).__name__}")
    if not db.strip():
        # Refused, as lookup's server="" is: read as "no db", it named the default database,
        # which a tuning then wrote into while the caller believed it named another.
        raise DatabaseArgumentError(
            "db", "empty: give a database URL, or leave db out for the one `pipetune serve` uses"
        )
    try:
        make_url(db)
    except ArgumentError:
        raise DatabaseArgumentError(
            "db",
            f"not a database URL: {db!r} (a file is sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db)",
        ) from None
    # The service's own check (an in-memory SQLite database, an unknown backend): refused
    # here, before a tuning opens it, not as the settings' ValidationError from inside.
    problem = database_url_problem(db)
    if problem is not None:
        raise DatabaseArgumentError("db", problem)
    # The CLI's check of --db's file (a directory, a file that is no SQLite database): the
    # caller named the wrong file, not a database that failed (LocalDatabaseError, no
    # ValueError, from inside the open).
    problem = database_file_problem(db)
    if problem is not None:
        raise DatabaseArgumentError("db", problem)
    return db


def _lease_ttl_s() -> float:
    """The lease TTL `pipetune serve` would read (PIPETUNE_LEASE_TTL_S): a worker heard from
    longer ago is not live, in a task's `no_worker` as at the service."""
    try:
        return validated_settings().lease_ttl_s
    except ValueError:  # (another setting refused: the read goes on with the default)
        return float(Settings.model_fields["lease_ttl_s"].default)


def _sqlite_file_missing(url: str) -> bool:
    path = sqlite_path(url)
    return path is not None and not path.exists()


def open_database(url: str, *, create: bool = False, write: bool = False) -> Database:
    """The database at `url`, checked to have this version's schema; with `create`, an empty
    one gets the schema first (as `pipetune serve` does on a fresh install); with `write`,
    checked to be writable (a tuning writes its task and trials: a read-only file refused
    its first write with SQLAlchemy's error)."""
    try:
        check_schema(url, create_if_empty=create)
        if write:
            check_writable(url)
        return Database(url, pool_size=1)
    except SchemaError as exc:
        raise LocalDatabaseError(str(exc)) from None
    except SQLAlchemyError as exc:
        reason = unavailable_reason(exc)
        if refuses_url_options(exc):  # (the URL's own options: bad input, not the server)
            raise DatabaseArgumentError("db", f"{redact(url)}: {reason}") from None
        read_only = None if create or write else read_only_sqlite_url(url, reason)
        if read_only is not None:
            return open_database(read_only)
        raise LocalDatabaseError(
            f"cannot open the database {redact(url)}: {reason}{sqlite_access_hint(url, reason)}"
        ) from None


def read_only_sqlite_url(url: str, reason: str) -> str | None:
    """The SQLite URL to read a database through that SQLite could not open (`reason`) in a
    folder it may not write: it keeps a WAL database's -shm file beside it, even to read, so a
    colleague's results on a read-only mount or share could not be read at all. Where no -wal
    file is there (the last writer checkpointed it and closed: every change is in the file),
    the file read as immutable (no -shm, no locks); where -wal and -shm both are, read-only
    (SQLite reads through them). None where neither applies, or `url` is no plain file's."""
    path = sqlite_path(url)
    if (
        "unable to open database file" not in reason
        or path is None
        or not path.is_file()
        or "?" in url  # (a URI or options of the caller's own: not second-guessed)
    ):
        return None
    wal, shm = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
    if not wal.exists():
        return sqlite_uri_url(path, immutable="1")
    if shm.exists():
        return sqlite_uri_url(path, mode="ro")
    return None


class LocalStore:
    """Read the local database as the service would answer (see the module docstring)."""

    def __init__(self, db: str | None = None, *, named: bool | None = None):
        """`named`: whether the caller named `db` (default: whether it was given); a named
        SQLite file must exist, the default database reads as empty until it does."""
        self.url = database_url(db)
        self._db: Database | None = None
        self._empty = _sqlite_file_missing(self.url)
        if (db is not None if named is None else named) and self._empty:
            # The default database reads as empty until something is tuned; a file the
            # caller named that is not there is a mistyped path, which read as "nothing
            # measured" and handed back the model's untuned pick (the CLI's --db refuses it).
            raise DatabaseArgumentError(
                "db",
                f"no database file at {sqlite_path(self.url)} (pipetune.tune(..., db=...), "
                "`pipetune serve` or `pipetune db upgrade --db ...` makes one)",
            )

    @property
    def where(self) -> str:
        """The database, for messages (no password)."""
        return redact(self.url)

    def _database(self) -> Database | None:
        if self._db is None and not self._empty:
            self._db = open_database(self.url)
        return self._db

    def best_schedule(self, workload: Any, gpu: str) -> ScheduleResponse:
        """The best measured schedule of the workload on the GPU, else the model's pick.
        As `Client.best_schedule`: the workload a dict or a workload object, the GPU any of
        its names ("H100" was a GPU no trial was recorded on)."""
        workload, gpu = as_workload(workload), as_gpu(gpu)
        database = self._database()
        if database is None:
            return schedule_response(workload, gpu, None)
        with database.read() as s:
            job, failed = measured_or_failures(s, workload.workload_hash, gpu)
            device = measuring_device(s, job)
        learned = None
        if job is None or job.latency_us is None:
            # As the service picks (a fit per call here: no cache outlives the store).
            with database.read_conn() as conn:
                learned = learned_pick(
                    conn,
                    workload,
                    gpu,
                    lambda: family_of(workload).enumerate(workload, get_gpu(gpu)),
                    lambda ids, space: prior_from_tasks(
                        list(ids),
                        learned_model_of_tasks(
                            conn, list(ids), generator_revision_of(workload).line
                        ),
                        space,
                    ),
                    failed.schedule_ids,
                )
        return schedule_response(workload, gpu, job, learned, failed, device)

    def task(self, task_id: int) -> TaskDoc:
        _check_task_id(task_id)
        database = self._database()
        doc = None
        if database is not None:
            with database.read() as s:
                doc = get_task_doc(s, task_id, _lease_ttl_s())
        if doc is None:
            raise LocalNotFoundError(f"task {task_id} does not exist in {self.where}")
        return doc

    def tasks(
        self,
        state: str | None = None,
        *,
        limit: int | None = None,
        offset: int | None = None,
        before: int | None = None,
    ) -> list[TaskDoc]:
        """Tasks, newest first, one page (as GET /v1/tasks)."""
        if state is not None and state not in TASK_STATES:
            raise LocalInputError(
                "state", f"must be one of {', '.join(TASK_STATES)}, got {state!r}"
            )
        # The service's bounds (GET /v1/tasks answers a 422); 0 and -1 read every task.
        if limit is not None and not 1 <= limit <= MAX_TASK_PAGE:
            raise LocalInputError("limit", f"must be within 1..{MAX_TASK_PAGE}, got {limit}")
        if offset is not None and not 0 <= offset <= ID_MAX:
            raise LocalInputError("offset", f"must be within 0..{ID_MAX}, got {offset}")
        if before is not None and not 1 <= before <= ID_MAX:
            raise LocalInputError("before", f"must be within 1..{ID_MAX}, got {before}")
        database = self._database()
        if database is None:
            return []
        with database.read() as s:
            page = limit or TASK_PAGE
            return list_task_docs(s, state, page, offset or 0, before, _lease_ttl_s())

    def all_trials(self, task_id: int, samples: bool = False) -> list[TrialDoc]:
        """Every trial of a task, in proposal order (a task has at most MAX_BUDGET);
        `samples`: with their timed repeats."""
        self.task(task_id)
        database = self._database()
        assert database is not None  # task() found the task
        with database.read() as s:
            return list_trial_docs(s, task_id, -1, MAX_BUDGET, samples)

    def curve(self, task_id: int) -> Curve:
        """Best-so-far latency and throughput after each final trial of the task."""
        _check_task_id(task_id)
        database = self._database()
        if database is not None:
            with database.read() as s:
                work = task_work(s, task_id)
                if work is not None:
                    return task_curve(s, task_id, *work, -1)
        raise LocalNotFoundError(f"task {task_id} does not exist in {self.where}")

    def worker_list(self, state: str | None = None, *, limit: int | None = None) -> WorkerList:
        """The registered workers, as GET /v1/workers (the workers that tuned into this
        database: in-process ones and a service's fleet), with their states by the lease TTL
        the settings give `pipetune serve`."""
        if state is not None and state not in WORKER_STATES:
            raise LocalInputError(
                "state", f"must be one of {', '.join(WORKER_STATES)}, got {state!r}"
            )
        if limit is not None and not 1 <= limit <= MAX_WORKER_PAGE:
            raise LocalInputError("limit", f"must be within 1..{MAX_WORKER_PAGE}, got {limit}")
        database = self._database()
        if database is None:
            return WorkerList(workers=[], counts=dict.fromkeys(WorkerState, 0))
        with database.read() as s:
            chosen = None if state is None else WorkerState(state)
            return list_worker_docs(s, chosen, limit or WORKER_PAGE, _lease_ttl_s())

    def workers(self, state: str | None = None, *, limit: int | None = None) -> list[WorkerDoc]:
        """`worker_list`'s workers (as Client.workers)."""
        return self.worker_list(state, limit=limit).workers

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
            self._db = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# What reads tuning results: the service through the SDK, or the local database directly.
Reader = Client | LocalStore


def all_tasks(reader: Reader) -> list[TaskDoc]:
    """Every task, page after page (newest first), each page after the last task read: by
    offset, each page read and skipped every task before it (2 s for 10,000 tasks through
    PostgreSQL, and a task created meanwhile shifted a task into the next page twice)."""
    tasks: list[TaskDoc] = []
    while True:
        before = tasks[-1].id if tasks else None
        page = reader.tasks(limit=TASK_PAGE, before=before)
        tasks.extend(page)
        if len(page) < TASK_PAGE:
            return tasks


def source_of(reader: Reader) -> str:
    """Where a reader's answers come from, for messages and files (no password)."""
    return f"local database {reader.where}" if isinstance(reader, LocalStore) else reader.base_url
