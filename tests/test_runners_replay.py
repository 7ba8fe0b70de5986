"""The replay runner: exact lookups, recorded failures, refusals with clear errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule, Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import bmm, gemm
from pipetune.workers.datasets import Dataset, Record, dataset_from_results, write_t4
from pipetune.workers.datasets.records import DatasetError
from pipetune.workers.runners import (
    DatasetMismatchError,
    ReplayRunner,
    RunnerError,
    ScheduleNotInDatasetError,
    make_runner,
)

WORKLOAD = gemm(256, 128, 64)
GPU = get_gpu("h100", calibrated=False)


@pytest.fixture(scope="module")
def schedules():
    space = Space.enumerate(WORKLOAD, GPU)
    return [space[i] for i in range(4)]


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory, schedules):
    results = [
        MeasureResult(status="ok", latency_us=12.5, samples_us=[12.0, 12.5, 13.0], spread=0.08),
        MeasureResult(status="compile_error", error="ptxas error", compile_ms=900.0),
        MeasureResult(status="wrong_result", max_abs_error=7.0, error="3 outputs off"),
        MeasureResult(status="timeout", error="no answer within 60 s"),
    ]
    dataset = dataset_from_results(WORKLOAD, GPU, schedules, results, runner="cupy")
    return write_t4(dataset, tmp_path_factory.mktemp("replay") / "g.t4.json.gz")


def test_replays_recorded_results_and_failures(dataset_file, schedules):
    with make_runner("replay", dataset=dataset_file, workload=WORKLOAD, gpu="h100") as runner:
        ok, compile_failed, wrong, timed_out = runner.measure(WORKLOAD, schedules)
    assert ok.status == "ok" and ok.latency_us == 12.5 and ok.samples_us == [12.0, 12.5, 13.0]
    assert ok.spread == 0.08 and ok.runner == "replay:cupy"
    assert compile_failed.status == "compile_error" and compile_failed.error == "ptxas error"
    assert compile_failed.latency_us is None and compile_failed.compile_ms == 900.0
    assert wrong.status == "wrong_result" and wrong.max_abs_error == 7.0
    assert timed_out.status == "timeout"


def test_absent_schedule_names_schedule_and_dataset(dataset_file, schedules):
    absent = Schedule(4, 4, 4, 4, 8, 6, 2)
    with ReplayRunner(dataset_file) as runner, pytest.raises(ScheduleNotInDatasetError) as caught:
        runner.measure(WORKLOAD, [schedules[0], absent])
    message = str(caught.value)
    assert absent.id in message and str(dataset_file) in message
    assert caught.value.schedule == absent


def test_other_workload_or_gpu_is_refused_at_construction(dataset_file):
    with pytest.raises(DatasetMismatchError, match=r"holds gemm 256x128x64, not bmm"):
        ReplayRunner(dataset_file, workload=bmm(2, 256, 128, 64))
    with pytest.raises(DatasetMismatchError, match="recorded on h100, not a100"):
        ReplayRunner(dataset_file, gpu="a100")


def test_other_workload_at_measure_time(dataset_file, schedules):
    with ReplayRunner(dataset_file) as runner, pytest.raises(DatasetMismatchError):
        runner.measure(gemm(512, 128, 64), schedules[:1])


def test_mismatch_can_be_ignored(dataset_file, schedules):
    other = gemm(512, 128, 64)
    with ReplayRunner(dataset_file, workload=other, gpu="a100", ignore_mismatch=True) as runner:
        assert runner.measure(other, schedules[:1])[0].latency_us == 12.5


def test_a_foreign_dataset_is_refused():
    foreign = Dataset([Record({"block_size_x": 16}, time_ms=1.0)], metadata={})
    with pytest.raises(DatasetError, match="not a pipetune dataset"):
        ReplayRunner(foreign)


def test_unknown_runner_name():
    with pytest.raises(RunnerError, match="known: cupy, replay, simulated"):
        make_runner("magic")


@pytest.mark.parametrize(
    ("label", "runners", "replayed"),
    [
        # An export of a task replay workers measured: replayed once, not "replay:replay:cupy".
        ("replay:cupy", ["replay:cupy"] * 4, ["replay:cupy"] * 4),
        # Several runners' export: each record names its own.
        ("cupy,replay:simulated", ["cupy", "cupy", "replay:simulated", None], None),
        # Several runners' label and no runner per record (an export made before records
        # kept theirs): the kind the label is shown as.
        ("cupy,simulated", None, ["replay:simulated"] * 4),
    ],
)
def test_a_replayed_runner_label_is_one_a_result_holds(
    tmp_path, schedules, label, runners, replayed
):
    """Replaying an export of a task that replay workers (or several runners) measured
    failed on every schedule: the result's runner, "replay:" before the file's label, was
    longer than a result's runner may be."""
    results = [
        MeasureResult(status="ok", latency_us=10.0 + i, samples_us=[10.0 + i], runner=r)
        for i, r in enumerate(runners or [None] * 4)
    ]
    dataset = dataset_from_results(WORKLOAD, GPU, schedules, results, runner=label)
    if runners is None:
        records = [
            replace(r, measurements={k: v for k, v in r.measurements.items() if k != "runner"})
            for r in dataset.records
        ]
        dataset = Dataset(records, knobs=dataset.knobs, metadata=dataset.metadata)
    path = write_t4(dataset, tmp_path / "export.t4.json")
    with ReplayRunner(path) as runner:
        got = [r.runner for r in runner.measure(WORKLOAD, schedules)]
    expected = replayed or ["replay:cupy", "replay:cupy", "replay:simulated", "replay:unknown"]
    assert got == expected
