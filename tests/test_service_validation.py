"""Bad input gets a 422 that names the field and the reason, and writes nothing."""

from __future__ import annotations

import json

import pytest
from service_support import (
    GEMM,
    WORKER_HEADERS,
    client_for,
    create_task,
    lease,
    ok,
    post_result,
    register,
    service_of,
    settle,
)
from sqlalchemy import func, select

from pipetune.model.trials import ERROR_MAX_CHARS
from pipetune.service.driver import Driver
from pipetune.service.orm import Base

pytest_plugins = ["service_fixtures"]
JSON_WORKER = {**WORKER_HEADERS, "Content-Type": "application/json"}

SOFTMAX = {"op": "softmax", "rows": 64, "cols": 64}
BAD_WORKLOADS = [
    ({"op": "transpose", "m": 64}, "op", "unknown operator"),
    ({"m": 64, "n": 64, "k": 64}, "op", "missing"),
    ({**GEMM, "m": -5}, "m", "greater than or equal to 1 (got -5)"),
    ({**GEMM, "n": 0}, "n", "greater than or equal to 1 (got 0)"),
    # The value shown although the bound's own digits are in pydantic's message.
    ({"op": "rmsnorm", "rows": 64, "cols": 64, "eps": 0}, "eps", "greater than 0 (got 0)"),
    ({"op": "layernorm", "rows": 64, "cols": 64, "eps": 0.0}, "eps", "greater than 0 (got 0.0)"),
    ({**GEMM, "k": 1001}, "k", "must be a multiple of 8"),
    ({**GEMM, "m": "1024"}, "m", "valid integer"),
    ({**GEMM, "m": 1.5}, "m", "valid integer"),
    ({**GEMM, "dtype": "float32"}, "dtype", "float16"),
    ({**GEMM, "alpha": 2}, "alpha", "Extra inputs are not permitted"),
    # An extra key named like an operator is still the key the error names (it was dropped
    # with the union's tag, and the 422 named no field).
    ({**GEMM, "bmm": 1}, "bmm", "Extra inputs are not permitted"),
    (
        {"op": "conv2d", "n": 1, "h": 8, "w": 8, "c": 8, "k": 8, "r": 3, "s": 3, "pad": 3},
        "pad",
        "must be smaller than the filter size",
    ),
    ({"op": "bmm", "b": 2, "m": 64, "n": 60, "k": 64}, "n", "multiple of 8"),
    # An operand too large for 32-bit indexing blamed b for every operand, b=1 included.
    (
        {"op": "bmm", "b": 1, "m": 1, "n": 16384, "k": 131072},
        "k",
        "B has 2147483648 elements (b=1, k=131072, n=16384), over the 2^31-1 limit",
    ),
    ({**GEMM, "m": 2**21, "k": 2048}, "m", "A has 4294967296 elements"),
    # Attention's softmax: a mask's query length without the mask, or one the rows or keys
    # cannot hold; a scale that is not a positive number.
    ({**SOFTMAX, "queries": 8}, "queries", "set causal too"),
    ({**SOFTMAX, "causal": True, "queries": 5}, "queries", "must divide rows (64)"),
    ({**SOFTMAX, "rows": 128, "causal": True, "queries": 128}, "queries", "at most cols (64)"),
    ({**SOFTMAX, "causal": "yes"}, "causal", "valid boolean"),
    ({**SOFTMAX, "scale": 0}, "scale", "greater than 0 (got 0)"),
    ({**SOFTMAX, "scale": "0.125"}, "scale", "valid number"),
    # inf and 0 in the kernels' float32 (accepted, and labelled scale=1e+308 and 1e-300)
    ({**SOFTMAX, "scale": 1e308}, "scale", "float32's normal range"),
    ({**SOFTMAX, "scale": 1e-300}, "scale", "float32's normal range"),
]


def _row_counts(client) -> dict[str, int]:
    service = service_of(client)
    with service.db.read() as s:
        return {
            t.name: s.scalar(select(func.count()).select_from(t))
            for t in Base.metadata.sorted_tables
        }


def _assert_422(response, field: str, reason: str) -> dict:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field, body
    assert reason in body["reason"], body
    assert body["detail"][0]["field"] == field
    return body


