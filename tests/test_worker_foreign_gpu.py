"""A worker measures only its own GPU's jobs. Two processes under one --name shared one
worker row: the second registered it as an A100 worker while the first, an H100's, still
ran, and the first leased the A100 task's jobs and had its H100 timings recorded as the
A100's. The service now refuses that registration while the name is live (409,
tests/test_worker_release_route.py); a worker handed another GPU's jobs all the same (its
process was silent past the lease TTL while another took its name) hands them back."""

from __future__ import annotations

import io
from types import SimpleNamespace

from worker_support import OK, leased_job

from pipetune.workers.daemon import EventLog, WorkerConfig
from pipetune.workers.daemon.gpu import describe_model_gpu
from pipetune.workers.daemon.worker import Worker


class _ReleasingService:
    def __init__(self) -> None:
        self.released: list[tuple[int, str]] = []

    def release(self, worker_id, leases, timeout_s):  # type: ignore[no-untyped-def]
        self.released += [(h.job_id, h.lease_token) for h in leases]
        return [h.job_id for h in leases]


def test_a_job_of_another_gpu_is_handed_back_not_measured():
    api = _ReleasingService()
    log = io.StringIO()
    settings = {"server": "http://fake", "token": "t", "runner": "simulated", "gpu": "h100"}
    worker = Worker(
        WorkerConfig(**settings),  # type: ignore[arg-type]
        SimpleNamespace(name="simulated", only_workload=None),  # type: ignore[arg-type]
        describe_model_gpu("h100", "simulated"),
        EventLog(stream=log),
        api_factory=lambda: api,  # type: ignore[arg-type,return-value]
    )
    worker.worker_id = 7
    submitted: list[list[int]] = []
    worker._pool = SimpleNamespace(  # type: ignore[assignment]
        submit=lambda _fn, unit: submitted.append([j.job_id for j in unit])
    )
    worker._measure_one = lambda workload, schedule: OK  # type: ignore[method-assign]
    own, foreign = leased_job(1), leased_job(2).model_copy(update={"gpu": "a100"})
    with worker._slots:
        worker._hold([own, foreign])
    worker._hand_over([own, foreign], api)  # type: ignore[arg-type]
    assert api.released == [(2, "token-0002")]
    assert submitted == [[1]]
    assert worker.counts["another_gpus_job"] == 1 and worker._busy == 1
    assert "a job of the a100, and this worker measures the h100" in log.getvalue()
