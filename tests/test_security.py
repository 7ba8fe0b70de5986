"""Access control and hygiene beyond the route tests in test_service_api.py (worker
tokens, API keys, body size limit) and test_service_queue.py (own leases only):

- no SQL is built by string formatting anywhere in the product's code;
- CORS is off unless origins are named, and then only for those origins;
- secrets (worker tokens, API keys, wrong guesses at them) appear in no log, no response,
  no command line and not in the database, which keeps only their sha256 digests;
- a database outage is a 503 the workers retry; a database bug is still a 500.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from live_support import start_service, start_worker, stop
from service_support import GEMM, client_for, metric_value, register, settings
from sqlalchemy import exc as sa_exc

from pipetune.clients.sdk import Client
from pipetune.service.settings import Settings

pytest_plugins = ["service_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("model", "tuner", "workers", "service", "clients", "migrations")
SQL_CALLS = {"text", "execute", "exec_driver_sql", "executescript", "executemany"}


def _formatted(node: ast.expr) -> bool:
    """Whether an expression builds a string at run time (f-string, %, +, .format)."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(part, ast.FormattedValue) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("format", "format_map", "join")
    if isinstance(node, ast.IfExp):
        return _formatted(node.body) or _formatted(node.orelse)
    return False


def sql_built_by_formatting(source: str, filename: str = "<source>") -> list[str]:
    """`file:line` of every SQL call whose statement is formatted rather than bound."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            name = func.attr
            # `.text(...)` is SQL only as sqlalchemy's (a canvas may draw text too).
            if name == "text" and getattr(func.value, "id", None) not in ("sa", "sqlalchemy"):
                continue
        else:
            name = getattr(func, "id", None)
        if name in SQL_CALLS and _formatted(node.args[0]):
            found.append(node.lineno)
    return [f"{filename}:{line}" for line in sorted(set(found))]


def test_the_sql_check_catches_formatted_statements():
    planted = """
conn.execute(text(f"SELECT * FROM jobs WHERE id = {job_id}"))
conn.execute(text("SELECT * FROM jobs WHERE id = %s" % job_id))
cursor.execute("DELETE FROM t WHERE name = '" + name + "'")
conn.exec_driver_sql("SELECT {}".format(value))
conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job_id})
cursor.execute("PRAGMA foreign_keys=ON")
conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")
canvas.text(x + 1, y, label)
conn.execute(sa.text(f"DROP TABLE {name}"))
"""
    assert sql_built_by_formatting(planted) == [f"<source>:{n}" for n in (2, 3, 4, 5, 10)]


def test_no_sql_is_built_by_string_formatting():
    files = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50  # the scan saw the code
    found = [
        hit
        for path in files
        for hit in sql_built_by_formatting(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def _preflight(client, origin: str):
    return client.options(
        "/v1/tasks",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )


def test_cors_is_off_by_default(db_url):
    with client_for(db_url) as c:
        preflight = _preflight(c, "https://elsewhere.example")
        simple = c.get("/v1/tasks", headers={"Origin": "https://elsewhere.example"})
    for response in (preflight, simple):
        assert not any(h.lower().startswith("access-control-") for h in response.headers)


def test_cors_allows_only_the_named_origins(db_url):
    with client_for(db_url, cors_origins=["https://dashboard.example"]) as c:
        allowed = _preflight(c, "https://dashboard.example")
        refused = _preflight(c, "https://elsewhere.example")
        simple = c.get("/v1/tasks", headers={"Origin": "https://elsewhere.example"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://dashboard.example"
    assert "access-control-allow-origin" not in refused.headers
    assert "access-control-allow-origin" not in simple.headers
    # Refused in JSON, as every other error of the API (it was text/plain).
    assert refused.status_code == 400
    assert refused.headers["content-type"] == "application/json"
    assert refused.json() == {"detail": "Disallowed CORS origin"}


def test_cors_origins_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("PIPETUNE_CORS_ORIGINS", "https://a.example, https://b.example")
    assert Settings().cors_origins == ["https://a.example", "https://b.example"]


@pytest.mark.parametrize(
    "origin", ["https://dashboard.example/", "dashboard.example", "https://Dashboard.example"]
)
def test_an_origin_no_browser_sends_is_refused_naming_the_variable(monkeypatch, origin):
    """CORS matches a request's Origin header exactly (scheme://host[:port], lowercase, no
    path): an origin written with a trailing slash, no scheme or capitals was taken and
    matched no browser's request, so the page it was meant for was refused without a word."""
    from pipetune.service.settings import SettingsError, load_settings

    monkeypatch.setenv("PIPETUNE_CORS_ORIGINS", f"https://a.example, {origin}")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value).startswith(f"PIPETUNE_CORS_ORIGINS: {origin!r} is not an origin")


