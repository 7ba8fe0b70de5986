"""`pipetune db ...` and the local-worker plumbing of `pipetune serve`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import DEFAULT_GPU, get_gpu
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import parse_workload
from pipetune.service.db import Database
from pipetune.service.local_workers import assign_gpus, stop_workers, worker_command
from pipetune.service.migrate import head_revision, upgrade
from pipetune.service.orm import ReferenceOptimumRow, WorkloadRow
from pipetune.workers.datasets import dataset_from_results, write_t4

runner = CliRunner()


def test_db_upgrade_and_current(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    before = runner.invoke(app, ["db", "current", "--db", url, "--json"])
    assert before.exit_code == 0, before.output
    doc = json.loads(before.output)
    assert doc["current"] is None and doc["head"] == head_revision()
    assert doc["up_to_date"] is False

    upgraded = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"revision {head_revision()}" in upgraded.output
    after = json.loads(runner.invoke(app, ["db", "current", "--db", url, "--json"]).output)
    assert after["current"] == head_revision() and after["up_to_date"] is True
    text = runner.invoke(app, ["db", "current", "--db", url])
    assert "up to date" in text.output


def test_db_current_check_exits_1_unless_the_database_is_up_to_date(tmp_path):
    """`db current` exited 0 whatever it found: a deploy script had to parse its JSON to
    know whether to run `db upgrade`. With --check it exits 1 unless up to date."""
    url = f"sqlite:///{tmp_path / 'check.db'}"
    missing = runner.invoke(app, ["db", "current", "--db", url, "--check"])
    assert missing.exit_code == 1 and "no database file" in missing.output
    upgrade(url, "0001")
    behind = runner.invoke(app, ["db", "current", "--db", url, "--check", "--json"])
    assert behind.exit_code == 1 and json.loads(behind.output)["state"] == "behind"
    assert runner.invoke(app, ["db", "current", "--db", url]).exit_code == 0  # (no --check)
    assert runner.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    current = runner.invoke(app, ["db", "current", "--db", url, "--check"])
    assert current.exit_code == 0 and "up to date" in current.output


def test_db_import_optimum_records_the_sweeps_best(tmp_path):
    url = f"sqlite:///{tmp_path / 'opt.db'}"
    assert runner.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    workload = parse_workload({"op": "gemm", "m": 256, "n": 256, "k": 256})
    gpu = get_gpu("a100")
    space = Space.enumerate(workload, gpu)
    latency = evaluate(space).latency_us
    results = [MeasureResult(status="ok", latency_us=float(x)) for x in latency]
    dataset = dataset_from_results(workload, gpu, list(space), results, runner="simulated")
    path = write_t4(dataset, tmp_path / "sweep.t4.json.gz")

    result = runner.invoke(app, ["db", "import-optimum", str(path), "--db", url])
    assert result.exit_code == 0, result.output
    db = Database(url)
    with db.read() as s:
        (row,) = s.scalars(select(ReferenceOptimumRow)).all()
        digest = s.scalar(select(WorkloadRow.hash).where(WorkloadRow.id == row.workload_id))
    db.dispose()
    assert digest == workload.workload_hash and row.gpu == "a100"
    assert abs(row.best_latency_us - float(latency.min())) < 1e-6 * float(latency.min())
    assert row.configurations == len(space)
    assert row.runner == "simulated"  # (its optimum normalises simulated tasks' curves only)

    missing = runner.invoke(app, ["db", "import-optimum", str(tmp_path / "nope.gz"), "--db", url])
    assert missing.exit_code == 2

    # A measured sweep would replace the simulated optimum: only with --force (a workload
    # keeps one optimum per GPU; the second import replaced the first without a word).
    measured = dataset_from_results(
        workload,
        gpu,
        list(space),
        [MeasureResult(status="ok", latency_us=2 * float(x)) for x in latency],
        runner="cupy",
    )
    measured_path = write_t4(measured, tmp_path / "measured.t4.json.gz")
    command = ["db", "import-optimum", str(measured_path), "--db", url]
    refused = runner.invoke(app, command)
    assert refused.exit_code == 2 and "has a simulated optimum" in refused.output
    assert "pass --force" in refused.output

    def held() -> tuple[str | None, float]:
        db = Database(url)
        with db.read() as s:
            (row,) = s.scalars(select(ReferenceOptimumRow)).all()
        db.dispose()
        return row.runner, row.best_latency_us

    assert held()[0] == "simulated"
    assert runner.invoke(app, [*command, "--force"]).exit_code == 0
    assert held() == ("cupy", 2 * float(latency.min()))


def test_serve_rejects_bad_options():
    assert runner.invoke(app, ["serve", "--runner", "opencl"]).exit_code == 2
    assert runner.invoke(app, ["serve", "--local-workers", "-1"]).exit_code == 2
    replay = runner.invoke(app, ["serve", "--local-workers", "2", "--runner", "replay"])
    assert replay.exit_code == 2
    # A dataset only replay workers read: it was ignored, and the service started without them.
    # What is missing is said: replay was asked for, but no local worker (it blamed --runner).
    for ignored, why in (
        (["--dataset", "x.t4.json.gz"], "--runner is simulated"),
        (["--dataset", "x.t4.json.gz", "--runner", "replay"], "--local-workers is 0"),
    ):
        refused = runner.invoke(app, ["serve", *ignored])
        assert (
            refused.exit_code == 2
            and f"only for the local workers of --runner replay ({why})" in refused.output
        ), refused.output


def test_local_workers_cover_every_gpu_of_the_registry():
    # The default GPU first: one worker serves what `pipetune tune` tunes by default.
    assert assign_gpus(1) == [DEFAULT_GPU] == ["h100"]
    assert assign_gpus(3) == ["h100", "a100", "h200"]
    assert assign_gpus(5) == ["h100", "a100", "h200", "h100", "a100"]
    command = worker_command("http://127.0.0.1:9", "simulated", "h100", "local-0")
    assert command[:4] == [sys.executable, "-m", "pipetune.clients.cli", "worker"]
    pairs = dict(zip(command[4::2], command[5::2], strict=True))
    # No --token: the token travels in the environment, out of sight of `ps`.
    assert pairs == {
        "--server": "http://127.0.0.1:9",
        "--runner": "simulated",
        "--gpu": "h100",
        "--name": "local-0",
        "--parent-pid": str(os.getpid()),  # the worker ends with this process
    }


def test_a_worker_ends_with_the_process_that_started_it(tmp_path):
    """`serve --local-workers` killed with SIGKILL left its workers polling for ever, and
    each restart added more: a worker given --parent-pid stops once that process is gone
    (here while it still waits for a service to register with)."""
    parent_code = (
        "import subprocess, sys, time\n"
        "from pipetune.service.local_workers import worker_command\n"
        "command = worker_command('http://127.0.0.1:9', 'simulated', 'h100', 'orphan-test')\n"
        "command += ['--register-timeout', '600']\n"
        "child = subprocess.Popen(command, start_new_session=True,\n"
        "    env={**__import__('os').environ, 'PIPETUNE_WORKER_TOKEN': 'x' * 32})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    worker_pid = int(parent.stdout.readline())
    try:
        time.sleep(3.0)  # registering (retrying): alive while its parent is
        os.kill(worker_pid, 0)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(worker_pid):
            time.sleep(0.2)
        assert not _alive(worker_pid), "the worker outlived the process that started it"
    finally:
        parent.kill()
        if _alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as ended: its parent is gone, and init
    reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_workers_terminates_then_kills():
    polite = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"],
    )
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\nwhile True: time.sleep(0.1)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout.readline().strip() == b"ready"
    started = time.monotonic()
    stop_workers([polite, stubborn], timeout_s=1.0)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5


def _error_line(result) -> str:  # type: ignore[no-untyped-def]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("revision", "reason"),
    [
        ("", "must name a revision"),
        ("head+1", "'head+1' steps outside this pipetune's revisions"),
        ("head-99", "'head-99' steps outside this pipetune's revisions"),
        ("+99", "'+99' steps outside this pipetune's revisions"),
        ("-1", "'-1' does not go up from the database's revision"),
        ("+0", "'+0' does not go up from the database's revision"),
    ],
    ids=["empty", "head+1", "head-99", "+99", "-1", "+0"],
)
def test_db_upgrade_refuses_a_revision_it_cannot_reach_before_touching_the_database(
    tmp_path, revision, reason
):
    """Alembic took these: an empty one and head+1 ended in a bare AssertionError, -1 in
    "Relative revision -1 didn't produce 1 migrations", both exit 1."""
    path = tmp_path / "r.db"
    result = runner.invoke(
        app, ["db", "upgrade", "--db", f"sqlite:///{path}", "--revision", revision]
    )
    assert result.exit_code == 2, result.output
    assert _error_line(result).startswith(f"error: --revision: {reason}")
    assert not path.exists()


def test_db_upgrade_takes_relative_revisions_from_the_databases_own(tmp_path):
    url = f"sqlite:///{tmp_path / 'rel.db'}"
    head = head_revision()

    def upgrade(revision: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, ["db", "upgrade", "--db", url, "--revision", revision])

    assert "at revision 0001" in upgrade("+1").stdout
    assert "at revision 0003" in upgrade("0002+1").stdout
    assert "at revision 0004" in upgrade("+1").stdout
    # Already past it: nothing to do, and said so (a user who meant to go back took the
    # revision line alone as done).
    past = upgrade("0003")
    assert past.exit_code == 0 and "at revision 0004" in past.stdout
    assert "note: '0003' is below it: an upgrade never goes down" in past.stdout
    assert "never goes down" not in upgrade("0004").stdout
    assert f"at revision {head}" in upgrade("head").stdout
    # At the newest revision +1 goes nowhere: said so, naming where the database is.
    result = upgrade("+1")
    assert result.exit_code == 2, result.output
    assert _error_line(result) == (
        f"error: --revision: '+1' steps outside this pipetune's revisions (0001..{head}) "
        f"from the database's revision {head}"
    )


def test_serve_on_an_address_it_cannot_bind_is_one_line_and_exit_2(tmp_path):
    """uvicorn logged its start, the bind error and its shutdown, then exited 3 (sys.exit
    past the CLI's own error): one `error:` line naming the option instead, and nothing made
    (no database file)."""
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve", "--db", url, "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert _error_line(result) == (
        f"error: --port: cannot bind 127.0.0.1:{port}: the port is already in use"
    )
    result = runner.invoke(app, ["serve", "--db", url, "--host", "999.1.1.1"])
    assert result.exit_code == 2, result.output
    assert _error_line(result).startswith(
        "error: --host: cannot bind 999.1.1.1:8000: the host name does not resolve ("
    )
    # An empty host: asyncio bound it to every interface, open to anyone without API keys.
    for empty in ("", " "):
        result = runner.invoke(app, ["serve", "--db", url, "--host", empty])
        assert result.exit_code == 2, result.output
        assert _error_line(result).startswith("error: --host: must be an address or name;")
    assert not (tmp_path / "srv.db").exists()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_starts_and_stops_cleanly_on_a_signal(tmp_path, stop):
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    command = [sys.executable, "-m", "pipetune.clients.cli", "serve", "--db", url]
    server = subprocess.Popen(
        [*command, "--port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The service's own line comes once uvicorn has bound the port (and says which).
        lines = iter(server.stdout.readline, "")
        started = next(line for line in lines if line.startswith("pipetune service on"))
        assert started.startswith("pipetune service on http://127.0.0.1:"), started
        server.send_signal(stop)
        assert server.wait(timeout=30) == 0
        assert server.stderr.read() == ""
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _serving(tmp_path, env: dict[str, str], *options: str):  # type: ignore[no-untyped-def]
    """`pipetune serve --port 0 OPTIONS` in the background, in an environment of no
    PIPETUNE_ variables but `env`'s; (process, its URL)."""
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    command = [sys.executable, "-m", "pipetune.clients.cli", "serve", "--db", url]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    server = subprocess.Popen(
        [*command, "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, "XDG_DATA_HOME": str(tmp_path), **env},
    )
    lines = iter(server.stdout.readline, "")
    started = next(line for line in lines if line.startswith("pipetune service on"))
    return server, started.split()[3]


def test_an_open_service_on_loopback_answers_only_requests_for_its_loopback_names(tmp_path):
    """Without API keys a page the user opened could reach the routes through DNS rebinding
    (its own name resolving to 127.0.0.1) and read what they answer: any Host was served."""
    server, base = _serving(tmp_path, {}, "--log-level", "warning")
    port = base.rsplit(":", 1)[1]
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/v1/tasks").status_code == 200
            for name in (f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
                assert client.get("/v1/tasks", headers={"Host": name}).status_code == 200
            refused = client.get("/v1/tasks", headers={"Host": f"rebound.example:{port}"})
            assert refused.status_code == 400
            detail = refused.json()["detail"]
            assert "'rebound.example:" in detail and "PIPETUNE_ALLOWED_HOSTS" in detail
    finally:
        server.terminate()
        server.wait(timeout=30)
    # With API keys the key guards the routes; PIPETUNE_ALLOWED_HOSTS names others.
    for env, status in (
        ({"PIPETUNE_API_KEYS": "k"}, 401),
        ({"PIPETUNE_ALLOWED_HOSTS": "tuner.lan"}, 400),
        ({"PIPETUNE_ALLOWED_HOSTS": "*"}, 200),
    ):
        server, base = _serving(tmp_path, env, "--log-level", "warning")
        try:
            with httpx.Client(base_url=base, timeout=30) as client:
                other = client.get("/v1/tasks", headers={"Host": "rebound.example"})
                assert other.status_code == status, (env, other.text)
                if "PIPETUNE_ALLOWED_HOSTS" in env:
                    named = client.get("/v1/tasks", headers={"Host": "tuner.lan:80"})
                    assert named.status_code == 200
        finally:
            server.terminate()
            server.wait(timeout=30)


@pytest.mark.parametrize("host", ["127.0.0.2", "127.1"])
def test_an_open_service_on_another_loopback_address_answers_requests_for_it(tmp_path, host):
    """`serve --host 127.0.0.2` (a loopback address, so no API keys are needed) refused every
    request addressed to that address, its local workers' registration too, as a foreign
    Host (400), and warned that anyone who reaches 127.0.0.2 could create tasks. `--host
    127.1` (127.0.0.1, as the bind resolves it) was taken for an address others reach by its
    text: its open routes answered any Host, so a page the user opened could reach them
    through DNS rebinding, and it warned of the wrong danger."""
    server, base = _serving(tmp_path, {}, "--host", host, "--log-level", "warning")
    try:
        assert base.startswith(f"http://{host}:"), base
        with httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/v1/tasks").status_code == 200
            assert client.get("/v1/tasks", headers={"Host": "rebound.example"}).status_code == 400
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "no API keys" not in server.stderr.read()


def test_serve_names_a_misspelt_variable_and_the_built_in_database_beyond_loopback(tmp_path):
    """A replica with PIPETUNE_DATABASE_URI (for _URL) ran on its own SQLite file beside the
    fleet's PostgreSQL, its tasks unseen by the others, and said nothing of either."""
    env = {"PIPETUNE_DATABASE_URI": "postgresql+psycopg://db/fleet"}
    url = f"sqlite:///{tmp_path / 'default' / 'pipetune' / 'pipetune.db'}"
    command = [sys.executable, "-m", "pipetune.clients.cli", "serve", "--host", "0.0.0.0"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    server = subprocess.Popen(
        [*command, "--port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, "XDG_DATA_HOME": str(tmp_path / "default"), **env},
    )
    try:
        lines = iter(server.stdout.readline, "")
        assert any(line.startswith("pipetune service on") for line in lines)
    finally:
        server.terminate()
        server.wait(timeout=30)
    said = server.stderr.read()
    assert (
        "warning: PIPETUNE_DATABASE_URI is set, but pipetune reads no such variable "
        "(did you mean PIPETUNE_DATABASE_URL?)"
    ) in said
    assert "warning: the built-in SQLite database" in said
    assert (tmp_path / "default" / "pipetune" / "pipetune.db").exists(), url
    # On loopback, or with a database named, neither warning is given.
    quiet, _ = _serving(tmp_path, {}, "--log-level", "warning")
    quiet.terminate()
    quiet.wait(timeout=30)
    assert "warning" not in quiet.stderr.read()


def test_serve_on_an_ipv6_loopback_address_gives_its_url_and_local_workers_join(tmp_path):
    """`serve --host ::1` printed http://::1:PORT, which is no URL, and handed it to its
    local workers, which each exited at once: "--server: not an http(s) URL"."""
    server, base = _serving(tmp_path, {}, "--host", "::1", "--local-workers", "1")
    try:
        assert base.startswith("http://[::1]:"), base
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 60
            while not client.get("/v1/workers").json()["workers"]:
                assert time.monotonic() < deadline, "the local worker never registered"
                assert server.poll() is None
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "not an http(s) URL" not in server.stderr.read()


def test_local_workers_of_a_service_answering_only_named_hosts_are_answered(tmp_path):
    """With PIPETUNE_ALLOWED_HOSTS naming a proxy's host, `serve --local-workers` refused its
    own workers (they reach it at 127.0.0.1: a foreign Host, 400), which exited at once."""
    env = {"PIPETUNE_ALLOWED_HOSTS": "tuner.lan"}
    server, base = _serving(tmp_path, env, "--local-workers", "1")
    try:
        proxied = {"Host": "tuner.lan"}
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 60
            while not client.get("/v1/workers", headers=proxied).json()["workers"]:
                assert time.monotonic() < deadline, "the local worker never registered"
                assert server.poll() is None
                time.sleep(0.2)
            assert client.get("/v1/tasks", headers={"Host": "rebound.example"}).status_code == 400
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "is not one this service answers" not in server.stderr.read()


@pytest.mark.parametrize(
    ("variable", "value", "runner"),
    [
        ("PIPETUNE_SIMULATED_TIME_SCALE", "fast", "simulated"),
        ("PIPETUNE_SIMULATED_FAULTS", "crash=often", "simulated"),
        ("PIPETUNE_SIMULATED_FAULTS", "crash=0.1", "replay"),
    ],
)
def test_serve_refuses_local_workers_an_environment_they_would_refuse(
    tmp_path, variable, value, runner
):
    """The local workers inherit serve's environment: with a variable they refuse, each
    exited at once and serve went on serving with no worker, where it is to check what its
    workers need before it starts."""
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    command = [sys.executable, "-m", "pipetune.clients.cli", "serve", "--db", url]
    command += ["--port", "0", "--local-workers", "1", "--runner", runner]
    if runner == "replay":
        workload = parse_workload({"op": "gemm", "m": 256, "n": 256, "k": 256})
        gpu = get_gpu("a100")
        space = list(Space.enumerate(workload, gpu))[:4]
        results = [MeasureResult(status="ok", latency_us=10.0 + i) for i in range(len(space))]
        dataset = dataset_from_results(workload, gpu, space, results, runner="simulated")
        command += ["--dataset", str(write_t4(dataset, tmp_path / "replay.t4.json.gz"))]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=30,
            env={**environ, "XDG_DATA_HOME": str(tmp_path), variable: value},
        )
    except subprocess.TimeoutExpired:
        pytest.fail("serve started with local workers that refuse their environment")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {variable}"), done.stderr
    assert not (tmp_path / "srv.db").exists()


def test_a_sqlite_folder_that_cannot_be_made_is_one_line_naming_the_database(tmp_path):
    """A path under a file: db upgrade and serve printed the crash handler's line
    (NotADirectoryError ... set PIPETUNE_DEBUG=1 for the traceback), naming no database.
    It is a bad --db (exit 2), refused before any folder is made, naming the file in the
    way."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    url = f"sqlite:///{blocker / 'sub' / 'p.db'}"
    env = {"XDG_DATA_HOME": str(tmp_path), "PIPETUNE_WORKER_TOKENS": ""}
    for command in (["db", "upgrade", "--db", url], ["serve", "--db", url, "--port", "0"]):
        result = CliRunner().invoke(app, command, env=env)
        assert result.exit_code == 2, result.output
        line = _error_line(result)
        assert (
            line
            == f"error: --db: {blocker} is not a folder (the database file would be made under it)"
        ), line
        assert "PIPETUNE_DEBUG" not in line


def _low_soft_limit(soft: int):  # type: ignore[no-untyped-def]
    """A preexec_fn that starts a child at `soft` open files, its hard limit untouched."""
    import resource

    def lower() -> None:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    return lower


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="Linux prlimit")
def test_serve_raises_its_soft_limit_on_open_files_to_the_hard_limit(tmp_path):
    """A replica holds a descriptor per worker connection: at a soft limit of 256 (many
    hosts give 1024), 400 long-polling workers left 222 unable to register (connections
    closed as accepted, 500s), under a hard limit of thousands."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"a hard limit of {hard} leaves nothing to raise")
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "pipetune.clients.cli", "serve", "--db", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, "XDG_DATA_HOME": str(tmp_path), "PIPETUNE_WORKER_TOKENS": "t"},
        preexec_fn=_low_soft_limit(256),
    )
    try:
        lines = []
        for line in iter(server.stdout.readline, ""):
            lines.append(line)
            if line.startswith("pipetune service on"):
                break
        soft, now_hard = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
        assert now_hard == hard
        assert soft == (hard if hard != resource.RLIM_INFINITY else 10240)
        said = [line for line in lines if line.startswith("open files:")]
        assert said == [
            f"open files: soft limit raised from 256 to {soft} (the hard limit; "
            "a worker's connection takes one)\n"
        ], lines
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_open_file_limit_is_never_lowered(monkeypatch):
    import resource

    from pipetune.clients.cli import service_cmds

    set_to = []
    monkeypatch.setattr(resource, "setrlimit", lambda kind, limits: set_to.append(limits))
    for limits in ((4096, 4096), (8192, 4096), (resource.RLIM_INFINITY, resource.RLIM_INFINITY)):
        monkeypatch.setattr(resource, "getrlimit", lambda kind, limits=limits: limits)
        assert service_cmds.raise_open_file_limit() is None
    assert set_to == []
    # An unlimited hard limit (macOS): up to the cap its setrlimit takes, not "unlimited".
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (256, resource.RLIM_INFINITY))
    assert service_cmds.raise_open_file_limit() == (256, service_cmds.UNLIMITED_FILES_CAP)
    assert set_to == [(service_cmds.UNLIMITED_FILES_CAP, resource.RLIM_INFINITY)]


def test_the_services_own_log_lines_follow_log_level_and_say_their_level():
    """pipetune.* loggers were left unconfigured under `serve`: their lines fell through to
    Python's last-resort handler, bare (no level) and at WARNING and above whatever
    --log-level said, and no INFO line of theirs (a task ended, leases expired) was shown."""
    import subprocess
    import sys

    script = (
        "import logging.config\n"
        "from pipetune.clients.cli.service_cmds import _log_config\n"
        "import sys\n"
        "logging.config.dictConfig(_log_config(sys.argv[1]))\n"
        "log = logging.getLogger('pipetune.service.driver')\n"
        "log.info('task 1 done')\n"
        "logging.getLogger('pipetune.service.errors').warning('database unavailable: x')\n"
    )
    shown = {}
    for level in ("info", "critical"):
        run = subprocess.run(
            [sys.executable, "-c", script, level], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        shown[level] = run.stderr.splitlines()
    assert [line.split() for line in shown["info"]] == [
        ["INFO:", "task", "1", "done"],
        ["WARNING:", "database", "unavailable:", "x"],
    ]
    assert shown["critical"] == []
