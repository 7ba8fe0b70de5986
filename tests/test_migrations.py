"""Alembic migrations: empty -> head equals the ORM's schema, downgrade works, and the
service refuses a database whose schema is behind (naming `pipetune db upgrade`)."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from service_support import settings, table_names
from sqlalchemy import Engine, inspect, text

from pipetune.service.app import create_app
from pipetune.service.db import make_engine
from pipetune.service.migrate import (
    SchemaError,
    check_schema,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from pipetune.service.orm import Base
from pipetune.service.settings import sqlite_url

pytest_plugins = ["service_fixtures"]


def _schema_diff(url: str) -> list:
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def test_upgrade_from_empty_to_head_equals_the_orm_and_downgrade_works(empty_url):
    upgrade(empty_url)
    assert _schema_diff(empty_url) == []
    engine = make_engine(empty_url, pool_size=1)
    assert current_revision(engine) == head_revision()
    indexes = {i["name"] for i in inspect(engine).get_indexes("jobs")}
    engine.dispose()
    assert {"ix_jobs_queue", "ix_jobs_lease_expiry", "ix_jobs_best"} <= indexes
    assert table_names(empty_url) == {t.name for t in Base.metadata.sorted_tables} | {
        "alembic_version"
    }

    downgrade(empty_url, "base")
    assert table_names(empty_url) == {"alembic_version"}
    upgrade(empty_url)  # and back up again
    assert _schema_diff(empty_url) == []


def test_the_service_refuses_a_schema_that_is_behind(empty_url):
    upgrade(empty_url)
    downgrade(empty_url, "base")
    with pytest.raises(SchemaError, match="run `pipetune db upgrade --db "):
        create_app(settings(empty_url))
    upgrade(empty_url)
    assert check_schema(empty_url) == head_revision()


def test_the_upgrade_command_said_is_quoted_for_a_shell(tmp_path):
    """A database on a path with a space: the command was printed unquoted."""
    url = f"sqlite:///{tmp_path / 'my dbs' / 'p.db'}"
    (tmp_path / "my dbs").mkdir()
    upgrade(url)
    downgrade(url, "base")
    with pytest.raises(SchemaError) as refused:
        check_schema(url)
    assert f"run `pipetune db upgrade --db '{url}'`" in str(refused.value)


def test_an_empty_database_is_built_only_when_allowed(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    with pytest.raises(SchemaError, match="has no pipetune schema"):
        check_schema(url)
    assert check_schema(url, create_if_empty=True) == head_revision()
    assert _schema_diff(url) == []


def test_serve_on_an_outdated_schema_exits_1_naming_db_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url)
    downgrade(url, "base")
    data = tmp_path / "data"  # the user data dir, where serve keeps a generated token
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    result = subprocess.run(
        [sys.executable, "-m", "pipetune.clients.cli", "serve", "--db", url, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "XDG_DATA_HOME": str(data)},
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"run `pipetune db upgrade --db {shlex.quote(url)}`" in errors[0]
    # Refused before anything is made: the worker token was generated and saved first.
    assert not (data / "pipetune" / "worker-token").exists()


def _one_finished_task(engine: Engine) -> None:
    """Task 1 (done, a100) of workload 1 with its trial 0 (job 1, measured by worker 1
    under lease 1), written as an older revision's schema has them."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workloads (id, hash, op, canonical, label, flops) "
                "VALUES (1, 'h', 'gemm', '{}', 'gemm', 1)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO tasks (id, workload_id, gpu, arch, strategy, budget, seed, "
                "batch_size, state, batches, trials_target, trials_enqueued, trials_done, "
                "trials_failed) VALUES (1, 1, 'a100', 'sm_80', 'auto', 8, 0, 8, 'done', "
                "1, 8, 8, 8, 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO workers (id, name, gpu, arch, runner, token_hash, busy_jobs) "
                "VALUES (1, 'w1', 'a100', 'sm_80', 'cupy', 'x', 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO jobs (id, task_id, workload_id, gpu, arch, trial, batch, schedule, "
                "schedule_id, state, attempts, result_worker, status, latency_us) VALUES "
                "(1, 1, 1, 'a100', 'sm_80', 0, 0, '{}', 's', 'done', 1, 1, 'ok', 12.5)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO leases (id, job_id, worker_id, token, leased_at, outcome) "
                "VALUES (1, 1, 1, 't', CURRENT_TIMESTAMP, 'result')"
            )
        )