@pytest.mark.parametrize(("workload", "field", "reason"), BAD_WORKLOADS)
def test_bad_workloads_name_the_field(client, workload, field, reason):
    for path, body in (
        ("/v1/tasks", {"workload": workload, "gpu": "h100", "budget": 10}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100"}),
        ("/v1/schedules", {"workload": workload, "gpu": "h100", "tune": {"budget": 5}}),
    ):
        _assert_422(client.post(path, json=body), field, reason)
    assert set(_row_counts(client).values()) == {0}


def test_an_attention_softmax_is_a_task_of_its_own_and_a_plain_one_keeps_its_identity(client):
    """The mask's query length defaults to cols and is written out, so both spellings are one
    task; a plain softmax given its defaults is the task it was before the fields existed."""
    plain = client.post("/v1/tasks", json={"workload": SOFTMAX, "gpu": "h100", "budget": 4})
    spelled = {**SOFTMAX, "scale": 1.0, "causal": False, "queries": None}
    again = client.post("/v1/tasks", json={"workload": spelled, "gpu": "h100", "budget": 4})
    assert plain.status_code == again.status_code == 201, again.text
    assert plain.json()["workload"] == again.json()["workload"] == {**SOFTMAX, "dtype": "float16"}
    causal = {**SOFTMAX, "scale": 0.125, "causal": True}
    square = {**causal, "queries": 64}
    first = client.post("/v1/tasks", json={"workload": causal, "gpu": "h100", "budget": 4})
    second = client.post("/v1/tasks", json={"workload": square, "gpu": "h100", "budget": 4})
    assert first.status_code == second.status_code == 201, second.text
    assert first.json()["workload"] == second.json()["workload"] == {**square, "dtype": "float16"}
    assert first.json()["label"] == "softmax 64x64 scale=0.125 causal"
    # The schedule answer (the model's pick, nothing measured yet) is the masked workload's.
    found = client.post("/v1/schedules", json={"workload": causal, "gpu": "h100"})
    assert found.status_code == 200, found.text
    assert found.json()["workload"] == {**square, "dtype": "float16"}


def test_misaligned_k_points_at_k(client):
    body = _assert_422(
        client.post("/v1/tasks", json={"workload": {**GEMM, "k": 1001}, "gpu": "h100"}),
        "k",
        "multiple of 8",
    )
    assert body["detail"][0]["loc"] == ["body", "workload", "k"]


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"gpu": "v100"}, "gpu", "unknown GPU 'v100'"),
        ({"gpu": 5}, "gpu", "valid string"),
        ({"budget": 0}, "budget", "greater than or equal to 1"),
        ({"budget": -3}, "budget", "greater than or equal to 1"),
        ({"budget": 5001}, "budget", "less than or equal to 5000"),
        ({"strategy": "bayes"}, "strategy", "Input should be"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"batch_size": 0}, "batch_size", "greater than or equal to 1"),
        ({"batch_size": 65}, "batch_size", "less than or equal to 64"),
        ({"urgency": 1}, "urgency", "Extra inputs"),
        ({"gemm": {"m": 64}}, "gemm", "Extra inputs"),
        ({"softmax": 1}, "softmax", "Extra inputs"),
        ({"priority": 0}, "priority", "greater than or equal to 1"),
        ({"priority": 11}, "priority", "less than or equal to 10"),
    ],
)
def test_bad_task_fields_name_the_field(client, change, field, reason):
    body = {"workload": GEMM, "gpu": "h100", "budget": 10, **change}
    _assert_422(client.post("/v1/tasks", json=body), field, reason)
    assert set(_row_counts(client).values()) == {0}


def test_a_bad_tune_batch_size_is_refused_and_nothing_is_tuned(client):
    body = {"workload": GEMM, "gpu": "h100", "tune": {"batch_size": 0}}
    error = _assert_422(client.post("/v1/schedules", json=body), "batch_size", "than or equal")
    assert error["detail"][0]["loc"] == ["body", "tune", "batch_size"]
    assert set(_row_counts(client).values()) == {0}


@pytest.mark.parametrize("budget", [0, 5001])
def test_a_bad_tune_budget_is_refused_and_nothing_is_tuned(client, budget):
    body = {"workload": GEMM, "gpu": "h100", "tune": {"budget": budget}}
    error = _assert_422(client.post("/v1/schedules", json=body), "budget", "than or equal")
    assert error["detail"][0]["loc"] == ["body", "tune", "budget"]
    assert set(_row_counts(client).values()) == {0}


