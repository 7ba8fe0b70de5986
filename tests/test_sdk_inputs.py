"""The SDK refuses arguments it cannot send faithfully (a task id that is not an integer, a
credential that cannot be an HTTP header value, a workload that is not one, a timeout that is
not a positive number of seconds) with a ValueError that names the argument, before any
request; the credential never appears in a message."""

from __future__ import annotations

import json
import socket
import types
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

import pipetune
from pipetune.clients.sdk import (
    InvalidArgumentError,
    PipetuneError,
    ProtocolError,
    ServiceUnavailableError,
)
from pipetune.clients.sdk.http import Http

URL = "http://pipetune.test"
SECRET = "s3cr3t-token"


class Recorder:
    """A transport that records each request and answers with `answer`."""

    def __init__(self, answer: Any) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json=self.answer)


def _client(answer: Any = None, **kwargs: Any) -> tuple[pipetune.Client, Recorder]:
    recorder = Recorder(answer)
    return pipetune.Client(URL, transport=httpx.MockTransport(recorder), **kwargs), recorder


# ---- task ids ----------------------------------------------------------------------------

TASK_CALLS: dict[str, Callable[[pipetune.Client, Any], Any]] = {
    "task": lambda c, i: c.task(i),
    "cancel": lambda c, i: c.cancel(i),
    "trials": lambda c, i: c.trials(i),
    "all_trials": lambda c, i: c.all_trials(i),
    "curve": lambda c, i: c.curve(i),
    "wait": lambda c, i: c.wait(i, timeout_s=0),
}
BAD_IDS = [5.99, 5.0, True, False, "x", "5", None, np.float64(5.0), [5]]


@pytest.mark.parametrize("call", sorted(TASK_CALLS))
@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_a_task_id_that_is_not_an_integer_is_refused_before_any_request(call, bad):
    client, recorder = _client()
    with pytest.raises(ValueError, match="task_id") as info:
        TASK_CALLS[call](client, bad)
    assert isinstance(info.value, PipetuneError)
    assert type(bad).__name__ in str(info.value)
    assert recorder.requests == []


@pytest.mark.parametrize("good", [5, np.int64(5), np.uint32(5)], ids=repr)
def test_an_integer_task_id_numpy_ones_included_is_sent_as_is(good):
    client, recorder = _client({"points": []})
    with pytest.raises(PipetuneError):  # the stub's answer is no TaskDoc; the path is the point
        client.task(good)
    client.curve(good)
    assert [r.url.path for r in recorder.requests] == ["/v1/tasks/5", "/v1/tasks/5/curve"]


# ---- credentials -------------------------------------------------------------------------

BAD_SECRETS = {
    "trailing newline": SECRET + "\n",
    "carriage return": SECRET + "\r\n",
    "inner space": "s3cr3t token",
    "tab": "s3cr3t\ttoken",
    "NUL": "s3cr3t\x00token",
    "DEL": "s3cr3t\x7ftoken",
    "non-ASCII": "s3cr3t-tökén",
}


@pytest.mark.parametrize("argument", ["token", "api_key"])
@pytest.mark.parametrize("secret", BAD_SECRETS.values(), ids=BAD_SECRETS.keys())
def test_a_credential_that_cannot_be_a_header_value_is_refused_without_showing_it(argument, secret):
    with pytest.raises(ValueError, match=rf"^{argument}\b") as info:
        pipetune.Client(URL, **{argument: secret})
    assert isinstance(info.value, PipetuneError)
    assert "s3cr3t" not in str(info.value) and "tökén" not in str(info.value)


def test_a_workers_token_is_checked_as_the_clients_are():
    from pipetune.clients.sdk import WorkerApi

    with pytest.raises(ValueError, match=r"^token: .*ends with a newline") as info:
        WorkerApi(URL, SECRET + "\n")
    assert SECRET not in str(info.value)


def test_a_trailing_newline_is_called_out_as_such():
    with pytest.raises(ValueError, match="newline") as info:
        pipetune.Client(URL, token=SECRET + "\n")
    assert "strip" in str(info.value)