def _trial_rows(engine: Engine) -> list:
    """What _one_finished_task wrote below the task: it must survive every migration."""
    with engine.connect() as conn:
        jobs = conn.execute(text("SELECT id, task_id, latency_us FROM jobs")).all()
        leases = conn.execute(text("SELECT id, job_id, outcome FROM leases")).all()
    return [*map(tuple, jobs), *map(tuple, leases)]


TRIAL_ROWS = [(1, 1, 12.5), (1, 1, "result")]


def test_0002_adds_the_task_prior_and_keeps_every_task(empty_url):
    upgrade(empty_url, "0001")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        upgrade(empty_url)
        assert _schema_diff(empty_url) == []
        assert _trial_rows(engine) == TRIAL_ROWS  # (SQLite lost them all from 0001)
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, prior_task FROM tasks")).all() == [(1, None)]
            conn.execute(
                text(
                    "INSERT INTO tasks (id, workload_id, gpu, arch, strategy, budget, seed, "
                    "batch_size, state, batches, trials_target, trials_enqueued, trials_done, "
                    "trials_failed, prior_task) VALUES (2, 1, 'h100', 'sm_90', 'auto', 8, 0, 8, "
                    "'queued', 1, 8, 8, 0, 0, 1)"
                )
            )
        downgrade(empty_url, "0001")
        assert _trial_rows(engine) == TRIAL_ROWS  # (and on the way down)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tasks")).scalar() == 2
            assert "prior_task" not in {c["name"] for c in inspect(conn).get_columns("tasks")}
    finally:
        engine.dispose()


def test_0003_adds_the_learned_prior_and_keeps_every_task(empty_url):
    upgrade(empty_url, "0002")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        upgrade(empty_url)
        assert _schema_diff(empty_url) == []
        assert _trial_rows(engine) == TRIAL_ROWS
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, learned_from FROM tasks")).all() == [(1, None)]
            conn.execute(
                text(
                    "INSERT INTO tasks (id, workload_id, gpu, arch, strategy, budget, seed, "
                    "batch_size, state, batches, trials_target, trials_enqueued, trials_done, "
                    "trials_failed, learned_from) VALUES (2, 1, 'h100', 'sm_90', 'auto', 8, 0, "
                    "8, 'queued', 1, 8, 8, 0, 0, '[1]')"
                )
            )
        downgrade(empty_url, "0002")
        assert _trial_rows(engine) == TRIAL_ROWS
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tasks")).scalar() == 2
            assert "learned_from" not in {c["name"] for c in inspect(conn).get_columns("tasks")}
    finally:
        engine.dispose()


def test_0004_adds_where_early_proposals_saw_results_and_keeps_every_job(empty_url):
    """Jobs recorded before it were seen by the rule of whole batches: they keep NULL, which
    says so (service/driver.py, first_seen_by)."""
    upgrade(empty_url, "0003")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        with engine.begin() as conn:
            for trial in range(1, 4):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, task_id, workload_id, gpu, arch, trial, batch, "
                        "schedule, schedule_id, state, attempts) VALUES (:id, 1, 1, 'a100', "
                        "'sm_80', :trial, 0, '{}', 's', 'done', 0)"
                    ),
                    {"id": trial + 1, "trial": trial},
                )
        upgrade(empty_url)
        assert _schema_diff(empty_url) == []
        with engine.begin() as conn:
            rows = conn.execute(text("SELECT trial, seen_at FROM jobs ORDER BY trial")).all()
            assert [tuple(r) for r in rows] == [(t, None) for t in range(4)]
            conn.execute(text("UPDATE jobs SET seen_at = -1 WHERE trial = 2"))
        downgrade(empty_url, "0003")
        assert _trial_rows(engine)[-1] == TRIAL_ROWS[-1]
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 4
            assert "seen_at" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
    finally:
        engine.dispose()


