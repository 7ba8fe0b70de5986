"""A proxy named in the environment (HTTP_PROXY and the like, set for a whole cluster or a
company's network): the SDK, the CLI and the workers reach a service on this machine's
loopback directly (through the proxy every request was refused, and `serve --local-workers`
tuned nothing), use the proxy for any other address, and say so when it refuses."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from live_support import start_service, start_worker, stop
from service_support import GEMM, live_server

from pipetune.clients.sdk import Client, PipetuneError, ServiceUnavailableError
from pipetune.clients.sdk.http import environment_proxy, is_loopback_name
from pipetune.service import local_workers
from pipetune.service.migrate import upgrade

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def _dead_port() -> int:
    """A port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def no_ambient_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """Every proxy variable, lower and upper case, naming a proxy that refuses."""
    proxy = f"http://127.0.0.1:{_dead_port()}"
    for name in PROXY_VARIABLES[:3]:
        monkeypatch.setenv(name, proxy)
        monkeypatch.setenv(name.lower(), proxy)
    return proxy


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.9.9.9", True),
     ("::1", True), ("[::1]", True), ("10.0.0.1", False), ("tuner.lan", False), ("", False)],
)  # fmt: skip
def test_which_names_are_this_machine_by_their_text(host, loopback):
    assert is_loopback_name(host) is loopback


def test_the_sdk_reaches_a_service_on_loopback_past_the_environment_s_proxy(
    tmp_path: Path, dead_proxy: str
):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    with live_server(url) as base:
        port = base.rsplit(":", 1)[1]
        for address in (base, f"http://localhost:{port}"):
            assert environment_proxy(address) == dead_proxy  # (what httpx would have used)
            with Client(address) as client:
                assert client.healthz()["status"] == "ok"
                task = client.tune(GEMM, "h100", budget=4)
                assert client.task(task.id).id == task.id