@pytest.mark.parametrize("host", ["http://tuner.lan", "tuner.lan/", "*.lan"])
def test_an_allowed_host_no_request_can_name_is_refused_naming_the_variable(monkeypatch, host):
    """PIPETUNE_ALLOWED_HOSTS=http://tuner.lan was read as the name "http": every request,
    /healthz too, was refused 400 ("PIPETUNE_ALLOWED_HOSTS: http"), and a wildcard name
    matched nothing."""
    from pipetune.service.settings import SettingsError, load_settings

    monkeypatch.setenv("PIPETUNE_ALLOWED_HOSTS", f"localhost, {host}")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value).startswith(f"PIPETUNE_ALLOWED_HOSTS: {host!r} is not a host name")
    monkeypatch.setenv("PIPETUNE_ALLOWED_HOSTS", "tuner.lan:8000, [::1], 10.0.0.7, fe80::1, *")
    assert len(load_settings().allowed_hosts) == 5


@pytest.mark.parametrize("variable", ["PIPETUNE_WORKER_TOKENS", "PIPETUNE_API_KEYS"])
def test_a_secret_no_client_can_send_is_refused_without_quoting_it(monkeypatch, variable):
    """A token or key with a space or a non-ASCII character was taken, and the service then
    served with credentials that its workers and CLI refuse to send (exit 2 at each)."""
    from pipetune.service.settings import SettingsError, load_settings

    for secret in ("two words", "s\u00e9same"):
        monkeypatch.setenv(variable, f"fine-one, {secret}")
        with pytest.raises(SettingsError) as refused:
            load_settings()
        message = str(refused.value)
        assert message.startswith(f"{variable}: ") and "2 (of 2)" in message
        assert secret not in message and "fine-one" not in message


@pytest.mark.parametrize(
    "variable",
    [
        "PIPETUNE_WORKER_TOKENS",
        "PIPETUNE_API_KEYS",
        "PIPETUNE_ALLOWED_HOSTS",
        "PIPETUNE_CORS_ORIGINS",
    ],
)
def test_a_list_of_only_commas_is_refused_and_an_empty_one_is_none(monkeypatch, variable):
    """PIPETUNE_API_KEYS=" , " (a template that lost its values) was read as no key: the
    user routes served open, as PIPETUNE_ALLOWED_HOSTS=" , " answered any Host."""
    from pipetune.service.settings import SettingsError, load_settings

    for value in (" , ", ",", " ,, "):
        monkeypatch.setenv(variable, value)
        with pytest.raises(SettingsError) as refused:
            load_settings()
        assert str(refused.value).startswith(f"{variable}: {value!r} names nothing"), refused
    field = variable.removeprefix("PIPETUNE_").lower()
    for value in ("", "   "):  # compose's way of saying none
        monkeypatch.setenv(variable, value)
        assert getattr(load_settings(), field) == []