def test_0005_adds_who_may_measure_what_and_keeps_every_row(empty_url):
    """Workers registered before it answer any workload, and tasks and jobs created before
    it are for any runner: they keep NULL, which says so."""
    upgrade(empty_url, "0004")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        upgrade(empty_url)
        assert _schema_diff(empty_url) == []
        assert _trial_rows(engine) == TRIAL_ROWS
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, workload_hash FROM workers")).all() == [(1, None)]
            assert conn.execute(text("SELECT id, only_runner FROM tasks")).all() == [(1, None)]
            assert {r.only_runner for r in conn.execute(text("SELECT only_runner FROM jobs"))} == {
                None
            }
            conn.execute(text("UPDATE workers SET workload_hash = 'abc' WHERE id = 1"))
            conn.execute(text("UPDATE tasks SET only_runner = 'cupy'"))
            conn.execute(text("UPDATE jobs SET only_runner = 'cupy'"))
        downgrade(empty_url, "0004")
        assert _trial_rows(engine) == TRIAL_ROWS  # (its jobs and leases refer to the worker)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM workers")).scalar() == 1
            assert conn.execute(text("SELECT count(*) FROM tasks")).scalar() == 1
            for table, column in (
                ("workers", "workload_hash"),
                ("tasks", "only_runner"),
                ("jobs", "only_runner"),
            ):
                assert column not in {c["name"] for c in inspect(conn).get_columns(table)}
    finally:
        engine.dispose()


# The columns revisions 0002 and 0005 gained after their first release (migration 0006).
LATE_COLUMNS = [("tasks", "imported_from"), ("tasks", "only_runner"), ("jobs", "only_runner")]


def _drop_columns(engine: Engine, columns: list[tuple[str, str]]) -> None:
    """The schema the first releases of 0002 and 0005 built (SQLite drops a column in place
    since 3.35, as PostgreSQL does)."""
    with engine.begin() as conn:
        for table, column in columns:
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))


def test_0006_adds_what_the_first_0002_and_0005_left_out_and_keeps_every_row(empty_url):
    """A database upgraded by the first 0002 and 0005 read as revision 0005 without
    tasks.imported_from, tasks.only_runner and jobs.only_runner: `db upgrade` did nothing
    and every task query failed on the missing column. 0006 adds each one that is missing,
    and changes nothing where all are there."""
    upgrade(empty_url, "0005")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        _drop_columns(engine, LATE_COLUMNS)
        assert current_revision(engine) == "0005"
        upgrade(empty_url)
        assert _schema_diff(empty_url) == []
        assert _trial_rows(engine) == TRIAL_ROWS
        with engine.connect() as conn:
            assert conn.execute(text("SELECT imported_from, only_runner FROM tasks")).all() == [
                (None, None)
            ]
        downgrade(empty_url, "0005")  # nothing of its own to undo
        assert current_revision(engine) == "0005"
        with engine.connect() as conn:
            assert "only_runner" in {c["name"] for c in inspect(conn).get_columns("jobs")}
        upgrade(empty_url)  # on a complete 0005: a no-op
        assert _schema_diff(empty_url) == []
    finally:
        engine.dispose()


def test_0009_numbers_each_tasks_queue_and_keeps_every_row(empty_url):
    """Jobs queued before fair shares get keys that number each task's queue from 0 (a
    step each, oldest first), the task its key after them; every other row key 0 and
    priority 1. At key 0 alike, a task created after the upgrade waited behind the whole
    backlog queued before it (service/fair_share.py)."""
    upgrade(empty_url, "0008")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        with engine.begin() as conn:
            for job_id in (2, 3):
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, task_id, workload_id, gpu, arch, trial, batch, "
                        "schedule, schedule_id, state, attempts) VALUES (:id, 1, 1, 'a100', "
                        "'sm_80', :id, 0, '{}', 's', 'queued', 0)"
                    ),
                    {"id": job_id},
                )
        upgrade(empty_url)
        assert _schema_diff(empty_url) == []
        with engine.connect() as conn:
            jobs = conn.execute(text("SELECT id, fair_key FROM jobs ORDER BY id")).all()
            # (The revision's own step, 2520: the application's may change, this may not.)
            assert [tuple(r) for r in jobs] == [(1, 0), (2, 0), (3, 2520)]
            task = conn.execute(text("SELECT fair_key, priority FROM tasks")).one()
            assert tuple(task) == (2 * 2520, 1)
            queue = {i["name"]: i["column_names"] for i in inspect(conn).get_indexes("jobs")}
            assert queue["ix_jobs_queue"] == ["state", "arch", "gpu", "fair_key", "id"]
        downgrade(empty_url, "0008")
        assert _trial_rows(engine)[0] == TRIAL_ROWS[0] and len(_trial_rows(engine)) == 4
        with engine.connect() as conn:
            assert "fair_key" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
            columns = {c["name"] for c in inspect(conn).get_columns("tasks")}
            assert not {"fair_key", "priority"} & columns
            queue = {i["name"]: i["column_names"] for i in inspect(conn).get_indexes("jobs")}
            assert queue["ix_jobs_queue"] == ["state", "arch", "gpu", "id"]
    finally:
        engine.dispose()