@pytest.mark.parametrize(
    "raw",
    [b'{"workload": {"op": "gemm", ', b"not json", b"[1, 2]", b""],
)
def test_malformed_json_is_a_422(client, raw):
    response = client.post("/v1/tasks", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "body" or response.json()["detail"]
    assert set(_row_counts(client).values()) == {0}


def test_malformed_json_says_so(client):
    response = client.post(
        "/v1/schedules", content=b'{"gpu": "h100",', headers={"Content-Type": "application/json"}
    )
    _assert_422(response, "body", "malformed JSON")


def test_bad_query_parameters(client):
    _assert_422(client.get("/v1/tasks/1/trials?after=-5"), "after", "greater than or equal")
    _assert_422(client.get("/v1/tasks?limit=0"), "limit", "greater than or equal to 1")
    _assert_422(client.get("/v1/curves?gpu=v100"), "gpu", "unknown GPU")
    _assert_422(client.get("/v1/tasks?state=sleeping"), "state", "Input should be")


def test_task_creation_is_all_or_nothing(db_url, monkeypatch):
    def broken_insert(*args, **kwargs):
        raise RuntimeError("disk full while writing the first batch")

    with client_for(db_url) as c:
        # Where each dialect writes a batch (PostgreSQL: the advance's one statement).
        monkeypatch.setattr(Driver, "_insert_jobs", staticmethod(broken_insert))
        monkeypatch.setattr(Driver, "_batch_statement", staticmethod(broken_insert))
        with pytest.raises(RuntimeError, match="disk full"):
            c.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 10})
        # Neither the task nor its workload row was left behind.
        assert set(_row_counts(c).values()) == {0}
        monkeypatch.undo()
        assert c.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100"}).status_code == 201
        counts = _row_counts(c)
        assert counts["tasks"] == 1 and counts["workloads"] == 1 and counts["jobs"] == 8


def test_a_full_disk_while_a_task_is_created_on_postgresql_is_a_503_and_healthz_says_so(pg):
    """A task's first batch is written by the driver's statement in the creation's ORM
    transaction: its error came out as the driver's (psycopg's), which the service answered
    500 with a traceback, and /healthz went on answering healthy. PostgreSQL's disk_full is
    raised here by a trigger on the jobs table."""
    from sqlalchemy import create_engine

    engine = create_engine(pg)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION full_disk() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION "
            "'could not extend file' USING ERRCODE = 'disk_full'; END $$ LANGUAGE plpgsql;"
            "CREATE TRIGGER full_disk BEFORE INSERT ON jobs FOR EACH ROW "
            "EXECUTE FUNCTION full_disk();"
        )
    try:
        with client_for(pg) as c:
            response = c.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 10})
            assert response.status_code == 503, response.text
            assert "disk" in response.json()["detail"], response.text
            assert c.get("/healthz").status_code == 503
            assert set(_row_counts(c).values()) == {0}  # nothing half-written
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER full_disk ON jobs; DROP FUNCTION full_disk();")
        engine.dispose()


