"""One root for everything pipetune raises on purpose: `except pipetune.PipetuneError` catches
bad input to the library, the SDK's failures, a runner or compiler refusing, and each error
is still the built-in exception it was (ValueError, TypeError, RuntimeError, KeyError)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest

import pipetune
from pipetune.clients import sdk
from pipetune.model import errors

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("model", "tuner", "workers", "clients", "service")
# Raised and caught inside one layer, never to a user of the library: the service's request
# errors become HTTP statuses (service/errors.py maps them), the CLI's become exit codes.
INTERNAL = {
    "service/errors.py": "request errors, answered as HTTP statuses",
    "service/middleware.py": "a body too large, answered 413",
    "service/routers/bounded_json.py": "a JSON body with too many fields, answered 422",
    "clients/cli/errors.py": "the CLI's errors, printed with an exit code",
    "service/db.py": "a driver error (psycopg's OperationalError), wrapped as SQLAlchemy's: a 503",
}

FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}


def _error_classes() -> list[tuple[str, str]]:
    """(file, class name) of every exception class the package defines, from the source."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in INTERNAL:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                    found.append((rel, node.name))
    return found


def _module(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    if parts[0] == "clients" and parts[1] == "public":
        return "pipetune"
    return "pipetune." + ".".join(p for p in parts if p != "__init__")


def test_the_walk_finds_the_errors_it_should():
    names = {name for _, name in _error_classes()}
    # (a walk that found nothing would pass the next test vacuously)
    assert {"WorkloadError", "RunnerError", "CompileError", "ArgumentError"} <= names
    assert len(names) > 30


@pytest.mark.parametrize(("rel", "name"), _error_classes())
def test_every_error_derives_from_the_root(rel, name):
    cls = getattr(importlib.import_module(_module(rel)), name)
    if not isinstance(cls, type) or not issubclass(cls, BaseException):
        pytest.skip(f"{name} is not an exception (a wire document named like one)")
    assert issubclass(cls, errors.PipetuneError), f"{rel}: {name} is not a PipetuneError"


def test_one_root_under_every_name():
    assert pipetune.PipetuneError is sdk.PipetuneError is errors.PipetuneError
    assert pipetune.InvalidArgumentError is sdk.InvalidArgumentError
    assert issubclass(pipetune.ArgumentError, pipetune.InvalidArgumentError)


@pytest.mark.parametrize(
    ("call", "builtin", "argument"),
    [
        (lambda: pipetune.tune(FC, "h100", budget=0, runner="simulated"), ValueError, "budget"),
        (lambda: pipetune.tune(FC, "h100", runner="nope"), ValueError, "runner"),
        (lambda: pipetune.tune(FC, "h100", runner="simulated", dataset="x"), ValueError, "dataset"),
        (lambda: pipetune.kernel(42, "h100"), TypeError, "workload"),
        (lambda: pipetune.best_schedule(FC, "h100", server="http://x", db="y"), ValueError, "db"),
    ],
    ids=["budget", "runner", "dataset", "workload type", "server and db"],
)
def test_the_librarys_refusals_are_pipetune_errors_naming_the_argument(call, builtin, argument):
    with pytest.raises(pipetune.PipetuneError) as caught:
        call()
    assert isinstance(caught.value, builtin)  # as before: except ValueError still works
    assert caught.value.argument == argument
    assert str(caught.value).startswith(f"{argument}: ")


def test_bad_model_input_is_a_pipetune_error():
    with pytest.raises(pipetune.PipetuneError, match="gpu"):
        pipetune.best_schedule(FC, "no-such-gpu")
    with pytest.raises(pipetune.PipetuneError, match="m"):
        pipetune.kernel({"op": "gemm", "m": -5, "n": 64, "k": 2048}, "h100")


def test_a_kernel_given_too_many_arrays_is_a_pipetune_type_error():
    k = pipetune.kernel(FC, "h100", schedule=pipetune.best_schedule(FC, "h100").schedule)
    arrays = [np.zeros(1)] * 4
    with pytest.raises(pipetune.PipetuneError) as caught:
        k(*arrays)
    assert isinstance(caught.value, TypeError)
    assert "got 4 arrays" in str(caught.value)


def test_the_tuned_result_types_its_best_schedule(tmp_path):
    result = pipetune.tune(
        FC, "h100", budget=2, runner="simulated", db=f"sqlite:///{tmp_path}/t.db"
    )
    assert isinstance(result.best_schedule, pipetune.Schedule)


def test_an_in_memory_database_is_refused_before_tuning_as_the_db_argument():
    # (it was pydantic's ValidationError for the service's Settings, from inside tune())
    with pytest.raises(pipetune.PipetuneError, match=r"^db: an in-memory SQLite database"):
        pipetune.tune(FC, "h100", budget=2, runner="simulated", db="sqlite://")


def test_tuning_into_a_database_that_cannot_be_written_says_so(tmp_path):
    """It raised SQLAlchemy's OperationalError from its first write, the SQL in its text
    (a read-only URI stands in for a file without write permission, which the tests' root
    user would write anyway)."""
    from pipetune.service.migrate import upgrade
    from pipetune.service.settings import sqlite_uri_url, sqlite_url

    upgrade(sqlite_url(tmp_path / "ro.db"))
    read_only = sqlite_uri_url(tmp_path / "ro.db", mode="ro")
    with pytest.raises(pipetune.PipetuneError, match="cannot be written") as caught:
        pipetune.tune(FC, "h100", budget=2, runner="simulated", db=read_only)
    assert "INSERT" not in str(caught.value) and "-wal and -shm" in str(caught.value)


def test_a_tuning_whose_database_fails_midway_is_a_pipetune_error(tmp_path, monkeypatch):
    """A database error after the start (a lock another process held past the busy timeout,
    a disk that filled): a PipetuneError that says which database and why, no SQL."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from pipetune.clients.library import tuning

    def locked(*args, **kwargs):
        raise OperationalError(
            "BEGIN IMMEDIATE", {}, sqlite3.OperationalError("database is locked")
        )

    monkeypatch.setattr(tuning._InProcessTask, "run", locked)
    with pytest.raises(pipetune.PipetuneError, match="database is locked") as caught:
        pipetune.tune(FC, "h100", budget=2, runner="simulated", db=f"sqlite:///{tmp_path}/t.db")
    assert "BEGIN IMMEDIATE" not in str(caught.value) and "t.db" in str(caught.value)


def test_a_cubin_for_an_arch_nvrtc_cannot_target_is_a_pipetune_error_naming_arch():
    # (it was a plain ValueError from the compiler, outside `except pipetune.PipetuneError`)
    k = pipetune.kernel(FC, "h100", schedule=pipetune.best_schedule(FC, "h100").schedule)
    for bad in ("sm_12", "sm90"):
        with pytest.raises(pipetune.InvalidArgumentError) as caught:
            k.cubin(bad)
        assert isinstance(caught.value, ValueError) and caught.value.argument == "arch"
        assert str(caught.value).startswith("arch: ")
    with pytest.raises(pipetune.PipetuneError, match=r"^arch: expected a target name") as typed:
        k.cubin(90)  # type: ignore[arg-type]
    assert isinstance(typed.value, TypeError)
    hopper = pipetune.kernel({"op": "hopper_gemm", "m": 1024, "n": 768, "k": 3072}, "h100")
    with pytest.raises(pipetune.InvalidArgumentError, match=r"^arch: .*not sm_80"):
        hopper.cubin("sm_80")