def _db_current(url: str) -> subprocess.CompletedProcess[str]:
    """`pipetune db current --db URL` in a process of its own."""
    command = [sys.executable, "-m", "pipetune.clients.cli", "db", "current", "--db", url]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_head_database_without_a_column_is_refused_naming_it(empty_url):
    """The revision alone said "up to date" (`db current`, the service's start) of a schema
    that lacked a column; the columns are compared as well now."""
    upgrade(empty_url)
    engine = make_engine(empty_url, pool_size=1)
    try:
        _drop_columns(engine, [("jobs", "only_runner")])
    finally:
        engine.dispose()
    with pytest.raises(SchemaError, match=r"lacks jobs\.only_runner"):
        check_schema(empty_url)
    current = _db_current(empty_url)
    assert current.returncode == 0 and "lacks jobs.only_runner" in current.stdout, current
    assert "up to date" not in current.stdout


def test_a_head_database_without_a_table_is_refused_naming_it(empty_url):
    """Only the tables that were there had their columns compared: without `leases`, `db
    current` said "up to date" and the service started, to fail every lease."""
    upgrade(empty_url)
    engine = make_engine(empty_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE leases"))
    finally:
        engine.dispose()
    with pytest.raises(SchemaError, match=r"lacks leases\.id, leases\.job_id"):
        check_schema(empty_url)
    current = _db_current(empty_url)
    assert current.returncode == 0 and "lacks leases.id" in current.stdout, current


# Released revisions are never edited (a database that ran one keeps its revision id and
# would never run the edit): a change goes into a new revision. SHA-256 of each file, by
# revision id.
RELEASED = {
    "0001": "c96d3de22e54383ac41b20baadae0b3ec77736ebb290da7df6d6c5fcd6017985",
    "0002": "e1ed0d62a7ad27184398f93370b952726a0c9f853c4773854b1e5ede6d33f733",
    "0003": "30424d72ef94da24ec29f83f349cdc1d446131b0d9a74350cae31305a955f117",
    "0004": "d9d10421b37503e744d00583b7aa6ff758bd5817139e49ec9924fcd178ceb175",
    "0005": "a73e115af701d67816f85512cb0284bd91bd6dc63e54f628f4a31e42a02b713a",
    "0006": "f070548293315e629e9713e0a9d309d7614ef6cd4fa99fb3aee63cabded98c56",
    "0007": "945e656eef66849351ff4383786f1396cc38e57dde22a1cb9fe1ffb33ecf9577",
    "0008": "6f0ebb9060fd2ef45377c3352dfa2b73d19bd112834ba2aaf9abb7d1acfe4c48",
    "0009": "0341ce11a51212fb968b636c8dd5fdf282cfb90c0f40d2f5d5d39d2c4db6286e",
    "0010": "777889c2d1ed98496c56edfe43df35a369190cba3e5bbe9298c6afc1011ccd31",
    "0011": "3bd47d3344d48dfe056a7a6d9a660ee8eae9419dedd1e442a44dbe756e74155c",
    "0012": "1e241af14b1770c05157de5a5455e8e40996bd7f710e46f7aa15d429bcfd1a4c",
    "0013": "aecb542aa0cdfa5985fffeb297b2b2d8fd31e85797f7311f9ecc237a88b398f0",
    "0014": "d09f6332c58329625d9add762c64b69d8ac68a46c833de036f3c30a4e7ef6e95",
}


def test_released_migrations_are_not_edited():
    """Every revision on main is released: pinned here when it is added, never edited."""
    versions = Path(__file__).resolve().parents[1] / "migrations" / "versions"
    files = {path.name[:4]: path for path in versions.glob("[0-9][0-9][0-9][0-9]_*.py")}
    assert sorted(files) == sorted(RELEASED), "pin each new revision's digest in RELEASED"
    for revision_id, digest in RELEASED.items():
        got = hashlib.sha256(files[revision_id].read_bytes()).hexdigest()
        assert got == digest, (
            f"{files[revision_id].name} was edited after its release: add a new revision instead"
        )


def test_migrations_installed_under_a_path_with_a_percent_sign_still_run(tmp_path, monkeypatch):
    """Alembic's ini options interpolate '%': pipetune installed under such a path (a
    checkout in ".../100% é#x/") failed every start with "invalid interpolation syntax"."""
    import shutil

    from pipetune.service import migrate

    odd = tmp_path / "100% disk é#x" / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, odd, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(migrate, "MIGRATIONS_DIR", odd)
    migrate.head_revision.cache_clear()
    try:
        url = sqlite_url(tmp_path / "db.sqlite")
        upgrade(url)
        # (check_schema answers the database's revision only where it is the newest)
        assert check_schema(url) == migrate.head_revision() == migrate.known_revisions()[0]
    finally:
        migrate.head_revision.cache_clear()


def test_a_failing_upgrade_keeps_nothing_of_it(empty_url):
    """One transaction for the whole upgrade, on SQLite as on PostgreSQL: a revision that
    fails (0004's column already there) left a SQLite database at 0003, the revisions before
    it committed one by one."""
    upgrade(empty_url, "0001")
    engine = make_engine(empty_url, pool_size=1)
    try:
        _one_finished_task(engine)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE jobs ADD COLUMN seen_at INTEGER"))
        with pytest.raises(Exception, match="seen_at"):
            upgrade(empty_url)
        assert current_revision(engine) == "0001"
        with engine.connect() as conn:
            assert "prior_task" not in {c["name"] for c in inspect(conn).get_columns("tasks")}
        assert _trial_rows(engine) == TRIAL_ROWS
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "table, row",
    [
        (
            "leases",
            "INSERT INTO leases (id, job_id, worker_id, token, leased_at, outcome) "
            "VALUES (999, 99999, 1, 't', '2026-01-01', 'result')",
        ),
        (  # a table the migrations rebuild, whose keys they renumber (0002: prior_task)
            "tasks",
            "INSERT INTO tasks (id, workload_id, gpu, arch, strategy, budget, seed, batch_size, "
            "state, batches, trials_target, trials_enqueued, trials_done, trials_failed) "
            "VALUES (999, 99999, 'a100', 'sm_80', 'random', 8, 0, 8, 'done', 1, 8, 8, 8, 0)",
        ),
    ],
)
def test_rows_dangling_before_the_upgrade_do_not_stop_it(tmp_path, table, row):
    """SQLite: the foreign key check after the migrations counts only what they broke. A row
    already pointing nowhere (written with foreign keys off) failed every upgrade for ever,
    blamed on the migration, after the migrations had been committed; and one in `tasks`
    still did, its key renumbered by the table's rebuild."""
    url = f"sqlite:///{tmp_path / 'dangling.db'}"
    upgrade(url, "0001")
    engine = make_engine(url, pool_size=1)
    try:
        _one_finished_task(engine)
        raw = engine.raw_connection()
        try:
            raw.execute("PRAGMA foreign_keys=OFF")
            raw.execute(row)
            raw.commit()
        finally:
            raw.close()
        upgrade(url)
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 2
            assert conn.execute(text(f"SELECT count(*) FROM {table} WHERE id = 999")).scalar()
    finally:
        engine.dispose()


