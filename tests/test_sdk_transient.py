"""The SDK against a service that fails for a moment: Client.wait looks again through a 503
("the database is unavailable; retry shortly", as the service answers an outage), a 429 or a
refused connection, and gives up only past its deadline or after WAIT_THROUGH_S of failures
in a row. (It raised at the first such answer, ending `pipetune tune --wait` mid-task.) And
answers that are not the service's (a proxy's page or JSON, a broken encoding) are the SDK's
own errors."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from pipetune.clients.sdk import (
    Client,
    InvalidRequestError,
    NotFoundError,
    ProtocolError,
    ServerError,
    WaitTimeoutError,
)
from pipetune.clients.sdk import client as client_module

TASK = {
    "id": 1,
    "state": "running",
    "workload": {"op": "gemm", "m": 64, "n": 64, "k": 64},
    "label": "gemm 64x64x64",
    "gpu": "h100",
    "strategy": "random",
    "budget": 4,
    "seed": 0,
    "batch_size": 4,
    "trials_done": 1,
    "trials_failed": 0,
    "trials_target": 4,
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
}
OUTAGE = httpx.Response(
    503, json={"detail": "the database is unavailable; retry shortly"}, headers={"Retry-After": "1"}
)


def _client(answers) -> Client:
    looks = itertools.count()

    def answer(request: httpx.Request) -> httpx.Response:
        reply = answers(next(looks))
        if isinstance(reply, Exception):
            raise reply
        return reply

    return Client("http://service", transport=httpx.MockTransport(answer))


def test_wait_looks_again_through_an_outage_and_a_restart():
    def answers(look: int):
        if look == 1:
            return OUTAGE
        if look == 2:
            return httpx.Response(429, json={"detail": "slow down"})
        if look == 3:
            return httpx.ConnectError("connection refused")
        return httpx.Response(200, json={**TASK, "state": "done" if look >= 5 else "running"})

    seen = []
    doc = _client(answers).wait(1, seen.append, poll_s=0.001)
    assert doc.state == "done" and [d.state for d in seen] == ["running", "done"]


def test_wait_gives_up_on_failures_past_its_deadline_or_its_patience(monkeypatch):
    with pytest.raises(ServerError, match="retry shortly"):  # the last error, not a time-out
        _client(lambda look: OUTAGE).wait(1, poll_s=0.001, timeout_s=0.05)
    monkeypatch.setattr(client_module, "WAIT_THROUGH_S", 0.05)
    with pytest.raises(ServerError):
        _client(lambda look: OUTAGE).wait(1, poll_s=0.001)  # no deadline: its patience
    running = httpx.Response(200, json=TASK)
    with pytest.raises(WaitTimeoutError):  # a task that runs on is still a time-out
        _client(lambda look: running).wait(1, poll_s=0.001, timeout_s=0.02)
    refused = httpx.Response(404, json={"detail": "task 1 does not exist"})
    with pytest.raises(NotFoundError, match="does not exist"):  # a 4xx is an answer: at once
        _client(lambda look: refused).wait(1, poll_s=0.001)


def test_wait_gives_up_at_its_deadline_when_poll_s_is_longer():
    """A poll_s longer than timeout_s: the last look is at the deadline, not a whole poll_s
    past it (it slept poll_s and raised then, saying "after {timeout_s} s")."""
    running = httpx.Response(200, json=TASK)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=r"still running after 0\.1 s") as late:
        _client(lambda look: running).wait(1, poll_s=3.0, timeout_s=0.1)
    assert (late.value.task_id, late.value.timeout_s, late.value.state) == (1, 0.1, "running")
    assert time.monotonic() - started < 1.5
    started = time.monotonic()  # the same through failed looks
    with pytest.raises(ServerError):
        _client(lambda look: OUTAGE).wait(1, poll_s=3.0, timeout_s=0.1)
    assert time.monotonic() - started < 1.5


def test_wait_leaves_the_service_alone_as_long_as_its_answer_asks(monkeypatch):
    """A 503 or 429 with Retry-After: the next look comes after that long (capped at
    MAX_RETRY_AFTER_S, and never past the deadline), not after poll_s: Client.wait looked
    every poll_s through a rate limit or an outage that asked for quiet."""
    from pipetune.clients.sdk.errors import MAX_RETRY_AFTER_S

    pauses: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", pauses.append)
    limited = httpx.Response(429, json={"detail": "slow down"}, headers={"Retry-After": "7"})
    hour = httpx.Response(503, json={"detail": "later"}, headers={"Retry-After": "3600"})
    replies = [OUTAGE, limited, hour, httpx.Response(429, json={"detail": "no header"})]

    def answers(look: int):
        if look < len(replies):
            return replies[look]
        return httpx.Response(200, json={**TASK, "state": "done"})

    assert _client(answers).wait(1, poll_s=2.0).state == "done"
    assert pauses == [2.0, 7.0, MAX_RETRY_AFTER_S, 2.0]  # Retry-After 1 < poll_s: poll_s
    pauses.clear()
    with pytest.raises(WaitTimeoutError):  # the deadline still bounds every pause
        _client(lambda look: limited if look == 0 else httpx.Response(200, json=TASK)).wait(
            1, poll_s=0.001, timeout_s=0.5
        )
    assert pauses and all(p <= 0.5 for p in pauses) and pauses[0] > 0.1


def test_healthz_of_something_that_is_not_the_service_is_a_protocol_error():
    page = httpx.Response(200, text="<html>a proxy's page</html>")
    with pytest.raises(ProtocolError, match="not a JSON object"):
        _client(lambda look: page).healthz()
    assert _client(lambda look: httpx.Response(200, json={"status": "ok"})).healthz() == {
        "status": "ok"
    }


def test_error_bodies_of_other_shapes_and_broken_encodings_are_clear_errors():
    """A proxy's JSON in other shapes than the service's, and a body whose Content-Encoding
    is not its own: the SDK's own errors (they were a TypeError and an httpx.DecodingError,
    past `except PipetuneError`)."""
    odd = [
        {"reason": "busy", "detail": 5},
        {"detail": [{"loc": 5, "msg": "bad"}]},
        {"field": 7, "reason": "bad"},
        {"detail": [{"field": ["x"], "loc": ["body", "gpu"], "msg": "unknown"}]},
    ]
    for body in odd:
        answer = httpx.Response(422, json=body)
        with pytest.raises(InvalidRequestError) as refused:
            _client(lambda look, answer=answer: answer).task(1)
        assert refused.value.field is None or isinstance(refused.value.field, str)
    assert "gpu: unknown" in str(refused.value)

    def broken(look: int) -> httpx.Response:  # (decoded when the client reads it)
        gzip = {"Content-Encoding": "gzip"}
        return httpx.Response(200, headers=gzip, stream=httpx.ByteStream(b"not gzip"))

    with pytest.raises(ProtocolError, match="cannot be decoded"):
        _client(broken).task(1)


def test_tune_model_waits_through_an_outage_and_a_restart_as_wait_does(monkeypatch):
    """`pipetune tune-model`'s wait over many tasks (tune_model.wait_all) ended at the first
    look that failed for the moment (a restart's refused connection, a failover's 503), its
    tasks going on at the service, where `tune --wait` rode it out. It now retries as
    Client.wait does, and gives up after WAIT_THROUGH_S of failures in a row."""
    from pipetune.clients import tune_model

    def answers(look: int):
        if look in (1, 2):
            return OUTAGE
        if look == 3:
            return httpx.ConnectError("connection refused")
        return httpx.Response(200, json={**TASK, "state": "done" if look >= 5 else "running"})

    client = _client(answers)
    first = client.task(1)  # look 0
    finals = tune_model.wait_all(client, [first], poll_s=0.001)
    assert [t.state for t in finals] == ["done"]
    monkeypatch.setattr(client_module, "WAIT_THROUGH_S", 0.05)
    with pytest.raises(ServerError, match="retry shortly"):  # its patience, then the error
        tune_model.wait_all(_client(lambda look: OUTAGE), [first], poll_s=0.001)
