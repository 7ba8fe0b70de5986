"""`pipetune db import-dataset FILE`: a recorded dataset of one workload on one GPU becomes a
finished task that a task on another GPU warm-starts from (`prior_task`), that the best
schedule lookup knows, and that stays out of the per-strategy curves. SQLite and PostgreSQL.
The datasets here are small simulated sweeps (plumbing only: simulated, not measured)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from service_support import WORKER_HEADERS, client_for, drain, register, service_of
from sqlalchemy import text
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import gemm
from pipetune.service.db import make_engine
from pipetune.workers.datasets import Dataset, load_dataset, write_t4
from pipetune.workers.runners import make_runner
from pipetune.workers.runners.sweep import sweep

pytest_plugins = ["service_fixtures"]

runner = CliRunner()
WORKLOAD = gemm(256, 128, 512)
KT_CACHE = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="module")
def a100_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated A100 sweep of every 8th schedule of WORKLOAD's space (301 of 2,402): each
    test imports, reads back or exports it at a cost in proportion to its records (the whole
    space made the file three times as slow), and the plumbing is the same for any number."""
    gpu = get_gpu("a100")
    schedules = list(Space.enumerate(WORKLOAD, gpu))[::8]
    with make_runner("simulated", gpu=gpu, seed=0, time_scale=0) as sim:
        data = sweep(sim, WORKLOAD, gpu, schedules, progress=None)
    path = tmp_path_factory.mktemp("import") / "gemm256_a100.t4.json.gz"
    write_t4(data, path)
    return path


def _import(path: Path, db_url: str) -> dict:
    result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _export_t4(task_id: int, out: Path, db_url: str) -> Dataset:
    """`pipetune export --format t4` of a task, read back."""
    args = ["export", "--task", str(task_id), "--format", "t4", "--out", str(out)]
    result = runner.invoke(app, [*args, "--db", db_url])
    assert result.exit_code == 0, result.output
    return load_dataset(out)


def test_an_imported_dataset_is_a_finished_task_a_warm_start_can_name(a100_sweep, db_url):
    data = load_dataset(a100_sweep)
    times = [r.time_ms for r in data.records if r.time_ms is not None]
    doc = _import(a100_sweep, db_url)
    assert doc["state"] == "done" and doc["gpu"] == "a100"
    assert doc["imported_from"] == str(a100_sweep) and doc["strategy"] == "grid"
    assert doc["trials_done"] == len(data) == doc["budget"]
    assert doc["best"]["latency_us"] == pytest.approx(min(times) * 1e3)
    assert doc["best"]["runner"] == "simulated"

    with client_for(db_url) as client:
        trials = client.get(f"/v1/tasks/{doc['id']}/trials?limit=10000").json()["trials"]
        assert len(trials) == len(data)
        assert [t["schedule"] for t in trials] == [dict(r.configuration) for r in data.records]
        assert all(t["predicted_us"] > 0 for t in trials)  # the model's, for the scatter
        best = client.post("/v1/schedules", json={"workload": WORKLOAD.canonical(), "gpu": "a100"})
        assert best.json()["source"] == "measured"
        assert best.json()["latency_us"] == pytest.approx(doc["best"]["latency_us"])
        curves = client.get("/v1/curves").json()["curves"]
        assert "grid" not in curves  # nothing was tuned here

        body = {"workload": WORKLOAD.canonical(), "gpu": "h100", "budget": 8}
        warm = client.post("/v1/tasks", json={**body, "prior_task": doc["id"]})
        assert warm.status_code == 201, warm.text
        assert warm.json()["prior_task"] == doc["id"]
        # A newer but shorter task there: prior_gpu still takes the import (more measured).
        short = client.post("/v1/tasks", json={**body, "gpu": "a100", "strategy": "random"})
        assert drain(client, register(client, "a100-worker", gpu="a100")) == 8
        assert client.get(f"/v1/tasks/{short.json()['id']}").json()["state"] == "done"
        by_gpu = client.post("/v1/tasks", json={**body, "seed": 1, "prior_gpu": "a100"})
        assert by_gpu.status_code == 201 and by_gpu.json()["prior_task"] == doc["id"]
        live = service_of(client).driver._live[warm.json()["id"]]
        prior = live.session.strategy.prior  # the import, completed by the model
        assert prior.source == f"task {doc['id']} on a100 and the analytical model"
        assert prior.sampled and prior.recorded.sum() > 0.9 * len(data)