def _revision_of(url: str) -> str | None:
    engine = make_engine(url, pool_size=1)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


_UPGRADE_AT = """
import sys, time
from pipetune.service.migrate import upgrade
url, at = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, at - time.time()))
upgrade(url, sys.argv[3] if len(sys.argv) > 3 else "head")
"""


@pytest.mark.parametrize("start", [None, "0006"], ids=["empty", "behind"])
def test_replicas_that_upgrade_at_once_both_succeed(start):
    """Replicas that all run `pipetune db upgrade` at start (docker-compose's service) read
    the old revision each in its own transaction and applied the same steps: the second
    failed in every round (a duplicate type in pg_type from empty, DuplicateColumn from
    behind). Each upgrade now waits for the one before it on PostgreSQL."""
    from service_support import PG_ADMIN_URL, require_pg

    from benchmarks.harness import pg_database

    require_pg()
    for _ in range(3):
        with pg_database(PG_ADMIN_URL) as url:
            if start is not None:
                upgrade(url, start)
            at = str(time.time() + 3.0)  # both past their imports, then released together
            command = [sys.executable, "-c", _UPGRADE_AT, url, at]
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
            runs = [subprocess.Popen(command, **pipes) for _ in range(2)]
            for run in runs:
                _, err = run.communicate(timeout=120)
                assert run.returncode == 0, err
            assert _revision_of(url) == head_revision()


