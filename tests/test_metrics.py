"""/metrics through prometheus_client: the service's counters, and the database's gauges
read at scrape time by a custom collector (the same figures from every replica)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from service_support import (
    client_for,
    create_task,
    drain,
    fake_latency,
    lease,
    metric_value,
    ok,
    register,
    service_of,
)

pytest_plugins = ["service_fixtures"]


def test_the_exposition_parses_and_its_gauges_follow_the_database(client):
    worker = register(client)
    create_task(client, budget=4, strategy="grid")
    lease(client, worker, max_jobs=1)
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["pipetune_queue_depth"].type == "gauge"
    assert families["pipetune_jobs_leased"].type == "counter"  # ..._total samples
    assert not any(s.name.endswith("_created") for f in families.values() for s in f.samples)
    assert metric_value(text, "pipetune_queue_depth", gpu="h100") == 3.0
    assert metric_value(text, "pipetune_leases_active", gpu="h100") == 1.0
    assert metric_value(text, "pipetune_tasks", state="running") == 1.0  # one job leased
    assert metric_value(text, "pipetune_workers_registered", gpu="h100", runner="simulated") == 1.0
    assert metric_value(text, "pipetune_jobs_leased_total", gpu="h100") == 1.0
    # Another worker takes the rest: the gauges are read afresh at the next scrape.
    other = register(client, name="w2")
    lease(client, other, max_jobs=3)
    text = client.get("/metrics").text
    # An empty queue reads 0, not "no data" (the series vanished when the queue emptied).
    assert metric_value(text, "pipetune_queue_depth", gpu="h100") == 0.0
    assert metric_value(text, "pipetune_leases_active", gpu="h100") == 4.0
    assert metric_value(text, "pipetune_workers_registered", gpu="h100", runner="simulated") == 2.0
    assert metric_value(text, "pipetune_workers_live", gpu="h100", runner="simulated") == 2.0
    # Every GPU and task state has a sample.
    assert metric_value(text, "pipetune_queue_depth", gpu="a100") == 0.0
    assert metric_value(text, "pipetune_tasks", state="cancelled") == 0.0
    assert metric_value(text, "pipetune_database_up") == 1.0


def test_a_worker_silent_past_the_lease_ttl_is_registered_but_not_live(db_url):
    """Worker rows are kept (a restarted worker registers again): the registered count grew
    with every restart and said nothing of how many workers were alive."""
    from sqlalchemy import update

    from pipetune.service.orm import WorkerRow

    with client_for(db_url) as client:
        gone, alive = register(client, name="gone"), register(client, name="alive")
        db = service_of(client).db
        with db.write() as s:
            s.execute(
                update(WorkerRow)
                .where(WorkerRow.id == gone)
                .values(last_heartbeat=db.now_plus(-3600.0))
            )
        text = client.get("/metrics").text
        assert (
            metric_value(text, "pipetune_workers_registered", gpu="h100", runner="simulated") == 2.0
        )
        assert metric_value(text, "pipetune_workers_live", gpu="h100", runner="simulated") == 1.0
        assert alive != gone


def test_the_scrape_answers_while_the_database_cannot_be_reached(client, monkeypatch):
    """The replica's own counters stay readable, and the database's state is said: the
    scrape answered 503 whole, so a replica whose database was down looked down itself."""
    from sqlalchemy.exc import OperationalError

    register(client)
    db = service_of(client).db

    def unreachable():
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    monkeypatch.setattr(db, "read", unreachable)
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert metric_value(response.text, "pipetune_database_up") == 0.0
    assert metric_value(response.text, "pipetune_queue_depth", gpu="h100") is None
    # The replica's own series are still there (its request latency, counted in process).
    assert "pipetune_http_request_duration_seconds_count" in response.text


def test_the_cpu_spent_proposing_is_counted_per_strategy(client):
    """A model-guided task's proposals (the first batch at creation, then an advance) add
    their thread CPU time under the strategy the task asked for; another strategy's count is
    its own."""
    name = "pipetune_proposal_cpu_seconds_total"
    assert metric_value(client.get("/metrics").text, name, strategy="auto") is None
    create_task(client, budget=16, strategy="auto")
    created = metric_value(client.get("/metrics").text, name, strategy="auto")
    assert created is not None and created > 0
    worker = register(client)
    drain(client, worker, lambda job: ok(fake_latency(job["schedule"])))
    text = client.get("/metrics").text
    assert metric_value(text, name, strategy="auto") > created
    assert metric_value(text, name, strategy="random") is None


def test_simulated_workers_and_results_are_counted_apart_from_gpus(client):
    """A simulated worker stands in for a GPU it does not have: the worker gauges counted it
    with the real ones (a fleet of simulations read as GPUs), and results had no label that
    told the analytical model's latencies from measured ones."""
    from service_support import post_result

    simulated = register(client, name="sim")
    gpu = register(client, name="gpu", runner="cupy")
    create_task(client, budget=4, strategy="grid")
    post_result(client, simulated, lease(client, simulated)[0], ok(10.0))
    post_result(client, gpu, lease(client, gpu)[0], {**ok(12.0), "runner": "cupy"})
    text = client.get("/metrics").text
    for gauge in ("pipetune_workers_registered", "pipetune_workers_live"):
        assert metric_value(text, gauge, gpu="h100", runner="simulated") == 1.0
        assert metric_value(text, gauge, gpu="h100", runner="cupy") == 1.0
        assert metric_value(text, gauge, gpu="a100", runner="replay") == 0.0  # every pair
    recorded = {"status": "ok", "accepted": "true", "recorded": "true"}
    results = "pipetune_results_total"
    assert metric_value(text, results, **recorded, simulated="true") == 1.0
    assert metric_value(text, results, **recorded, simulated="false") == 1.0


def test_a_request_of_any_other_method_is_counted_as_other(client):
    """Each method the HTTP parser takes (some thirty: PROPFIND, MKCOL, ...) x route x status
    was a series of its own, kept for good: anyone could grow /metrics without a credential."""
    for method in ("PROPFIND", "MKCOL", "PURGE"):
        assert client.request(method, "/v1/tasks").status_code == 405
    text = client.get("/metrics").text
    assert 'method="PROPFIND"' not in text and 'method="MKCOL"' not in text
    count = "pipetune_http_request_duration_seconds_count"
    assert metric_value(text, count, method="other", route="/v1/tasks", status="405") == 3.0


def test_results_refused_in_a_batch_are_counted(client):
    """A batch's reports refused item by item (a job that does not exist, a lease token the
    worker does not hold) answer 200 with a 404 or 403 ack: nothing on the service's side
    counted them, so a worker whose every report was refused showed nowhere."""
    from service_support import WORKER_HEADERS

    worker = register(client)
    create_task(client, budget=4, strategy="grid")
    (job,) = lease(client, worker)
    result = {"status": "ok", "latency_us": 5.0}
    body = {
        "worker_id": worker,
        "results": [
            {"job_id": job["job_id"], "lease_token": "not-its-token", "result": result},
            {"job_id": 999_999, "lease_token": "not-its-token", "result": result},
        ],
    }
    answer = client.post("/v1/jobs/results", json=body, headers=WORKER_HEADERS)
    assert answer.status_code == 200, answer.text
    assert [a["status_code"] for a in answer.json()["acks"]] == [403, 404]
    text = client.get("/metrics").text
    refused = "pipetune_results_refused_total"
    assert metric_value(text, refused, reason="not_its_lease") == 1.0
    assert metric_value(text, refused, reason="no_such_job") == 1.0
    assert metric_value(text, "pipetune_results_total", status="ok", accepted="false") is None
