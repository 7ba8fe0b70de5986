"""`make demo`: the main job end to end on the embedded defaults.

1. start `pipetune serve` on a fresh SQLite database in a temporary directory, with three
   local workers: `--runner cupy` when `nvidia-smi` finds a GPU and CuPy is installed, else
   `--runner simulated` (the analytical model plus noise, at
   PIPETUNE_SIMULATED_TIME_SCALE=0.05 so the demo takes seconds);
2. wait for /healthz;
3. ask for the best schedule of ALCOP's MM_RN50_FC (gemm 1024x64x2048 on H100) before
   tuning (the model's pick), tune it with a budget of 16 trials (`pipetune tune ... --wait`)
   and ask again (now the best measured trial);
4. with simulated workers (one per GPU), tune the same GEMM on H200 warm-started from what
   the H100 task measured (`--prior-gpu h100`: transfer between GPUs);
5. tune a memory-intensive operator the same way (BERT-base's attention softmax at batch 8,
   sequence 128: the second kernel family, whose throughput is GB/s);
6. print the dashboard URL, stop the service with SIGTERM and check that it exited cleanly.

    python -m pipetune.clients.demo [--budget 16] [--runner auto|cupy|simulated] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pipetune.clients.local_service import LocalService, ServiceStartError, pipetune_command
from pipetune.model.hardware import gpu_keys
from pipetune.service.settings import sqlite_url
from pipetune.service.worker_token import generated_worker_token

WORKLOAD = ["gemm", "--m", "1024", "--n", "64", "--k", "2048", "--gpu", "h100"]
# model/operators.py's Softmax_BERT_b8_s128: rows = batch 8 x 12 heads x seq 128, cols = seq.
SOFTMAX = ["softmax", "--rows", "12288", "--cols", "128", "--gpu", "h100"]
DEMO_TIME_SCALE = "0.05"


def gpu_present() -> bool:
    """A GPU the cupy runner can use: nvidia-smi lists one and CuPy is installed."""
    exe = shutil.which("nvidia-smi")
    if exe is None or importlib.util.find_spec("cupy") is None:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_cli(args: list[str], server: str) -> int:
    command = [*pipetune_command(), *args, "--server", server]
    print("$ pipetune " + " ".join(args), flush=True)
    return subprocess.run(command).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipetune.clients.demo", description=__doc__)
    parser.add_argument("--budget", type=int, default=16, help="trials to tune (default 16)")
    parser.add_argument("--runner", choices=("auto", "cupy", "simulated"), default="auto")
    parser.add_argument("--workers", type=int, default=3, help="local workers (default 3)")
    parser.add_argument(
        "--keep", action="store_true", help="keep serving after the demo, until Ctrl-C"
    )
    args = parser.parse_args(argv)
    runner = args.runner
    if runner == "auto":
        runner = "cupy" if gpu_present() else "simulated"
    gpus = gpu_keys()
    if runner == "simulated" and args.workers < len(gpus):
        # Simulated workers are spread over the GPUs round robin (service/local_workers.py):
        # with fewer, a GPU the demo tunes for (the H100, then the H200) would have none and
        # the demo would wait.
        parser.error(f"--workers: at least {len(gpus)} with simulated workers (one per GPU: "
                     f"{', '.join(gpus)})")  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="pipetune-demo-"))
    # A worker token of the demo's own, in its work dir: serve would otherwise generate one
    # in the user's data dir, the one thing the demo left outside its temporary directory.
    token, _ = generated_worker_token(workdir / "worker-token")
    env = {
        "PIPETUNE_SIMULATED_TIME_SCALE": os.environ.get(
            "PIPETUNE_SIMULATED_TIME_SCALE", DEMO_TIME_SCALE
        ),
        "PIPETUNE_WORKER_TOKENS": token,
    }
    service = LocalService(
        sqlite_url(workdir / "pipetune.db"),
        workdir / "serve.log",
        extra_args=["--local-workers", str(args.workers), "--runner", runner],
        env=env,
    )
    what = (
        "cupy: real GPU measurements"
        if runner == "cupy"
        else "simulated: analytical model + noise, not measurements"
    )
    say(f"starting pipetune serve on {service.url} with {args.workers} local {runner} workers")
    print(f"   ({what}; database, log and worker token in {workdir})", flush=True)
    status = 1
    try:
        service.start(timeout_s=90)
        say("the best schedule before tuning (the analytical model's pick)")
        if run_cli(["schedule", *WORKLOAD], service.url) != 0:
            return 1
        say(f"tuning MM_RN50_FC with a budget of {args.budget} trials")
        tune = ["tune", *WORKLOAD, "--budget", str(args.budget), "--wait"]
        if run_cli(tune, service.url) != 0:
            print(service.log_tail(), file=sys.stderr)
            return 1
        say("the best schedule after tuning (the best trial the workers reported)")
        if run_cli(["schedule", *WORKLOAD], service.url) != 0:
            return 1
        if runner == "simulated":  # (a cupy demo has workers for this machine's GPU only)
            say("the same GEMM on H200, warm-started from the H100 task's trials")
            warm = [*WORKLOAD[:-1], "h200", "--prior-gpu", "h100"]
            if run_cli(["tune", *warm, "--budget", str(args.budget), "--wait"], service.url):
                print(service.log_tail(), file=sys.stderr)
                return 1
        say(f"tuning a memory-intensive operator (BERT's attention softmax), {args.budget} trials")
        tune = ["tune", *SOFTMAX, "--budget", str(args.budget), "--wait"]
        if run_cli(tune, service.url) != 0:
            print(service.log_tail(), file=sys.stderr)
            return 1
        say("the workers that measured them (live; `exited` once stopped)")
        if run_cli(["workers"], service.url) != 0:
            return 1
        say(f"dashboard: {service.url}/dashboard")
        if args.keep:
            print("serving until Ctrl-C", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                service.process.wait()  # type: ignore[union-attr]
        status = 0
    except ServiceStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        # Stop first: printing can fail (a closed pipe) and must not leave the service up.
        code = service.stop()
        say("stopped the service (SIGTERM)")
        if code in (0, -signal.SIGTERM):  # uvicorn re-raises the SIGTERM it handled
            print("   stopped cleanly", flush=True)
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"   the service exited with {code}; its log: {workdir / 'serve.log'}")
            print(service.log_tail(), file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
