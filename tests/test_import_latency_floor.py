"""An imported dataset's record whose ok latency is below its task's latency floor (its
workload's FLOPs at a few times its GPU's peak: TaskRow.latency_floor_us) is no measurement.
A worker's such result is recorded as a failed trial that says why; an import bypassed that
rule, and a file's 0.001 us for a 1024^3 GEMM on an H100 became the task's best and the
workload's answer to POST /v1/schedules. Now `pipetune db import-dataset` records it as the
results path does, in the same words, and a memory-bound operator (no floor) is imported as
before. SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_support import client_for, job_row
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.workloads import softmax
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import gemm
from pipetune.service.db import Database
from pipetune.service.orm import JobRow, TaskRow, latency_floor_us
from pipetune.workers.datasets import dataset_from_results, write_t4

pytest_plugins = ["service_fixtures"]

runner = CliRunner()
H100 = get_gpu("h100")
WORKLOAD = gemm(1024, 1024, 1024)
FLOOR_US = latency_floor_us("gemm", 2 * 1024**3, "h100")
IMPOSSIBLE = MeasureResult(status="ok", latency_us=0.001, samples_us=[0.001, 0.001, 0.001])
PLAUSIBLE = MeasureResult(status="ok", latency_us=30.0, samples_us=[30.0], spread=0.0)
# The words of a worker's result below the floor (test_result_impossible_latency.py).
WORDS = (
    "implausible latency: latency_us 0.001 (samples_us 0.001 to 0.001) is below "
    f"{FLOOR_US:.4g} us, the least this task's workload can take on its GPU"
)


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY", "PIPETUNE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


def _write(path: Path, workload, results: list[MeasureResult]) -> Path:  # type: ignore[no-untyped-def]
    schedules = list(family_of(workload).enumerate(workload, H100))[: len(results)]
    data = dataset_from_results(workload, H100, schedules, results, runner="cupy")
    return write_t4(data, path)


def _import(path: Path, db_url: str) -> dict:
    args = ["db", "import-dataset", str(path), "--db", db_url, "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _jobs(db_url: str, task_id: int) -> list[JobRow]:
    database = Database(db_url, pool_size=1)
    try:
        with database.read() as s:
            return list(s.query(JobRow).filter_by(task_id=task_id).order_by(JobRow.trial))
    finally:
        database.dispose()


def test_an_impossible_imported_latency_is_a_failed_trial_never_the_best(db_url, tmp_path, caplog):
    path = _write(tmp_path / "gemm_h100.t4.json.gz", WORKLOAD, [IMPOSSIBLE, PLAUSIBLE])
    doc = _import(path, db_url)
    assert (doc["trials_done"], doc["trials_failed"]) == (2, 1)
    # The import says which records, and why (on stderr, where no logging is set up).
    warned = [r.getMessage() for r in caplog.records if r.name == "pipetune.service.imports"]
    assert len(warned) == 1 and warned[0].startswith(f"{path}: record 0 (1 of 2): {WORDS}"), warned
    assert doc["best"]["latency_us"] == 30.0 and doc["best"]["trial"] == 1

    impossible, plausible = _jobs(db_url, doc["id"])
    assert (impossible.state, impossible.status, impossible.latency_us) == (
        "failed",
        "runtime_error",
        None,
    )
    assert impossible.samples_us == [] and impossible.spread is None
    assert impossible.error.startswith(WORDS), impossible.error
    assert (plausible.state, plausible.latency_us) == ("done", 30.0)

    database = Database(db_url, pool_size=1)
    try:
        with database.read() as s:
            assert s.get(TaskRow, doc["id"]).latency_floor_us == pytest.approx(FLOOR_US)
    finally:
        database.dispose()
    with client_for(db_url) as client:
        best = client.post("/v1/schedules", json={"workload": WORKLOAD.canonical(), "gpu": "h100"})
        assert best.status_code == 200, best.text
        assert (best.json()["source"], best.json()["latency_us"]) == ("measured", 30.0)
        assert job_row(client, plausible.id).latency_us == 30.0

    # The same file again is already imported (its records judged alike): nothing written.
    again = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url])
    assert again.exit_code == 0, again.output
    assert f"task {doc['id']}: already imported" in again.stdout
    assert len(_jobs(db_url, doc["id"])) == 2


def test_a_memory_bound_operators_import_has_no_floor(db_url, tmp_path):
    """Its work is bytes, which caches can beat DRAM at: no bound, the records as sent."""
    workload = softmax(4096, 768)
    fast = MeasureResult(status="ok", latency_us=0.001, samples_us=[0.001], spread=0.0)
    path = _write(tmp_path / "softmax_h100.t4.json.gz", workload, [fast, PLAUSIBLE])
    doc = _import(path, db_url)
    assert (doc["trials_done"], doc["trials_failed"]) == (2, 0)
    assert doc["best"]["latency_us"] == 0.001
    database = Database(db_url, pool_size=1)
    try:
        with database.read() as s:
            assert s.get(TaskRow, doc["id"]).latency_floor_us is None
    finally:
        database.dispose()
