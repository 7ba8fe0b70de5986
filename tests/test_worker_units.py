"""The worker daemon's parts that need no service: configuration checks, the retry policy
for results, the log format, and how a worker describes its GPU."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.sdk import NotFoundError, ServerError, ServiceUnavailableError
from pipetune.workers.daemon import DetectionError, EventLog, WorkerConfig, open_runner
from pipetune.workers.daemon.gpu import describe_model_gpu, detect_cupy
from pipetune.workers.daemon.reporting import call_with_retries

NAN, INF = float("nan"), float("inf")


def config(**kw) -> WorkerConfig:  # type: ignore[no-untyped-def]
    return WorkerConfig(**{"server": "http://127.0.0.1:9", "token": "t", **kw})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"runner": "simulated"}, "--gpu: a simulated worker must be told which GPU"),
        ({"runner": "replay", "gpu": "a100"}, "--dataset: a replay worker needs the dataset"),
        ({"runner": "simulated", "gpu": "h100", "dataset": Path("x")}, "only a replay worker"),
        ({"runner": "opencl"}, "--runner: must be one of cupy, replay, simulated"),
        ({"runner": "cupy", "concurrency": 0}, "--concurrency: must be within 1..4032, got 0"),
        # Held leases past the heartbeat's 4,096: every heartbeat refused, every lease lost.
        ({"runner": "cupy", "concurrency": 4033}, "--concurrency: must be within 1..4032"),
        ({"runner": "cupy", "token": ""}, "--token: give the worker token"),
        # Refused by the first request in the control thread: a traceback, and exit 0.
        ({"runner": "cupy", "token": "tok en"}, "--token: must be printable ASCII"),
        ({"runner": "cupy", "token": "tökén"}, "but it contains a non-ASCII character"),
        ({"runner": "cupy", "lease_wait_s": 31}, "--lease-wait: must be within 0..30"),
        # NaN compares false with every bound: a NaN register timeout never gave up.
        ({"runner": "cupy", "register_timeout_s": NAN}, "--register-timeout: must be a finite"),
        ({"runner": "cupy", "register_timeout_s": INF}, "--register-timeout: must be a finite"),
        ({"runner": "cupy", "register_timeout_s": -1}, "--register-timeout: must be a finite"),
        ({"runner": "cupy", "heartbeat_s": NAN}, "--heartbeat: must be a finite"),
        ({"runner": "cupy", "heartbeat_s": 0}, "--heartbeat: must be a finite"),
        ({"runner": "cupy", "trial_timeout_s": NAN}, "--trial-timeout: must be a finite"),
        ({"runner": "cupy", "trial_timeout_s": INF}, "--trial-timeout: must be a finite"),
        ({"runner": "cupy", "result_retry_s": NAN}, "--result-retry: must be a finite"),
        ({"runner": "cupy", "result_retry_s": -INF}, "--result-retry: must be a finite"),
        ({"runner": "cupy", "lease_wait_s": NAN}, "--lease-wait: must be within 0..30"),
        # Past threading.TIMEOUT_MAX: the heartbeat thread died, every trial failed.
        ({"runner": "cupy", "heartbeat_s": 1e12}, "--heartbeat: at most 604800 s"),
        ({"runner": "cupy", "trial_timeout_s": 1e12}, "--trial-timeout: at most 604800 s"),
        # Refused by the registration: a pydantic ValidationError of several lines, exit 1.
        ({"runner": "cupy", "name": "x" * 129}, "--name: at most 128 characters, got 129"),
        ({"runner": "cupy", "name": "   "}, "--name: must not be blank"),
    ],
)
def test_bad_configurations_are_refused_with_the_option(kw: dict, message: str):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        config(**kw)


def test_a_worker_given_a_nan_heartbeat_exits_2_naming_it():
    """A NaN passed every check (NaN <= 0 is false): the worker started. (A NaN
    --register-timeout retried the unreachable service for ever.)"""
    args = ["worker", "--server", "http://127.0.0.1:9", "--token", "x", "--runner", "simulated"]
    args += ["--gpu", "h100", "--register-timeout", "0", "--heartbeat", "nan"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: --heartbeat: must be a finite number of seconds, more than 0, got nan"
    ]


def test_a_worker_name_the_service_would_refuse_exits_2_naming_it():
    """A --name over 128 characters started the worker, whose registration then failed with
    a pydantic ValidationError of several lines and exit 1."""
    args = ["worker", "--server", "http://127.0.0.1:9", "--token", "x", "--runner", "simulated"]
    args += ["--gpu", "h100", "--register-timeout", "0", "--name", "w" * 200]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == ["error: --name: at most 128 characters, got 200"]


def test_a_malformed_simulated_time_scale_is_bad_input_exit_2(monkeypatch: pytest.MonkeyPatch):
    """The environment's setting is the user's input: it exited 1, as a runner that could not
    run does."""
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "abc")
    args = ["worker", "--server", "http://127.0.0.1:9", "--token", "x", "--runner", "simulated"]
    args += ["--gpu", "h100", "--register-timeout", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "PIPETUNE_SIMULATED_TIME_SCALE must be a non-negative number" in result.stderr
    assert "'abc'" in result.stderr and "Traceback" not in result.output


def test_default_name_says_host_runner_and_process():
    name = config(runner="simulated", gpu="h100").name
    assert "-simulated-" in name and len(name) <= 128


def test_results_are_retried_until_the_service_answers():
    calls = []

    def post() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ServiceUnavailableError("http://x", "connection refused")
        return "ack"

    retried: list[int] = []
    waits: list[float] = []
    result = call_with_retries(
        post,
        give_up_after_s=30,
        abort=threading.Event(),
        on_retry=lambda attempt, exc, wait: (retried.append(attempt), waits.append(wait)),
        initial_s=0.01,
    )
    assert result == "ack" and len(calls) == 3 and retried == [1, 2]
    # Exponential backoff, read from the waits it chose: the gaps between the calls measured
    # it too, and on a loaded machine a 10 ms sleep that overran by 11 ms failed the test.
    assert waits[1] >= 2 * waits[0] > 0
    assert calls[1] - calls[0] >= waits[0] and calls[2] - calls[1] >= waits[1]


def test_a_5xx_is_retried_but_a_4xx_is_final():
    answers = [ServerError(503, "busy"), NotFoundError(404, "no such job")]

    def post() -> str:
        raise answers.pop(0)

    with pytest.raises(NotFoundError):
        call_with_retries(post, give_up_after_s=30, abort=threading.Event(), initial_s=0.01)
    assert answers == []  # the 503 was retried, the 404 was not


def test_retries_give_up_after_the_deadline_or_on_abort():
    def down() -> None:
        raise ServiceUnavailableError("http://x", "refused")

    start = time.monotonic()
    with pytest.raises(ServiceUnavailableError):
        call_with_retries(down, give_up_after_s=0.2, abort=threading.Event(), initial_s=0.01)
    assert time.monotonic() - start < 5
    abort = threading.Event()
    abort.set()
    start = time.monotonic()
    with pytest.raises(ServiceUnavailableError):
        call_with_retries(down, give_up_after_s=600, abort=abort, initial_s=1.0)
    assert time.monotonic() - start < 1.0


def test_log_lines_for_people_and_for_machines():
    human, machine = io.StringIO(), io.StringIO()
    fields = {"task": 3, "trial": 7, "schedule": "s-2-2-2-2-2-3-2", "status": "ok"}
    EventLog(stream=human).info("trial", **fields, latency_us=12.3456, error=None)
    EventLog(json_lines=True, stream=machine).info("trial", **fields, latency_us=12.3456)
    line = human.getvalue()
    assert line.count("\n") == 1
    assert "trial task=3 trial=7 schedule=s-2-2-2-2-2-3-2 status=ok latency_us=12.35" in line
    assert "error" not in line  # empty fields are left out
    doc = json.loads(machine.getvalue())
    assert doc["event"] == "trial" and doc["latency_us"] == 12.3456 and doc["level"] == "info"


def test_a_simulated_worker_describes_the_gpu_it_stands_in_for():
    runner, device = open_runner(config(runner="simulated", gpu="H100-SXM"))
    with runner:
        assert runner.name == "simulated"
    assert (device.gpu, device.arch, device.sm_count) == ("h100", "sm_90", 132)
    assert device.device_name.startswith("simulated: NVIDIA H100")
    assert describe_model_gpu("a100", "replay").arch == "sm_80"


def test_cupy_detection_without_a_usable_gpu_says_why():
    try:
        device = detect_cupy(0)
    except DetectionError as exc:
        assert str(exc).startswith("no usable CUDA GPU through CuPy: ")
    else:  # a GPU machine: the probe found a device the model knows
        assert device.arch.startswith("sm_") and device.sm_count


def test_detection_without_cupy_says_what_to_install(monkeypatch):
    """Without CuPy the probe child's last line was a bare ModuleNotFoundError; the other
    commands that need CuPy name the package (runners.base.cupy_missing)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a)
    )
    with pytest.raises(
        DetectionError, match=r"CuPy is not installed \(pip install 'pipetune\[gpu\]'\)"
    ):
        detect_cupy(0)


def test_a_fatal_error_making_the_api_ends_run_with_it():
    """The API was made outside the control thread's try: its error was that thread's
    traceback, and run() returned 0 as after a clean stop."""
    from pipetune.workers.daemon.worker import Worker

    class BrokenApiError(RuntimeError):
        pass

    def factory():  # type: ignore[no-untyped-def]
        raise BrokenApiError("no API")

    worker = Worker.__new__(Worker)
    worker._api_factory = factory
    worker._fatal = None
    worker._control()
    assert isinstance(worker._fatal, BrokenApiError)
