"""Datasets: the T4 format (write -> read is lossless), Kernel Tuner caches, bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from shared_datasets import HUB_CACHE, HUB_T4, needs_hub

from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule, Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import gemm
from pipetune.workers.datasets import (
    Dataset,
    DatasetError,
    Record,
    check_pipetune,
    dataset_from_results,
    load_dataset,
    read_kt_cache,
    read_t4,
    record_from_result,
    result_from_record,
    summary,
    to_t4_document,
    write_t4,
)

WORKLOAD = gemm(256, 128, 64)


@pytest.fixture(scope="module")
def schedules():
    space = Space.enumerate(WORKLOAD, get_gpu("h100", calibrated=False))
    return [space[i] for i in range(6)]


def awkward_results() -> list[MeasureResult]:
    """Every status, floats that do not survive careless formatting, optional fields."""
    return [
        MeasureResult(
            status="ok",
            latency_us=0.1 + 0.2,
            samples_us=[
                0.30000000000000004,
                1.0000000000000002e-3,
                123456.78901234567,
                5e-324 + 1.0,
            ],
            spread=1 / 3,
            registers=96,
            spill_bytes=0,
            smem_bytes=49152,
            compile_ms=812.3456789012345,
            max_abs_error=2.0**-20,
            runner="cupy",
        ),
        MeasureResult(status="compile_error", error="ptxas: too many resources\nline 2"),
        MeasureResult(status="launch_error", error="CUDA_ERROR_INVALID_VALUE", smem_bytes=1),
        MeasureResult(status="runtime_error", error="illegal address", registers=255),
        MeasureResult(status="wrong_result", max_abs_error=3.25, error="12 outputs off"),
        MeasureResult(status="timeout", error="no answer within 60 s"),
    ]


def pipetune_dataset(schedules) -> Dataset:
    return dataset_from_results(
        WORKLOAD,
        get_gpu("h100", calibrated=False),
        schedules,
        awkward_results(),
        runner="cupy",
        device_name="NVIDIA H100 80GB HBM3",
        settings={"warmup": 3, "repeats": 30},
        timestamps=[f"2024-01-0{i + 1} 00:00:00.000001+00:00" for i in range(6)],
    )


def test_t4_round_trip_is_lossless(tmp_path, schedules):
    dataset = pipetune_dataset(schedules)
    path = write_t4(dataset, tmp_path / "d.t4.json.gz")
    again = read_t4(path)
    assert again == dataset
    assert again.records == dataset.records  # floats bit for bit, failures and all
    assert again.metadata["pipetune"]["device_name"] == "NVIDIA H100 80GB HBM3"
    # A second write gives the very same bytes (deterministic gzip, stable ordering).
    assert write_t4(again, tmp_path / "e.t4.json.gz").read_bytes() == path.read_bytes()


def test_plain_json_round_trip(tmp_path, schedules):
    dataset = pipetune_dataset(schedules)
    path = write_t4(dataset, tmp_path / "d.t4.json")
    assert json.loads(path.read_text())["schema_version"] == "1.0.0"
    assert read_t4(path) == dataset


def test_measure_results_survive_the_file_within_one_ulp(tmp_path, schedules):
    path = write_t4(pipetune_dataset(schedules), tmp_path / "d.t4.json.gz")
    dataset = load_dataset(path)
    info = check_pipetune(dataset)
    assert info.workload == WORKLOAD and info.gpu == "h100" and info.runner == "cupy"
    for schedule, original in zip(schedules, awkward_results(), strict=True):
        back = result_from_record(dataset.lookup(schedule.as_dict()), runner="cupy")
        assert back.status == original.status
        assert back.error == original.error
        assert back.registers == original.registers
        assert back.max_abs_error == original.max_abs_error
        if original.latency_us is not None:
            # µs -> ms -> µs: a division and a multiplication by 1000.
            assert back.latency_us == pytest.approx(original.latency_us, rel=1e-15)
            assert back.samples_us == pytest.approx(original.samples_us, rel=1e-15)


def test_t4_document_matches_the_benchmark_hub_schema(schedules):
    doc = to_t4_document(pipetune_dataset(schedules))
    assert list(doc) == ["metadata", "results", "schema_version"]
    assert doc["schema_version"] == "1.0.0"
    assert doc["metadata"]["timeunit"] == "miliseconds"  # the hub's spelling
    ok, compile_failed, launch_failed = doc["results"][:3]
    assert list(ok) == [
        "timestamp",
        "configuration",
        "times",
        "invalidity",
        "correctness",
        "measurements",
        "objectives",
    ]
    assert ok["configuration"] == schedules[0].as_dict()
    assert ok["invalidity"] == "correct" and ok["correctness"] == 1
    assert ok["objectives"] == ["time"]
    assert ok["measurements"][0] == {
        "name": "time",
        "value": 0.30000000000000004 / 1e3,
        "unit": "ms",
    }
    assert ok["times"]["compilation"] == 812.3456789012345
    assert ok["times"]["runtimes"][0] == 0.30000000000000004 / 1e3
    # Failures: Kernel Tuner's markers in the objective, no runtimes, correctness 0.
    assert compile_failed["invalidity"] == "compile"
    assert compile_failed["measurements"][0]["value"] == "CompilationFailedConfig"
    assert compile_failed["correctness"] == 0 and "runtimes" not in compile_failed["times"]
    assert launch_failed["invalidity"] == "runtime"
    assert launch_failed["measurements"][0]["value"] == "RuntimeFailedConfig"
    statuses = [
        m["value"] for r in doc["results"] for m in r["measurements"] if m["name"] == "status"
    ]
    assert statuses == [
        "ok",
        "compile_error",
        "launch_error",
        "runtime_error",
        "wrong_result",
        "timeout",
    ]


def test_records_reject_inconsistent_values():
    config = {"a": 1}
    with pytest.raises(DatasetError, match="needs a time"):
        Record(config)
    with pytest.raises(DatasetError, match="finite"):
        Record(config, time_ms=float("nan"))
    with pytest.raises(DatasetError, match="contradicts"):
        Record(config, invalidity="compile", status="ok")
    with pytest.raises(DatasetError, match="scalar"):
        Record({"a": [1, 2]}, time_ms=1.0)
    with pytest.raises(DatasetError, match="appears twice"):
        Dataset([Record(config, time_ms=1.0), Record(config, time_ms=2.0)])
    with pytest.raises(DatasetError, match="knobs"):
        Dataset([Record(config, time_ms=1.0), Record({"b": 1}, time_ms=2.0)])


def test_generic_dataset_queries():
    records = [
        Record({"x": 1, "mode": "a"}, time_ms=2.0),
        Record({"x": 2, "mode": "a"}, invalidity="runtime"),
        Record({"x": 1, "mode": "b"}, time_ms=0.5),
    ]
    ds = Dataset(records)
    assert ds.knobs == ("x", "mode")
    assert ds.configurations()[1] == {"x": 2, "mode": "a"}
    assert ds.valid_mask().tolist() == [True, False, True]
    np.testing.assert_array_equal(ds.times_ms(), [2.0, np.nan, 0.5])
    assert ds.best() is records[2]
    assert ds.failures() == {"runtime": 1}
    assert ds.lookup({"mode": "a", "x": 2}) is records[1]
    assert ds.lookup({"x": 3, "mode": "a"}) is None
    assert ds[1].trial_status == "runtime_error"


# --- bad files: a clear DatasetError, never a partial dataset ------------------------


@pytest.fixture
def good_file(tmp_path, schedules) -> Path:
    return write_t4(pipetune_dataset(schedules), tmp_path / "good.t4.json.gz")


def test_truncated_gzip(tmp_path, good_file):
    data = good_file.read_bytes()
    bad = tmp_path / "truncated.t4.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="truncated gzip"):
        load_dataset(bad)


def test_corrupt_gzip(tmp_path, good_file):
    data = bytearray(good_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "corrupt.t4.json.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="gzip"):
        load_dataset(bad)


def test_a_file_of_more_text_than_a_dataset_is_refused_after_reading_only_that_much(
    tmp_path, monkeypatch
):
    """An 18 MB gzip file of 4 GiB of text took 2.7 GB of memory before a MemoryError
    (exit 1); /dev/zero was read for ever."""
    from pipetune.workers.datasets import files

    monkeypatch.setattr(files, "MAX_TEXT_BYTES", 2**20)
    bomb = tmp_path / "bomb.t4.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (2**20 + 1)))  # 1 KiB that inflates past the cap
    assert bomb.stat().st_size < 2**20
    plain = tmp_path / "large.t4.json"
    plain.write_bytes(b" " * (2**20 + 1))
    for path in (bomb, plain, Path("/dev/zero")):
        with pytest.raises(DatasetError, match=r"more than 1 MiB of text: not a dataset file"):
            load_dataset(path)
    # At the cap itself, still a file to parse (here: not JSON).
    fits = tmp_path / "fits.t4.json.gz"
    fits.write_bytes(gzip.compress(b" " * 2**20))
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_dataset(fits)


def test_truncated_json(tmp_path, good_file):
    text = gzip.decompress(good_file.read_bytes())
    bad = tmp_path / "truncated.t4.json"
    bad.write_bytes(text[:-40])
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_dataset(bad)


def _measurement(doc: dict, name: str) -> dict:
    return next(m for m in doc["results"][0]["measurements"] if m["name"] == name)


def _rewrite(tmp_path: Path, good_file: Path, change) -> Path:
    doc = json.loads(gzip.decompress(good_file.read_bytes()))
    change(doc)
    bad = tmp_path / "changed.t4.json"
    bad.write_text(json.dumps(doc))
    return bad


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d.update(schema_version="2.0.0"), "schema_version"),
        (lambda d: d.pop("results"), "neither a T4"),
        (lambda d: d["results"][0].pop("invalidity"), "missing required field 'invalidity'"),
        (lambda d: d["results"][0].update(invalidity="maybe"), "unknown invalidity"),
        (lambda d: d["results"][0]["times"].update(runtimes="fast"), "runtimes"),
        (lambda d: d["results"][0]["measurements"][0].update(value="RuntimeFailedConfig"), "time"),
        (lambda d: d["results"][1]["configuration"].update(chunk=3), "chunk"),
        (
            lambda d: d["results"][1].update(configuration=d["results"][0]["configuration"]),
            "two different results",
        ),
        (lambda d: d["metadata"].update(timeunit="seconds"), "timeunit"),
        (lambda d: d["metadata"]["pipetune"]["workload"].update(m=-1), "pipetune metadata: m"),
        (lambda d: _measurement(d, "registers").update(value=-1), "registers"),
        (lambda d: _measurement(d, "status").update(value="fine"), "unknown trial status"),
    ],
)
def test_wrong_schema(tmp_path, good_file, change, reason):
    bad = _rewrite(tmp_path, good_file, change)
    with pytest.raises(DatasetError, match=reason):
        load_dataset(bad)


def test_nan_in_a_file_is_refused(tmp_path):
    bad = tmp_path / "nan.t4.json"
    bad.write_text('{"schema_version": "1.0.0", "results": [], "metadata": {"x": NaN}}')
    with pytest.raises(DatasetError, match="NaN"):
        load_dataset(bad)


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "absent.t4.json.gz")


def test_failed_write_leaves_no_file(tmp_path, schedules):
    dataset = pipetune_dataset(schedules)
    dataset.metadata["bad"] = float("nan")  # JSON cannot hold it: the write must fail whole
    target = tmp_path / "never.t4.json.gz"
    with pytest.raises(ValueError):
        write_t4(dataset, target)
    assert list(tmp_path.iterdir()) == []


# --- Kernel Tuner caches -------------------------------------------------------------

CACHE = {
    "device_name": "Test GPU",
    "kernel_name": "k",
    "problem_size": [64],
    "tune_params_keys": ["bx", "flag"],
    "tune_params": {"bx": [32, 64], "flag": [0, 1]},
    "objective": "time",
    "cache": {
        "32,0": {"bx": 32, "flag": 0, "time": 1.5, "times": [1.4, 1.6], "compile_time": 10.0,
                 "verification_time": 0, "benchmark_time": 3.1, "strategy_time": 0,
                 "framework_time": 0.2, "GFLOP/s": 12.5, "timestamp": "t0"},
        "64,0": {"bx": 64, "flag": 0, "time": "CompilationFailedConfig", "compile_time": 9.0,
                 "verification_time": 0, "benchmark_time": 0, "strategy_time": 0,
                 "framework_time": 0.1, "timestamp": "t1"},
        "32,1": {"bx": 32, "flag": 1, "time": "InvalidConfig"},
    },
}  # fmt: skip


def test_kernel_tuner_cache(tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(CACHE))
    ds = read_kt_cache(path)
    assert ds.format == "kt-cache" and ds.knobs == ("bx", "flag")
    ok, compile_failed, invalid = ds.records
    assert ok.time_ms == 1.5 and ok.runtimes_ms == (1.4, 1.6) and ok.compile_ms == 10.0
    assert ok.measurements == {"GFLOP/s": 12.5}
    assert ok.times == {"validation": 0, "benchmark": 3.1, "search_algorithm": 0, "framework": 0.2}
    assert compile_failed.invalidity == "compile" and compile_failed.time_ms is None
    assert invalid.invalidity == "constraints" and invalid.trial_status == "compile_error"
    assert summary(ds)["device_name"] == "Test GPU"
    # As T4 and back: the same records.
    assert read_t4(write_t4(ds, tmp_path / "k.t4.json.gz")).records == ds.records


def test_a_caches_objectives_are_all_named_in_its_t4_file(tmp_path):
    """A cache of "objective": ["time", "energy"] became a T4 file whose every result named
    ["time"] alone."""
    path = tmp_path / "k.json"
    path.write_text(json.dumps({**CACHE, "objective": ["time", "energy"]}))
    ds = read_kt_cache(path)
    assert ds.objective == "time" and ds.objectives == ("time", "energy")
    doc = json.loads(write_t4(ds, tmp_path / "k.t4.json").read_text())
    assert {tuple(r["objectives"]) for r in doc["results"]} == {("time", "energy")}


def test_an_open_kernel_tuner_cache_needs_allow_open(tmp_path):
    text = json.dumps(CACHE, indent="")
    open_text = text[: text.rindex("}", 0, text.rindex("}"))] + ","  # Kernel Tuner's form
    path = tmp_path / "open.json"
    path.write_text(open_text)
    with pytest.raises(DatasetError, match="not valid JSON"):
        read_kt_cache(path)
    assert len(read_kt_cache(path, allow_open=True)) == 3
    assert len(load_dataset(path, allow_open=True)) == 3
    # Read as any dataset (`pipetune dataset info`), the error says what would read it.
    with pytest.raises(DatasetError, match=r"not valid JSON .* left open .*--allow-open"):
        load_dataset(path)
    path.write_text("{not a cache,")  # no hint where --allow-open would not help
    with pytest.raises(DatasetError, match="not valid JSON") as error:
        load_dataset(path)
    assert "allow-open" not in str(error.value)


def test_allow_open_reads_a_complete_file_as_it_is(tmp_path):
    # Closed whatever it held, a complete file that does not end as Kernel Tuner ends a
    # cache had brackets added: `pipetune dataset info --allow-open` refused every T4 file
    # (the benchmark hub's too) and a cache whose last key is not its "cache", "Extra data".
    cache = tmp_path / "k.json"
    cache.write_text(json.dumps(CACHE))
    t4 = write_t4(read_kt_cache(cache), tmp_path / "k.t4.json.gz")
    assert len(load_dataset(t4, allow_open=True)) == 3
    reordered = tmp_path / "reordered.json"
    reordered.write_text(json.dumps({"cache": CACHE["cache"], **CACHE}))  # "cache" first
    assert len(load_dataset(reordered, allow_open=True)) == 3
    assert len(read_kt_cache(reordered, allow_open=True)) == 3


def test_a_bad_cache_entry(tmp_path):
    cache = json.loads(json.dumps(CACHE))
    del cache["cache"]["32,0"]["flag"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cache))
    with pytest.raises(DatasetError, match="missing knob"):
        load_dataset(path)


def test_a_kernel_tuner_1_cache_with_listed_objectives_and_error_entries(tmp_path):
    # Kernel Tuner 1.x writes "objective": ["time"] and marks a failure with "__error__"
    # (the objective then absent): such a cache was refused ("'objective' must be a name").
    cache = json.loads(json.dumps(CACHE))
    cache["objective"] = ["time"]
    cache["objective_higher_is_better"] = [False]
    del cache["cache"]["64,0"]["time"]
    cache["cache"]["64,0"]["__error__"] = "CompilationFailedConfig"
    cache["cache"]["32,1"] = {"bx": 32, "flag": 1, "__error__": "InvalidConfig"}
    path = tmp_path / "kt1.json"
    path.write_text(json.dumps(cache))
    ok, compile_failed, invalid = load_dataset(path).records
    assert ok.time_ms == 1.5 and ok.invalidity == "correct"
    assert (compile_failed.invalidity, invalid.invalidity) == ("compile", "constraints")
    assert compile_failed.compile_ms == 9.0
    cache["cache"]["32,1"]["__error__"] = "Oops"
    path.write_text(json.dumps(cache))
    with pytest.raises(DatasetError, match="__error__ 'Oops' is not a failure marker"):
        load_dataset(path)


def test_a_key_written_twice_is_refused_not_silently_dropped(tmp_path):
    # json keeps the last of a repeated key: a configuration measured twice lost one time.
    text = json.dumps(CACHE)
    first = '"32,0": {'
    twice = text.replace(first, '"32,0": {"bx": 32, "flag": 0, "time": 0.1}, ' + first, 1)
    path = tmp_path / "twice.json"
    path.write_text(twice)
    with pytest.raises(DatasetError, match='the key "32,0" appears twice in one object'):
        load_dataset(path)


@pytest.mark.parametrize("time_ms", [1e-310, 1e-7, 1e8], ids=["subnormal", "tiny", "huge"])
def test_a_time_no_kernel_takes_is_refused(tmp_path, time_ms):
    """A subnormal time was taken: its throughput overflowed to infinity, and `bench tuner
    --json` printed NaN for the dataset's scores (JSON has no NaN)."""
    cache = json.loads(json.dumps(CACHE))
    cache["cache"]["32,0"]["time"] = time_ms
    path = tmp_path / "odd_time.json"
    path.write_text(json.dumps(cache))
    with pytest.raises(DatasetError, match=r"time must be between 1e-06 and 1e\+07 ms"):
        load_dataset(path)


