"""Benchmark: how a tuning task's batches spread over a fleet of worker daemons, with and
without leasing ahead (SIMULATED trials: the wall time is the model's kernel time scaled, not a
measurement).

    python -m benchmarks.bench_lease_ahead [--workers 8] [--budget 32] [--strategy bo]
        [--lease-ahead 2,0] [--replicas 1] [--repeats 2] [--time-scale 1] [--json]

A model-guided task proposes a batch (8 trials) when the one before is complete, so a batch
finishes with its slowest worker: with as many idle workers as trials, each should measure
one. This starts `pipetune serve` (on SQLite; with `--replicas 2`, two replicas on a fresh
PostgreSQL database, `--pg` its server), `--workers` worker daemons (`pipetune worker --runner
simulated --gpu h200 --lease-ahead N`, spread over the replicas; a trial takes
PIPETUNE_SIMULATED_TIME_SCALE=`--time-scale` times what a real one would, about a second), and
runs one task of `--budget` trials on a GEMM, once per lease-ahead value per repeat (the values
taking turns). Per run: the task's wall time from its creation until it is done, and for each
batch (trials in proposal order, `batch_size` a batch) how many workers measured it and the
most of its trials one worker measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from benchmarks.harness import DEFAULT_PG, TOKEN, pg_database, service_process
from pipetune.clients.sdk import Client
from pipetune.model.wire import TOKEN_ENV
from pipetune.model.workloads import Gemm
from pipetune.service.local_workers import stop_workers, worker_command
from pipetune.service.migrate import upgrade
from pipetune.service.settings import sqlite_url
from pipetune.tuner.strategies import STRATEGIES
from pipetune.workers.runners import TIME_SCALE_ENV

GPU = "h200"
WORKLOAD = Gemm(m=1024, n=64, k=1152)
REGISTER_TIMEOUT_S = 60.0
TASK_TIMEOUT_S = 600.0


def _worker(
    server: str, name: str, lease_ahead: int, time_scale: float, log: Path
) -> subprocess.Popen[bytes]:
    """One simulated worker daemon, its output in `log`: the command `serve --local-workers`
    runs (service/local_workers.py), with the lease-ahead asked for."""
    command = worker_command(server, "simulated", GPU, name)
    command += ["--lease-ahead", str(lease_ahead)]
    env = {
        **_base_env(),
        TOKEN_ENV: TOKEN,  # (in the environment: a command line is shown to everyone)
        TIME_SCALE_ENV: f"{time_scale:g}",
    }
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def _base_env() -> dict[str, str]:
    """This shell's environment without its PIPETUNE_* settings (the benchmark's own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIPETUNE_")}


@contextlib.contextmanager
def _database(replicas: int, pg_admin_url: str, directory: Path) -> Iterator[str]:
    if replicas == 1:
        url = sqlite_url(directory / "pipetune.db")
        upgrade(url)
        yield url
        return
    with pg_database(pg_admin_url) as url:
        upgrade(url)
        yield url


def run_once(
    workers: int,
    budget: int,
    strategy: str,
    lease_ahead: int,
    replicas: int,
    time_scale: float,
    pg_admin_url: str = DEFAULT_PG,
) -> dict[str, object]:
    """One task on a fresh service and fleet: its wall time and each batch's spread. The
    run's folder (the database, the logs) is removed once it succeeded, kept where not."""
    directory = Path(tempfile.mkdtemp(prefix="bench-lease-ahead-"))
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(_database(replicas, pg_admin_url, directory))
        services = [
            stack.enter_context(service_process(url, directory / f"serve-{r}.log", {}))
            for r in range(replicas)
        ]
        procs = [
            _worker(
                services[i % replicas].url,
                f"w{i}",
                lease_ahead,
                time_scale,
                directory / f"worker-{i}.log",
            )
            for i in range(workers)
        ]
        stack.callback(stop_workers, procs)
        client = stack.enter_context(Client(services[0].url))
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while len(client.workers("live")) < workers:
            if time.monotonic() > deadline:
                raise SystemExit(f"the workers did not register (logs in {directory})")
            time.sleep(0.1)
        started = time.monotonic()
        task = client.tune(WORKLOAD, GPU, budget=budget, strategy=strategy)  # type: ignore[arg-type]
        done = client.wait(task.id, poll_s=0.05, timeout_s=TASK_TIMEOUT_S)
        wall_s = time.monotonic() - started
        trials = client.all_trials(task.id)
    shutil.rmtree(directory, ignore_errors=True)
    batch = done.batch_size or budget
    spread: dict[int, Counter[str]] = {}
    for trial in trials:
        spread.setdefault(trial.trial // batch, Counter())[trial.worker or "?"] += 1
    return {
        "strategy": strategy,
        "lease_ahead": lease_ahead,
        "workers": workers,
        "replicas": replicas,
        "budget": budget,
        "state": str(done.state),
        "trials_done": done.trials_done,
        "batch_size": batch,
        "wall_s": round(wall_s, 3),
        "workers_per_batch": [len(spread[b]) for b in sorted(spread)],
        # The most trials of each batch that one worker measured: the batch lasts as long as
        # that worker's trials take.
        "most_per_worker": [max(spread[b].values()) for b in sorted(spread)],
        "simulated": True,
    }


def _counts(option: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{option} must be integers separated by commas") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{option} must not be negative")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--strategy", default="bo", choices=STRATEGIES)
    parser.add_argument("--lease-ahead", type=lambda t: _counts("--lease-ahead", t), default=[2, 0])
    parser.add_argument("--replicas", type=int, default=1, choices=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL admin URL (--replicas 2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args(argv)
    for option in ("workers", "budget", "repeats"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be at least 1")
    if not 0 <= args.time_scale <= 100:
        parser.error("--time-scale must be within 0..100")
    for _ in range(args.repeats):
        for ahead in args.lease_ahead:
            run = run_once(
                args.workers,
                args.budget,
                args.strategy,
                ahead,
                args.replicas,
                args.time_scale,
                args.pg,
            )
            if args.json:
                print(json.dumps(run), flush=True)
            else:
                print(
                    f"SIMULATED {run['strategy']}, {run['workers']} workers, "
                    f"{run['replicas']} replica(s), lease-ahead {run['lease_ahead']}: "
                    f"{run['wall_s']:.2f} s, workers per batch {run['workers_per_batch']}, "
                    f"the most trials of a batch on one worker {run['most_per_worker']} "
                    f"({run['trials_done']} trials, {run['state']})",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