def test_short_secrets_are_warned_of_without_quoting_them():
    from pipetune.service.settings import MIN_SECRET_CHARS, short_secret_warnings

    strong = "s" * MIN_SECRET_CHARS
    warned = short_secret_warnings(
        settings("sqlite:///x.db", api_keys=[strong, "k1"], worker_tokens=["tok-short", strong])
    )
    assert len(warned) == 2, warned
    assert warned[0].startswith("warning: PIPETUNE_API_KEYS: key 2 (of 2) has 2 characters")
    assert warned[1].startswith("warning: PIPETUNE_WORKER_TOKENS: token 1 (of 2) has 9 ")
    assert not any("k1" in line.split("has")[1] or "tok-short" in line for line in warned)
    assert short_secret_warnings(settings("sqlite:///x.db", api_keys=[strong])) == []


def test_settings_never_show_their_secrets():
    shown = repr(settings("sqlite:///x.db", worker_tokens=["tok-secret"], api_keys=["key-secret"]))
    assert "tok-secret" not in shown and "key-secret" not in shown
    assert "database_url" in shown  # the rest is still there to read


def test_secrets_stay_out_of_logs_responses_command_lines_and_the_database(tmp_path: Path):
    worker_token = "wt-" + os.urandom(12).hex()
    api_key = "ak-" + os.urandom(12).hex()
    guesses = ["wrong-" + os.urandom(8).hex() for _ in range(2)]
    env = {"PIPETUNE_WORKER_TOKENS": worker_token, "PIPETUNE_API_KEYS": api_key}
    svc = start_service(tmp_path, env=env, extra_args=["--log-level", "debug"])
    log = tmp_path / "worker.log"
    bodies: list[str] = []
    try:
        user = {"X-API-Key": api_key}
        with httpx.Client(base_url=svc.url, timeout=30) as http:
            assert http.get("/v1/tasks", headers={"X-API-Key": guesses[0]}).status_code == 401
            bad = {"Authorization": f"Bearer {guesses[1]}"}
            body = {"name": "x", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
            assert http.post("/v1/workers", json=body, headers=bad).status_code == 401
            task = http.post(
                "/v1/tasks",
                json={"workload": GEMM, "gpu": "h100", "budget": 4, "strategy": "grid"},
                headers=user,
            ).json()
            # The worker takes its token from the environment, as deployments pass it.
            proc = start_worker(
                svc.url,
                log,
                *("--runner", "simulated", "--gpu", "h100"),
                token=None,
                env={"PIPETUNE_WORKER_TOKEN": worker_token},
            )
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            with Client(svc.url, api_key=api_key) as c:
                done = c.wait(task["id"], poll_s=0.2, timeout_s=60)
            assert stop(proc, log) == 0
            for path in ("/v1/workers", f"/v1/tasks/{task['id']}/trials", "/metrics"):
                bodies.append(http.get(path, headers=user).text)
            bodies.append(json.dumps(http.get("/openapi.json").json()))
    finally:
        svc.stop()
    assert done.state == "done" and done.trials_done == 4
    logs = (tmp_path / "serve.log").read_text() + log.read_text()
    assert "POST /v1/jobs/lease" in logs or "trial" in logs  # the logs saw the traffic
    database = (tmp_path / "pipetune.db").read_bytes()
    for path in tmp_path.glob("pipetune.db-*"):  # the write-ahead log too
        database += path.read_bytes()
    digest = hashlib.sha256(worker_token.encode()).hexdigest()
    assert digest.encode() in database  # the database keeps the digest ...
    for secret in (worker_token, api_key, *guesses):
        assert secret not in logs
        assert secret.encode() not in database  # ... and never the token itself
        assert secret.encode() not in cmdline
        assert all(secret not in body for body in bodies)
    assert all(digest not in body for body in bodies)  # nor does any response show it


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (sa_exc.OperationalError("SELECT 1", {}, Exception("connection refused")), 503),
        (sa_exc.InterfaceError("SELECT 1", {}, Exception("connection closed")), 503),
        (sa_exc.TimeoutError("QueuePool limit reached"), 503),
        (sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key")), 500),
    ],
)
def test_a_database_outage_is_a_503_and_a_database_bug_a_500(db_url, error, status):
    from fastapi.testclient import TestClient

    from pipetune.service.app import create_app

    app = create_app(settings(db_url))
    service = app.state.service

    def failing(*_args, **_kwargs):
        raise error

    service.queue.lease = failing  # the route's first database call
    with TestClient(app, raise_server_exceptions=False) as c:
        worker = register(c)
        response = c.post(
            "/v1/jobs/lease",
            json={"worker_id": worker, "max_jobs": 1, "wait_s": 0},
            headers={"Authorization": "Bearer test-worker-token"},
        )
        assert c.get("/healthz").status_code == 200  # the app itself is fine
    assert response.status_code == status, response.text
    if status == 503:
        assert response.headers["retry-after"] == "1"
        assert response.json() == {"detail": "the database is unavailable; retry shortly"}
        assert "SELECT" not in response.text and "connection refused" not in response.text


