"""Bad input to `pipetune serve`, `pipetune db ...` and the commands that read a database or
talk to a service: one line on stderr and exit 2 before anything is written or sent; a
re-run import finds what it imported. Database checks run on SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from service_support import require_pg, row_count
from sqlalchemy import select
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.cli.remote import cli_error
from pipetune.clients.local_service import free_port
from pipetune.clients.sdk import NotFoundError
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import gemm
from pipetune.service.db import Database
from pipetune.service.orm import ReferenceOptimumRow, TaskRow
from pipetune.workers.daemon import gpu as daemon_gpu
from pipetune.workers.datasets import dataset_from_results, write_t4

pytest_plugins = ["service_fixtures"]

runner = CliRunner()
WORKLOAD = gemm(256, 256, 256)
FC = ["--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY", "PIPETUNE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


def _sweep(path: Path, limit: int | None = None, scale: float = 1.0) -> Path:
    """A simulated sweep of WORKLOAD on the A100 (its first `limit` schedules)."""
    gpu = get_gpu("a100")
    space = Space.enumerate(WORKLOAD, gpu)
    schedules = list(space)[:limit]
    latency = evaluate(space).latency_us[: len(schedules)] * scale
    results = [MeasureResult(status="ok", latency_us=float(x)) for x in latency]
    data = dataset_from_results(WORKLOAD, gpu, schedules, results, runner="simulated")
    return write_t4(data, path)


def _one_error_line(result, prefix: str) -> None:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {prefix}"), result.stderr


# ---- 1: import-optimum takes only an exhaustive sweep -----------------------------------


def test_import_optimum_refuses_a_partial_sweep(db_url, tmp_path):
    partial = _sweep(tmp_path / "lim5.t4.json.gz", limit=5)
    result = runner.invoke(app, ["db", "import-optimum", str(partial), "--db", db_url])
    assert result.exit_code == 2, result.output
    _one_error_line(result, f"{partial}: not an exhaustive sweep: it holds 5 of the ")
    assert row_count(db_url, ReferenceOptimumRow.gpu) == 0  # nothing written

    full = _sweep(tmp_path / "full.t4.json.gz")
    result = runner.invoke(app, ["db", "import-optimum", str(full), "--db", db_url])
    assert result.exit_code == 0, result.output
    assert "(simulated runner)" in result.stdout


def test_import_optimum_into_a_file_that_is_not_there_says_so_and_creates_nothing(tmp_path):
    """It said "the database has no pipetune schema" of a mistyped --db."""
    full = _sweep(tmp_path / "full.t4.json.gz")
    missing = tmp_path / "typo.db"
    result = runner.invoke(app, ["db", "import-optimum", str(full), "--db", f"sqlite:///{missing}"])
    assert result.exit_code == 1, result.output
    _one_error_line(result, f"no database file at {missing} (this pipetune needs revision ")
    assert result.stderr.rstrip().endswith("creates it") and not missing.exists()


def test_import_optimum_from_a_file_name_that_is_not_utf8_stores_it_escaped(db_url, tmp_path):
    """Its source column could not hold the name: UnicodeEncodeError, exit 1, nothing kept."""
    import os

    named = _sweep(Path(os.fsdecode(bytes(tmp_path) + b"/opt\xe9.t4.json.gz")))
    result = runner.invoke(app, ["db", "import-optimum", str(named), "--db", db_url])
    assert result.exit_code == 0, result.output
    database = Database(db_url)
    try:
        with database.read() as s:
            (source,) = s.scalars(select(ReferenceOptimumRow.source)).all()
    finally:
        database.dispose()
    assert source.endswith("opt\\xe9.t4.json.gz"), source


def test_a_sqlite_path_that_is_not_utf8_is_named_escaped(tmp_path):
    """Every command that names its database (db upgrade's report, db current, tasks' source)
    failed with UnicodeEncodeError, exit 1: db upgrade after it had done its work."""
    import os

    url = "sqlite:///" + os.fsdecode(bytes(tmp_path) + b"/lat\xe9.db")
    for command in (["db", "upgrade"], ["db", "current"], ["tasks"]):
        result = runner.invoke(app, [*command, "--db", url])
        assert result.exit_code == 0, (command, result.output)
    assert (bytes(tmp_path) + b"/lat\xe9.db") in [os.fsencode(p) for p in tmp_path.iterdir()]
    # (as the other file names not UTF-8: escaped, not URL-quoted as lat%5Cxe9.db)
    assert "lat\\xe9.db" in runner.invoke(app, ["db", "current", "--db", url]).stdout


# ---- 2: import-dataset run again answers with the task it made ---------------------------


def _import(path: Path, url: str) -> dict:
    result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_importing_the_same_trials_again_answers_with_the_first_task(db_url, tmp_path):
    path = _sweep(tmp_path / "part.t4.json.gz", limit=40)
    first = _import(path, db_url)
    again = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url])
    assert again.exit_code == 0, again.output
    assert f"task {first['id']}: already imported" in " ".join(again.stdout.split())
    copy = tmp_path / "renamed.t4.json.gz"
    copy.write_bytes(path.read_bytes())
    assert _import(copy, db_url) == first  # the same document: the first import's task
    assert row_count(db_url, TaskRow.id) == 1

    other = _sweep(tmp_path / "other.t4.json.gz", limit=40, scale=1.5)  # other latencies
    assert _import(other, db_url)["id"] != first["id"]
    assert row_count(db_url, TaskRow.id) == 2


# ---- 3: serve checks its local workers before it starts ----------------------------------


def test_serve_refuses_a_replay_dataset_that_does_not_read(tmp_path):
    full = _sweep(tmp_path / "full.t4.json.gz", limit=20)
    truncated = tmp_path / "trunc.t4.json.gz"
    truncated.write_bytes(full.read_bytes()[:300])
    with pytest.raises(EOFError):
        gzip.decompress(truncated.read_bytes())
    db = tmp_path / "s.db"
    args = ["serve", "--db", f"sqlite:///{db}", "--port", str(free_port()), "--local-workers"]
    result = runner.invoke(app, [*args, "1", "--runner", "replay", "--dataset", str(truncated)])
    assert result.exit_code == 2, result.output
    _one_error_line(result, f"--dataset: {truncated}: ")
    assert not db.exists()


def test_serve_without_a_gpu_for_cupy_workers_exits_1(tmp_path, monkeypatch):
    def no_gpu(device: int = 0, timeout_s: float = 0) -> dict:
        raise daemon_gpu.DetectionError("no usable CUDA GPU through CuPy: no device")

    monkeypatch.setattr(daemon_gpu, "probe_cupy", no_gpu)
    db = tmp_path / "s.db"
    args = ["serve", "--db", f"sqlite:///{db}", "--port", str(free_port())]
    result = runner.invoke(app, [*args, "--local-workers", "2", "--runner", "cupy"])
    assert result.exit_code == 1, result.output
    _one_error_line(result, "--runner cupy: no usable CUDA GPU")
    assert not db.exists()


def test_local_replay_workers_stand_in_for_the_datasets_gpu(tmp_path):
    from pipetune.service.local_workers import preflight, worker_gpus

    path = _sweep(tmp_path / "a100.t4.json.gz", limit=5)
    assert preflight("replay", path) == "a100"
    assert worker_gpus(3, "replay", "a100") == ["a100"] * 3
    assert worker_gpus(2, "simulated") == ["h100", "a100"]  # the default GPU first
    assert worker_gpus(2, "cupy") == [None, None]


# ---- 4: --db, --revision and --log-level -------------------------------------------------


@pytest.fixture
def not_a_database(tmp_path: Path) -> str:
    path = tmp_path / "notes.db"
    path.write_text("hello\n")
    return f"sqlite:///{path}"


BAD_URLS = {
    "notaurl": "not a database URL (",
    "foo://x": "not a database URL pipetune can use ('foo'",
    # A port that is not a number was "error: ValueError: invalid literal for int()", exit 1;
    # one out of range was refused by libpq at the connection (exit 1), or, 0, ignored.
    "postgresql+psycopg://u@h:5432x/d": "not a database URL (",
    "postgresql+psycopg://u@[::1/d": "not a database URL (",
    "postgresql+psycopg://u@h:70000/d": "the port must be 1..65535, got 70000",
    "postgresql+psycopg://u@h:0/d": "the port must be 1..65535, got 0",
    "file": "is not a SQLite database file",
    # Under a file: "failed: File exists (FILE)", exit 1; `db current`: "db upgrade creates it".
    "under a file": "notes.db is not a folder",
    # In memory: each connection had an empty database of its own ("no such table: tasks").
    "sqlite://": "an in-memory SQLite database lasts only as long as one connection",
    # Refused by the driver before it reached the server: "the database ... failed", exit 1.
    "pg?connect_timeout=abc": "ProgrammingError: bad value for connect_timeout: 'abc'",
    "pg?bogus=1": 'ProgrammingError: invalid connection option "bogus"',
}
COMMANDS = {
    "serve": ["serve"],
    "db current": ["db", "current"],
    "db upgrade": ["db", "upgrade"],
    "tasks": ["tasks"],
    "curve": ["curve", "1"],
    "schedule": ["schedule", "gemm", *FC],
    "export": ["export", "--task", "1", "--format", "t4", "--out", "x.t4.json.gz"],
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=str)
@pytest.mark.parametrize("bad", list(BAD_URLS), ids=str)
def test_a_bad_db_is_one_line_naming_the_option_and_exit_2(command, bad, not_a_database):
    url = {"file": not_a_database, "under a file": f"{not_a_database}/sub/x.db"}.get(bad, bad)
    if bad.startswith("pg?"):
        url = require_pg() + bad.removeprefix("pg")
    result = runner.invoke(app, [*COMMANDS[command], "--db", url])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--db: ")
    assert BAD_URLS[bad] in result.stderr


def test_a_bad_database_url_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("PIPETUNE_DATABASE_URL", "notaurl")
    for command in (["db", "current"], ["tasks"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        _one_error_line(result, "PIPETUNE_DATABASE_URL: not a database URL")


def test_db_current_on_an_empty_database_says_it_has_no_schema(tmp_path):
    """It printed "revision None" of an empty SQLite file (or a new PostgreSQL database)."""
    empty = tmp_path / "empty.db"
    empty.touch()
    result = runner.invoke(app, ["db", "current", "--db", f"sqlite:///{empty}"])
    line = " ".join(result.stdout.split())
    assert result.exit_code == 0, result.output
    assert "None" not in line and "no pipetune schema (newest" in line
    assert "behind: run `pipetune db upgrade`" in line


def test_db_current_on_a_mistyped_path_creates_nothing(tmp_path):
    missing = tmp_path / "mistyped" / "x.db"
    result = runner.invoke(app, ["db", "current", "--db", f"sqlite:///{missing}", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["current"] is None
    text = runner.invoke(app, ["db", "current", "--db", f"sqlite:///{missing}"])
    assert text.exit_code == 0 and "no database file" in text.stdout
    optimum = _sweep(tmp_path / "full.t4.json.gz")
    refused = runner.invoke(
        app, ["db", "import-optimum", str(optimum), "--db", f"sqlite:///{missing}"]
    )
    assert refused.exit_code == 1 and "pipetune db upgrade" in refused.stderr
    assert not missing.parent.exists()


def test_unknown_revision_and_log_level_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = runner.invoke(app, ["db", "upgrade", "--db", url, "--revision", "zzz"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--revision: Can't locate revision identified by 'zzz'")
    assert not (tmp_path / "r.db").exists()
    result = runner.invoke(app, ["serve", "--db", url, "--log-level", "foo"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--log-level: must be one of critical, error, warning, info")


# ---- 5: --poll is checked before a task is created ---------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["tune", "gemm", *FC, "--budget", "2", "--wait", "--poll", "-1"],
        ["tune", "gemm", *FC, "--budget", "2", "--wait", "--poll", "0"],
        ["tune-model", "bert-base", "--seq", "64", "--budget", "2", "--poll", "-1"],
    ],
    ids=["tune -1", "tune 0", "tune-model -1"],
)
def test_a_poll_that_is_not_positive_exits_2_before_anything_is_sent(command):
    # Nothing listens at the server: had the command sent anything, it would exit 1.
    result = runner.invoke(app, [*command, "--server", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--poll: must be a positive number of seconds")


@pytest.mark.parametrize(
    "command",
    [
        ["tune", "gemm", *FC, "--budget", "2", "--wait", "--poll", "1e-9"],
        ["tune-model", "bert-base", "--seq", "64", "--budget", "2", "--poll", "0.05"],
    ],
    ids=["tune 1e-9", "tune-model 0.05"],
)
def test_a_poll_shorter_than_a_tenth_of_a_second_exits_2_before_anything_is_sent(command):
    # (It polled the service flat out.) Nothing listens at the server, as above.
    result = runner.invoke(app, [*command, "--server", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--poll: at least 0.1 s")


@pytest.mark.parametrize(
    "command",
    [
        ["tune", "gemm", *FC, "--budget", "2", "--wait", "--poll", "1e10"],
        ["tune-model", "bert-base", "--seq", "64", "--budget", "2", "--poll", "1e10"],
    ],
    ids=["tune", "tune-model"],
)
def test_a_poll_longer_than_a_week_exits_2_before_anything_is_sent(command):
    # 1e10 s overflowed the sleep (OverflowError, exit 1) after the task had been created.
    result = runner.invoke(app, [*command, "--server", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--poll: at most 604800 s (a week), got 1e+10")


# ---- 7: a task id that does not exist, a --server that is not a URL ----------------------


def test_a_task_that_does_not_exist_exits_2(db_url, tmp_path):
    curve = runner.invoke(app, ["curve", "999", "--db", db_url])
    assert curve.exit_code == 2, curve.output
    _one_error_line(curve, "task 999 does not exist")
    out = tmp_path / "x.t4.json.gz"
    export = ["export", "--task", "999", "--format", "t4", "--out", str(out), "--db", db_url]
    result = runner.invoke(app, export)
    assert result.exit_code == 2, result.output
    assert not out.exists()
    # From a service: its 404.
    error = cli_error(NotFoundError(404, "task 999 does not exist"))
    assert error.code == 2 and str(error) == "task 999 does not exist (HTTP 404)"


# A space in the host went to the resolver, and read as a service that is down (exit 1).
@pytest.mark.parametrize("server", ["notaurl", "http://", "ftp://host", "http://exa mple:8000"])
def test_a_server_that_is_not_an_http_url_exits_2(server):
    for command in (["tasks"], ["tune", "gemm", *FC, "--budget", "2"]):
        result = runner.invoke(app, [*command, "--server", server])
        assert result.exit_code == 2, result.output
        _one_error_line(result, f"--server: not an http(s) URL: {server!r}")
    worker = ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t"]
    result = runner.invoke(app, [*worker, "--register-timeout", "0", "--server", server])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--server: not an http(s) URL")


def test_a_server_from_the_environment_is_named_as_the_variable():
    """A bad PIPETUNE_SERVER read "--server: ...", an option the user had not typed."""
    env = {"PIPETUNE_SERVER": "notaurl"}
    worker = ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t"]
    for command in (["tasks"], ["tune", "gemm", *FC, "--budget", "2"], worker):
        result = runner.invoke(app, command, env=env)
        assert result.exit_code == 2, result.output
        _one_error_line(result, "PIPETUNE_SERVER: not an http(s) URL: 'notaurl'")
    # The option given as well: it is the one used, and the one named.
    result = runner.invoke(app, ["tasks", "--server", "other"], env=env)
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--server: not an http(s) URL: 'other'")


def test_a_worker_names_a_misspelt_variable():
    """PIPETUNE_SIMULATED_FAULT (for _FAULTS) injected no fault, and nothing said so."""
    worker = ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t"]
    server = f"http://127.0.0.1:{free_port()}"
    env = {"PIPETUNE_SIMULATED_FAULT": "crash=1"}
    result = runner.invoke(app, [*worker, "--register-timeout", "0", "--server", server], env=env)
    assert (
        "warning: PIPETUNE_SIMULATED_FAULT is set, but pipetune reads no such variable "
        "(did you mean PIPETUNE_SIMULATED_FAULTS?)"
    ) in result.stderr


@pytest.mark.parametrize("command", [["db", "upgrade"], ["serve", "--port", "18998"]])
def test_a_sqlite_file_that_cannot_be_opened_says_what_to_check(command):
    """SQLite's "unable to open database file" names no cause (a read-only mount, a folder
    that cannot be written): the line says what to check. /proc takes no files."""
    result = runner.invoke(app, [*command, "--db", "sqlite:////proc/pipetune-test.db"])
    assert result.exit_code == 1, result.output
    line = " ".join(result.output.split())
    assert "unable to open database file" in line
    assert "write the file and its folder" in line and "read-only mount" in line


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPETUNE_LEASE_TTL_S", "inf"),  # leases with no expiry (SQLite), a 500 each (PG)
        ("PIPETUNE_LEASE_TTL_S", "1e12"),
        ("PIPETUNE_MAX_ATTEMPTS", "99999999999999999999"),  # overflowed SQLite each sweep
        ("PIPETUNE_SWEEP_INTERVAL_S", "inf"),  # upkeep silently off (0 is the way)
        ("PIPETUNE_LEASE_POLL_S", "inf"),
        ("PIPETUNE_LEASE_WAIT_CAP_S", "inf"),
        ("PIPETUNE_REQUEST_READ_TIMEOUT_S", "inf"),
        ("PIPETUNE_MAX_BODY_BYTES", "100000000000000000000"),
        ("PIPETUNE_DB_POOL_SIZE", "100000000000000000000"),
    ],
)
def test_a_setting_past_what_it_can_mean_is_refused_at_start(
    monkeypatch, tmp_path, variable, value
):
    monkeypatch.setenv(variable, value)
    result = runner.invoke(app, ["serve", "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code == 2, result.output
    # (inf and nan were told "less than or equal to 604800": not the reason)
    reason = "a finite number" if value == "inf" else "less than or equal to"
    assert f"error: {variable}: Input should be {reason}" in result.output
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    "variable",
    [
        "PIPETUNE_LEASE_TTL_S",
        "PIPETUNE_PROPOSE_EARLY",
        "PIPETUNE_LEASE_POLL_S",
        "PIPETUNE_LEASE_WAIT_CAP_S",
        "PIPETUNE_SWEEP_INTERVAL_S",
        "PIPETUNE_REQUEST_READ_TIMEOUT_S",
        "PIPETUNE_DB_STATEMENT_DEADLINE_S",
    ],
)
def test_a_duration_that_is_not_a_number_says_so(monkeypatch, tmp_path, variable):
    for value in ("nan", "-inf"):
        monkeypatch.setenv(variable, value)
        result = runner.invoke(app, ["serve", "--db", f"sqlite:///{tmp_path / 'x.db'}"])
        assert result.exit_code == 2, result.output
        assert f"error: {variable}: Input should be a finite number" in result.output


def test_a_statement_deadline_too_short_for_any_database_is_refused_at_start(monkeypatch, tmp_path):
    """0.0001 s was taken: the replica started, gave up on every statement, and answered
    503 for ever while /healthz blamed a stopped database or hung storage."""
    monkeypatch.setenv("PIPETUNE_DB_STATEMENT_DEADLINE_S", "0.0001")
    serve = ["serve", "--port", str(free_port()), "--db", f"sqlite:///{tmp_path / 'x.db'}"]
    result = runner.invoke(app, serve)
    assert result.exit_code == 2, result.output
    _one_error_line(result, "PIPETUNE_DB_STATEMENT_DEADLINE_S: at least 1 s, got 0.0001")
    assert not (tmp_path / "x.db").exists()
    monkeypatch.setenv("PIPETUNE_DB_STATEMENT_DEADLINE_S", "0")  # the same rule, one message
    result = runner.invoke(app, serve)
    assert result.exit_code == 2, result.output
    _one_error_line(result, "PIPETUNE_DB_STATEMENT_DEADLINE_S: at least 1 s, got 0")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # The reasons named the request's fields where the user typed options.
        (
            ["--prior-task", "1", "--prior-gpu", "h200"],
            "--prior-gpu: give --prior-task or --prior-gpu, not both",
        ),
        (
            ["--learned-prior", "--prior-task", "1"],
            "--learned-prior: give --prior-task or --learned-prior, not both",
        ),
        # The value was said twice: "unknown GPU 'x'; known: ... (got 'x')".
        (["--prior-gpu", "x"], "--prior-gpu: unknown GPU 'x'; known: a100, h100, h200"),
    ],
)
def test_a_refused_tuning_option_is_named_as_typed(args, line):
    result = runner.invoke(app, ["tune", "gemm", *FC, *args, "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: {line}" or result.stderr.strip().startswith(
        f"error: {line} ("
    ), result.stderr


def test_an_export_task_out_of_range_names_the_option(tmp_path):
    out = tmp_path / "x.t4.json.gz"
    export = ["export", "--task", "0", "--format", "t4", "--out", str(out)]
    result = runner.invoke(app, [*export, "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 2, result.output
    _one_error_line(result, "--task: must be within 1..2147483647, got 0")
    assert not out.exists()
