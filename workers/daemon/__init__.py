"""The GPU worker daemon (`pipetune worker`): registers with the service, long-polls for
jobs of its arch, measures them with a runner (cupy | replay | simulated), reports the
results with retries, heartbeats, and drains on SIGTERM. It talks to the service only over
HTTP, through the SDK (clients.sdk)."""

from __future__ import annotations

import signal
import threading

from pipetune.workers.daemon.config import RUNNERS, TOKEN_ENV, WorkerConfig
from pipetune.workers.daemon.gpu import DetectionError, DeviceInfo
from pipetune.workers.daemon.logs import EventLog
from pipetune.workers.daemon.startup import open_runner
from pipetune.workers.daemon.worker import Worker, WorkerError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

__all__ = [
    "RUNNERS",
    "TOKEN_ENV",
    "DetectionError",
    "DeviceInfo",
    "EventLog",
    "Worker",
    "WorkerConfig",
    "WorkerError",
    "open_runner",
    "run_worker",
]


def run_worker(config: WorkerConfig, log: EventLog | None = None) -> int:
    """Build the runner, register, work until SIGTERM/SIGINT; the exit status (0 after a
    clean drain). Startup failures raise (DetectionError, RunnerError, the SDK's errors)."""
    log = log or EventLog(json_lines=config.json_logs)
    runner, device = open_runner(config)
    with runner:
        worker = Worker(config, runner, device, log)
        on_main = threading.current_thread() is threading.main_thread()
        previous = (
            {s: signal.signal(s, worker.signal_handler) for s in STOP_SIGNALS} if on_main else {}
        )
        try:
            return worker.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
