"""Bad arguments the library sent on or opened: a server URL with a
control character (httpx.InvalidURL at the first request), a task state, GPU, operator or
strategy the service does not know (its 422 came back as an ApiError, no ValueError), and a
`db=` naming a file that is not a SQLite database or a directory (LocalDatabaseError, no
ValueError). Each is an InvalidArgumentError (a ValueError) naming the argument, raised
before any request or any database is opened."""

from __future__ import annotations

from typing import Any, get_args

import httpx
import pytest

import pipetune
from pipetune.clients.library.store import DatabaseArgumentError, LocalStore
from pipetune.clients.sdk import InvalidArgumentError
from pipetune.model.hardware import gpu_keys
from pipetune.model.states import TaskState
from pipetune.model.wire import OpName, StrategyName

URL = "http://pipetune.test"
FC = {"op": "gemm", "m": 1024, "n": 64, "k": 2048}
CURVES = {"gpu": None, "op": None, "curves": {}, "runners": []}


class Recorder:
    def __init__(self, answer: Any) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json=self.answer)


def _client(answer: Any = None) -> tuple[pipetune.Client, Recorder]:
    recorder = Recorder(answer)
    return pipetune.Client(URL, transport=httpx.MockTransport(recorder)), recorder


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY", "PIPETUNE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


# ---- a server URL with a control character or a space -----------------------------------

BAD_URLS = [
    "http://127.0.0.1:1\n",
    "http://127.0.0.1:1\r\n",
    "http://127.0.0.1:1\t",
    "http://127.0.0.1:1/\x01",
    "http://127.0.0.1:1/a b",
    "http://127.0.0.1:1/\x7f",
    "\u00a0http://127.0.0.1:1",
]


@pytest.mark.parametrize("url", BAD_URLS, ids=repr)
def test_best_schedule_refuses_a_server_with_a_control_character(url):
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.best_schedule(FC, "h100", server=url)
    assert info.value.argument == "server"
    assert str(info.value).startswith("server: not an http(s) URL: ")


@pytest.mark.parametrize("url", BAD_URLS, ids=repr)
def test_client_refuses_a_base_url_or_variable_with_a_control_character(url, monkeypatch):
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.Client(url)
    assert info.value.argument == "base_url"
    monkeypatch.setenv("PIPETUNE_SERVER", url)
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.Client()
    assert info.value.argument == "PIPETUNE_SERVER"


def test_a_trailing_newline_is_named_and_a_password_not_repeated():
    with pytest.raises(InvalidArgumentError) as info:
        pipetune.best_schedule(FC, "h100", server="http://u:hunter2@127.0.0.1:1\n")
    assert "ends with a newline (read from a file? strip it)" in str(info.value)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "https://h.example/pipetune/é"])
def test_a_url_without_control_characters_is_still_taken(url):
    pipetune.Client(url).close()


# ---- Client.tasks(state=) and Client.curves(gpu=, op=, strategy=) ----------------------

BAD_CHOICES = [
    ("tasks", "state", "bogus"),
    ("tasks", "state", "DONE "),
    ("tasks", "state", 3),
    ("curves", "gpu", "rtx"),
    ("curves", "gpu", 100),
    ("curves", "op", "nosuch"),
    ("curves", "op", "GEMM"),
    ("curves", "strategy", "nosuch"),
    ("curves", "strategy", ["auto"]),
]


@pytest.mark.parametrize(("method", "argument", "value"), BAD_CHOICES, ids=repr)
def test_a_name_outside_the_vocabulary_is_refused_before_any_request(method, argument, value):
    client, recorder = _client()
    with pytest.raises(InvalidArgumentError) as info:
        getattr(client, method)(**{argument: value})
    assert isinstance(info.value, ValueError)
    assert info.value.argument == argument
    assert recorder.requests == []


@pytest.mark.parametrize("state", [*TaskState, *(s.value for s in TaskState)], ids=repr)
def test_every_task_state_is_sent(state):
    client, recorder = _client({"tasks": []})
    assert client.tasks(state=state) == []
    (request,) = recorder.requests
    assert request.url.params["state"] == TaskState(state).value


def test_every_gpu_op_and_strategy_is_sent():
    for gpu in gpu_keys():
        client, recorder = _client(CURVES)
        client.curves(gpu=gpu.upper())  # any of its names, as the service takes it
        assert recorder.requests[0].url.params["gpu"] == gpu
    for op in OpName:
        client, recorder = _client(CURVES)
        client.curves(op=op.value)
        assert recorder.requests[0].url.params["op"] == op.value
    for strategy in get_args(StrategyName):
        client, recorder = _client(CURVES)
        client.curves(strategy=strategy)
        assert recorder.requests[0].url.params["strategy"] == strategy
    client, recorder = _client(CURVES)
    client.curves()
    assert dict(recorder.requests[0].url.params) == {}