def test_a_time_of_a_nanosecond_or_three_hours_is_taken(tmp_path):
    cache = json.loads(json.dumps(CACHE))
    cache["cache"]["32,0"]["time"] = 1e-6
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(cache))
    assert load_dataset(path).records[0].time_ms == 1e-6
    cache["cache"]["32,0"]["time"] = 1e7
    path.write_text(json.dumps(cache))
    assert load_dataset(path).records[0].time_ms == 1e7


# --- the benchmark hub's real files ----------------------------------------------------


@needs_hub
def test_benchmark_hub_t4_and_cache_agree():
    t4, cache = load_dataset(HUB_T4), load_dataset(HUB_CACHE)
    assert (t4.format, cache.format) == ("t4", "kt-cache")
    assert len(t4) == len(cache) == 4362
    for ds in (t4, cache):
        doc = summary(ds)
        assert (doc["valid"], doc["failed"]) == (4201, 161)
        assert doc["failures"] == {"runtime": 155, "compile": 6}
    assert t4.best().configuration == cache.best().configuration
    assert t4.best().time_ms == cache.best().time_ms == pytest.approx(0.5536, abs=1e-4)
    for record in cache:
        twin = t4.lookup(record.configuration)
        assert twin is not None
        assert (twin.time_ms, twin.runtimes_ms, twin.invalidity) == (
            record.time_ms,
            record.runtimes_ms,
            record.invalidity,
        )