def test_an_upgrade_that_waits_for_another_migration_says_so():
    """With another session holding the migration lock, `db upgrade` waited without a word
    and with no time limit: a deploy hung, saying nothing."""
    import psycopg
    from service_support import PG_ADMIN_URL, libpq_url, require_pg

    from benchmarks.harness import pg_database

    require_pg()
    with pg_database(PG_ADMIN_URL) as url:
        command = [sys.executable, "-m", "pipetune.clients.cli", "db", "upgrade", "--db", url]
        with psycopg.connect(libpq_url(url)) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(7370616964)")
            run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
            try:
                assert run.stderr is not None
                lines: list[str] = []
                reader = threading.Thread(target=lambda: lines.append(run.stderr.readline()))
                reader.start()
                reader.join(timeout=60)  # (the note comes while the lock is held)
                assert lines and lines[0].startswith(
                    "waiting for another migration of this database"
                ), lines
                assert run.poll() is None  # still waiting
            finally:
                holder.rollback()  # the lock goes with the transaction
            _, rest = run.communicate(timeout=120)
        assert run.returncode == 0, rest
        assert _revision_of(url) == head_revision()


def test_an_upgrade_that_times_out_on_a_lock_says_who_holds_it_and_what_to_do():
    """A table the upgrade alters, locked by another session (a running service): after the
    migration's lock timeout the command said only "LockNotAvailable: canceling statement
    due to lock timeout". It says what holds it and that nothing was changed."""
    from service_support import PG_ADMIN_URL, require_pg
    from typer.testing import CliRunner

    from benchmarks.harness import pg_database
    from pipetune.clients.cli.main import app

    require_pg()
    with pg_database(PG_ADMIN_URL) as url:
        upgrade(url, "0008")
        holder = make_engine(url, pool_size=1)
        try:
            with holder.connect() as conn:
                conn.execute(text("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE"))
                result = CliRunner().invoke(app, ["db", "upgrade", "--db", url])
                conn.rollback()
            assert result.exit_code == 1, result.output
            line = result.output.strip().splitlines()[-1]
            assert "lock timeout" in line and "the upgrade changed nothing" in line, line
            engine = make_engine(url, pool_size=1)
            try:
                assert current_revision(engine) == "0008"
            finally:
                engine.dispose()
        finally:
            holder.dispose()


def test_two_threads_creating_one_new_database_both_get_its_schema(tmp_path: Path):
    """Two threads' first `pipetune.tune` on a new database at once: Alembic's commands swap a
    module-global proxy in and out, and one thread died with a bare KeyError: 'config' (two
    of three, with three). Made one at a time, every thread finds the schema."""
    import threading

    from pipetune.service.migrate import check_schema, head_revision

    def create(url: str, start: threading.Barrier, answers: list[object]) -> None:
        start.wait()
        try:
            answers.append(check_schema(url, create_if_empty=True))
        except Exception as exc:
            answers.append(exc)

    for attempt in range(4):  # (the race was lost most times; several fresh files)
        url = f"sqlite:///{tmp_path / f'new-{attempt}.db'}"
        start = threading.Barrier(4)
        answers: list[object] = []
        threads = [threading.Thread(target=create, args=(url, start, answers)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [head_revision()] * 4


def test_going_below_0012_with_a_long_op_is_refused_naming_it_and_changes_nothing(empty_url):
    """0012 widened workloads.op for the fused Hopper GEMMs; going back would cut their op
    (SQLite) or fail midway (PostgreSQL), so the downgrade names them and stops."""
    upgrade(empty_url)
    engine = make_engine(empty_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO workloads (id, hash, op, canonical, label, flops) "
                    "VALUES (1, 'h', 'hopper_gemm_bias_gelu', '{}', 'x', 1)"
                )
            )
        with pytest.raises(RuntimeError, match="hopper_gemm_bias_gelu need more than 16"):
            downgrade(empty_url, "0011")
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            ops = conn.execute(text("SELECT op FROM workloads")).scalars().all()
        assert ops == ["hopper_gemm_bias_gelu"]
    finally:
        engine.dispose()
