"""A Client used after close() (or after its `with` block): the SDK's own error, naming what
happened, and nothing sent. (It was httpx's bare RuntimeError, past `except PipetuneError`.)"""

from __future__ import annotations

import httpx
import pytest

from pipetune.clients.sdk import Client, ClientClosedError, PipetuneError

TASKS = {"tasks": []}


def _client(sent: list[httpx.Request]) -> Client:
    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=TASKS)

    return Client("http://service", transport=httpx.MockTransport(answer))


def test_a_call_after_the_with_block_is_a_clear_pipetune_error():
    sent: list[httpx.Request] = []
    with _client(sent) as client:
        assert client.tasks() == []
    with pytest.raises(PipetuneError, match=r"GET /v1/tasks: .*is closed") as closed:
        client.tasks()
    assert isinstance(closed.value, ClientClosedError)
    assert isinstance(closed.value, RuntimeError)  # as httpx's error was
    assert len(sent) == 1


def test_a_call_after_close_is_refused_and_closing_twice_is_fine():
    sent: list[httpx.Request] = []
    client = _client(sent)
    client.close()
    client.close()
    for call in (client.healthz, lambda: client.task(1), lambda: client.wait(1, timeout_s=5)):
        with pytest.raises(ClientClosedError, match="is closed"):
            call()
    assert sent == []
