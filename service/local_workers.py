"""Local worker processes for `pipetune serve --local-workers N`.

Each worker is a separate process running the `pipetune worker` command (the service never
runs the worker code: it only starts the command). Simulated and replay workers are
spread over the GPUs of the hardware registry, round robin, so every GPU has one as soon as
N >= the number of GPUs and a fresh install tunes for any GPU without one. A replay worker
answers only for the GPU its dataset was recorded on, so every replay worker stands in for
that one. A cupy worker measures the GPU it finds, so it is not told one.

`preflight` checks, before the service starts, what the workers will need (the replay
dataset reads; CuPy finds a GPU the model knows): a worker that cannot start only logs its
error, and the service would otherwise go on serving with no worker. It reads the dataset
with the dataset format's reader and probes the GPU in a short-lived child (as the worker
does); the measuring code still runs only in the worker processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from pipetune.model.hardware import DEFAULT_GPU, gpu_keys
from pipetune.model.trials import RunnerKind
from pipetune.model.wire import TOKEN_ENV

RUNNERS: tuple[str, ...] = (RunnerKind.SIMULATED, RunnerKind.REPLAY, RunnerKind.CUPY)

# Each local worker is a whole Python process: a few per CPU, as `bench tuner --jobs` (more
# only contend; `--local-workers 100000` started one process after another, a fork bomb).
WORKERS_PER_CPU = 4


def max_local_workers() -> int:
    """The most worker processes `serve --local-workers` starts here: WORKERS_PER_CPU per
    CPU."""
    return WORKERS_PER_CPU * (os.cpu_count() or 1)


def local_workers_problem(n: int) -> str | None:
    """Why `n` cannot be the number of local workers (None when it can)."""
    most = max_local_workers()
    if not 0 <= n <= most:
        return f"must be within 0..{most} here ({WORKERS_PER_CPU} per CPU), got {n}"
    return None


def assign_gpus(n: int, gpus: list[str] | None = None) -> list[str]:
    """Round robin, the default GPU first: with one worker, what `pipetune tune` tunes for
    when it names no GPU has one (a100 first, in the registry's order, left such a task
    waiting for ever)."""
    gpus = gpus or gpu_keys()
    gpus = sorted(gpus, key=lambda g: g != DEFAULT_GPU)  # stable: the rest in their order
    return [gpus[i % len(gpus)] for i in range(n)]


def worker_gpus(n: int, runner: str, replay_gpu: str | None = None) -> list[str | None]:
    """The GPU each of n local workers stands in for (None: a cupy worker finds its own)."""
    if runner == RunnerKind.CUPY:
        return [None] * n
    if runner == RunnerKind.REPLAY and replay_gpu is not None:
        # A replay worker told another GPU than its dataset's refuses to start.
        return [replay_gpu] * n
    return list(assign_gpus(n))


def preflight(runner: str, dataset: Path | None = None) -> str | None:
    """Check that local workers of this runner can start here; for replay, the GPU the
    dataset was recorded on. Raises what the worker would fail with: DatasetError or
    OSError for a dataset that does not read (a usage mistake), DetectionError where CuPy
    finds no GPU the model knows (the machine, not the command line), RunnerSettingError for
    a variable of the environment the workers would refuse."""
    _check_worker_environment(runner)
    if runner == RunnerKind.REPLAY:
        from pipetune.workers.datasets import check_pipetune, load_dataset

        if dataset is None:
            raise ValueError("the replay runner needs a dataset")
        return check_pipetune(load_dataset(dataset)).gpu
    if runner == RunnerKind.CUPY:
        from pipetune.workers.daemon.gpu import detect_cupy

        detect_cupy(0)  # the device local cupy workers measure on (they get no --device)
    return None


def _check_worker_environment(runner: str) -> None:
    """The settings the workers read from the environment they inherit: RunnerSettingError
    naming the variable (each worker exited at once on it, the service serving with none)."""
    from pipetune.workers.runners.base import RunnerSettingError
    from pipetune.workers.runners.faults import FAULTS_ENV, fault_plan_problem
    from pipetune.workers.runners.simulated import time_scale_from_env

    if runner == RunnerKind.SIMULATED:
        time_scale_from_env()
    # Empty is unset, as for the worker's --simulate-faults (click ignores an empty
    # variable): `serve --local-workers` refused to start workers that took it.
    faults = os.environ.get(FAULTS_ENV)
    if faults and (problem := fault_plan_problem(runner, faults)):
        raise RunnerSettingError(f"{FAULTS_ENV}: {problem}")


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
    # The worker ends with this process, whatever ends it (a kill -9 included): otherwise
    # each restart of `serve` added its workers to the ones still polling.
    command += ["--parent-pid", str(os.getpid())]
    if dataset is not None:
        command += ["--dataset", str(dataset)]
    return command


def direct_to(server: str) -> dict[str, str]:
    """NO_PROXY (both spellings: the lower case one wins where both are set) with the
    server's host added to what the environment lists: a local worker talks to this machine,
    which a proxy the environment names cannot reach (`serve --host` on one of its own
    addresses; a loopback one is never proxied, clients/sdk/http.py)."""
    host = urlsplit(server).hostname or ""
    listed = os.environ.get("no_proxy", os.environ.get("NO_PROXY", ""))
    value = ",".join(part for part in (listed.strip(", "), host) if part)
    return {"NO_PROXY": value, "no_proxy": value}


def start_workers(
    n: int,
    server: str,
    token: str,
    runner: str,
    dataset: Path | None = None,
    replay_gpu: str | None = None,
) -> list[subprocess.Popen]:
    """Start n worker processes; replay_gpu: the replay dataset's GPU (from `preflight`).
    n is checked first (local_workers_problem): nothing starts for one out of bounds."""
    if problem := local_workers_problem(n):
        raise ValueError(f"local workers: {problem}")
    gpus = worker_gpus(n, runner, replay_gpu)
    host = os.uname().nodename
    processes = []
    for i, gpu in enumerate(gpus):
        name = f"local-{host}-{os.getpid()}-{i}-{gpu or runner}"
        command = worker_command(server, runner, gpu, name, dataset)
        # The token in the environment, not the command line (which `ps` shows everyone).
        env = {**os.environ, TOKEN_ENV: token, **direct_to(server)}
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