def test_a_worker_on_the_serving_machine_finds_the_generated_token(tmp_path: Path):
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.service.worker_token import generated_worker_token

    env = {"XDG_DATA_HOME": str(tmp_path), "PIPETUNE_WORKER_TOKEN": ""}
    command = ["worker", "--server", "http://127.0.0.1:9", "--runner", "simulated"]
    command += ["--gpu", "h100", "--register-timeout", "0"]
    cli = CliRunner()
    missing = cli.invoke(app, command, env=env)
    assert missing.exit_code == 2 and "--token: give the worker token" in missing.output
    token, path = generated_worker_token(tmp_path / "pipetune" / "worker-token")
    assert generated_worker_token(path) == (token, path)  # reused, not replaced
    found = cli.invoke(app, command, env=env)
    # Past the token check: it now fails only because nothing listens on port 9.
    assert found.exit_code == 1 and "--token" not in found.output, found.output
    assert token not in found.output


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.2", True),
        ("[::1]", True),
        ("::1", True),
        ("127.1", False),  # (a shorthand: only `serve` resolves it, see below)
        ("10.0.0.1", False),
        ("tuner.lan", False),
        ("", False),
    ],
)
def test_one_rule_says_which_hosts_are_this_machine(host: str, loopback: bool):
    """`serve --host` (no API key needed) and `worker --server` (the generated token) ask it."""
    from pipetune.clients.cli.hosts import is_loopback_host

    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.1", True), ("127.0.1", True), ("10.1", False), ("localhost", True), ("", False)],
)
def test_serve_takes_a_host_that_resolves_to_loopback_only_for_this_machine(
    host: str, loopback: bool
):
    """`serve --host 127.1` binds 127.0.0.1 (inet_aton's shorthand, as the bind resolves it)
    and was taken for an address others reach. A worker does not resolve: it would send the
    generated token to a name that answers 127.0.0.1 when asked and another address when it
    connects."""
    from pipetune.clients.cli.hosts import is_loopback_host

    assert is_loopback_host(host, resolve=True) is loopback


