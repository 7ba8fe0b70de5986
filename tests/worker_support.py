"""What the worker daemon's tests with a fake service share: a registration answer, a leased
job, a trial's result, the worker run in a thread and a bounded wait."""

from __future__ import annotations

import datetime as dt
import io
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobLease, ScheduleDoc
from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import Worker

OK = MeasureResult(status="ok", latency_us=5.0)
# What the fake's POST /v1/workers answers.
REGISTERED = SimpleNamespace(
    id=7, name="w", gpu="h100", arch="sm_90", runner="simulated", name_in_use=None
)


def leased_job(i: int) -> JobLease:
    """Job i of task 1 (trial i), leased under token-000i: a GEMM 64x64x64 on the H100."""
    return JobLease(
        job_id=i,
        lease_token=f"token-{i:04d}",
        lease_expires_at=dt.datetime.now(dt.UTC),
        lease_ttl_s=120.0,
        task_id=1,
        trial=i,
        workload={"op": "gemm", "m": 64, "n": 64, "k": 64},
        gpu="h100",
        schedule=ScheduleDoc(
            block_row_warps=2, block_col_warps=2, warp_row_tiles=2, warp_col_tiles=2,
            chunk=2, smem_stages=3, reg_stages=2,
        ),
    )  # fmt: skip


def run_in_thread(worker: Worker) -> tuple[threading.Thread, list[int]]:
    """worker.run() in a thread (as `pipetune worker`'s main thread runs it); its status."""
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(worker.run()), daemon=True)
    thread.start()
    return thread, status


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Whether `condition` came true within `timeout_s` (polled every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def simulated_daemon(server: str, api: object | None = None, **config: object) -> Worker:
    """A worker daemon of an H100 with a stand-in simulated runner (its trials are the test's
    to answer), on `server` with the tests' token, or on the fake `api` where given; `config`:
    WorkerConfig's other fields."""
    from service_support import TOKEN

    settings = {"server": server, "token": TOKEN, "runner": "simulated", "gpu": "h100"}
    return Worker(
        WorkerConfig(**{**settings, **config}),  # type: ignore[arg-type]
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=io.StringIO()),
        api_factory=None if api is None else (lambda: api),  # type: ignore[arg-type,return-value]
    )
