"""The service-facing commands without a service: every command's --help, the one-line
message and exit 1 when the service is down, and exit 2 on bad arguments (before anything
is sent)."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.local_service import free_port
from pipetune.model.workloads import OPS

WORKER = ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t"]

runner = CliRunner()
FC = ["--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]


@pytest.fixture(autouse=True)
def no_ambient_service(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY", "PIPETUNE_WORKER_TOKEN"):
        monkeypatch.delenv(name, raising=False)


HELP = [
    *(["schedule", op] for op in OPS),
    *(["tune", op] for op in OPS),
    ["schedule"],
    ["tune"],
    ["tasks"],
    ["curve"],
    ["tune-model"],
    ["worker"],
]


@pytest.mark.parametrize("command", HELP, ids=" ".join)
def test_every_command_has_help(command: list[str]):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: pipetune " + " ".join(command) in " ".join(result.stdout.split())
    if command[0] in ("tune", "schedule", "tasks", "curve", "tune-model") and len(command) != 1:
        assert "--server" in result.stdout and "--api-key" in result.stdout


def _down() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


DOWN = [
    ["schedule", "gemm", *FC],
    ["tune", "gemm", *FC, "--budget", "8", "--wait"],
    ["tasks"],
    ["curve", "1"],
    ["tune-model", "bert-base", "--seq", "64", "--budget", "2"],
    ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t", "--register-timeout", "0"],
]


@pytest.mark.parametrize("command", DOWN, ids=lambda c: c[0])
def test_service_down_is_one_line_and_exit_1(command: list[str]):
    server = _down()
    result = runner.invoke(app, [*command, "--server", server])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot reach the pipetune service at {server} (")


BAD = [
    (["schedule", "gemm", "--m", "1024", "--n", "63", "--k", "2048"], "n: must be a multiple of 8"),
    (["schedule", "gemm", *FC[:6], "--gpu", "v100"], "--gpu: unknown GPU 'v100'"),
    (["tune", "gemm", *FC, "--budget", "0"], "--budget: must be within 1..5000"),
    (["tune", "gemm", *FC, "--strategy", "bogus"], "--strategy: unknown 'bogus'"),
    (["tune", "gemm", *FC, "--batch-size", "0"], "--batch-size: must be within 1..64, got 0"),
    (["tune", "gemm", *FC, "--batch-size", "65"], "--batch-size: must be within 1..64"),
    (["tune", "gemm", *FC, "--priority", "0"], "--priority: must be within 1..10, got 0"),
    (["tune", "gemm", *FC, "--priority", "11"], "--priority: must be within 1..10, got 11"),
    (["tune", "bmm", "--b", "12", "--m", "512", "--n", "512", "--k", "60"], "k: must be a"),
    (["curve", "1", "--png", "/no/such/dir/curve.png"], "--png: directory /no/such/dir"),
    (["tune-model", "vgg16"], "NETWORK: unknown network 'vgg16'"),
    (["tune-model", "bert-base", "--seq", "100"], "--seq: must be a multiple of 8"),
    (["tune-model", "bert-base", "--seq", "1024"], "--seq: bert-base takes at most 512 tokens"),
    (["tune-model", "resnet50", "--seq", "128"], "--seq: resnet50 takes images"),
    (["tune-model", "gpt2", "--batch", "0"], "--batch: must be at least 1"),
    (["tune-model", "bert-base", "--decode"], "--decode: bert-base is an encoder"),
    (["tune-model", "resnet50", "--decode"], "--decode: resnet50 is not a network of sequences"),
    (["tune-model", "llama2-7b", "--decode", "--seq", "8192"], "--seq: llama2-7b takes at most"),
    # Named as typed (the network function's argument names were shown: "fuse_swiglu: ...").
    (["tune-model", "gpt2", "--fuse-swiglu"], "--fuse-swiglu: gpt2 has no SwiGLU to fuse"),
    (["tune-model", "llama2-7b", "--fuse-bias-gelu"], "--fuse-bias-gelu: llama2-7b has no bias"),
    (["tune-model", "gpt2", "--batch", "100000"], "--batch/--seq: batch 100000 x seq 1024 is"),
    (["tune-model", "gpt2", "--batch-size", "0"], "--batch-size: must be within 1..64, got 0"),
    (["tune-model", "gpt2", "--priority", "0"], "--priority: must be within 1..10, got 0"),
    (["worker", "--runner", "simulated", "--token", "t"], "--gpu: a simulated worker must"),
    (["worker", "--runner", "opencl", "--token", "t"], "--runner: must be one of"),
    (["worker", "--runner", "simulated", "--gpu", "h100"], "--token: give the worker token"),
    (["worker", "--runner", "simulated", "--gpu", "v100", "--token", "t"], "--gpu: unknown GPU"),
    (
        ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t", "--parent-pid", "0"],
        "--parent-pid: must be a process id, got 0",
    ),
    (
        # A running process that is not the parent: it stopped at once with exit 0.
        [*WORKER, "--parent-pid", str(os.getpid())],
        f"--parent-pid: process {os.getpid()} is not this worker's parent",
    ),
    (["tune", "gemm", *FC[:6], "--gpu", "v100"], "--gpu: unknown GPU 'v100'"),
    (
        ["worker", "--runner", "replay", "--gpu", "a100", "--token", "t", "--dataset", "/no/x"],
        "--dataset: /no/x does not exist",
    ),
]


@pytest.mark.parametrize(
    ("command", "message"), BAD, ids=lambda v: v[0] if isinstance(v, list) else ""
)
def test_bad_arguments_exit_2_with_the_reason(command: list[str], message: str):
    result = runner.invoke(app, [*command, "--server", _down()])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


@pytest.mark.parametrize(
    "command", [["curve", "not-a-number"], ["schedule", "gemm", "--m", "1024"], ["tune-model"]]
)
def test_malformed_command_lines_exit_2(command: list[str]):
    result = runner.invoke(app, command)
    assert result.exit_code == 2
    assert "Usage:" in result.stderr


def test_a_worker_with_a_malformed_server_url_is_refused_at_once():
    """`worker --server garbage` retried for --register-timeout (60 s) before saying the URL
    was malformed."""
    import time

    started = time.monotonic()
    args = ["worker", "--runner", "simulated", "--gpu", "h100", "--token", "t"]
    result = runner.invoke(app, [*args, "--server", "garbage", "--register-timeout", "30"])
    assert result.exit_code == 2, result.output
    assert "error: --server: not an http(s) URL: 'garbage'" in result.stderr
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("minutes", ["inf", "1e308", "0"])
def test_a_campaign_plan_of_infinite_minutes_is_refused(minutes):
    """--minutes inf printed `"budget_s": Infinity`, which is not JSON; 1e308 passed as
    finite and overflowed to the same (a ValueError, exit 1)."""
    result = runner.invoke(app, ["campaign", "plan", "--minutes", minutes, "--json"])
    assert result.exit_code == 2, result.output
    assert "--minutes: must be more than 0 and at most 10080 (a week)" in result.stderr
    result = runner.invoke(app, ["campaign", "plan", "--calls", "0"])
    assert result.exit_code == 2 and "--calls: must be at least 1, got 0" in result.stderr


@pytest.mark.parametrize(
    ("reason", "credential", "hint"),
    [
        ("a valid API key required", None, "give --api-key or set PIPETUNE_API_KEY"),
        ("a valid worker token required", "give --token or set X", "give --token or set X"),
    ],
)
def test_a_refused_credential_names_where_it_comes_from(
    reason: str, credential: str | None, hint: str
):
    """A 401 said "a valid API key required (HTTP 401)": neither the option nor the variable
    that gives the key."""
    from pipetune.clients.cli.remote import cli_error
    from pipetune.clients.sdk import AuthError

    exc = AuthError(401, reason, method="GET", path="/v1/tasks")
    error = cli_error(exc) if credential is None else cli_error(exc, credential=credential)
    assert error.code == 1
    assert str(error) == f"{reason} (HTTP 401): {hint}"


@pytest.mark.parametrize(
    "command",
    [["tasks"], ["schedule", "gemm", *FC], ["curve", "1"], ["export", "--gpu", "h100"]],
    ids=lambda c: c[0],
)
def test_a_db_file_that_is_not_there_is_a_mistyped_path(command, tmp_path, monkeypatch):
    """`tasks --db sqlite:///typo.db` said "no tasks" (and `export` wrote an empty export)
    with exit 0: a database named on the command line must be there. The default one still
    reads as empty until something is tuned."""
    monkeypatch.delenv("PIPETUNE_SERVER", raising=False)
    missing = tmp_path / "typo.db"
    extra = ["--out-dir", str(tmp_path / "out")] if command[0] == "export" else []
    result = runner.invoke(app, [*command, *extra, "--db", f"sqlite:///{missing}"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"error: --db: no database file at {missing} (`pipetune serve` or `pipetune db "
        "upgrade --db ...` makes one)"
    )
    assert not missing.exists() and not (tmp_path / "out").exists()


def test_a_request_field_the_service_refuses_is_named_as_the_option_typed():
    """`tune --seed -1` said "seed: ...", `--prior-task 0` "prior_task: ...", `tasks --state
    bogus` "state: ...": the request's field names, not the options the user typed. A
    workload field keeps its name (every local check of it says it so)."""
    from pipetune.clients.cli.remote import cli_error
    from pipetune.clients.library.store import LocalInputError
    from pipetune.clients.sdk import InvalidRequestError

    refused = InvalidRequestError(422, "prior_task: must be at least 1", field="prior_task")
    assert str(cli_error(refused)) == "--prior-task: must be at least 1"
    assert cli_error(refused).code == 2
    local = LocalInputError("state", "must be one of queued, running")
    assert str(cli_error(local)) == "--state: must be one of queued, running"
    workload = InvalidRequestError(422, "n: must be a multiple of 8", field="n")
    assert str(cli_error(workload)) == "n: must be a multiple of 8"
