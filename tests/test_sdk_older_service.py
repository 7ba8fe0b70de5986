"""A client asks an older service: a field that service does not know is a 422 there
(an unknown field in a request is refused), so the SDK sends a field added since only where
its value differs from the default the service would use anyway."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from pipetune.clients.sdk import Client
from pipetune.model.wire import TuneOptions
from pipetune.model.workloads import gemm

# What a service from before task priorities answered a "tune" or a task with "priority".
OLD_422 = {
    "field": "priority",
    "reason": "Extra inputs are not permitted",
    "detail": [{"loc": ["body", "priority"], "field": "priority", "type": "extra_forbidden"}],
}
TASK = {
    "id": 1,
    "state": "queued",
    "workload": {"op": "gemm", "m": 256, "n": 64, "k": 512},
    "gpu": "h100",
    "strategy": "auto",
    "budget": 3,
    "seed": 0,
    "batch_size": 8,
    "trials_done": 0,
    "trials_failed": 0,
    "trials_target": 3,
    "created_at": "2026-12-02T15:00:00Z",
    "updated_at": "2026-12-02T15:00:00Z",
}
SCHEDULE = {
    "throughput": 1.0,
    "throughput_unit": "TFLOP/s",
    "source": "model",
    "workload": TASK["workload"],
    "gpu": "h100",
    "schedule": {
        "block_row_warps": 2,
        "block_col_warps": 2,
        "warp_row_tiles": 1,
        "warp_col_tiles": 1,
        "chunk": 4,
        "smem_stages": 5,
        "reg_stages": 2,
    },
    "schedule_id": "s-2-2-1-1-4-5-2",
    "latency_us": None,
    "predicted_us": 4.0,
    "task_id": 1,
}


def _older_service(sent: list[dict[str, Any]]) -> Client:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if "priority" in body or "priority" in body.get("tune", {}):
            return httpx.Response(422, json=OLD_422)
        return httpx.Response(200, json=SCHEDULE if "tune" in body else TASK)

    return Client("http://service", transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.tune(gemm(256, 64, 512), "h100", budget=3),
        lambda c: c.schedule_and_tune(gemm(256, 64, 512), "h100", TuneOptions(budget=3)),
    ],
    ids=["tune", "schedule_and_tune"],
)
def test_the_default_priority_is_not_sent(call):
    """schedule_and_tune sent `"priority": 1` in its "tune" (TuneOptions' default), and a
    service that predates priorities answered 422 to a request that asked nothing new."""
    sent: list[dict[str, Any]] = []
    call(_older_service(sent))
    assert sent and all("priority" not in {**b, **b.get("tune", {})} for b in sent)


def test_a_priority_asked_for_is_sent():
    sent: list[dict[str, Any]] = []
    client = _older_service(sent)
    with pytest.raises(Exception, match="priority"):
        client.schedule_and_tune(gemm(256, 64, 512), "h100", TuneOptions(budget=3, priority=3))
    with pytest.raises(Exception, match="priority"):
        client.tune(gemm(256, 64, 512), "h100", budget=3, priority=3)
    assert sent[0]["tune"]["priority"] == 3 and sent[1]["priority"] == 3


def test_a_worker_api_leaves_request_ids_out_once_a_service_refuses_them():
    """A worker daemon of now against a service from before request ids: the request is
    sent again without the id (and from then on without), not refused forever."""
    from pipetune.clients.sdk.worker_api import WorkerApi
    from pipetune.model.wire import new_request_id

    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if "request_id" in body:
            refused = {**OLD_422, "field": "request_id"}
            refused["detail"] = [{**OLD_422["detail"][0], "loc": ["body", "request_id"]}]
            return httpx.Response(422, json=refused)
        return httpx.Response(200, json={"jobs": []})

    api = WorkerApi("http://old", "t", transport=httpx.MockTransport(answer))
    assert api.lease(3, max_jobs=2, wait_s=0, request_id=new_request_id()) == []
    assert api.lease(3, max_jobs=2, wait_s=0, request_id=new_request_id()) == []
    assert ["request_id" in body for body in sent] == [True, False, False]
    assert api.lease(3, wait_s=0) == [] and "request_id" not in sent[-1]  # none: never sent
    rid = new_request_id()
    assert api.lease(3, wait_s=0, request_id=rid, retry=True) == []
    assert not {"request_id", "retry"} & set(sent[-1])


def test_a_worker_api_sends_retry_only_on_a_retry():
    from pipetune.clients.sdk.worker_api import WorkerApi

    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"jobs": []})

    api = WorkerApi("http://new", "t", transport=httpx.MockTransport(answer))
    api.lease(3, wait_s=0, request_id="lease-0001")
    api.lease(3, wait_s=0, request_id="lease-0001", retry=True)
    api.lease(3, wait_s=0)
    assert [(b.get("request_id"), b.get("retry")) for b in sent] == [
        ("lease-0001", None),
        ("lease-0001", True),
        (None, None),
    ]