def test_what_is_not_a_pipetune_dataset_is_refused_with_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    missing = runner.invoke(
        app, ["db", "import-dataset", str(tmp_path / "no.t4.json"), "--db", url]
    )
    assert missing.exit_code == 2 and "no.t4.json" in missing.stderr
    cache = KT_CACHE / "convolution_A100.kt-cache.json.gz"
    if cache.exists():
        foreign = runner.invoke(app, ["db", "import-dataset", str(cache), "--db", url])
        assert foreign.exit_code == 2 and "not a pipetune dataset" in foreign.stderr
    assert not (tmp_path / "x.db").exists()  # nothing written


@pytest.mark.parametrize("label", ["Simulated", "foo", "cupy,bogus"])
def test_a_dataset_whose_runner_label_pipetune_never_writes_is_refused(a100_sweep, tmp_path, label):
    # "Simulated" was stored as given, then read as measured (is_simulated looks for the
    # lower-case kind): a learned prior took the analytical model's own answers back.
    data = load_dataset(a100_sweep)
    data.metadata["pipetune"]["runner"] = label
    relabelled = tmp_path / "relabelled.t4.json.gz"
    write_t4(data, relabelled)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    result = runner.invoke(app, ["db", "import-dataset", str(relabelled), "--db", url])
    assert result.exit_code == 2, result.output
    assert f"runner {label!r}" in result.stderr
    assert not (tmp_path / "x.db").exists()


def test_each_records_timestamp_is_kept_and_exported_back(a100_sweep, db_url, tmp_path):
    """An imported record's timestamp is when it was measured: the trial keeps it, and the
    task's T4 export writes it back (it was dropped on import and the export wrote its own
    time on every record). One without a timestamp, or with one that is not ISO 8601 (the
    schema does not constrain it), has none in the export either."""
    data = load_dataset(a100_sweep)
    stamps: list[str | None] = [
        f"2023-12-22 09:{i // 60 % 60:02d}:{i % 60:02d}.500000+00:00" for i in range(len(data))
    ]
    stamps[1] = "2024-01-02T03:04:05"  # naive: UTC, as Kernel Tuner's files mean it
    stamps[2] = None
    stamps[3] = "last Tuesday"
    records = [replace(r, timestamp=t) for r, t in zip(data.records, stamps, strict=True)]
    path = tmp_path / "stamped.t4.json.gz"
    write_t4(Dataset(records, knobs=data.knobs, metadata=data.metadata), path)
    doc = _import(path, db_url)

    out = tmp_path / "back.t4.json.gz"
    back = [r.timestamp for r in _export_t4(doc["id"], out, db_url).records]
    assert back[0] == stamps[0] and back[4:] == stamps[4:]
    assert back[1] == "2024-01-02 03:04:05+00:00"
    assert back[2] is None and back[3] is None
    with client_for(db_url) as client:
        trials = client.get(f"/v1/tasks/{doc['id']}/trials?limit=3").json()["trials"]
    assert trials[0]["finished_at"].startswith("2023-12-22T09:00:00.5")
    assert trials[2]["finished_at"] is None
    # ... and no trial was created after it finished (the import's time came after it).
    engine = make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            late = conn.execute(
                text("SELECT count(*) FROM jobs WHERE task_id = :t AND created_at > finished_at"),
                {"t": doc["id"]},
            ).scalar()
    finally:
        engine.dispose()
    assert late == 0


