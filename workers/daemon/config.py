"""The worker's settings (what `pipetune worker` options and environment give it)."""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from pipetune.clients.sdk.http import header_value_problem
from pipetune.model.trials import RunnerKind
from pipetune.model.wire import (
    MAX_HELD_LEASES,
    MAX_JOBS_PER_LEASE,
    MAX_LEASE_WAIT_S,
    MAX_SECONDS,
    MAX_WORKER_NAME,
    TOKEN_ENV,
)
from pipetune.workers.runners.faults import fault_plan_problem

RUNNERS: tuple[str, ...] = tuple(RunnerKind)


def default_name(runner: str) -> str:
    # Host and pid: several workers on one machine (one per GPU) stay distinguishable.
    return f"{socket.gethostname()}-{runner}-{os.getpid()}"[:MAX_WORKER_NAME]


# MAX_SECONDS (model.wire) is the longest wait the worker's threads and pipes can be given:
# past threading.TIMEOUT_MAX (about 9.2e9 s) Event.wait overflowed, killing the heartbeat
# thread, and every trial's wait for the measuring child failed (1e12 meant as "no limit").


# A worker holds up to concurrency + lease_ahead leases and lists them all in each heartbeat,
# which the service takes up to MAX_HELD_LEASES at a time: with more, every heartbeat was
# refused (422) and every held lease expired under the worker.
MAX_CONCURRENCY = MAX_HELD_LEASES - MAX_JOBS_PER_LEASE


