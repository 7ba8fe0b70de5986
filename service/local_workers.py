"""Local worker processes for `pipetune serve --local-workers N`.

Each worker is a separate process running the `pipetune worker` command (the service never
imports the worker code: it only starts the command). Simulated and replay workers are
spread over the GPUs of the hardware registry, round robin, so every GPU has one as soon as
N >= the number of GPUs and a fresh install tunes for any GPU without one. A cupy worker
measures the GPU it finds, so it is not told one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipetune.model.hardware import gpu_keys
from pipetune.model.trials import RunnerKind

RUNNERS: tuple[str, ...] = (RunnerKind.SIMULATED, RunnerKind.REPLAY, RunnerKind.CUPY)
# The environment variable `pipetune worker` reads its token from (its documented option).
TOKEN_ENV = "PIPETUNE_WORKER_TOKEN"


def assign_gpus(n: int, gpus: list[str] | None = None) -> list[str]:
    gpus = gpus or gpu_keys()
    return [gpus[i % len(gpus)] for i in range(n)]


def worker_command(
    server: str,
    runner: str,
    gpu: str | None,
    name: str,
    dataset: Path | None = None,
) -> list[str]:
    command = [sys.executable, "-m", "pipetune.clients.cli", "worker", "--server", server]
    command += ["--runner", runner]
    if gpu is not None:
        command += ["--gpu", gpu]
    command += ["--name", name]
    if dataset is not None:
        command += ["--dataset", str(dataset)]
    return command


def start_workers(
    n: int, server: str, token: str, runner: str, dataset: Path | None = None
) -> list[subprocess.Popen]:
    gpus: list[str | None] = [None] * n if runner == "cupy" else list(assign_gpus(n))
    host = os.uname().nodename
    processes = []
    for i, gpu in enumerate(gpus):
        name = f"local-{host}-{os.getpid()}-{i}-{gpu or runner}"
        command = worker_command(server, runner, gpu, name, dataset)
        # The token in the environment, not the command line (which `ps` shows everyone).
        env = {**os.environ, TOKEN_ENV: token}
        # A session of its own: a Ctrl-C at the terminal reaches `serve` only, which then
        # stops the workers once (a second signal would make them abandon their trials).
        processes.append(subprocess.Popen(command, start_new_session=True, env=env))
    return processes


def stop_workers(processes: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    """SIGTERM every worker, wait for them together, then kill the ones still running."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in processes:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