@pytest.mark.parametrize("field", ["registers", "smem_bytes"])
def test_a_value_no_trial_row_holds_is_refused_naming_the_record(
    a100_sweep, db_url, tmp_path, field
):
    """A worker's result with 2^31 registers is a 422 naming the field; the same value in a
    dataset failed on PostgreSQL's insert ("integer out of range", exit 1) and was stored by
    SQLite. It is refused before the database now, exit 2, and nothing is written."""
    data = load_dataset(a100_sweep)
    records = list(data.records)
    bad = next(i for i, r in enumerate(records) if r.valid)
    records[bad] = replace(records[bad], measurements={**records[bad].measurements, field: 2**31})
    path = tmp_path / "huge.t4.json"
    write_t4(Dataset(records, knobs=data.knobs, metadata=data.metadata), path)
    result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url])
    assert result.exit_code == 2, result.output
    assert f"record {bad}'s {field}: must be at most 2147483647" in result.output
    with client_for(db_url) as client:
        assert client.get("/v1/tasks").json()["tasks"] == []


def test_settings_too_large_to_keep_are_refused_before_the_database(a100_sweep, db_url, tmp_path):
    """100 kB of settings were stored with the imported task and sent with every listing of
    the service's tasks (the dashboard's, every 2 s). Refused now, exit 2, nothing written;
    settings up to the limit are kept whole."""
    data = load_dataset(a100_sweep)
    meta = json.loads(json.dumps(data.metadata))
    meta["pipetune"]["settings"] = {"warmup": 3, "notes": "B" * 100_000}
    path = tmp_path / "big_settings.t4.json.gz"
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), path)
    result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", db_url])
    assert result.exit_code == 2, result.output
    assert "settings: 100,023 characters of JSON, over the 8,192" in result.stderr
    with client_for(db_url) as client:
        assert client.get("/v1/tasks").json()["tasks"] == []

    fits = {"warmup": 3, "notes": "B" * (8192 - 23)}  # 8,192 characters as compact JSON
    meta["pipetune"]["settings"] = fits
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), path)
    assert _import(path, db_url)["imported_settings"] == fits


def test_an_export_names_the_gpus_its_workers_registered(db_url, tmp_path):
    """A task measured by a worker that registered its device exported device_name null:
    the T4 file did not say which GPU measured it. Its trials name their worker's device
    now, and the export's metadata the devices of its trials."""
    with client_for(db_url) as client:
        body = {"name": "gpu-7", "gpu": "h100", "arch": "sm_90", "runner": "simulated",
                "device_name": "NVIDIA H100 80GB HBM3"}  # fmt: skip
        worker = client.post("/v1/workers", json=body, headers=WORKER_HEADERS).json()["id"]
        task = client.post(
            "/v1/tasks", json={"workload": WORKLOAD.canonical(), "gpu": "h100", "budget": 4}
        ).json()
        assert drain(client, worker) == 4
        trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    assert {t["worker_device"] for t in trials} == {"NVIDIA H100 80GB HBM3"}
    out = tmp_path / "task.t4.json"
    meta = _export_t4(task["id"], out, db_url).metadata["pipetune"]
    assert meta["device_name"] == "NVIDIA H100 80GB HBM3"


def test_a_measured_schedule_outside_todays_rules_is_still_the_users_kernel(tmp_path: Path):
    """A measured best ran, whatever the rules say now: `pipetune export` wrote its kernel,
    while `pipetune.kernel()` refused the same schedule as outside the GPU's space. (Such a
    trial was stored under earlier rules: an import of one today is refused, see
    tests/test_import_validity.py, so the stored trial is rewritten here.)"""
    import pipetune
    from pipetune.model.family import family_of
    from pipetune.model.trials import MeasureResult
    from pipetune.workers.datasets import dataset_from_results

    workload, a100 = gemm(1024, 64, 2048), get_gpu("a100")
    fam = family_of(workload)
    # A schedule of the H100's space (more shared memory) that the A100's rules refuse.
    outside = next(
        s
        for s in fam.enumerate(workload, get_gpu("h100"))
        if fam.schedule_problems(s, workload, a100)
    )
    inside = next(iter(fam.enumerate(workload, a100)))
    result = MeasureResult(status="ok", latency_us=5.0, samples_us=[5.0], runner="cupy")
    path = tmp_path / "inside.t4.json.gz"
    write_t4(dataset_from_results(workload, a100, [inside], [result], runner="cupy"), path)
    db = f"sqlite:///{tmp_path / 'measured.db'}"
    task = _import(path, db)["id"]
    engine = make_engine(db)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE jobs SET schedule = :doc, schedule_id = :id WHERE task_id = :task"),
                {"doc": json.dumps(outside.as_dict()), "id": outside.id, "task": task},
            )
    finally:
        engine.dispose()
    kernel = pipetune.kernel(workload, "a100", db=db)
    assert kernel.origin == "measured" and kernel.schedule.id == outside.id