@pytest.mark.parametrize("argument", ["token", "api_key"])
def test_a_credential_that_is_not_a_string_is_refused(argument):
    with pytest.raises(ValueError, match=rf"^{argument}\b.*bytes"):
        pipetune.Client(URL, **{argument: SECRET.encode()})


def test_valid_credentials_are_sent_unchanged():
    token, key = "abc.DEF-123_~+/=", "k3y!#$%&'*^`|"
    client, recorder = _client({"tasks": []}, token=token, api_key=key)
    assert client.tasks() == []
    (request,) = recorder.requests
    assert request.headers["Authorization"] == f"Bearer {token}"
    assert request.headers["X-API-Key"] == key


@pytest.fixture
def listening_url() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog does) and never answers:
    enough for httpx to connect and then build the request."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_an_illegal_header_httpx_refuses_is_not_called_unreachable_nor_shown(listening_url):
    # Client refuses such a credential up front; Http (shared with WorkerApi) must still not
    # report httpx's local refusal as an unreachable service, with the header in the text.
    http = Http(listening_url, {"Authorization": f"Bearer {SECRET}\n"}, timeout_s=5)
    try:
        with pytest.raises(ValueError) as info:
            http.request("GET", "/v1/tasks")
    finally:
        http.close()
    assert isinstance(info.value, PipetuneError)
    assert not isinstance(info.value, ServiceUnavailableError)
    assert SECRET not in str(info.value)
    assert "header" in str(info.value) and "GET /v1/tasks" in str(info.value)


# ---- workloads ---------------------------------------------------------------------------

WORKLOAD_CALLS: dict[str, Callable[[pipetune.Client, Any], Any]] = {
    "best_schedule": lambda c, w: c.best_schedule(w, "h100"),
    "tune": lambda c, w: c.tune(w, "h100", budget=4),
}


@pytest.mark.parametrize("call", sorted(WORKLOAD_CALLS))
@pytest.mark.parametrize("bad", ["gemm", None, [1], 3, [("op", "gemm")]], ids=repr)
def test_a_workload_that_is_not_a_dict_or_a_model_is_refused_before_any_request(call, bad):
    client, recorder = _client()
    with pytest.raises(ValueError, match="workload") as info:
        WORKLOAD_CALLS[call](client, bad)
    assert isinstance(info.value, PipetuneError)
    message = str(info.value)
    assert '{"op": "gemm"' in message and type(bad).__name__ in message
    assert recorder.requests == []


@pytest.mark.parametrize(
    "workload",
    [
        {"op": "gemm", "m": 64, "n": 64, "k": 64},
        types.MappingProxyType({"op": "gemm", "m": 64, "n": 64, "k": 64}),
        pipetune.Gemm(m=64, n=64, k=64),
    ],
    ids=["dict", "mapping", "model"],
)
def test_a_dict_mapping_or_workload_model_is_sent(workload):
    client, recorder = _client()
    with pytest.raises(PipetuneError):  # the stub's answer is no ScheduleResponse
        client.best_schedule(workload, "h100")
    (request,) = recorder.requests
    sent = httpx.Response(200, content=request.content).json()["workload"]
    assert {k: sent[k] for k in ("op", "m", "n", "k")} == {"op": "gemm", "m": 64, "n": 64, "k": 64}


# ---- timeouts ----------------------------------------------------------------------------

# A bad timeout used to pass construction and fail at the first request: socket's bare
# "Timeout value out of range" (-1), a TypeError ("10"), "Invalid value NaN", or (0) every
# request timing out, reported as an unreachable service.
BAD_SECONDS = {
    "negative": (-1, "more than 0"),
    "zero": (0, "more than 0"),
    "string": ("10", "number of seconds, not str"),
    "NaN": (float("nan"), "finite"),
    "infinity": (float("inf"), "finite"),
    "bool": (True, "number of seconds, not bool"),
    "None": (None, "number of seconds, not NoneType"),
    "huge int": (10**5000, "finite"),
}
GOOD_SECONDS = [5, 2.5, np.float32(0.5), np.int64(3)]