def _check_seconds(flag: str, value: float, *, zero_ok: bool) -> None:
    """A ValueError naming `flag` unless `value` is a finite number of seconds, > 0 (or >= 0
    with `zero_ok`: no retrying at all), at most MAX_SECONDS."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "at least 0" if zero_ok else "more than 0"
        raise ValueError(f"{flag}: must be a finite number of seconds, {bound}, got {value:g}")
    if value > MAX_SECONDS:
        raise ValueError(f"{flag}: at most {MAX_SECONDS:g} s (a week), got {value:g}")


# The operator's bounds on the intervals (`pipetune worker` options), checked where an
# operator gives them (check_operator_intervals, the CLI): WorkerConfig itself takes any
# positive value, so that tests run the daemon in-process at a hundredth of a second.
# --heartbeat: the heartbeat thread's wake-ups. Each may send one (an idle worker's every
# sixth, a busy one's whenever a lease is due, every one to a service that does not say its
# TTLs): at 1e-9 s the thread spun and sent them flat out. At most half the service's default
# lease TTL (120 s): leases are extended, and a cancelled task's jobs learned of, at wake-ups;
# the worker wakes every quarter of a shorter TTL the service says of itself anyway.
MIN_HEARTBEAT_S = 0.5
MAX_HEARTBEAT_S = 60.0
# --lease-wait: how long an idle worker's lease request waits for jobs at the service before
# it asks again: at a few milliseconds, one request after another (at most MAX_LEASE_WAIT_S,
# the longest the service holds one).
MIN_LEASE_WAIT_S = 1.0


def check_operator_intervals(heartbeat_s: float, lease_wait_s: float) -> None:
    """A ValueError naming the option where --heartbeat or --lease-wait is out of the
    operator's bounds (above). A non-finite --heartbeat is left to WorkerConfig's message."""
    if math.isfinite(heartbeat_s) and not MIN_HEARTBEAT_S <= heartbeat_s <= MAX_HEARTBEAT_S:
        why = (
            "the heartbeat thread wakes that often, and a wake-up may send one"
            if heartbeat_s < MIN_HEARTBEAT_S
            else "half the service's default lease TTL of 120 s: leases are extended at wake-ups"
        )
        raise ValueError(
            f"--heartbeat: must be within {MIN_HEARTBEAT_S:g}..{MAX_HEARTBEAT_S:g} s ({why}), "
            f"got {heartbeat_s:g}"
        )
    if not MIN_LEASE_WAIT_S <= lease_wait_s <= MAX_LEASE_WAIT_S:
        if not math.isfinite(lease_wait_s):
            why = "a finite number of seconds"
        elif lease_wait_s < MIN_LEASE_WAIT_S:
            why = "an idle worker sends a lease request that often"
        else:
            why = "the longest the service holds a lease request"
        raise ValueError(
            f"--lease-wait: must be within {MIN_LEASE_WAIT_S:g}..{MAX_LEASE_WAIT_S:g} s "
            f"({why}), got {lease_wait_s:g}"
        )


@dataclass(frozen=True)
class WorkerConfig:
    server: str
    token: str
    runner: str = "cupy"
    gpu: str | None = None  # required for simulated/replay; checked against the device for cupy
    dataset: Path | None = None  # replay only
    concurrency: int = 1
    # Jobs leased ahead, beyond the ones being measured: they wait here, so the GPU never
    # waits on the network for its next trial (their leases are heartbeated like the rest).
    lease_ahead: int = 2
    name: str = field(default="")
    device: int = 0  # CUDA device index (cupy)
    heartbeat_s: float = 5.0
    lease_wait_s: float = 10.0
    register_timeout_s: float = 60.0  # keep trying to reach the service this long at start
    result_retry_s: float = 900.0  # keep retrying one result this long
    trial_timeout_s: float = 60.0  # a trial with no answer by then is a timeout
    # simulated only: rehearse GPU faults (workers.runners.faults), e.g. "crash=0.2,hang=0.1"
    simulate_faults: str | None = None
    json_logs: bool = False
    # Stop when this process is no longer the worker's parent (it died: `serve
    # --local-workers` passes its own pid, so that its workers end with it, even on a kill -9).
    parent_pid: int | None = None

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError(f"--token: give the worker token (or set {TOKEN_ENV})")
        # Refused here, exit 2: the first request refused it in a thread (a traceback, exit 0).
        if problem := header_value_problem(self.token):
            raise ValueError(f"--token: {problem}")
        if self.runner not in RUNNERS:
            raise ValueError(f"--runner: must be one of {', '.join(RUNNERS)}, got {self.runner!r}")
        if self.runner in (RunnerKind.SIMULATED, RunnerKind.REPLAY) and not self.gpu:
            raise ValueError(
                f"--gpu: a {self.runner} worker must be told which GPU it stands in for "
                "(h100, h200, a100)"
            )
        if self.runner == RunnerKind.REPLAY and self.dataset is None:
            raise ValueError("--dataset: a replay worker needs the dataset file to answer from")
        if self.runner != RunnerKind.REPLAY and self.dataset is not None:
            raise ValueError("--dataset: only a replay worker reads a dataset")
        if self.simulate_faults is not None and (
            problem := fault_plan_problem(self.runner, self.simulate_faults)
        ):
            raise ValueError(f"--simulate-faults: {problem}")
        # Each duration must be finite: NaN compares false with every bound (a NaN register
        # timeout never gave up), and an infinite heartbeat or timeout stalls the worker.
        _check_seconds("--trial-timeout", self.trial_timeout_s, zero_ok=False)
        _check_seconds("--heartbeat", self.heartbeat_s, zero_ok=False)
        _check_seconds("--register-timeout", self.register_timeout_s, zero_ok=True)
        _check_seconds("--result-retry", self.result_retry_s, zero_ok=True)
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(
                f"--concurrency: must be within 1..{MAX_CONCURRENCY}, got {self.concurrency}"
            )
        if not 0 <= self.lease_ahead <= MAX_JOBS_PER_LEASE:
            raise ValueError(
                f"--lease-ahead: must be within 0..{MAX_JOBS_PER_LEASE}, got {self.lease_ahead}"
            )
        if not 0 <= self.lease_wait_s <= MAX_LEASE_WAIT_S:
            raise ValueError(f"--lease-wait: must be within 0..{MAX_LEASE_WAIT_S:g} s")
        if self.parent_pid is not None and self.parent_pid < 1:
            raise ValueError(f"--parent-pid: must be a process id, got {self.parent_pid}")
        # Refused here, exit 2: the registration refused it, a pydantic ValidationError of
        # several lines and exit 1.
        if self.name and not self.name.strip():
            raise ValueError("--name: must not be blank")
        if len(self.name) > MAX_WORKER_NAME:
            raise ValueError(f"--name: at most {MAX_WORKER_NAME} characters, got {len(self.name)}")
        if not self.name:
            object.__setattr__(self, "name", default_name(self.runner))