def test_a_read_only_postgresql_is_a_503_saying_so_and_healthz_says_so(pg):
    """A standby after a failover (or default_transaction_read_only): each write raised
    ReadOnlySqlTransaction, an InternalError, which the service answered 500 with a
    traceback while /healthz answered healthy."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    database = make_url(pg).database
    engine = create_engine(pg)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    try:
        with client_for(pg) as c:
            response = c.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 10})
            assert response.status_code == 503, response.text
            assert response.json()["detail"].startswith("the database is read-only"), response.text
            health = c.get("/healthz")
            assert health.status_code == 503, health.text
            assert health.json()["detail"].startswith("the database is read-only")
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("SET default_transaction_read_only = off")
            conn.exec_driver_sql(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
        engine.dispose()


def test_results_a_trial_row_cannot_hold_are_refused(client):
    client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 1})
    worker = register(client)
    (job,) = lease(client, worker)
    url = f"/v1/jobs/{job['job_id']}/result"
    start = f'{{"worker_id": {worker}, "lease_token": "{job["lease_token"]}", "result": '
    infinite = (start + '{"status": "ok", "latency_us": Infinity}}').encode()
    response = client.post(url, content=infinite, headers=JSON_WORKER)
    _assert_422(response, "latency_us", "finite")
    huge = {"status": "ok", "latency_us": 5.0, "registers": 2**40}
    _assert_422(post_result(client, worker, job, huge), "registers", "at most")
    assert post_result(client, worker, job, ok(5.0)).json()["accepted"] is True
    assert client.get(f"/v1/tasks/{2**40}").status_code == 422


def test_a_busy_count_no_column_holds_is_refused_not_clamped(client):
    worker = register(client)
    url = f"/v1/workers/{worker}/heartbeat"
    _assert_422(
        client.post(url, json={"busy_jobs": 2**70}, headers=WORKER_HEADERS),
        "busy_jobs",
        "less than or equal",
    )
    assert client.post(url, json={"busy_jobs": 3}, headers=WORKER_HEADERS).status_code == 200


def test_an_error_that_echoes_a_nul_is_still_a_422(client):
    """Found by the schema fuzzer: the 422 body quoting `gpu=\\x00` failed its own validation."""
    response = client.get("/v1/curves", params={"gpu": "\x00"})
    assert response.status_code == 422
    assert "gpu" in response.text


# ---- results no kernel can have, and text no column can hold ------------------------------


def _leased_job(client) -> tuple[int, dict]:
    client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 8})
    worker = register(client)
    (job,) = lease(client, worker)
    return worker, job


def _raw_post(client, url: str, body: dict):
    """A body as a client's JSON library sends it: json.dumps escapes what is not ASCII
    (a lone surrogate as \\ud800, which decodes back to one)."""
    return client.post(url, content=json.dumps(body).encode(), headers=JSON_WORKER)


def _both_routes(client, worker: int, job: dict, result: dict) -> list:
    single = _raw_post(
        client,
        f"/v1/jobs/{job['job_id']}/result",
        {"worker_id": worker, "lease_token": job["lease_token"], "result": result},
    )
    item = {"job_id": job["job_id"], "lease_token": job["lease_token"], "result": result}
    batched = _raw_post(client, "/v1/jobs/results", {"worker_id": worker, "results": [item, item]})
    return [single, batched]


def _trials_done(client) -> int:
    (task,) = client.get("/v1/tasks").json()["tasks"]
    return task["trials_done"]


def test_a_median_among_its_repeats_is_taken_whatever_their_order(client):
    worker, job = _leased_job(client)
    result = {"status": "ok", "latency_us": 6.0, "samples_us": [6.5, 5.0, 6.0, 7.0]}
    assert post_result(client, worker, job, result).json()["accepted"] is True
    # At an end, within rounding: a mean of equal repeats may round past them.
    (job,) = lease(client, worker)
    result = {"status": "ok", "latency_us": 1.1000000000000003, "samples_us": [1.1, 1.1, 1.1]}
    assert post_result(client, worker, job, result).json()["accepted"] is True


@pytest.mark.parametrize(
    ("result", "field", "reason"),
    [
        # 1e-300 us overflowed the throughput to infinity; the task's cost model, and every
        # later learned-prior lookup of the family, then failed with a 500.
        ({"status": "ok", "latency_us": 1e-300}, "latency_us", "greater than or equal to 0.001"),
        ({"status": "ok", "latency_us": 1e308}, "latency_us", "less than or equal to 10000000000"),
        ({**ok(5.0), "samples_us": [-5.0, 6.0]}, "samples_us", "greater than or equal"),
        ({**ok(5.0), "runner": "replay:simulated2"}, "runner", "at most 16 characters"),
        ({**ok(5.0), "runner": "cupy\ud800"}, "runner", "unicode string"),
        ({**ok(5.0), "runner": "cupy\u0000"}, "runner", "NUL"),
        ({**ok(5.0), "runner": "foo"}, "runner", "unknown runner 'foo'"),
        # Stored, answered as the measured best's runner, and written by `pipetune export` into
        # a C header's comment: it closed the comment and put a preprocessor line after it.
        ({**ok(5.0), "runner": "simulated:*/\n#1"}, "runner", "must be runner names"),
        ({**ok(5.0), "runner": "simulated x"}, "runner", "must be runner names"),
        # Counts were coerced from 12.0, "12" and true, where every other number is strict.
        ({**ok(5.0), "registers": 12.0}, "registers", "whole number"),
        ({**ok(5.0), "spill_bytes": "12"}, "spill_bytes", "whole number"),
        ({**ok(5.0), "smem_bytes": True}, "smem_bytes", "whole number"),
        # A simulated worker's result passed as a GPU measurement (it then taught learned
        # priors, which take measured trials only).
        ({**ok(5.0), "runner": "cupy"}, "runner", "which registered as simulated"),
        ({**ok(5.0), "runner": "replay:cupy"}, "runner", "which registered as simulated"),
        # Results whose fields contradict their status were stored: a failure's latency
        # dropped while its timed repeats were kept, an ok result with an error.
        ({"status": "wrong_result", "latency_us": 0.5}, "latency_us", "has no latency"),
        ({"status": "timeout", "samples_us": [0.5, 0.5]}, "samples_us", "no timed repeats"),
        ({**ok(7.0), "error": "CUDA_ERROR_ILLEGAL_ADDRESS"}, "error", "carries no error"),
        # A latency no repeat came near, stored as the schedule's best: 4,194 TFLOP/s on an
        # A100 led the task's curve and every lookup of the workload's best.
        (
            {"status": "ok", "latency_us": 0.001, "samples_us": [1e10, 1e10, 1e10]},
            "latency_us",
            "must lie within the timed repeats (samples_us, 1e+10 to 1e+10 us)",
        ),
        ({**ok(7.0), "samples_us": [5.0, 6.0, 6.5]}, "latency_us", "as their median, got 7"),
    ],
)
def test_results_no_kernel_can_have_are_refused_on_both_routes(client, result, field, reason):
    worker, job = _leased_job(client)
    for response in _both_routes(client, worker, job, result):
        _assert_422(response, field, reason)
    assert _trials_done(client) == 0  # nothing recorded, the lease still good:
    assert post_result(client, worker, job, ok(5.0)).json()["accepted"] is True


def test_a_result_may_name_its_own_workers_runner(client):
    worker, job = _leased_job(client)
    accepted = post_result(client, worker, job, {**ok(5.0), "runner": "simulated"})
    assert accepted.json()["accepted"] is True, accepted.text
    settle(client)
    assert client.get("/v1/tasks/1/trials").json()["trials"][0]["runner"] == "simulated"


def test_log_text_is_kept_storable_and_cut_to_its_head(client):
    """A compiler's log is the measurement's, not the worker's mistake: a lone surrogate in
    it is replaced (SQLite and PostgreSQL both answered 500), a long one keeps its head."""
    worker, job = _leased_job(client)
    log = "ptxas error \ud800 at line 3\n" + "x" * 300_000
    failed = {"status": "compile_error", "error": log}
    single, _ = _both_routes(client, worker, job, failed)
    assert single.status_code == 200 and single.json()["accepted"] is True, single.text
    settle(client)
    trial = client.get("/v1/tasks/1/trials").json()["trials"][0]
    assert trial["error"].startswith("ptxas error \ufffd at line 3\nxxx")
    assert len(trial["error"]) < ERROR_MAX_CHARS + 100
    assert trial["error"].endswith("more characters cut]")


@pytest.mark.parametrize(
    ("path", "change", "field"),
    [
        ("/v1/tasks", {"gpu": "\ud800"}, "gpu"),
        ("/v1/schedules", {"gpu": "h1\udc0000"}, "gpu"),
        ("/v1/tasks", {"prior_gpu": "\ud800"}, "prior_gpu"),
    ],
)
def test_lone_surrogates_are_a_422_not_a_500(client, path, change, field):
    response = _raw_post(client, path, {"workload": GEMM, "gpu": "h100", **change})
    _assert_422(response, field, "lone surrogate")
    body = {"name": "w\ud800", "gpu": "h100", "arch": "sm_90", "runner": "cupy"}
    _assert_422(_raw_post(client, "/v1/workers", body), "name", "lone surrogate")
    assert set(_row_counts(client).values()) == {0}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"budget": True}, "budget"),
        ({"budget": "7"}, "budget"),
        ({"budget": 7.0}, "budget"),
        ({"seed": "1"}, "seed"),
        ({"batch_size": "8"}, "batch_size"),
        ({"batch_size": 8.0}, "batch_size"),
        ({"learned_prior": "yes"}, "learned_prior"),
        ({"prior_task": "3"}, "prior_task"),
    ],
)
def test_task_numbers_and_flags_are_not_coerced(client, change, field):
    body = {"workload": GEMM, "gpu": "h100", **change}
    _assert_422(client.post("/v1/tasks", json=body), field, "valid")
    assert set(_row_counts(client).values()) == {0}


def test_worker_and_job_ids_in_bodies_are_checked_as_in_paths(client):
    worker, job = _leased_job(client)
    for bad in ("1", 1.0, True, 0, -5, 2**70):
        lease_body = {"worker_id": bad, "max_jobs": 1, "wait_s": 0}
        _assert_422(
            client.post("/v1/jobs/lease", json=lease_body, headers=WORKER_HEADERS), "worker_id", ""
        )
        result = {"worker_id": bad, "lease_token": job["lease_token"], "result": ok(5.0)}
        url = f"/v1/jobs/{job['job_id']}/result"
        _assert_422(client.post(url, json=result, headers=WORKER_HEADERS), "worker_id", "")
        item = {"job_id": bad, "lease_token": job["lease_token"], "result": ok(5.0)}
        batch = {"worker_id": worker, "results": [item]}
        response = client.post("/v1/jobs/results", json=batch, headers=WORKER_HEADERS)
        error = _assert_422(response, "job_id", "")
        assert error["detail"][0]["loc"] == ["body", "results", 0, "job_id"]
    assert _trials_done(client) == 0


def test_an_arch_specific_target_registers_as_its_device_and_gets_jobs(client):
    client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "budget": 8})
    body = {"name": "w90a", "gpu": "h100", "arch": "sm_90a", "runner": "simulated"}
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    assert response.status_code == 201, response.text
    assert response.json()["arch"] == "sm_90"
    assert len(lease(client, response.json()["id"], max_jobs=4)) == 4


@pytest.mark.parametrize(
    ("change", "field", "shown"),
    [
        ({"name": "a\nb\tc"}, "name", "'\\n' at 1"),
        ({"name": "gpu-0\x1b[31m"}, "name", "'\\x1b' at 5"),
        ({"device_name": "NVIDIA H100\r"}, "device_name", "'\\r' at 11"),
        ({"driver": "\x07"}, "driver", "'\\x07' at 0"),
        # A right-to-left override: "node-\u202e10\u202c" is shown as "node-01".
        ({"name": "node-\u202e10\u202c"}, "name", "'\\u202e' at 5"),
        ({"name": "node\u200b-01"}, "name", "'\\u200b' at 4"),  # a zero-width space
        ({"device_name": "H100\u2028forged"}, "device_name", "'\\u2028' at 4"),  # a line break
    ],
)
def test_worker_names_are_one_line_of_text(client, change, field, shown):
    body = {"name": "w", "gpu": "h100", "arch": "sm_90", "runner": "simulated", **change}
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    _assert_422(response, field, f"line separator characters, got {shown}")
    assert client.get("/v1/workers").json()["workers"] == []
    # Letters of any script, and spaces, are a name.
    named = {**body, field: "gpu 0 · Ångström"}
    assert client.post("/v1/workers", json=named, headers=WORKER_HEADERS).status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sm_count": "132"}, "sm_count"),
        ({"sm_count": 132.0}, "sm_count"),
        ({"clocks_mhz": True}, "clocks_mhz"),
    ],
)
def test_worker_numbers_are_not_coerced(client, change, field):
    body = {"name": "w", "gpu": "h100", "arch": "sm_90", "runner": "simulated", **change}
    _assert_422(client.post("/v1/workers", json=body, headers=WORKER_HEADERS), field, "valid")
    assert set(_row_counts(client).values()) == {0}


@pytest.mark.parametrize("eps", [True, "1e-5"])
def test_a_layernorm_eps_is_a_number_not_a_flag_or_text(client, eps):
    workload = {"op": "layernorm", "rows": 128, "cols": 768, "eps": eps}
    response = client.post("/v1/tasks", json={"workload": workload, "gpu": "h100"})
    _assert_422(response, "eps", "valid number")
    assert set(_row_counts(client).values()) == {0}


def test_a_blank_worker_name_is_refused(client):
    body = {"name": "   ", "gpu": "h100", "arch": "sm_90", "runner": "simulated"}
    response = client.post("/v1/workers", json=body, headers=WORKER_HEADERS)
    _assert_422(response, "name", "blank")


# Too deep for the JSON parser of every Python pipetune supports: 3.13 parses 5,000 levels,
# which 3.11 and 3.12 refuse (200 KB, under the body limit).
@pytest.mark.parametrize(
    "raw", [b'{"gpu": "h100\xff"}', b"[" * 100_000 + b"]" * 100_000], ids=["not-utf8", "too-deep"]
)
def test_a_body_that_is_not_json_text_is_a_422(client, raw):
    response = client.post("/v1/tasks", content=raw, headers={"Content-Type": "application/json"})
    _assert_422(response, "body", "not JSON text")


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        ("text/plain", "not text/plain"),
        ("text/json", "not text/json"),  # has "json" in it, and was left without the hint
        (None, "no Content-Type was sent"),
    ],
)
def test_a_body_sent_as_another_content_type_says_so(client, sent, said):
    body = json.dumps({"workload": GEMM, "gpu": "h100"}).encode()
    request = client.build_request("POST", "/v1/tasks", content=body)
    if sent is None:
        request.headers.pop("Content-Type", None)
    else:
        request.headers["Content-Type"] = sent
    response = client.send(request)
    _assert_422(response, "body", "Content-Type: application/json")
    _assert_422(response, "body", said)


def test_a_number_longer_than_python_reads_is_said_to_be_one(client):
    raw = b'{"workload": {"op": "gemm", "m": ' + b"9" * 5000 + b', "n": 64, "k": 64}}'
    response = client.post("/v1/tasks", content=raw, headers={"Content-Type": "application/json"})
    _assert_422(response, "body", "a number in the body has more digits")


def test_a_422_does_not_echo_a_huge_value_or_list_every_problem(client):
    huge = client.post("/v1/tasks", json={"workload": GEMM, "gpu": "x" * 400_000})
    assert huge.status_code == 422 and len(huge.content) < 5_000, len(huge.content)
    assert huge.json()["field"] == "gpu"
    # As many unknown fields as a body object may have (more are refused while decoding:
    # test_a_body_object_of_too_many_fields_is_refused_before_validation): 20 listed.
    extra = {f"k{i}": i for i in range(250)}
    many = client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", **extra})
    assert many.status_code == 422 and len(many.content) < 20_000, len(many.content)
    assert many.json()["reason"] == "Extra inputs are not permitted"
    assert len(many.json()["detail"]) <= 20


def test_a_path_id_is_its_digits_alone(client):
    """/v1/tasks/1.0, /+1 and /%201 were task 1 (pydantic's lax integers): one resource
    under many addresses, and a typo read as another id."""
    task = create_task(client, budget=2)
    for route in ("/v1/tasks/{}", "/v1/tasks/{}/trials", "/v1/tasks/{}/curve"):
        bad = (f"{task['id']}.0", f"+{task['id']}", f"%20{task['id']}", "0x1", "1_0")
        for raw in (*bad, f"0{task['id']}", f"000{task['id']}"):
            response = client.get(route.format(raw))
            assert response.status_code == 422, (route, raw, response.text)
            assert response.json()["field"] == "task_id"
            assert "an id is a whole number written in digits" in response.json()["reason"]
        assert client.get(route.format(task["id"])).status_code == 200


@pytest.mark.parametrize(
    ("workload", "field", "shown"),
    [
        ({"op": None, "m": 1, "n": 64, "k": 64}, "op", "unknown operator null;"),
        ({"op": 5, "m": 1, "n": 64, "k": 64}, "op", "unknown operator 5;"),
        ({"op": "transpose", "m": 1}, "op", 'unknown operator "transpose";'),
        ({"op": "gemm", "m": True, "n": 64, "k": 64}, "m", "(got true)"),
        ({"op": "gemm", "m": "64", "n": 64, "k": 64}, "m", '(got "64")'),
        ({"op": "gemm", "m": None, "n": 64, "k": 64}, "m", "(got null)"),
    ],
)
def test_a_422_shows_the_value_as_json_wrote_it(client, workload, field, shown):
    """A JSON client sent null, true, 5 or "64": the reason says so, not Python's None, True,
    '5' or '64' (an operator of 5 read as the string '5')."""
    body = {"workload": workload, "gpu": "h100", "budget": 10}
    _assert_422(client.post("/v1/tasks", json=body), field, shown)


@pytest.mark.parametrize(
    ("url", "field", "takes"),
    [
        # A misspelt filter answered every task in every state, as if nothing was asked.
        ("/v1/tasks?stat=done", "stat", "it takes state, limit, offset, before"),
        ("/v1/tasks/1/trials?afterr=3", "afterr", "it takes after, limit, samples"),
        ("/v1/tasks/1/curve?limit=5", "limit", "it takes after"),
        ("/v1/curves?gpus=h100", "gpus", "it takes gpu, op, strategy, max_k"),
        ("/v1/workers?status=live", "status", "it takes state, limit"),
        ("/v1/tasks/1?verbose=1", "verbose", "it takes no query parameters"),
    ],
)
def test_a_query_parameter_the_route_does_not_take_is_refused(client, url, field, takes):
    create_task(client, budget=2)
    body = _assert_422(client.get(url), field, "not a query parameter of this route")
    assert takes in body["reason"], body
    assert body["detail"][0]["loc"] == ["query", field]


def test_every_unknown_query_parameter_is_named_and_known_ones_still_work(client):
    task = create_task(client, budget=2)
    body = _assert_422(client.get("/v1/tasks?stat=done&limit=1&limt=1"), "stat", "this route")
    assert [item["field"] for item in body["detail"]] == ["stat", "limt"]
    # A worker's POST with a query string its route does not read is refused as well.
    response = client.post("/v1/jobs/lease?max_jobs=2", headers=WORKER_HEADERS, json={})
    assert response.status_code == 422 and response.json()["field"] == "max_jobs"
    ok = client.get(f"/v1/tasks/{task['id']}/trials?after=-1&limit=5&samples=true")
    assert ok.status_code == 200 and len(ok.json()["trials"]) == 2
    assert client.get("/v1/tasks?state=queued&limit=1").status_code == 200
    # The dashboard's own address carries the page's state for its script.
    assert client.get("/dashboard?task=1").status_code == 200


def test_a_count_in_a_query_is_written_as_one(client):
    """?limit=1.0 and ?limit=%201 were read as 1 (pydantic's lax integers), where a body
    refuses such values; -1 stays a value where a parameter allows it."""
    task = create_task(client, budget=2)
    for url in (
        "/v1/tasks?limit=1.0",
        "/v1/tasks?limit=%201",
        "/v1/tasks?offset=01",
        f"/v1/tasks/{task['id']}/trials?after=0.0",
        f"/v1/tasks/{task['id']}/trials?limit=1e3",
        f"/v1/tasks/{task['id']}/curve?after=-1.0",
        "/v1/curves?max_k=10.0",
        "/v1/workers?limit=+5",
    ):
        response = client.get(url)
        assert response.status_code == 422, (url, response.text)
        reason = response.json()["reason"]
        assert "a whole number written in digits" in reason, url
        assert reason.count("got ") == 1, reason  # the value once, not again as "(got ...)"
    assert client.get(f"/v1/tasks/{task['id']}/trials?after=-1&limit=5").status_code == 200
    assert client.get("/v1/tasks?limit=1&offset=0").status_code == 200


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/v1/tasks", {}), ("/v1/jobs/lease", WORKER_HEADERS)],
    ids=["user", "worker"],
)
def test_a_body_object_of_too_many_fields_is_refused_before_validation(db_url, path, headers):
    """50,000 unknown fields cost 330 ms of event-loop CPU per 422 (one pydantic error per
    key), holding every other request: an object past MAX_FIELDS is refused as it is
    decoded, naming the body."""
    from pipetune.service.routers.bounded_json import MAX_FIELDS

    body = {f"k{i}": 0 for i in range(50_000)}
    with client_for(db_url) as c:
        answer = c.post(path, json=body, headers=headers)
        assert answer.status_code == 422, answer.text
        doc = answer.json()
        assert doc["field"] == "body" and f"than {MAX_FIELDS}" in doc["reason"]
        at_limit = {f"k{i}": 0 for i in range(MAX_FIELDS)}  # decoded, then refused as unknown
        assert c.post(path, json=at_limit, headers=headers).json()["field"] != "body"


def test_a_reason_that_quotes_the_value_does_not_say_it_again(client):
    """ "unknown GPU 'v100'; known: a100, h100, h200 (got 'v100')": the project's own reasons
    quote the value, and the (got ...) suffix is for pydantic's, which never do."""
    for change in ({"gpu": "v100"}, {"prior_gpu": "v100"}):
        body = {"workload": GEMM, "gpu": "h100", "budget": 10, **change}
        error = _assert_422(client.post("/v1/tasks", json=body), next(iter(change)), "v100")
        assert "(got" not in error["reason"], error["reason"]
    seed = _assert_422(
        client.post("/v1/tasks", json={"workload": GEMM, "gpu": "h100", "seed": -1}), "seed", ""
    )
    assert seed["reason"].endswith("greater than or equal to 0 (got -1)")
