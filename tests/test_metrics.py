"""/metrics through prometheus_client: the service's counters, and the database's gauges
read at scrape time by a custom collector (the same figures from every replica)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from service_support import create_task, drain, fake_latency, lease, metric_value, ok, register

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
    assert metric_value(text, "pipetune_workers_registered", gpu="h100") == 1.0
    assert metric_value(text, "pipetune_jobs_leased_total", gpu="h100") == 1.0
    # Another worker takes the rest: the gauges are read afresh at the next scrape.
    other = register(client, name="w2")
    lease(client, other, max_jobs=3)
    text = client.get("/metrics").text
    assert metric_value(text, "pipetune_queue_depth", gpu="h100") is None
    assert metric_value(text, "pipetune_leases_active", gpu="h100") == 4.0
    assert metric_value(text, "pipetune_workers_registered", gpu="h100") == 2.0


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
