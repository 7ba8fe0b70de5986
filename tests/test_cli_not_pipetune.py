"""--server naming something that is not pipetune (another application, a proxy's page, a
wrong port): one line naming --server, exit 2, whatever the page's status; a proxy's 5xx page
stays a server error (the service behind it may come back), said in a few words."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.sdk import ApiError, Client, NotPipetuneError, ProtocolError

PAGE = (
    b"<html><head><style>body { color: red }</style><script>var x = '<p>';</script></head>"
    b"<body><h1>Welcome to nginx!</h1><p>It&amp;works.</p></body></html>"
)
runner = CliRunner()


def _page_server(status: int) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Page(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(params=[200, 404, 502])
def page(request: pytest.FixtureRequest) -> Iterator[tuple[int, str]]:
    server, url = _page_server(request.param)
    yield request.param, url
    server.shutdown()


def test_a_page_where_the_api_belongs_names_server(page, monkeypatch):
    status, url = page
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)
    for args in (["tasks"], ["tune", "gemm", "--m", "64", "--n", "64", "--k", "64"]):
        result = runner.invoke(app, [*args, "--server", url])
        (line,) = result.stderr.strip().splitlines()
        assert "<" not in line and "nginx!" in line and "var x" not in line, line
        if status == 502:  # a proxy in front of a service that is down: a server error
            assert result.exit_code == 1
            assert line.startswith("error: not a pipetune answer: Welcome to nginx! It&works.")
            continue
        # Was the page's whole HTML with exit 2 (404), or "the answer is not a TaskList:
        # Expecting value ..." with exit 1 (200).
        assert result.exit_code == 2, result.output
        assert (line.startswith("error: --server: ") and "not JSON" in line) or "a page" in line
        assert line.endswith("is --server (or PIPETUNE_SERVER) the pipetune service's base URL?")


def test_the_sdk_tells_a_page_from_an_answer_that_does_not_parse():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tasks":
            return httpx.Response(200, html=PAGE.decode())
        if request.url.path == "/v1/workers":
            return httpx.Response(404, html=PAGE.decode())
        return httpx.Response(200, json={"not": "a task list"})

    with Client("http://pages", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(NotPipetuneError, match="http://pages does not answer as a pipetune"):
            client.tasks()
        with pytest.raises(ApiError) as refused:
            client.workers()
        assert refused.value.from_a_page and refused.value.status_code == 404
        assert refused.value.reason == "not a pipetune answer: Welcome to nginx! It&works."
        with pytest.raises(ProtocolError) as other:  # JSON of another shape: not a page
            client.task(1)
        assert not isinstance(other.value, NotPipetuneError)
        # One line saying the first problem, where pydantic's text ran over several lines
        # and ended in a link to its documentation.
        text = str(other.value)
        assert text.startswith("GET /v1/tasks/1: the answer is not a TaskDoc (id: Field required;")
        assert text.endswith(
            "more): is http://pages a pipetune service of a version this client reads?"
        )
        assert "\n" not in text and "errors.pydantic.dev" not in text