def test_a_gpus_measurements_are_the_best_known_however_fast_a_simulated_sweep(tmp_path, db_url):
    """An imported simulated sweep (the model's times, 4.5 us) hid what a GPU measured (11.8
    us): `POST /v1/schedules` answered the simulated pick and `pipetune export` wrote it."""
    from pipetune.model.family import family_of
    from pipetune.model.trials import MeasureResult
    from pipetune.workers.datasets import dataset_from_results

    measured = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/MM_RN50_FC.t4.json.gz"
    real = _import(measured, db_url)
    assert real["best"]["runner"] == "cupy"
    workload, h100 = gemm(1024, 64, 2048), get_gpu("h100")
    schedules = list(family_of(workload).enumerate(workload, h100))[:5]
    fast = MeasureResult(status="ok", latency_us=4.5, samples_us=[4.5], runner="simulated")
    simulated = tmp_path / "fc.simulated.t4.json.gz"
    write_t4(
        dataset_from_results(workload, h100, schedules, [fast] * 5, runner="simulated"), simulated
    )
    model = _import(simulated, db_url)
    assert model["best"]["latency_us"] < real["best"]["latency_us"]  # the case in question
    with client_for(db_url) as client:
        doc = {"workload": workload.canonical(), "gpu": "h100"}
        best = client.post("/v1/schedules", json=doc).json()
    assert best["source"] == "measured" and best["runner"] == "cupy"
    assert best["latency_us"] == pytest.approx(real["best"]["latency_us"])


def test_a_timestamp_past_what_utc_holds_is_no_timestamp():
    """9999-12-31 23:59:59-05:00 is after the last UTC time: the import raised OverflowError
    (exit 1), where a timestamp it cannot read is left out."""
    from pipetune.workers.datasets.pipetune import parse_t4_timestamp

    assert parse_t4_timestamp("9999-12-31 23:59:59-05:00") is None
    assert parse_t4_timestamp("yesterday") is None
    kept = parse_t4_timestamp("2023-12-22 09:54:05.502007+00:00")
    assert kept is not None and kept.year == 2023


def test_a_task_several_runners_measured_exports_a_file_that_reads_back(db_url, tmp_path):
    """A task measured by a replay worker and a simulated one exported the runner label
    "replay:cupy,simulated" and nothing per record: every command refused the file it wrote
    (each record's runner was taken to be that label, longer than a trial's runner). Each
    record keeps its own runner now, and an import gives each trial its own back."""
    from service_support import fake_latency, lease, ok, post_result

    with client_for(db_url) as client:
        ids = []
        for name, kind in (("replayer", "replay"), ("simulator", "simulated")):
            body = {"name": name, "gpu": "h100", "arch": "sm_90", "runner": kind}
            ids.append(client.post("/v1/workers", json=body, headers=WORKER_HEADERS).json()["id"])
        body = {"workload": WORKLOAD.canonical(), "gpu": "h100", "budget": 8, "batch_size": 8}
        task = client.post("/v1/tasks", json=body).json()
        for job in lease(client, ids[0], max_jobs=4):
            result = {**ok(fake_latency(job["schedule"])), "runner": "replay:cupy"}
            assert post_result(client, ids[0], job, result).status_code == 200
        assert drain(client, ids[1]) == 4
        trials = client.get(f"/v1/tasks/{task['id']}/trials").json()["trials"]
    runners = {json.dumps(t["schedule"], sort_keys=True): t["runner"] for t in trials}
    assert sorted(set(runners.values())) == ["replay:cupy", "simulated"]

    out = tmp_path / "mixed.t4.json"
    _export_t4(task["id"], out, db_url)
    info = runner.invoke(app, ["dataset", "info", str(out), "--json"])
    assert info.exit_code == 0, info.output
    assert json.loads(info.stdout)["runner"] == "replay:cupy,simulated"

    other = f"sqlite:///{tmp_path / 'other.db'}"
    doc = _import(out, other)
    with client_for(other) as client:
        back = client.get(f"/v1/tasks/{doc['id']}/trials").json()["trials"]
    assert {json.dumps(t["schedule"], sort_keys=True): t["runner"] for t in back} == runners