# ---- db= naming a file that is no SQLite database ----------------------------------------


@pytest.fixture
def not_databases(tmp_path) -> list[str]:
    text = tmp_path / "notes.db"
    text.write_text("not a database\n")
    folder = tmp_path / "folder.db"
    folder.mkdir()
    under_a_file = text / "inside.db"
    return [f"sqlite:///{p}" for p in (text, folder, under_a_file)]


def test_db_that_is_not_a_sqlite_file_is_an_argument_error(not_databases):
    calls = [
        lambda db: pipetune.best_schedule(FC, "h100", db=db),
        lambda db: pipetune.tune(FC, "h100", 2, runner="simulated", db=db),
        lambda db: LocalStore(db),
    ]
    for db in not_databases:
        for call in calls:
            with pytest.raises(DatabaseArgumentError) as info:
                call(db)
            assert isinstance(info.value, ValueError)
            assert info.value.argument == "db"


# ---- NumPy numbers, where a caller computed a size or a budget with NumPy ---------------


def test_numpy_integers_are_the_numbers_they_hold():
    """np.int64 sizes, knob values and budgets were refused with "Input should be a valid
    integer (got np.int64(4096))", and reached the SDK's JSON encoder as a TypeError; a bool,
    a string or a float stays refused."""
    np = pytest.importorskip("numpy")
    assert pipetune.Gemm(m=np.int64(1024), n=np.int32(64), k=2048) == pipetune.Gemm(
        m=1024, n=64, k=2048
    )
    assert pipetune.Softmax(rows=np.int64(8), cols=np.uint16(64)).rows == 8
    knobs = {"block_row_warps": 2, "block_col_warps": 2, "warp_row_tiles": 2,
             "warp_col_tiles": 2, "chunk": 2, "smem_stages": 3, "reg_stages": 2}  # fmt: skip
    plain = pipetune.kernel(FC, "h100", schedule=knobs)
    numpy_made = pipetune.kernel(
        {k: np.int64(v) if k != "op" else v for k, v in FC.items()},
        "h100",
        schedule={k: np.int64(v) for k, v in knobs.items()},
    )
    assert numpy_made.source == plain.source and numpy_made.launch == plain.launch
    for bad in (True, "64", 64.0):
        with pytest.raises(pipetune.PipetuneError, match=r"^m: "):
            pipetune.best_schedule({**FC, "m": bad}, "h100")
    client, recorder = _client({"detail": "stop here"})
    with pytest.raises(pipetune.PipetuneError):  # the stand-in's answer is no schedule
        client.best_schedule({**FC, "m": np.int64(1024)}, "h100")
    sent = recorder.requests[0].read()
    assert b'"m":1024' in sent.replace(b" ", b"")


def test_schedule_and_tune_takes_its_options_as_a_dict():
    """It took only a TuneOptions (which pipetune does not export): a dict was an
    AttributeError from inside; a bad option is named before any request."""
    client, recorder = _client({"detail": "stop here"})
    with pytest.raises(pipetune.PipetuneError):
        client.schedule_and_tune(FC, "h100", {"budget": 4, "strategy": "random"})
    (request,) = recorder.requests
    assert b'"tune":{"budget":4,"strategy":"random"' in request.read().replace(b" ", b"")
    client, recorder = _client()
    with pytest.raises(InvalidArgumentError) as info:
        client.schedule_and_tune(FC, "h100", {"budget": 0})
    assert info.value.argument == "budget" and recorder.requests == []
    with pytest.raises(TypeError, match=r"^tune: must be a dict") as refused:
        client.schedule_and_tune(FC, "h100", [("budget", 4)])
    assert isinstance(refused.value, pipetune.PipetuneError)


def test_db_naming_a_file_that_is_not_there_is_an_argument_error(tmp_path):
    """A mistyped db= path read as an empty database: best_schedule and kernel handed back
    the model's untuned pick without a word (the CLI's --db refuses the same path)."""
    missing = f"sqlite:///{tmp_path / 'tuned.db'}"
    for call in (
        lambda: pipetune.best_schedule(FC, "h100", db=missing),
        lambda: pipetune.kernel(FC, "h100", db=missing),
    ):
        with pytest.raises(DatabaseArgumentError, match=r"^db: no database file at ") as info:
            call()
        assert info.value.argument == "db"
    assert not (tmp_path / "tuned.db").exists()


def test_a_bad_workload_is_an_invalid_argument_naming_its_field():
    """WorkloadError had no `argument` and was not an InvalidArgumentError: `except
    pipetune.InvalidArgumentError` let a bad workload through."""
    with pytest.raises(pipetune.InvalidArgumentError) as info:
        pipetune.best_schedule({**FC, "n": 60}, "h100")
    assert info.value.argument == info.value.field == "n"
    assert str(info.value).startswith("n: must be a multiple of 8")