def _worker_api(**kwargs: Any) -> Any:
    from pipetune.clients.sdk import WorkerApi

    return WorkerApi(URL, SECRET, transport=httpx.MockTransport(Recorder(None)), **kwargs)


CONSTRUCTORS: dict[str, Callable[..., Any]] = {
    "Client": lambda **kw: _client(**kw)[0],
    "WorkerApi": _worker_api,
}


@pytest.mark.parametrize("make", sorted(CONSTRUCTORS))
@pytest.mark.parametrize(("bad", "words"), BAD_SECONDS.values(), ids=BAD_SECONDS.keys())
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_at_construction(
    make, bad, words
):
    with pytest.raises(InvalidArgumentError) as info:
        CONSTRUCTORS[make](timeout_s=bad)
    assert info.value.argument == "timeout_s"
    assert words in info.value.reason


@pytest.mark.parametrize("good", GOOD_SECONDS, ids=repr)
def test_a_positive_timeout_numpy_ones_included_is_the_requests(good):
    client, recorder = _client({"tasks": []}, timeout_s=good)
    assert client.tasks() == []
    (request,) = recorder.requests
    assert request.extensions["timeout"]["read"] == float(good)
    _worker_api(timeout_s=good).close()


# wait's poll_s as a timeout (0 would poll the service flat out); its timeout_s may be None
# (no limit) or 0 (look once), so a negative one is "0 or more".
WAIT_CASES = {
    **{f"poll_s {key}": ("poll_s", *case) for key, case in BAD_SECONDS.items() if key != "None"},
    "timeout_s negative": ("timeout_s", -1, "0 or more"),
    **{
        f"timeout_s {key}": ("timeout_s", *case)
        for key, case in BAD_SECONDS.items()
        if key not in ("negative", "zero", "None")
    },
}


@pytest.mark.parametrize(("argument", "bad", "words"), WAIT_CASES.values(), ids=WAIT_CASES.keys())
def test_wait_refuses_a_bad_poll_or_timeout_before_any_request(argument, bad, words):
    client, recorder = _client()
    with pytest.raises(InvalidArgumentError) as info:
        client.wait(1, **{argument: bad})
    assert info.value.argument == argument
    assert words in info.value.reason
    assert recorder.requests == []


@pytest.mark.parametrize("timeout_s", [None, 0, *GOOD_SECONDS], ids=repr)
def test_wait_takes_no_timeout_a_zero_one_or_a_positive_one(timeout_s):
    client, recorder = _client()
    with pytest.raises(ProtocolError):  # the stub's answer is no TaskDoc: it was asked
        client.wait(1, poll_s=np.float64(0.1), timeout_s=timeout_s)
    assert len(recorder.requests) == 1


# ---- a task's options and the query parameters -----------------------------------------

# Each was sent as given and refused by the service (a 422), so against a service that was
# down the caller was told "cannot reach" instead of what was wrong with the argument.
BAD_TUNE_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    "budget 0": ({"budget": 0}, "budget"),
    "budget over the most": ({"budget": 5001}, "budget"),
    "budget bool": ({"budget": True}, "budget"),
    "budget float": ({"budget": 16.0}, "budget"),
    "budget past printing": ({"budget": 10**5000}, "budget"),
    "seed negative": ({"seed": -1}, "seed"),
    "strategy unknown": ({"strategy": "nope"}, "strategy"),
    "batch_size 0": ({"batch_size": 0}, "batch_size"),
    "batch_size 65": ({"batch_size": 65}, "batch_size"),
    "priority 11": ({"priority": 11}, "priority"),
    "priority 0": ({"priority": 0}, "priority"),
    "runner unknown": ({"runner": "gpu"}, "runner"),
    "prior_task 0": ({"prior_task": 0}, "prior_task"),
    "prior_gpu unknown": ({"prior_gpu": "h999"}, "prior_gpu"),
    "two priors": ({"prior_task": 3, "prior_gpu": "h100"}, "prior_gpu"),
    "learned and a task": ({"prior_task": 3, "learned_prior": True}, "learned_prior"),
    "learned_prior not a bool": ({"learned_prior": "yes"}, "learned_prior"),
}
GEMM = {"op": "gemm", "m": 64, "n": 64, "k": 64}


