"""`pipetune db import-dataset` and `db import-optimum` refuse a file holding a record whose
schedule is not valid for its workload on the GPU the file names (a sweep of another board,
or one labelled with another GPU): exit 2 naming the record and the rule it breaks, as
`pipetune.kernel(..., schedule=...)` says it, and nothing written. Such a file was stored:
the service answered the schedule as the measured best, `pipetune export` wrote a kernel the
GPU cannot launch, and its time became the GPU's optimum. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from service_support import row_count
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.main import app
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.knobs import ScheduleError
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import gemm
from pipetune.service.orm import JobRow, ReferenceOptimumRow, TaskRow
from pipetune.workers.datasets import dataset_from_results, summary, write_t4

pytest_plugins = ["service_fixtures"]

runner = CliRunner()
WORKLOAD = gemm(1024, 64, 2048)
FAM = family_of(WORKLOAD)
A100 = get_gpu("a100")
BAD = 3  # the record of the schedule the A100 cannot run


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPETUNE_SERVER", "PIPETUNE_API_KEY", "PIPETUNE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def outside():  # type: ignore[no-untyped-def]
    """A schedule of the H100's space (more shared memory) that the A100's rules refuse."""
    return next(
        s
        for s in FAM.enumerate(WORKLOAD, get_gpu("h100"))
        if FAM.schedule_problems(s, WORKLOAD, A100)
    )


def _write(path: Path, schedules: list) -> Path:  # type: ignore[type-arg]
    """An A100 file of `schedules`, each measured ok; the one at BAD (if any) is the fastest."""
    results = [
        MeasureResult(status="ok", latency_us=1.0 if i == BAD else 10.0 + i, samples_us=[])
        for i in range(len(schedules))
    ]
    data = dataset_from_results(WORKLOAD, A100, schedules, results, runner="cupy")
    return write_t4(data, path)


def _kernels_words(schedule) -> str:  # type: ignore[no-untyped-def]
    """How `pipetune.kernel` refuses the schedule on the A100: its reason, which it gives of
    its argument ("schedule: s-... is not valid ...") and an import of the record's schedule
    ("record 3's configuration: schedule s-... is not valid ...")."""
    with pytest.raises(ScheduleError) as refused:
        pipetune.kernel(WORKLOAD, "a100", schedule=schedule.as_dict())
    assert isinstance(refused.value, pipetune.InvalidArgumentError)
    assert str(refused.value) == f"schedule: {refused.value.reason}"
    return f"schedule {refused.value.reason}"


def _invoke(args: list[str]):  # type: ignore[no-untyped-def]
    """The command's result, and the RuntimeWarnings it raised (the model on a schedule
    outside the space divided by zero)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = runner.invoke(app, args)
    return result, [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_import_dataset_refuses_a_record_its_gpu_cannot_run(db_url, tmp_path, outside):
    valid = list(FAM.enumerate(WORKLOAD, A100))[:6]
    schedules = [*valid[:BAD], outside, *valid[BAD:]]
    path = _write(tmp_path / "labelled_a100.t4.json.gz", schedules)
    result, warned = _invoke(["db", "import-dataset", str(path), "--db", db_url])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {path}: record {BAD}'s configuration: {_kernels_words(outside)}"]
    assert "shared memory per block over the limit" in lines[0]
    assert not warned
    assert row_count(db_url, TaskRow.id) == 0 and row_count(db_url, JobRow.id) == 0  # nothing

    # The same file without it imports as before (and the model warns of nothing).
    good = _write(tmp_path / "a100.t4.json.gz", valid)
    result, warned = _invoke(["db", "import-dataset", str(good), "--db", db_url, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["trials_done"] == len(valid) and doc["state"] == "done"
    assert not warned
    assert row_count(db_url, TaskRow.id) == 1 and row_count(db_url, JobRow.id) == len(valid)


def test_import_optimum_refuses_a_record_its_gpu_cannot_run(db_url, tmp_path, outside):
    """Every valid schedule and one more: an exhaustive sweep, but not of the A100."""
    space = list(FAM.enumerate(WORKLOAD, A100))
    path = _write(
        tmp_path / "sweep_labelled_a100.t4.json.gz", [*space[:BAD], outside, *space[BAD:]]
    )
    result, _ = _invoke(["db", "import-optimum", str(path), "--db", db_url])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {path}: record {BAD}'s configuration: {_kernels_words(outside)}"]
    assert row_count(db_url, ReferenceOptimumRow.gpu) == 0  # no 1 µs optimum of the A100

    good = _write(tmp_path / "sweep_a100.t4.json.gz", space)
    result, _ = _invoke(["db", "import-optimum", str(good), "--db", db_url])
    assert result.exit_code == 0, result.output
    assert row_count(db_url, ReferenceOptimumRow.gpu) == 1


def test_dataset_info_counts_the_records_outside_the_gpus_space(tmp_path, outside):
    valid = list(FAM.enumerate(WORKLOAD, A100))[:6]
    path = _write(tmp_path / "labelled_a100.t4.json.gz", [*valid[:BAD], outside, *valid[BAD:]])
    result = runner.invoke(app, ["dataset", "info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["valid"] == len(valid) + 1 and doc["outside_space"] == 1
    assert (
        summary(
            dataset_from_results(
                WORKLOAD,
                A100,
                valid,
                [MeasureResult(status="ok", latency_us=5.0)] * len(valid),
                runner="cupy",
            )
        )["outside_space"]
        == 0
    )
