"""A result sent again for a lease whose result is recorded: the same result is a duplicate
(a worker that never saw its answer), a different one a conflict. A conflicting result was
answered "duplicate: already recorded" (only the lease token was compared), and the worker
told its result was taken while the first one stayed. Now the first stays (no double count)
and the answer says it conflicts (accepted=false: it was not recorded), on both routes and
both databases."""

from __future__ import annotations

import pytest
from service_support import (
    create_task,
    job_row,
    lease,
    ok,
    post_result,
    post_results,
    register,
    result_item,
    service_of,
)

pytest_plugins = ["service_fixtures"]

DUPLICATE = "duplicate: already recorded"
CONFLICT = "conflict: a different result is already recorded for this lease"


@pytest.mark.parametrize(
    ("other", "sent", "fields"),
    [
        (ok(20.0), "ok 20 us", "latency_us, samples_us"),
        (
            {"status": "compile_error", "error": "ptxas: too many resources"},
            "compile_error",
            "status, latency_us, samples_us, spread, error",
        ),
        # The same status and latency, other timed repeats: another measurement too.
        (
            {"status": "ok", "latency_us": 30.0, "samples_us": [29.0, 30.0, 31.0]},
            "ok 30 us",
            "samples_us, spread",
        ),
    ],
)
def test_a_different_result_on_a_recorded_lease_is_a_conflict_and_the_first_stays(
    client, other, sent, fields
):
    task = create_task(client, budget=2, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker)
    first = post_result(client, worker, job, ok(30.0)).json()
    assert (first["accepted"], first["detail"]) == (True, None)
    same = post_result(client, worker, job, ok(30.0)).json()
    assert (same["accepted"], same["job_state"], same["detail"]) == (True, "done", DUPLICATE)

    response = post_result(client, worker, job, other)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["accepted"] is False and answer["job_state"] == "done"
    assert answer["detail"] == (
        f"{CONFLICT} (recorded ok 30 us, sent {sent}; they differ in {fields}): not recorded"
    )
    # First write wins, counted once.
    recorded = job_row(client, job["job_id"])
    assert (recorded.status, recorded.latency_us, recorded.samples_us) == ("ok", 30.0, [30.0])
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["trials_failed"]) == (1, 0)
    assert doc["best"]["latency_us"] == 30.0


def test_a_recorded_failure_sent_again_is_a_duplicate_and_an_ok_one_a_conflict(client):
    create_task(client, budget=2, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker)
    failure = {"status": "runtime_error", "error": "illegal memory access"}
    assert post_result(client, worker, job, failure).json()["detail"] is None
    assert post_result(client, worker, job, failure).json()["detail"] == DUPLICATE
    answer = post_result(client, worker, job, ok(9.0)).json()
    assert (answer["accepted"], answer["job_state"]) == (False, "failed")
    assert answer["detail"].startswith(f"{CONFLICT} (recorded runtime_error, sent ok 9 us;")
    assert job_row(client, job["job_id"]).status == "runtime_error"


def test_every_field_of_a_result_sent_again_reads_back_equal_on_both_databases(client):
    """A duplicate is told from a conflict by comparing what was stored with what is sent:
    floats that do not print short, every optional field, none dropped by a round trip
    through either database (a worker's honest repeat is never called a conflict)."""
    create_task(client, budget=2, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker)
    result = {
        "status": "ok",
        "latency_us": 12.345678901234567,
        "samples_us": [12.3, 12.345678901234567, 13.000000000000002, 1e-3 + 12.5],
        "spread": 0.05406504065040651,
        "registers": 168,
        "spill_bytes": 0,
        "smem_bytes": 49152,
        "compile_ms": 1234.5678,
        "max_abs_error": 3.0517578125e-05,
        "runner": "simulated",
        "generator_revision": 2,
    }
    assert post_result(client, worker, job, result).json()["detail"] is None
    again = post_result(client, worker, job, result).json()
    assert (again["accepted"], again["detail"]) == (True, DUPLICATE)
    (ack,) = post_results(client, worker, [result_item(job, result)])
    assert (ack["accepted"], ack["detail"]) == (True, DUPLICATE)
    changed = post_result(client, worker, job, {**result, "registers": 170}).json()
    assert changed["accepted"] is False
    assert "they differ in registers)" in changed["detail"]


def test_the_batched_route_answers_each_repeat_as_a_duplicate_or_a_conflict(client):
    task = create_task(client, budget=4, strategy="grid", batch_size=4)
    worker = register(client)
    jobs = lease(client, worker, max_jobs=4)
    assert len(jobs) == 4
    acks = post_results(
        client, worker, [result_item(jobs[0], ok(30.0)), result_item(jobs[1], ok(40.0))]
    )
    assert [(a["accepted"], a["detail"]) for a in acks] == [(True, None), (True, None)]

    # The request sent again, one result changed: the other is a duplicate.
    acks = post_results(
        client, worker, [result_item(jobs[0], ok(30.0)), result_item(jobs[1], ok(35.0))]
    )
    assert [a["status_code"] for a in acks] == [200, 200]
    assert [a["accepted"] for a in acks] == [True, False]
    assert acks[0]["detail"] == DUPLICATE
    assert acks[1]["detail"].startswith(f"{CONFLICT} (recorded ok 40 us, sent ok 35 us;")
    assert acks[1]["job_state"] == "done"

    # Two results of one lease in one request: the first is recorded, the second conflicts.
    acks = post_results(
        client, worker, [result_item(jobs[2], ok(50.0)), result_item(jobs[2], ok(45.0))]
    )
    assert [a["accepted"] for a in acks] == [True, False]
    assert acks[0]["detail"] is None
    assert acks[1]["detail"].startswith(f"{CONFLICT} (recorded ok 50 us, sent ok 45 us;")

    for job, latency in ((jobs[0], 30.0), (jobs[1], 40.0), (jobs[2], 50.0)):
        assert job_row(client, job["job_id"]).latency_us == latency
    doc = client.get(f"/v1/tasks/{task['id']}").json()
    assert (doc["trials_done"], doc["best"]["latency_us"]) == (3, 30.0)


def test_a_conflict_is_counted_as_a_result_not_accepted_nor_recorded(client):
    create_task(client, budget=2, strategy="grid")
    worker = register(client)
    (job,) = lease(client, worker)
    results = service_of(client).metrics.results

    def count(accepted: str, recorded: str) -> float:
        return results.labels("ok", accepted, recorded, "true")._value.get()

    conflicting = service_of(client).metrics.results_conflicting
    post_result(client, worker, job, ok(30.0))
    before = (count("true", "false"), count("false", "false"), conflicting._value.get())
    post_result(client, worker, job, ok(30.0))  # (a duplicate: no conflict)
    post_result(client, worker, job, ok(31.0))
    after = (count("true", "false"), count("false", "false"), conflicting._value.get())
    assert after == (before[0] + 1, before[1] + 1, before[2] + 1)