@needs_hub
def test_benchmark_hub_t4_rewrites_losslessly(tmp_path):
    original = load_dataset(HUB_T4)
    again = read_t4(write_t4(original, tmp_path / "hub.t4.json.gz"))
    assert again == original


def test_a_foreign_files_units_and_objectives_survive_a_rewrite(tmp_path):
    """`pipetune dataset convert` of a file with a measurement in GFLOP/s and two objectives
    wrote the unit as "" and the objectives as ["time"], and said it had written the file."""
    result = {
        "configuration": {"x": 1},
        "times": {"runtimes": [1.0]},
        "invalidity": "correct",
        "correctness": 1,
        "measurements": [
            {"name": "time", "value": 1.0, "unit": "ms"},
            {"name": "GFLOP/s", "value": 12.5, "unit": "GFLOP/s"},
            {"name": "smem_bytes", "value": 4096, "unit": "B"},
        ],
        "objectives": ["time", "GFLOP/s"],
    }
    source = tmp_path / "u.t4.json"
    source.write_text(json.dumps({"schema_version": "1.0.0", "results": [result]}))
    original = read_t4(source)
    assert original.objectives == ("time", "GFLOP/s")
    written = json.loads(write_t4(original, tmp_path / "u2.t4.json").read_text())["results"][0]
    assert written["measurements"] == result["measurements"]
    assert written["objectives"] == ["time", "GFLOP/s"]
    assert read_t4(tmp_path / "u2.t4.json") == original
    assert original.records[0].units == {"GFLOP/s": "GFLOP/s"}  # ("B" is smem_bytes' default)
    # A unit that is not a string says nothing (it was read so before), not a bad file.
    result["measurements"][1]["unit"] = None
    source.write_text(json.dumps({"schema_version": "1.0.0", "results": [result]}))
    assert read_t4(source).records[0].units == {}


