"""Checking a SQLite database file must not drop this process's locks on it.

The library checks the file behind `db=` before every call (`pipetune.tune`, `best_schedule`,
LocalStore). It read the header with open() and closed it, and closing any descriptor of a
file drops every POSIX lock the process holds on it, those SQLite holds for the connections
of other threads included. Another process then took the database as unused: it reset the
write-ahead log under a writer, and tunings that had returned were lost from the file.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from pipetune.service.settings import database_file_problem

# Another process asks for the write lock, without waiting: "locked" while we hold ours.
_TRY_TO_WRITE = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    conn.execute("BEGIN IMMEDIATE")
    print("got the write lock")
except sqlite3.OperationalError as exc:
    print(exc)
"""


def _other_process_tries_to_write(path) -> str:
    run = subprocess.run(
        [sys.executable, "-c", _TRY_TO_WRITE, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return run.stdout.strip()


def test_a_check_of_the_file_keeps_the_write_lock_another_connection_holds(tmp_path):
    path = tmp_path / "p.db"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (x INTEGER)")
        holder.execute("BEGIN IMMEDIATE")  # this process's write lock on the file
        holder.execute("INSERT INTO t VALUES (1)")
        assert _other_process_tries_to_write(path) == "database is locked"
        assert database_file_problem(f"sqlite:///{path}") is None
        assert _other_process_tries_to_write(path) == "database is locked"
        holder.execute("COMMIT")
    finally:
        holder.close()
    assert _other_process_tries_to_write(path) == "got the write lock"


def test_what_the_check_tells_apart(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()  # what sqlite3 leaves on a first connect: an empty database
    text = tmp_path / "notes.db"
    text.write_text("SQLite is a library, and these are notes about it\n" * 40)
    made = tmp_path / "made.db"
    sqlite3.connect(made).execute("CREATE TABLE t (x)").connection.close()
    assert database_file_problem(f"sqlite:///{empty}") is None
    assert database_file_problem(f"sqlite:///{made}") is None
    assert database_file_problem(f"sqlite:///{text}") == f"{text} is not a SQLite database file"
    assert database_file_problem(f"sqlite:///{tmp_path}") == (
        f"{tmp_path} is a directory, not a database file"
    )
