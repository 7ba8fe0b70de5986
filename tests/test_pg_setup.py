"""How the tests get their PostgreSQL (tests/pg_instance.py settle, run by conftest.py): the
local server when it answers, else a private throwaway server; with neither, the tests that
need it fail with a one-line reason and never skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pg_instance
from pg_instance import ADMIN_URL_ENV, UNAVAILABLE_ENV, connection_problem, settle

NOTHING_THERE = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # port 1: refused
ROOT = Path(__file__).resolve().parents[1]


def test_no_local_server_gets_a_private_one_for_the_run():
    env: dict[str, str] = {}
    pg = settle(env, default_url=NOTHING_THERE)
    assert pg is not None
    try:
        assert env[ADMIN_URL_ENV] == pg.url
        assert connection_problem(pg.url) is None
        assert UNAVAILABLE_ENV not in env
    finally:
        pg.destroy()
    assert not pg.root.exists()
    assert connection_problem(pg.url) is not None


def test_a_server_that_answers_or_a_given_url_is_used_as_it_is():
    env = {ADMIN_URL_ENV: NOTHING_THERE}
    assert settle(env, default_url=NOTHING_THERE) is None
    assert env == {ADMIN_URL_ENV: NOTHING_THERE}  # given: not replaced, even if down


def test_neither_a_server_nor_binaries_records_why_in_one_line(monkeypatch):
    def no_binaries() -> None:
        raise pg_instance.PostgresUnavailableError("no PostgreSQL server binaries (initdb) found")

    monkeypatch.setattr(pg_instance.PostgresInstance, "started", no_binaries)
    env: dict[str, str] = {}
    assert settle(env, default_url=NOTHING_THERE) is None
    reason = env[UNAVAILABLE_ENV]
    assert "\n" not in reason and ADMIN_URL_ENV not in env
    assert reason.startswith(f"no PostgreSQL answers at {NOTHING_THERE} (")
    assert "no PostgreSQL server binaries (initdb) found" in reason


def test_without_postgresql_its_tests_fail_with_the_reason_and_never_skip():
    env = {**os.environ, UNAVAILABLE_ENV: "no PostgreSQL here (a test of the tests)"}
    env.pop(ADMIN_URL_ENV, None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
         "tests/test_migrations.py", "-k", "postgresql"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 1, out
    assert "skipped" not in out, out
    # Each test errs in its database fixture, the report giving the reason as one line.
    errors = [line for line in out.splitlines() if line.startswith("ERROR tests/")]
    assert len(errors) >= 2 and all("[postgresql]" in e.split(" - ")[0] for e in errors), out
    reason = "no PostgreSQL here (a test of the tests) (make test sets PostgreSQL up)"
    assert out.splitlines().count(reason) == len(errors), out
