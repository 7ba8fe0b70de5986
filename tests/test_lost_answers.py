"""Answers lost on their way back (a proxy's timeout, a connection cut mid-body) and a proxy's
"later" pages. A task POSTed whose answer was lost said only "cannot reach the pipetune
service", though the service had made the task: a script that ran `pipetune tune` again
made a second one. A JSON body cut short was "not a pipetune service" (exit 2, blaming
--server), and a proxy's 429 page likewise; both are moments, not the user's setting."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.sdk import TRANSIENT, Client, ServiceUnavailableError

GEMM = {"op": "gemm", "m": 64, "n": 64, "k": 64, "dtype": "float16"}
TUNE = ["tune", "gemm", "--m", "64", "--n", "64", "--k", "64"]
CUT_TASK = b'{"id": 19, "state": "queued", "workload": {"op": "ge'
runner = CliRunner()


def _server(behaviour: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Faulty(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # (a body to the connection's close: cut where it ends)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if behaviour == "lost":  # read whole, then no answer at all
                self.close_connection = True
                return
            if behaviour == "cut":
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(CUT_TASK)
                return
            page = b"<html><body><h1>429 Too Many Requests</h1></body></html>"
            self.send_response(429)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        do_GET = do_DELETE = do_POST

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Faulty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def faulty(request: pytest.FixtureRequest) -> Iterator[str]:
    server, url = _server(request.param)
    yield url
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("faulty", ["lost", "cut"], indirect=True)
def test_a_post_whose_answer_was_lost_says_it_may_have_acted(faulty):
    with Client(faulty, timeout_s=5) as c:
        with pytest.raises(ServiceUnavailableError) as raised:
            c.tune(GEMM, "h100", budget=4)
        assert raised.value.maybe_acted == "POST /v1/tasks"
        assert "POST /v1/tasks may have reached it: look before sending it again" in str(
            raised.value
        )
        assert isinstance(raised.value, TRANSIENT)  # (a wait goes on through it)
        with pytest.raises(ServiceUnavailableError) as read:
            c.tasks()
        assert read.value.maybe_acted is None  # a read acts on nothing
        with pytest.raises(ServiceUnavailableError) as cancel:
            c.cancel(7)
        assert cancel.value.maybe_acted is None  # (cancelling twice cancels once)


def test_a_post_that_could_not_connect_acted_on_nothing():
    server, url = _server("lost")
    server.shutdown()
    server.server_close()  # (the port refuses now)
    with Client(url, timeout_s=5) as c, pytest.raises(ServiceUnavailableError) as raised:
        c.tune(GEMM, "h100", budget=4)
    assert raised.value.maybe_acted is None
    assert "may have reached it" not in str(raised.value)


@pytest.mark.parametrize("faulty", ["lost", "cut"], indirect=True)
def test_tune_whose_answer_was_lost_says_the_task_may_exist(faulty, monkeypatch):
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)
    result = runner.invoke(app, [*TUNE, "--server", faulty])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach the pipetune service"), line
    assert "it may have created the task; `pipetune tasks --server" in line, line
    assert "--limit 5` lists the newest" in line and "base URL" not in line, line


@pytest.mark.parametrize("faulty", ["later"], indirect=True)
def test_a_proxys_429_page_is_a_retry_later_not_a_wrong_server(faulty, monkeypatch):
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)
    for args in (["tasks"], TUNE):
        result = runner.invoke(app, [*args, "--server", faulty])
        assert result.exit_code == 1, result.output
        assert "429" in result.stderr and "--server" not in result.stderr, result.stderr


TASK = (
    b'{"id":42,"state":"queued","workload":{"dtype":"float16","op":"gemm","m":64,"n":64,"k":64,'
    b'"b_layout":"kn"},"label":"gemm 64x64x64","gpu":"h100","strategy":"auto","budget":50,'
    b'"seed":0,"batch_size":8,"priority":1,"trials_done":0,"trials_failed":0,"trials_target":50,'
    b'"created_at":"2026-12-07T01:18:12Z","updated_at":"2026-12-07T01:18:12Z"}'
)


def test_tune_wait_that_fails_names_the_task_that_goes_on(monkeypatch):
    """The task made, its wait ended by an answer this client cannot read: the line named
    no task, though it goes on at the service."""

    class Made(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._json(201, TASK)

        def do_GET(self) -> None:
            self._json(200, b"{}")  # (not a TaskDoc: a ProtocolError, which ends a wait)

        def _json(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Made)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("PIPETUNE_SERVER", raising=False)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = runner.invoke(app, [*TUNE, "--wait", "--json", "--server", url])
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 1, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert "task 42 goes on at the service" in line and "/v1/tasks/42" in line, line


def test_a_wait_gives_up_at_its_own_timeout_on_a_service_that_does_not_answer():
    """Client.wait(timeout_s=2) on a client of timeout_s=20, the service's answer never
    coming: its one look took the client's 20 s (a proxy trickling an answer held it for
    minutes); it gives up at its own deadline, saying why (the look timed out)."""
    import time

    answer = threading.Event()

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer.wait(30)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=20) as c:
            started = time.monotonic()
            with pytest.raises(ServiceUnavailableError) as raised:
                c.wait(42, timeout_s=2, poll_s=0.1)
            took = time.monotonic() - started
    finally:
        answer.set()
        server.shutdown()
        server.server_close()
    assert took < 10, took
    assert "timed out" in str(raised.value)