@pytest.fixture
def refused_url() -> str:
    """A loopback port nothing listens on: every request is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("kwargs", "argument"), BAD_TUNE_ARGUMENTS.values(), ids=BAD_TUNE_ARGUMENTS.keys()
)
def test_tune_refuses_a_bad_option_before_any_request(kwargs, argument, refused_url):
    client, recorder = _client()
    with pytest.raises(InvalidArgumentError) as info:
        client.tune(GEMM, "h100", **kwargs)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: ")
    assert recorder.requests == []
    # ... and so against a service that is down: the argument, not "cannot reach".
    with pipetune.Client(refused_url) as down, pytest.raises(InvalidArgumentError) as info:
        down.tune(GEMM, "h100", **kwargs)
    assert info.value.argument == argument


def test_tune_sends_its_options_as_before():
    client, recorder = _client()
    with pytest.raises(ProtocolError):  # the stub's answer is no TaskDoc
        client.tune(GEMM, "h100", budget=16, seed=3, batch_size=4)
    with pytest.raises(ProtocolError):
        client.tune(GEMM, "h100", prior_gpu="h200", runner="cupy", priority=3, learned_prior=False)
    first, second = (httpx.Response(200, content=r.content).json() for r in recorder.requests)
    assert first == {
        "workload": GEMM,
        "gpu": "h100",
        "budget": 16,
        "strategy": "auto",
        "seed": 3,
        "batch_size": 4,
    }  # (the default priority is left out: a service before it refuses the field)
    assert {k: second[k] for k in ("prior_gpu", "runner", "priority", "learned_prior")} == {
        "prior_gpu": "h200",
        "runner": "cupy",
        "priority": 3,
        "learned_prior": False,
    }


PAGE_CALLS: dict[str, tuple[Callable[[pipetune.Client], Any], str]] = {
    "tasks limit 0": (lambda c: c.tasks(limit=0), "limit"),
    "tasks limit past the page": (lambda c: c.tasks(limit=1001), "limit"),
    "tasks limit float": (lambda c: c.tasks(limit=10.0), "limit"),
    "tasks offset negative": (lambda c: c.tasks(offset=-1), "offset"),
    "tasks before 0": (lambda c: c.tasks(before=0), "before"),
    "tasks before bool": (lambda c: c.tasks(before=True), "before"),
    "trials after -2": (lambda c: c.trials(1, after=-2), "after"),
    "trials after str": (lambda c: c.trials(1, after="3"), "after"),
    "task id 0": (lambda c: c.task(0), "task_id"),
    "task id past the column": (lambda c: c.task(2**31), "task_id"),
}


@pytest.mark.parametrize(("call", "argument"), PAGE_CALLS.values(), ids=PAGE_CALLS.keys())
def test_a_query_parameter_out_of_the_services_bounds_is_refused_before_any_request(
    call, argument, refused_url
):
    client, recorder = _client()
    with pytest.raises(InvalidArgumentError) as info:
        call(client)
    assert info.value.argument == argument
    assert recorder.requests == []
    with pipetune.Client(refused_url) as down, pytest.raises(InvalidArgumentError):
        call(down)


def test_query_parameters_in_bounds_are_sent():
    client, recorder = _client({"tasks": [], "trials": []})
    client.tasks(limit=np.int64(1000), offset=0, before=7)
    client.trials(1, after=-1)
    tasks, trials = (dict(r.url.params) for r in recorder.requests)
    assert tasks == {"limit": "1000", "offset": "0", "before": "7"}
    assert trials == {"after": "-1"}


# ---- the service's URL -------------------------------------------------------------------

# Refused as the CLI refuses --server (one rule, sdk.http.server_problem); sent, each was
# "cannot reach the pipetune service" at the first call, as if the service were down.
NOT_URLS = ["notaurl", "127.0.0.1:8000", "ftp://host", "http://", "http://host:port", 8000]


@pytest.mark.parametrize("url", NOT_URLS, ids=repr)
def test_a_base_url_that_is_not_an_http_url_is_refused_at_construction(url):
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.Client(url)
    assert info.value.argument == "base_url"
    assert not isinstance(info.value, ServiceUnavailableError)


def test_a_server_variable_that_is_not_a_url_is_named(monkeypatch):
    monkeypatch.setenv("PIPETUNE_SERVER", "gpu-host:8000")
    with pytest.raises(InvalidArgumentError, match=r"^PIPETUNE_SERVER: not an http"):
        pipetune.Client()


def test_a_password_in_a_refused_url_is_not_repeated():
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.Client("http://user:hunter2@host:port")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["notaurl", "", "gpu-host:8000", 8000], ids=repr)
def test_best_schedules_server_that_is_not_a_url_is_named_server(url, monkeypatch):
    monkeypatch.setenv("PIPETUNE_SERVER", "http://127.0.0.1:1")  # ("" is not "the default")
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.best_schedule(GEMM, "h100", server=url)
    assert info.value.argument == "server"


def test_wait_refuses_a_progress_that_cannot_be_called_before_any_request():
    client, recorder = _client()
    with pytest.raises(TypeError) as info:
        client.wait(1, progress=5)  # type: ignore[arg-type]
    assert isinstance(info.value, PipetuneError)
    assert str(info.value).startswith("progress: ")
    assert recorder.requests == []


FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
UNSENDABLE: dict[str, tuple[Callable[[pipetune.Client], Any], str, str]] = {
    # JSON's encoder raised a bare ValueError ("Out of range float values are not JSON
    # compliant") or TypeError, naming no field, no PipetuneError.
    "a NaN size": (lambda c: c.best_schedule({**FC, "m": float("nan")}, "h100"), "m", "finite"),
    "an object": (lambda c: c.best_schedule({**FC, "k": object()}, "h100"), "k", "(a object)"),
    "an array": (lambda c: c.tune({**FC, "n": np.array([1])}, "h100"), "n", "(a ndarray)"),
    "a bytes key": (lambda c: c.best_schedule({b"op": "gemm"}, "h100"), "workload", "b'op'"),
    "a gpu object": (lambda c: c.best_schedule(FC, object()), "gpu", "not object"),
    "a gpu None": (lambda c: c.schedule_and_tune(FC, None, {"budget": 2}), "gpu", "not NoneType"),
}


@pytest.mark.parametrize(("call", "argument", "words"), UNSENDABLE.values(), ids=UNSENDABLE.keys())
def test_what_json_cannot_carry_is_refused_naming_it_before_any_request(call, argument, words):
    client, recorder = _client()
    with pytest.raises(InvalidArgumentError) as info:
        call(client)
    assert info.value.argument == argument and words in str(info.value), info.value
    assert recorder.requests == []


def test_tune_options_take_numpy_integers_as_the_numbers_they_hold():
    """`Client.tune(budget=np.int64(2))` was refused: "budget: Input should be a valid integer
    (got np.int64(2))", where the workload's sizes and schedule_and_tune's options took them."""
    task = {
        "id": 1, "state": "queued", "workload": FC, "gpu": "a100", "strategy": "auto",
        "budget": 2, "seed": 3, "trials_done": 0, "trials_failed": 0,
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    client, recorder = _client(task)
    client.tune(FC, "a100", budget=np.int64(2), seed=np.int32(3), batch_size=np.int16(4),
                priority=np.int64(2), prior_task=np.uint8(9))  # fmt: skip
    (request,) = recorder.requests
    sent = json.loads(request.content)
    assert (sent["budget"], sent["seed"], sent["batch_size"], sent["priority"]) == (2, 3, 4, 2)
    assert sent["prior_task"] == 9