def test_a_worker_of_another_machines_service_is_not_given_the_generated_token(
    tmp_path: Path,
):
    """The token `serve` generated is this machine's service's: a worker pointed at another
    --server without a token sent it there (Authorization: Bearer), handing that server a
    token that lets it act as a worker of the local service."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.service.worker_token import generated_worker_token

    generated_worker_token(tmp_path / "pipetune" / "worker-token")
    env = {"XDG_DATA_HOME": str(tmp_path), "PIPETUNE_WORKER_TOKEN": ""}
    for server in ("http://tuner.example:8000", "http://192.0.2.7:8000"):
        command = ["worker", "--server", server, "--runner", "simulated"]
        command += ["--gpu", "h100", "--register-timeout", "0"]
        result = CliRunner().invoke(app, command, env=env)
        assert result.exit_code == 2, (server, result.output)
        assert "--token: give the worker token" in result.output


def test_serve_says_whether_its_worker_token_is_new_or_kept(tmp_path: Path):
    # A restart reuses the token file; the line said "generated" at every start.
    from pipetune.service.worker_token import announcement, generated_worker_token

    path = tmp_path / "pipetune" / "worker-token"
    token, _ = generated_worker_token(path)
    first, again = announcement(path, reused=False), announcement(path, reused=True)
    assert first.startswith(f"worker token: generated, in {path}")
    assert again.startswith(f"worker token: kept from an earlier start, in {path}")
    assert token not in first + again


def test_a_kept_token_file_others_can_read_is_made_private_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A worker-token file of mode 0644 was reused as it was, and announced "readable only
    by you"."""
    from pipetune.service import worker_token
    from pipetune.service.worker_token import generated_worker_token

    path = tmp_path / "pipetune" / "worker-token"
    token, _ = generated_worker_token(path)
    path.chmod(0o644)
    assert generated_worker_token(path) == (token, path)
    assert path.stat().st_mode & 0o777 == 0o600
    # Another user's file, open to others: refused (serve: one line, exit 2), not reused.
    path.chmod(0o640)
    monkeypatch.setattr(worker_token.os, "getuid", lambda: path.stat().st_uid + 1)
    with pytest.raises(OSError, match="readable by others and belongs to another user"):
        generated_worker_token(path)