def test_a_records_own_runner_pipetune_never_writes_is_refused(a100_sweep, tmp_path):
    """A record's own runner is checked as the file's label is: "Simulated" would be read
    as measured."""
    data = load_dataset(a100_sweep)
    records = list(data.records)
    records[3] = replace(
        records[3], measurements={**records[3].measurements, "runner": "Simulated"}
    )
    path = tmp_path / "odd.t4.json"
    write_t4(Dataset(records, knobs=data.knobs, metadata=data.metadata), path)
    result = runner.invoke(
        app, ["db", "import-dataset", str(path), "--db", f"sqlite:///{tmp_path / 'x.db'}"]
    )
    assert result.exit_code == 2, result.output
    assert "'Simulated'" in result.stderr


def test_two_imports_of_one_dataset_at_once_make_one_task(a100_sweep, db_url):
    """Two imports of one file at the same time on PostgreSQL each found no task and each
    wrote one (an import script run twice at once doubled the workload's trials); the
    second waits for the first now and answers with its task, as on SQLite."""
    import threading

    from pipetune.service.db import Database
    from pipetune.service.imports import import_once
    from pipetune.workers.datasets import check_pipetune

    data = load_dataset(a100_sweep)
    info = check_pipetune(data)
    database = Database(db_url, pool_size=2)
    outcome: dict[str, tuple[int, bool]] = {}

    def second() -> None:
        with database.write() as s:
            outcome["second"] = import_once(s, data, info, "copy.t4.json", database.now())

    try:
        with database.write() as s:
            outcome["first"] = import_once(s, data, info, str(a100_sweep), database.now())
            thread = threading.Thread(target=second)
            thread.start()
            thread.join(timeout=1.0)  # (it waits for this transaction to commit)
        thread.join(timeout=60)
    finally:
        database.dispose()
    task, written = outcome["first"]
    assert written
    assert outcome["second"] == (task, False)


def test_an_imported_datasets_device_and_settings_are_exported_back(a100_sweep, db_url, tmp_path):
    """An export of an imported task wrote device_name null (it named only the GPUs of the
    workers that measured its trials, and an imported task has none) and replaced the file's
    measurement settings (a sweep's warm-up and repeats) with the task's own."""
    data = load_dataset(a100_sweep)
    meta = json.loads(json.dumps(data.metadata))
    meta["pipetune"]["device_name"] = "NVIDIA A100-SXM4-40GB"
    meta["pipetune"]["settings"] = {"warmup": 3, "repeats": 30, "l2_flush": True}
    path = tmp_path / "a100_named.t4.json.gz"
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), path)
    doc = _import(path, db_url)
    with client_for(db_url) as client:
        task = client.get(f"/v1/tasks/{doc['id']}").json()
    assert task["imported_device_name"] == "NVIDIA A100-SXM4-40GB"
    assert task["imported_settings"] == {"warmup": 3, "repeats": 30, "l2_flush": True}

    out = tmp_path / "back.t4.json.gz"
    back = _export_t4(doc["id"], out, db_url).metadata["pipetune"]
    assert back["device_name"] == "NVIDIA A100-SXM4-40GB"
    assert back["settings"] == {"warmup": 3, "repeats": 30, "l2_flush": True}
    # A tuned task's export still describes the task (no import behind it).
    with client_for(db_url) as client:
        tuned = client.post(
            "/v1/tasks", json={"workload": WORKLOAD.canonical(), "gpu": "a100", "budget": 4}
        ).json()
    assert tuned["imported_device_name"] is None and tuned["imported_settings"] is None