def test_serve_s_local_workers_and_a_worker_tune_past_the_environment_s_proxy(tmp_path: Path):
    """The service, its local worker, a `pipetune worker` and the client all with a refusing
    proxy in their environment: the task is tuned to the end."""
    proxy = f"http://127.0.0.1:{_dead_port()}"
    env = {"HTTP_PROXY": proxy, "http_proxy": proxy, "ALL_PROXY": proxy}
    service = start_service(tmp_path, env=env, extra_args=["--local-workers", "1"])
    log = tmp_path / "worker.log"
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            with Client(service.url) as client:
                task = client.tune(GEMM, "h100", budget=6)
                proc = start_worker(service.url, log, "--runner", "simulated", "--gpu", "h100",
                                    "--name", "behind-proxy", env=env)  # fmt: skip
                try:
                    done = client.wait(task.id, poll_s=0.2, timeout_s=60)
                    names = {w.name for w in client.workers()}
                finally:
                    code = stop(proc, log)
    finally:
        service.stop()
    assert code == 0
    assert done.state == "done" and done.trials_done == 6
    assert "behind-proxy" in names and len(names) == 2  # the local worker is the other


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy that answers /healthz itself, recording each request line."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.requestline)
        body = json.dumps({"status": "ok", "via": "proxy"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def forward_proxy() -> Iterator[str]:
    _Proxy.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_another_host_is_still_reached_through_the_environment_s_proxy(
    forward_proxy: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("HTTP_PROXY", forward_proxy)
    with Client("http://pipetune.example:8000") as client:
        assert client.healthz() == {"status": "ok", "via": "proxy"}
    assert _Proxy.seen == ["GET http://pipetune.example:8000/healthz HTTP/1.1"]


def test_a_refusing_proxy_is_named_in_the_error(dead_proxy: str, monkeypatch):
    """It read as the service's own refusal ("cannot reach the pipetune service ...
    Connection refused") with the service up, and nothing said a proxy was in the way."""
    with (
        Client("http://pipetune.example:8000") as client,
        pytest.raises(ServiceUnavailableError) as refused,
    ):
        client.healthz()
    said = str(refused.value)
    assert "cannot reach the pipetune service at http://pipetune.example:8000" in said
    assert f"through the proxy the environment names, {dead_proxy}" in said
    # A proxy's password is not repeated.
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, dead_proxy.replace("://", "://user:s3cret@"))
    with (
        Client("http://pipetune.example:8000") as client,
        pytest.raises(ServiceUnavailableError) as refused,
    ):
        client.healthz()
    assert "s3cret" not in str(refused.value)
    assert dead_proxy.replace("://", "://user:***@") in str(refused.value)
    # NO_PROXY names the host: reached directly (this name resolves nowhere), no proxy said.
    monkeypatch.setenv("NO_PROXY", "pipetune.example")
    with (
        Client("http://pipetune.example:8000") as client,
        pytest.raises(ServiceUnavailableError) as direct,
    ):
        client.healthz()
    assert "proxy" not in str(direct.value)


@pytest.mark.parametrize(
    ("no_proxy", "url", "through_proxy"),
    [("", "http://tuner.example:8000", True),
     ("*", "http://tuner.example:8000", False),
     ("tuner.example", "http://tuner.example:8000", False),
     ("tuner.example", "http://gpu.tuner.example:8000", False),
     (".tuner.example", "http://gpu.tuner.example:8000", False),
     ("tuner.example", "http://othertuner.example:8000", True),
     ("other.example, tuner.example", "http://tuner.example:8000", False),
     ("http://tuner.example", "http://tuner.example:8000", False),
     ("https://tuner.example", "http://tuner.example:8000", True),
     ("10.9.8.7", "http://10.9.8.7:8000", False),
     ("10.9.8.7", "http://10.9.8.70:8000", True)],
)  # fmt: skip
def test_the_proxy_said_is_the_one_httpx_takes(
    forward_proxy: str, monkeypatch: pytest.MonkeyPatch, no_proxy: str, url: str,
    through_proxy: bool,
):  # fmt: skip
    """environment_proxy reads NO_PROXY as httpx does: where it names the proxy, the request
    reached the proxy; where it names none, it went elsewhere (straight to the host)."""
    monkeypatch.setenv("HTTP_PROXY", forward_proxy)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    assert (environment_proxy(url) == forward_proxy) is through_proxy
    with Client(url, timeout_s=2) as client:
        try:
            reached = client.healthz() == {"status": "ok", "via": "proxy"}
        except PipetuneError:  # (not there, or something else answered)
            reached = False
    assert reached is through_proxy
    assert bool(_Proxy.seen) is through_proxy


@pytest.mark.parametrize(
    ("listed", "server", "expected"),
    [("", "http://192.0.2.2:8000", "192.0.2.2"),
     ("corp.example, .lan", "http://192.0.2.2:8000", "corp.example, .lan,192.0.2.2"),
     ("corp.example", "http://[fd00::2]:8000", "corp.example,fd00::2")],
)  # fmt: skip
def test_serve_s_local_workers_reach_its_own_address_directly(
    monkeypatch: pytest.MonkeyPatch, forward_proxy: str, listed: str, server: str,
    expected: str,
):  # fmt: skip
    """`serve --host` on one of the machine's own addresses: its local workers were told to
    reach it through the environment's proxy, which cannot. They are started with that
    address in NO_PROXY (and what was listed kept), which the SDK then honours."""
    started: list[dict[str, str]] = []
    monkeypatch.setattr(local_workers.subprocess, "Popen", lambda *a, env, **k: started.append(env))
    monkeypatch.setenv("HTTP_PROXY", forward_proxy)
    if listed:
        monkeypatch.setenv("no_proxy", listed)
    local_workers.start_workers(1, server, "t" * 20, "simulated")
    (env,) = started
    assert env["NO_PROXY"] == env["no_proxy"] == expected
    monkeypatch.setenv("NO_PROXY", env["NO_PROXY"])
    monkeypatch.setenv("no_proxy", env["no_proxy"])
    assert environment_proxy(server) is None
    assert environment_proxy("http://elsewhere.example:8000") == forward_proxy