def test_the_token_command_serve_prints_works_on_a_path_with_spaces(tmp_path: Path):
    """`PIPETUNE_WORKER_TOKEN=$(cat <path>)` was printed unquoted: pasted into a shell, a
    data directory with a space in its path gave cat two files."""
    from pipetune.service.worker_token import announcement, generated_worker_token

    path = tmp_path / "data home" / "pipetune" / "worker-token"
    token, _ = generated_worker_token(path)
    line = announcement(path, reused=False)
    start = line.index("PIPETUNE_WORKER_TOKEN=$(")
    command = line[start : line.index(")", start) + 1]
    shown = subprocess.run(
        ["bash", "-c", f"{command}; printf %s \"$PIPETUNE_WORKER_TOKEN\""],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout == token


def test_serve_without_a_writable_data_directory_for_its_token_is_one_line_and_exit_2(
    tmp_path: Path,
):
    """An OSError (a read-only data directory) came through as exit 1."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app

    (tmp_path / "pipetune").write_text("a file where the data directory would be")
    env = {"XDG_DATA_HOME": str(tmp_path), "PIPETUNE_WORKER_TOKENS": ""}
    command = ["serve", "--db", f"sqlite:///{tmp_path / 'serve.db'}", "--port", "0"]
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 2, result.output
    assert "cannot keep a generated worker token in" in result.output
    assert "PIPETUNE_WORKER_TOKENS" in result.output and "Traceback" not in result.output
    # The database it would have served is not left behind (it was, schema and all).
    assert not list(tmp_path.glob("serve.db*")), list(tmp_path.iterdir())
    # An existing one is left as it was.
    (tmp_path / "kept.db").touch()
    command = ["serve", "--db", f"sqlite:///{tmp_path / 'kept.db'}", "--port", "0"]
    assert CliRunner().invoke(app, command, env=env).exit_code == 2
    assert (tmp_path / "kept.db").exists()


def test_serve_says_a_workers_token_variable_is_not_its_own(tmp_path: Path):
    """PIPETUNE_WORKER_TOKEN exported for the fleet (as compose's section has users do) was
    ignored by `serve` without a word: it served its generated token, and the workers'
    401 told them to set the variable they had set."""
    env = {
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "PIPETUNE_WORKER_TOKENS": "",
        "PIPETUNE_WORKER_TOKEN": "fleet-token-0123456789",
    }
    svc = start_service(tmp_path, env=env)
    try:
        log = svc.log_path.read_text()
    finally:
        svc.stop()
    assert "warning: PIPETUNE_WORKER_TOKEN is set (what a worker sends) but not" in log, log
    assert "fleet-token-0123456789" not in log
    (tmp_path / "quiet").mkdir()
    quiet = start_service(tmp_path / "quiet", env={"XDG_DATA_HOME": str(tmp_path / "q")})
    try:
        assert "warning: PIPETUNE_WORKER_TOKEN" not in quiet.log_path.read_text()
    finally:
        quiet.stop()


def test_a_kept_token_no_worker_can_send_is_refused_not_served_with(tmp_path: Path):
    """A worker-token file holding "abc def" was kept and announced, and `serve
    --local-workers` served on with no worker: each refused to send it."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app

    (tmp_path / "pipetune").mkdir()
    (tmp_path / "pipetune" / "worker-token").write_text("abc def\n")
    env = {"XDG_DATA_HOME": str(tmp_path), "PIPETUNE_WORKER_TOKENS": ""}
    command = ["serve", "--db", f"sqlite:///{tmp_path / 'serve.db'}", "--port", "0"]
    result = CliRunner().invoke(app, [*command, "--local-workers", "1"], env=env)
    assert result.exit_code == 2, result.output
    assert "the token it holds has a space" in result.output and "remove the file" in result.output
    assert "abc def" not in result.output


def test_a_password_in_the_database_url_query_is_not_shown(pg_url: str):
    """libpq takes the password in the query too (?password=...): SQLAlchemy's hide_password
    hides the user info's only, and `db current`, `db upgrade`, `serve`'s banner and the
    source written into exported files showed the query's."""
    from sqlalchemy.engine import make_url
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.service.migrate import redact

    secret = "pw-" + os.urandom(8).hex()
    url = make_url(pg_url).update_query_dict({"password": secret, "sslmode": "prefer"})
    given = url.render_as_string(hide_password=False)
    shown = redact(given)
    assert secret not in shown
    assert "password=***" in shown and "sslmode=prefer" in shown  # the rest still shown
    assert secret not in redact(f"{given}&sslpassword={secret}x")
    for command in (["db", "current"], ["db", "current", "--json"], ["db", "upgrade"]):
        result = CliRunner().invoke(app, [*command, "--db", given])
        assert result.exit_code == 0, result.output
        assert secret not in result.output and "password=***" in result.output


@pytest.mark.parametrize(
    "url",
    # (Short: pydantic cuts the middle out of a long input, the password with it, by chance.)
    [
        "postgresql+psycopg://u:{secret}@h:x/d",  # does not parse
        "postgresql+psycopg2://u:{secret}@h/d",  # a driver not installed
        "mysql://u:{secret}@h/d",  # a backend pipetune does not run on
    ],
)
def test_a_refused_database_url_is_not_quoted_by_the_settings_error(
    url: str, monkeypatch: pytest.MonkeyPatch
):
    """load_settings words its own message; Settings() built directly (create_app, the
    library's LocalStore) raised pydantic's ValidationError, which quotes the input. The
    library now words it as load_settings does (validated_settings), naming the variable."""
    from pipetune.clients.library.store import LocalStore
    from pipetune.service.settings import SettingsError

    secret = "pw-" + os.urandom(4).hex()
    monkeypatch.setenv("PIPETUNE_DATABASE_URL", url.format(secret=secret))
    with pytest.raises(SettingsError) as caught:
        LocalStore()
    assert str(caught.value).startswith("PIPETUNE_DATABASE_URL: ")  # says which setting
    assert secret not in str(caught.value)  # (what a traceback or a log line shows)


def test_a_password_in_the_server_url_is_sent_but_never_shown(tmp_path: Path):
    """httpx sends a --server URL's user info as basic auth (a service behind a proxy that
    asks for it): the worker's log ("waiting_for_service server=..."), the SDK's and the
    CLI's "cannot reach the pipetune service at ...", `tasks`' title and the source that
    `export` writes into index.json all showed the password."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.clients.sdk import ServiceUnavailableError, WorkerApi
    from pipetune.clients.sdk.http import shown_url

    secret = "pw-" + os.urandom(8).hex()
    server = f"http://user:{secret}@127.0.0.1:9"
    assert shown_url(server) == "http://user:***@127.0.0.1:9"
    assert shown_url(f"{server}/v1?next=a@b") == "http://user:***@127.0.0.1:9/v1?next=a@b"
    assert shown_url("http://user@127.0.0.1:9") == "http://user@127.0.0.1:9"

    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"tasks": []})

    with Client(server, transport=httpx.MockTransport(answer)) as c:
        c.tasks()
        assert secret not in c.base_url
    basic = httpx.BasicAuth("user", secret)._auth_header  # the password still goes out
    assert sent[0].headers["authorization"] == basic

    with pytest.raises(ServiceUnavailableError) as caught, Client(server) as c:
        c.tasks()
    assert secret not in str(caught.value) and "user:***@127.0.0.1:9" in str(caught.value)
    assert secret not in WorkerApi(server, "a-token").base_url

    cli = CliRunner()
    worker = ["worker", "--server", server, "--token", "a-token", "--runner", "simulated"]
    outputs = [cli.invoke(app, [*worker, "--gpu", "h100", "--register-timeout", "1"])]
    outputs.append(cli.invoke(app, ["tasks", "--server", server]))
    outputs.append(cli.invoke(app, ["tasks", "--server", f"ftp://user:{secret}@host"]))
    for result in outputs:
        assert result.exit_code in (1, 2) and "user:***@" in result.output, result.output
        assert secret not in result.output


def test_the_health_check_answers_whatever_host_it_is_addressed_to(db_url):
    """With PIPETUNE_ALLOWED_HOSTS set, /healthz asked at 127.0.0.1 (compose's check, the
    image's HEALTHCHECK, a load balancer's probe) was refused 400: the service read as down
    and compose never started its workers. The API stays behind the guard."""
    with client_for(db_url, allowed_hosts=["tuner.lan"]) as client:
        health = client.get("/healthz", headers={"Host": "127.0.0.1:8000"})
        assert health.status_code == 200, health.text
        refused = client.get("/v1/tasks", headers={"Host": "127.0.0.1:8000"})
        assert refused.status_code == 400
        assert "is not one this service answers" in refused.json()["detail"]
        assert client.get("/v1/tasks", headers={"Host": "tuner.lan:8000"}).status_code == 200
        # The refusal counted, under its route (it was in no series).
        refused_docs = client.get("/docs", headers={"Host": "127.0.0.1:8000"})
        assert refused_docs.status_code == 400
        count = "pipetune_http_request_duration_seconds_count"
        text = client.get("/metrics", headers={"Host": "tuner.lan"}).text
        assert metric_value(text, count, method="GET", route="/v1/tasks", status="400") == 1.0
        assert metric_value(text, count, method="GET", route="/docs", status="400") == 1.0


def test_a_url_with_no_password_is_shown_as_given():
    """A database path with a percent sign or a byte that is not UTF-8 was shown URL-quoted
    (a%25b.db, x%5Cxe9.db): a file that does not exist, in the message about the one that
    does."""
    from pipetune.service.migrate import redact

    assert redact("sqlite:////tmp/a%b.db") == "sqlite:////tmp/a%b.db"
    assert redact("sqlite:////tmp/my db.db") == "sqlite:////tmp/my db.db"
    assert redact(os.fsdecode(b"sqlite:////tmp/x\xe9.db")) == "sqlite:////tmp/x\\xe9.db"
    assert (
        redact("postgresql://u@h:5432/db?sslmode=prefer")
        == "postgresql://u@h:5432/db?sslmode=prefer"
    )
    assert redact("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