def test_a_foreign_files_measurements_named_status_and_error_are_measurements(tmp_path):
    """Another program's T4 file may name a measurement "error" or "status" (the schema
    allows any name): they were read as pipetune's failure message and trial status, and the
    file refused ("an error must be a string", "unknown trial status"). Only a file with
    pipetune's metadata says pipetune's fields so."""
    result = {
        "configuration": {"x": 1},
        "times": {"runtimes": [1.0]},
        "invalidity": "correct",
        "correctness": 1,
        "measurements": [
            {"name": "time", "value": 1.0, "unit": "ms"},
            {"name": "error", "value": 0.0012, "unit": ""},
            {"name": "status", "value": "success", "unit": ""},
        ],
    }
    source = tmp_path / "foreign.t4.json"
    source.write_text(json.dumps({"schema_version": "1.0.0", "results": [result]}))
    record = read_t4(source).records[0]
    assert record.measurements == {"error": 0.0012, "status": "success"}
    assert record.error is None and record.status is None
    written = json.loads(write_t4(read_t4(source), tmp_path / "b.t4.json").read_text())
    assert written["results"][0]["measurements"] == result["measurements"]


def test_record_from_result_uses_milliseconds():
    schedule = Schedule(1, 1, 1, 1, 1, 1, 1)
    record = record_from_result(schedule, MeasureResult(status="ok", latency_us=1500.0, spread=0.0))
    assert record.time_ms == 1.5 and record.configuration == schedule.as_dict()


