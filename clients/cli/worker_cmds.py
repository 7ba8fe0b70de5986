"""`pipetune worker`: the GPU worker daemon (workers.daemon).

pipetune worker --server http://service:8000 --token T --runner cupy --concurrency 4
pipetune worker --token T --runner simulated --gpu h100          # no GPU: model + noise
pipetune worker --token T --runner simulated --gpu h100 --simulate-faults crash=0.1,hang=0.1
pipetune worker --token T --runner replay --gpu a100 --dataset conv.t4.json.gz
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import typer

from pipetune.clients.cli.environment import unknown_variable_warnings
from pipetune.clients.cli.errors import USAGE_ERRORS, CliError, one_line, reported, runner_failure
from pipetune.clients.cli.hosts import is_loopback_host
from pipetune.clients.cli.remote import SERVER_HELP, check_server, cli_error
from pipetune.clients.sdk import DEFAULT_SERVER, SERVER_ENV, PipetuneError
from pipetune.model.hardware import gpu_keys
from pipetune.model.wire import MAX_LEASE_WAIT_S
from pipetune.workers.daemon import RUNNERS, TOKEN_ENV, DetectionError, WorkerConfig, run_worker
from pipetune.workers.daemon.config import (
    MAX_HEARTBEAT_S,
    MIN_HEARTBEAT_S,
    MIN_LEASE_WAIT_S,
    check_operator_intervals,
)
from pipetune.workers.datasets import DatasetError
from pipetune.workers.runners import DatasetMismatchError, RunnerError
from pipetune.workers.runners.faults import FAULTS_ENV


def _generated_token(server: str) -> str:
    """The token `pipetune serve` generated on this machine (same user), or "": only for
    a service on this machine, whose token it is (sent to another --server, it gave that
    server a token of the local service's)."""
    from pipetune.service.worker_token import read_generated_token

    if not is_loopback_host(urlsplit(server).hostname or ""):
        return ""
    try:
        return read_generated_token() or ""
    except OSError:
        return ""


@reported
def worker(
    server: str = typer.Option(DEFAULT_SERVER, "--server", envvar=SERVER_ENV, help=SERVER_HELP),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar=TOKEN_ENV,
        help="worker token (default, for a --server on this machine: the one `pipetune serve` "
        "generated here, if any)",
    ),
    runner: str = typer.Option(
        "cupy",
        "--runner",
        help=f"{' | '.join(RUNNERS)}: cupy measures on a real GPU (detected through CuPy), "
        "replay answers from a recorded dataset, simulated is the analytical model + noise "
        "(demos and CI only)",
    ),
    dataset: Path | None = typer.Option(None, "--dataset", help="replay: the dataset file"),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help=f"the GPU a simulated/replay worker stands in for ({', '.join(gpu_keys())}); "
        "cupy: only for a device the model does not know",
    ),
    concurrency: int = typer.Option(
        1, "--concurrency", help="jobs leased and measured at a time (cupy: one on the GPU)"
    ),
    lease_ahead: int = typer.Option(
        2,
        "--lease-ahead",
        help="jobs leased ahead of the ones being measured, so the GPU never waits on the "
        "network; an idle worker leases only its slots, and a busy one takes jobs ahead one "
        "at a time, only from those queued, after the idle workers, so a batch spreads over "
        "the fleet (0: lease only for free slots)",
    ),
    name: str | None = typer.Option(None, "--name", help="worker name (default host-runner-pid)"),
    device: int = typer.Option(0, "--device", help="cupy: CUDA device index"),
    heartbeat_s: float = typer.Option(
        5.0,
        "--heartbeat",
        help="seconds between the heartbeat thread's wake-ups: it sends one when a lease "
        "will have lived half its TTL by the next, when the worker goes busy or idle, and "
        f"else every sixth; {MIN_HEARTBEAT_S:g} to {MAX_HEARTBEAT_S:g}, below the lease TTL",
    ),
    lease_wait_s: float = typer.Option(
        10.0,
        "--lease-wait",
        help=f"long-poll seconds per lease request ({MIN_LEASE_WAIT_S:g} to {MAX_LEASE_WAIT_S:g})",
    ),
    register_timeout_s: float = typer.Option(
        60.0, "--register-timeout", help="seconds to keep trying to reach the service at start"
    ),
    result_retry_s: float = typer.Option(
        900.0,
        "--result-retry",
        help="seconds to keep retrying results while the service is down (one clock for the "
        "whole outage: results reported after that are tried once)",
    ),
    trial_timeout_s: float = typer.Option(
        60.0,
        "--trial-timeout",
        help="seconds a trial may take before its measuring process is killed (cupy, and "
        "simulated with --simulate-faults)",
    ),
    simulate_faults: str | None = typer.Option(
        None,
        "--simulate-faults",
        envvar=FAULTS_ENV,
        help="simulated only: rehearse GPU faults on a CPU, e.g. crash=0.2,hang=0.1 "
        "(that fraction of trials' measuring process dies of SIGSEGV or hangs)",
    ),
    json_logs: bool = typer.Option(False, "--json-logs", help="log JSON lines (for machines)"),
    parent_pid: int | None = typer.Option(
        None,
        "--parent-pid",
        help="stop once process PID is no longer this worker's parent (it died), leaving the "
        "jobs in hand to their leases (`serve --local-workers` passes its own)",
    ),
) -> None:
    """Run a GPU worker: register, lease this GPU's jobs (of its own model: an H100 takes no
    H200 task's), measure, report; drains and exits 0 on SIGTERM, 3 if results could not be
    reported (a second SIGTERM stops after the current trial)."""
    # A malformed URL is refused now, not after --register-timeout of retrying it.
    check_server(server)
    if parent_pid is None:  # (serve's local workers: serve has said it, once)
        for line in unknown_variable_warnings():  # (a misspelt PIPETUNE_SIMULATED_FAULTS)
            print(line, file=sys.stderr, flush=True)
    try:
        check_operator_intervals(heartbeat_s, lease_wait_s)
        config = WorkerConfig(
            server=server,
            token=token or _generated_token(server),
            runner=runner,
            gpu=gpu,
            dataset=dataset,
            concurrency=concurrency,
            lease_ahead=lease_ahead,
            name=name or "",
            device=device,
            heartbeat_s=heartbeat_s,
            lease_wait_s=lease_wait_s,
            register_timeout_s=register_timeout_s,
            result_retry_s=result_retry_s,
            trial_timeout_s=trial_timeout_s,
            simulate_faults=simulate_faults,
            json_logs=json_logs,
            parent_pid=parent_pid,
        )
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    if parent_pid is not None and parent_pid != os.getppid() and _process_exists(parent_pid):
        # (It stopped at once, exit 0, as if its parent had died: a typo looked like success.)
        raise CliError(f"--parent-pid: process {parent_pid} is not this worker's parent", 2)
    if dataset is not None and not dataset.exists():
        raise CliError(f"--dataset: {dataset} does not exist", 2)
    try:
        code = run_worker(config)
    except (DatasetError, DatasetMismatchError) as exc:
        raise CliError(f"--dataset: {one_line(exc)}", 2) from None
    except (DetectionError, RunnerError) as exc:
        raise runner_failure(exc) from None
    except USAGE_ERRORS:
        raise  # a bad GPU or workload: `reported` says it, naming the option
    except PipetuneError as exc:  # (last: the errors above are PipetuneErrors too)
        raise cli_error(exc, credential=f"give --token or set {TOKEN_ENV}") from None
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `pipetune worker`."""
    app.command("worker")(worker)


def _process_exists(pid: int) -> bool:
    """Whether a process `pid` runs (one of another user's too). A parent that has already
    ended is what --parent-pid watches for: the worker then stops as it would later."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True
