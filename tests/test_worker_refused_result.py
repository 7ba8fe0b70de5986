"""A result the service refuses as invalid (422: a runner's answer it cannot store) ends its
job: the worker reports, once, a failed trial saying why in its place. Before, the worker
dropped the result and forgot the job, which stayed leased until its TTL ran out, was leased
again (to the same worker), measured and refused again, and was recorded `lost` after
max_attempts TTLs, the reason nowhere."""

from __future__ import annotations

from pathlib import Path

import httpx
from service_support import live_server
from worker_support import leased_job, run_in_thread, simulated_daemon, wait_until

from pipetune.clients.sdk import InvalidRequestError
from pipetune.model.trials import MeasureResult
from pipetune.model.wire import JobResult, ResultAck
from pipetune.service.migrate import upgrade

# A median that is none of its repeats': the service refuses it (queue.check_storable).
UNSTORABLE = MeasureResult(
    status="ok", latency_us=5.0, samples_us=[100.0, 110.0], runner="simulated"
)


def test_a_result_refused_as_invalid_is_recorded_as_a_failed_trial_saying_why(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    upgrade(url)
    with live_server(url) as base, httpx.Client(base_url=base, timeout=30) as client:
        worker = simulated_daemon(base, lease_wait_s=1)
        measured: list[int] = []
        worker._measure_one = lambda workload, schedule: measured.append(1) or UNSTORABLE  # type: ignore[method-assign]
        thread, status = run_in_thread(worker)
        try:
            body = {
                "workload": {"op": "gemm", "m": 64, "n": 64, "k": 64},
                "gpu": "h100",
                "budget": 1,
                "strategy": "grid",
            }
            task = client.post("/v1/tasks", json=body).json()["id"]

            def finished() -> dict | None:
                doc = client.get(f"/v1/tasks/{task}").json()
                return doc if doc["state"] == "done" else None

            assert wait_until(lambda: finished() is not None, timeout_s=15)
            (trial,) = client.get(f"/v1/tasks/{task}/trials").json()["trials"]
        finally:
            worker.request_stop()
            thread.join(15)
    assert not thread.is_alive() and status == [0]
    assert measured == [1]  # measured once: the job was not leased again
    assert trial["state"] == "failed" and trial["status"] == "runtime_error", trial
    assert "the service refused the result measured (ok, 5 us)" in trial["error"]
    assert "latency_us: must lie within the timed repeats" in trial["error"]
    assert worker.counts["refused"] == 1 and worker.counts["accepted"] == 1


class RefusingApi:
    """The single-result route, refusing as invalid every result (`refuse_all`) or only the
    measured one (ok), taking the failed trial reported in its place."""

    base_url = "http://fake"

    def __init__(self, refuse_all: bool) -> None:
        self.refuse_all = refuse_all
        self.posted: list[MeasureResult] = []

    def post_result(self, job_id: int, body: JobResult) -> ResultAck:
        self.posted.append(body.result)
        if self.refuse_all or body.result.ok:
            raise InvalidRequestError(422, "result.latency_us: must lie within the repeats")
        return ResultAck(accepted=True, job_state="failed")


def test_a_failed_trial_refused_in_its_turn_is_not_sent_again():
    """At most two requests a result: never a loop, whatever the service refuses."""
    api = RefusingApi(refuse_all=True)
    worker = simulated_daemon("http://fake", api)
    worker.worker_id = 7
    worker._report(api, leased_job(1), UNSTORABLE)  # type: ignore[arg-type]
    assert [r.status for r in api.posted] == ["ok", "runtime_error"]
    assert worker.counts["refused"] == 2 and "accepted" not in worker.counts
    accepting = RefusingApi(refuse_all=False)
    worker._report(accepting, leased_job(2), UNSTORABLE)  # type: ignore[arg-type]
    assert [r.status for r in accepting.posted] == ["ok", "runtime_error"]
    assert worker.counts["accepted"] == 1


def test_a_field_the_service_does_not_know_fails_no_trial():
    """A service older than the worker (a field it does not know, `extra_forbidden`) has not
    judged the measurement: no failed trial is recorded in its place (the job is left to its
    lease, and recorded once the service is upgraded, as the README's upgrade order says)."""
    api = RefusingApi(refuse_all=True)
    detail = [{"loc": ["body", "result", "generator_revision"], "type": "extra_forbidden"}]

    def refuse_unknown(job_id: int, body: JobResult) -> ResultAck:
        api.posted.append(body.result)
        raise InvalidRequestError(
            422,
            "Extra inputs are not permitted",
            field="generator_revision",
            body={"field": "generator_revision", "detail": detail},
        )

    api.post_result = refuse_unknown  # type: ignore[method-assign]
    worker = simulated_daemon("http://fake", api)
    worker.worker_id = 7
    worker._report(api, leased_job(1), UNSTORABLE)  # type: ignore[arg-type]
    assert [r.status for r in api.posted] == ["ok"] and worker.counts["refused"] == 1
