"""A small run of the load benchmark with the batched worker protocol (leases of several
jobs, their results in one POST /v1/jobs/results), two replicas, then an idle phase: no job
leased twice or lost, every result counted once, and the figures `--json` prints are there
(no timing is asserted). With churn: a worker dies holding a whole lease's jobs."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from service_support import require_pg

from benchmarks.bench_load import JSON_KEYS, as_json, run_load
from benchmarks.harness import fake_result, result_maker
from benchmarks.load_driver import LoadConfig, workload
from benchmarks.load_report import section
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import parse_workload
from pipetune.service.thread_cpu import ROLES

TASKS, BUDGET, BATCH = 3, 24, 8


@pytest.fixture
def pg_admin_url() -> str:
    return require_pg()


def _run_without_duplicates_or_losses(pg_admin_url: str, config: LoadConfig) -> tuple[dict, dict]:
    """The load run's report, once no job was leased twice or lost; and the report's figures
    a failing assertion shows."""
    report = run_load(pg_admin_url, config)
    details = {k: report[k] for k in ("duplicates", "lost", "http_errors", "service_errors")}
    assert report["duplicate_leases"] == 0 and report["lost_jobs"] == 0, details
    return report, details


def test_batched_workers_lease_each_job_once_and_an_idle_fleet_is_measured(pg_admin_url):
    config = LoadConfig(
        replicas=2,
        workers=8,
        tasks=TASKS,
        budget=BUDGET,
        batch_size=BATCH,
        seconds=90,
        wait_s=0.5,
        batched=True,
        max_jobs=4,
        idle_s=2.0,
        idle_wait_s=1.0,
        daemon_heartbeat_s=0.2,
        results="simulated",
    )
    report, details = _run_without_duplicates_or_losses(pg_admin_url, config)
    assert report["http_errors"] == {} and report["service_tracebacks"] == 0, details
    assert report["tasks_done"] == TASKS, details
    assert report["results_accepted"] == report["results_db"] == TASKS * BUDGET, details
    assert report["results_counted_once"], details
    # Batched: fewer result requests than results (one per lease that got jobs).
    assert report["result_requests"] < TASKS * BUDGET
    # The idle phase: every worker polled, nothing was leased, its CPU was measured.
    assert report["idle_polls"] >= config.workers and report["idle_jobs"] == 0
    # Each worker heartbeat as the daemon does: idle, every sixth wake-up (fewer than
    # thirteen wake-ups of 0.2 s fit in 2 s), not at every one; before, at least once.
    assert config.workers <= report["idle_heartbeats"] <= 2 * config.workers, details
    assert report["heartbeats"] >= report["idle_heartbeats"] + config.workers
    figures = json.loads(json.dumps(as_json(report)))
    assert set(JSON_KEYS) <= set(figures) and figures["config"]["batched"] is True
    for key in ("results_per_s", "service_cpu_ms_per_result", "postgres_cpu_ms_per_result"):
        assert figures[key] > 0, key
    assert figures["generator_cpu_ms_per_result"] > 0
    # The replicas' own count of their proposals' CPU is a part of their CPU.
    assert 0 <= figures["proposal_cpu_ms_per_result"] < figures["service_cpu_ms_per_result"]
    # And its CPU by thread: the event loop served every request, and the roles together
    # used no more than the processes (read in 10 ms ticks per thread, and the replicas'
    # counters a scrape later than the processes: 200 ms of slack over the run).
    by_thread = figures["service_cpu_ms_per_result_by_thread"]
    assert by_thread["event_loop"] > 0 and set(by_thread) <= set(ROLES)
    results = figures["results_accepted"]
    assert sum(by_thread.values()) * results <= figures["service_cpu_ms_per_result"] * results + 200
    assert math.isfinite(figures["empty_poll_cpu_ms_per_s"])
    # The workers answered with the simulated runner's results, and the written section says so.
    assert figures["config"]["results"] == "simulated"
    command = argparse.Namespace(
        workers=8, tasks=TASKS, seconds=90, budget=BUDGET, churn=[0], seed=0
    )
    written = section([report], command)
    assert "posts SIMULATED results" in written and "made-up" not in written


def test_a_run_stopped_by_its_time_limit_has_no_idle_phase(pg_admin_url):
    """A run whose tasks are unfinished at --seconds leaves jobs queued: an idle phase would
    lease and answer them, measuring work as the cost of an empty queue and counting its
    results in the load's results/s and CPU per result (4,963 results/s at 0.11 ms of
    service CPU each, from a 0.3 s window)."""
    config = LoadConfig(
        replicas=1,
        workers=4,
        tasks=1,
        budget=2000,
        batch_size=BATCH,
        seconds=0.3,
        wait_s=0.5,
        batched=True,
        max_jobs=4,
        idle_s=1.0,
        idle_wait_s=0.5,
    )
    report, details = _run_without_duplicates_or_losses(pg_admin_url, config)
    assert report["tasks_done"] == 0 and report["results_db"] < 2000, details
    assert report["idle_polls"] == report["idle_jobs"] == 0, report["idle_jobs"]
    assert math.isnan(report["empty_poll_cpu_ms_per_s"]) and report["idle_skipped"]
    figures = json.loads(json.dumps(as_json(report)))
    assert figures["empty_poll_cpu_ms_per_s"] is None and figures["idle_skipped"]
    assert figures["results_accepted"] == figures["results_db"], details


def test_batched_workers_with_churn_re_lease_what_the_dead_held(pg_admin_url):
    config = LoadConfig(
        replicas=2,
        workers=8,
        tasks=TASKS,
        budget=BUDGET,
        batch_size=BATCH,
        seconds=60,
        wait_s=0.5,
        batched=True,
        max_jobs=3,
        churn=0.1,
        lease_ttl_s=2.0,
    )
    report, details = _run_without_duplicates_or_losses(pg_admin_url, config)
    assert report["tasks_done"] == TASKS and report["results_counted_once"], details
    assert report["abandoned"] > 0 and report["abandoned_expired"] == report["abandoned"]
    assert report["re_leased_one_result"] == report["re_leased_jobs"], details


def test_simulated_results_follow_the_model_and_say_so():
    # What `bench_load --results simulated` workers answer: the simulated runner's result
    # (the analytical model plus its noise), labelled simulated; made-up ones stay the default.
    shape = workload(1)
    space = Space.enumerate(parse_workload(shape), get_gpu("h100"))
    predicted = evaluate(space).T_kernel * 1e6
    answer = result_maker("simulated")
    for row in (0, len(space) // 2, len(space) - 1):
        job = {"gpu": "h100", "workload": shape, "schedule": space[row].as_dict()}
        result = answer(job)
        assert result["status"] == "ok" and result["runner"] == "simulated"
        assert result["latency_us"] == pytest.approx(predicted[row], rel=0.15)
        assert answer(job) == result  # deterministic per schedule
    assert result_maker("made-up") is fake_result
    assert LoadConfig().results == "made-up"
    with pytest.raises(ValueError, match="made-up or simulated"):
        result_maker("measured")


@pytest.mark.parametrize("churn", [0.0, 0.1])
def test_workers_that_report_each_job_as_measured_keep_their_jobs_in_hand(pg_admin_url, churn):
    """`--report-each` (the worker daemon with one GPU): each job is reported alone as soon as
    it is measured, and each report leases what tops the worker's jobs back up to max_jobs.
    With churn a worker dies holding what it had in hand, and those jobs are leased again."""
    config = LoadConfig(
        replicas=2,
        workers=6,
        tasks=TASKS,
        budget=BUDGET,
        batch_size=BATCH,
        seconds=60,
        wait_s=0.5,
        batched=True,
        report_each=True,
        max_jobs=3,
        churn=churn,
        lease_ttl_s=2.0 if churn else LoadConfig.lease_ttl_s,
    )
    report, details = _run_without_duplicates_or_losses(pg_admin_url, config)
    assert report["tasks_done"] == TASKS and report["results_counted_once"], details
    assert report["results_accepted"] == report["results_db"] == TASKS * BUDGET, details
    # One results request per job answered: each was reported alone (with churn, a job whose
    # lease expired under a live worker is answered again by the next).
    if churn:
        assert report["result_requests"] >= report["results_accepted"]
    else:
        assert report["result_requests"] == TASKS * BUDGET
    # Reports leased the next jobs (without churn most came so, not by a lease request; a
    # replacement worker starts with a lease request).
    assert report["report_leases"] > (0 if churn else report["lease_requests"])
    if churn:
        assert report["abandoned"] > 0 and report["abandoned_expired"] == report["abandoned"]
        assert report["re_leased_one_result"] == report["re_leased_jobs"], details


def test_report_each_needs_the_batched_protocol_with_leases_in_reports():
    with pytest.raises(ValueError, match="report_each"):
        LoadConfig(report_each=True)
    with pytest.raises(ValueError, match="report_each"):
        LoadConfig(report_each=True, batched=True, lease_with_results=False)


def test_answers_lost_on_the_way_are_retried_into_the_same_jobs(pg_admin_url):
    """A fifth of the answers that leased jobs are lost on the way back; each request is sent
    again with its request_id as a retry, and gets the jobs its lost answer held. Without,
    those jobs stayed leased to a worker that never got them until their TTL: with a 5 s
    TTL, 40 leases of 160 expired and the run took 18 s instead of 2."""
    config = LoadConfig(
        replicas=2,
        workers=8,
        tasks=TASKS,
        budget=BUDGET,
        batch_size=BATCH,
        seconds=60,
        wait_s=0.5,
        batched=True,
        max_jobs=3,
        lease_ttl_s=5.0,
        lose_answers=0.2,
    )
    report, details = _run_without_duplicates_or_losses(pg_admin_url, config)
    assert report["tasks_done"] == TASKS and report["results_counted_once"], details
    assert report["answers_lost"] > 0 and report["leases_expired"] == 0, details
    assert as_json(report)["answers_lost"] == report["answers_lost"]


def test_lose_answers_is_a_probability():
    with pytest.raises(ValueError, match="lose_answers"):
        LoadConfig(lose_answers=1.0)
