"""`pipetune db ...` and the local-worker plumbing of `pipetune serve`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from sqlalchemy import select
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import parse_workload
from pipetune.service.db import Database
from pipetune.service.local_workers import assign_gpus, stop_workers, worker_command
from pipetune.service.migrate import head_revision
from pipetune.service.orm import ReferenceOptimumRow, WorkloadRow
from pipetune.workers.datasets import dataset_from_results, write_t4

runner = CliRunner()


def test_db_upgrade_and_current(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    before = runner.invoke(app, ["db", "current", "--db", url, "--json"])
    assert before.exit_code == 0, before.output
    doc = json.loads(before.output)
    assert doc["current"] is None and doc["head"] == head_revision()
    assert doc["up_to_date"] is False

    upgraded = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"revision {head_revision()}" in upgraded.output
    after = json.loads(runner.invoke(app, ["db", "current", "--db", url, "--json"]).output)
    assert after["current"] == head_revision() and after["up_to_date"] is True
    text = runner.invoke(app, ["db", "current", "--db", url])
    assert "up to date" in text.output


def test_db_import_optimum_records_the_sweeps_best(tmp_path):
    url = f"sqlite:///{tmp_path / 'opt.db'}"
    assert runner.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    workload = parse_workload({"op": "gemm", "m": 256, "n": 256, "k": 256})
    gpu = get_gpu("a100")
    space = Space.enumerate(workload, gpu)
    latency = evaluate(space).latency_us
    results = [MeasureResult(status="ok", latency_us=float(x)) for x in latency]
    dataset = dataset_from_results(workload, gpu, list(space), results, runner="simulated")
    path = write_t4(dataset, tmp_path / "sweep.t4.json.gz")

    result = runner.invoke(app, ["db", "import-optimum", str(path), "--db", url])
    assert result.exit_code == 0, result.output
    db = Database(url)
    with db.read() as s:
        (row,) = s.scalars(select(ReferenceOptimumRow)).all()
        digest = s.scalar(select(WorkloadRow.hash).where(WorkloadRow.id == row.workload_id))
    db.dispose()
    assert digest == workload.workload_hash and row.gpu == "a100"
    assert abs(row.best_latency_us - float(latency.min())) < 1e-6 * float(latency.min())
    assert row.configurations == len(space)

    missing = runner.invoke(app, ["db", "import-optimum", str(tmp_path / "nope.gz"), "--db", url])
    assert missing.exit_code == 2


def test_serve_rejects_bad_options():
    assert runner.invoke(app, ["serve", "--runner", "opencl"]).exit_code == 2
    assert runner.invoke(app, ["serve", "--local-workers", "-1"]).exit_code == 2
    replay = runner.invoke(app, ["serve", "--local-workers", "2", "--runner", "replay"])
    assert replay.exit_code == 2


def test_local_workers_cover_every_gpu_of_the_registry():
    assert assign_gpus(3) == ["a100", "h100", "h200"]
    assert assign_gpus(5) == ["a100", "h100", "h200", "a100", "h100"]
    assert assign_gpus(1) == ["a100"]
    command = worker_command("http://127.0.0.1:9", "simulated", "h100", "local-0")
    assert command[:4] == [sys.executable, "-m", "pipetune.clients.cli", "worker"]
    pairs = dict(zip(command[4::2], command[5::2], strict=True))
    # No --token: the token travels in the environment, out of sight of `ps`.
    assert pairs == {
        "--server": "http://127.0.0.1:9",
        "--runner": "simulated",
        "--gpu": "h100",
        "--name": "local-0",
    }


def test_stop_workers_terminates_then_kills():
    polite = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"],
    )
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\nwhile True: time.sleep(0.1)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout.readline().strip() == b"ready"
    started = time.monotonic()
    stop_workers([polite, stubborn], timeout_s=1.0)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5