def test_a_dataset_that_differs_beyond_its_schedules_and_times_is_not_already_imported(
    a100_sweep, db_url, tmp_path
):
    """The same schedules, statuses and latencies with other repeats, another device or
    another runner were found "already imported" and their content dropped without a word:
    each is a task of its own now. A copy of the file under another name still is not."""
    data = load_dataset(a100_sweep)
    first = _import(a100_sweep, db_url)

    copy = tmp_path / "renamed.t4.json.gz"
    copy.write_bytes(a100_sweep.read_bytes())
    assert _import(copy, db_url)["id"] == first["id"]

    fewer_repeats = tmp_path / "fewer_repeats.t4.json.gz"
    records = [replace(r, runtimes_ms=r.runtimes_ms[:3]) for r in data.records]
    write_t4(Dataset(records, knobs=data.knobs, metadata=data.metadata), fewer_repeats)
    other_device = tmp_path / "other_device.t4.json.gz"
    meta = json.loads(json.dumps(data.metadata))
    meta["pipetune"]["device_name"] = "NVIDIA A100-SXM4-80GB"
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), other_device)

    tasks = {first["id"]}
    for path in (fewer_repeats, other_device):
        doc = _import(path, db_url)
        assert doc["id"] not in tasks and doc["imported_from"] == str(path), path.name
        tasks.add(doc["id"])
        assert _import(path, db_url)["id"] == doc["id"]  # and once only


def test_a_file_name_or_device_name_no_text_column_holds_is_stored_readably(
    a100_sweep, db_url, tmp_path
):
    """A file name that is not UTF-8 failed the import with UnicodeEncodeError (exit 1); a NUL
    or a lone surrogate in the device name did too, and PostgreSQL's refusal of the NUL read
    as the database failing. Both are stored with what they cannot hold replaced."""
    import os

    data = load_dataset(a100_sweep)
    meta = json.loads(json.dumps(data.metadata))
    meta["pipetune"]["device_name"] = "A100\x00x \ud800 lone"
    named = Path(os.fsdecode(bytes(tmp_path) + b"/lat\xe9.t4.json.gz"))
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), named)
    doc = _import(named, db_url)
    assert doc["imported_from"].endswith("lat\\xe9.t4.json.gz")
    assert doc["imported_device_name"] == "A100\ufffdx \ufffd lone"


@pytest.mark.parametrize("stated", [{}, [1, 2]], ids=["empty", "not-an-object"])
def test_an_imported_file_without_settings_is_not_exported_as_a_tuning_run(
    a100_sweep, db_url, tmp_path, stated
):
    """Settings of {} (or none pipetune could keep) were exported as the task's own: strategy
    grid, seed 0, budget N, a tuning run that never happened."""
    data = load_dataset(a100_sweep)
    meta = json.loads(json.dumps(data.metadata))
    meta["pipetune"]["settings"] = stated
    path = tmp_path / "no_settings.t4.json.gz"
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), path)
    doc = _import(path, db_url)
    back = _export_t4(doc["id"], tmp_path / "back.t4.json.gz", db_url).metadata["pipetune"]
    assert back["settings"] == {}


def test_a_file_with_empty_settings_imported_before_they_were_kept_is_already_imported(
    a100_sweep, db_url, tmp_path
):
    """Imports before settings of {} were kept as {} stored none for them; the same file
    imported again compared {} with none and became a second task."""
    from sqlalchemy import create_engine, update

    from pipetune.service.orm import TaskRow

    data = load_dataset(a100_sweep)
    meta = json.loads(json.dumps(data.metadata))
    meta["pipetune"]["settings"] = {}
    path = tmp_path / "empty_settings.t4.json.gz"
    write_t4(Dataset(data.records, knobs=data.knobs, metadata=meta), path)
    first = _import(path, db_url)
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as an import before then left it
        conn.execute(
            update(TaskRow).where(TaskRow.id == first["id"]).values(imported_settings=None)
        )
    engine.dispose()
    assert _import(path, db_url)["id"] == first["id"]