def test_a_failed_record_replays_as_a_failure_without_timings():
    """A foreign file may keep a failed configuration's time and repeats: replayed, they made
    a failed result carrying a latency, which the service now refuses (and which stored its
    repeats and dropped its latency before). A valid record's stray error text is dropped."""
    config = {"block_size_x": 16}
    failed = Record(config, invalidity="runtime", time_ms=0.5, runtimes_ms=[0.5, 0.6])
    result = result_from_record(failed, "replay:cupy")
    assert (result.status, result.latency_us, result.samples_us) == ("runtime_error", None, [])
    valid = Record(config, time_ms=0.5, runtimes_ms=[0.5], error="a stray warning")
    replayed = result_from_record(valid, "replay:cupy")
    assert replayed.ok and replayed.latency_us == 500.0 and replayed.error is None


def test_a_pipetune_file_without_results_says_so(tmp_path, schedules):
    # It said "knobs [] are not the schedule knobs of gemm ...", which hid the cause.
    dataset = pipetune_dataset(schedules)
    empty = Dataset([], knobs=dataset.knobs, metadata=dataset.metadata)
    with pytest.raises(DatasetError, match="no results: the file records no configuration"):
        check_pipetune(empty)


def test_a_record_with_other_knobs_is_named_beside_record_0():
    # With the knobs taken from record 0, a record 0 missing one blamed record 1.
    records = [
        Record(configuration={"bx": 32}, invalidity="correct", time_ms=1.0),
        Record(configuration={"bx": 64, "tile": 2}, invalidity="correct", time_ms=2.0),
    ]
    with pytest.raises(DatasetError, match=r"record 1 has knobs \['bx', 'tile'\], record 0 has"):
        Dataset(records)


def test_files_written_all_or_none_refuse_a_folder_before_renaming_any(tmp_path):
    """A folder where one of the files goes was found at its rename: the files renamed
    before it were replaced and the temporary files after it left behind (an export over a
    folder holding a directory named index.json)."""
    from pipetune.workers.datasets.files import write_all_atomic

    (tmp_path / "a.cubin").write_bytes(b"old")
    (tmp_path / "index.json").mkdir()
    with pytest.raises(IsADirectoryError):
        write_all_atomic([(tmp_path / "a.cubin", b"new"), (tmp_path / "index.json", b"{}")])
    assert (tmp_path / "a.cubin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.cubin", "index.json"]


def test_a_rename_that_fails_leaves_no_temporary_file(tmp_path, monkeypatch):
    import os

    from pipetune.workers.datasets import files

    renames = []

    def second_fails(src, dst):
        renames.append(dst)
        if len(renames) == 2:
            raise PermissionError("permission denied")
        os.rename(src, dst)

    monkeypatch.setattr(files.os, "replace", second_fails)
    out = [(tmp_path / name, b"x") for name in ("a", "b", "c")]
    with pytest.raises(PermissionError):
        files.write_all_atomic(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
