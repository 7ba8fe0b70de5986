"""A measured time is shown as the kernel's own only where the generator revision that made
the timed kernel is the one that makes it now. The convolutions' committed H100 sweeps timed
revision 1 of their generator; the loader change that made revision 2 took every
convolution's time to 0.80x. A lookup answered their 72.9 us as "measured", and `pipetune
export` wrote it beside a revision-2 kernel in index.json and the header."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pipetune
from pipetune.clients.cli.main import app
from pipetune.model.family import generator_revision_of
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import gemm
from pipetune.workers.datasets import Dataset, load_dataset, write_t4
from pipetune.workers.datasets.pipetune import PipetuneInfo
from pipetune.workers.runners import make_runner
from pipetune.workers.runners.sweep import sweep

runner = CliRunner()
CONV_SWEEP = Path(__file__).resolve().parents[1] / "benchmarks/data/h100/Conv2D_RN50_2.t4.json.gz"
# The few fastest records are enough: the best of them is what is looked up and exported.
RECORDS = 12


def _database(tmp: Path, data: Dataset, name: str) -> str:
    path = tmp / f"{name}.t4.json.gz"
    write_t4(data, path)
    url = f"sqlite:///{tmp / name}.db"
    result = runner.invoke(app, ["db", "import-dataset", str(path), "--db", url])
    assert result.exit_code == 0, result.output
    return url


def _fastest(data: Dataset) -> list:
    ok = [r for r in data.records if r.valid]
    return sorted(ok, key=lambda r: r.time_ms)[:RECORDS]


@pytest.fixture(scope="module")
def conv() -> tuple[Dataset, object, int]:
    """The committed sweep (revision 1), its workload, and the revision made now."""
    data = load_dataset(CONV_SWEEP)
    workload = PipetuneInfo(data).workload
    return data, workload, generator_revision_of(workload).revision


@pytest.fixture(scope="module")
def older(conv, tmp_path_factory: pytest.TempPathFactory) -> str:
    data, _, now = conv
    assert now > 1, "the convolution generator is past revision 1 (model/gemm_family.py)"
    records = _fastest(data)
    assert {r.measurements.get("generator_revision", 1) for r in records} == {1}
    small = Dataset(records, knobs=data.knobs, metadata=data.metadata)
    return _database(tmp_path_factory.mktemp("older"), small, "older")


@pytest.fixture(scope="module")
def current(conv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same records, as if the generator of today had timed them."""
    data, _, now = conv
    records = [
        replace(r, measurements={**r.measurements, "generator_revision": now})
        for r in _fastest(data)
    ]
    small = Dataset(records, knobs=data.knobs, metadata=data.metadata)
    return _database(tmp_path_factory.mktemp("current"), small, "current")


def test_a_lookup_names_the_revision_it_measured_and_the_one_made_now(conv, older, current):
    _, workload, now = conv
    old = pipetune.best_schedule(workload, "h100", db=older)
    assert old.source == "measured" and old.runner == "cupy"
    assert old.device_name == "NVIDIA H100 80GB HBM3"  # as the imported dataset names it
    assert (old.measured_generator_revision, old.generator_revision) == (1, now)
    same = pipetune.best_schedule(workload, "h100", db=current)
    assert (same.measured_generator_revision, same.generator_revision) == (now, now)


def test_a_kernel_of_an_older_measurement_says_so(conv, older, current):
    _, workload, now = conv
    words = "measured on revision 1 of the tensor_gemm.conv kernel generator; this kernel is "
    words += f"its revision {now}, whose times differ"
    kernel = pipetune.kernel(workload, "h100", db=older)
    assert kernel.older_kernel == words and words in repr(kernel)
    launch = kernel.launch_document()
    assert launch["latency_label"] == words
    assert (launch["measured_generator_revision"], launch["generator_revision"]) == (1, now)
    assert launch["generator"] == "tensor_gemm.conv"
    fresh = pipetune.kernel(workload, "h100", db=current)
    assert fresh.older_kernel is None and "revision" not in repr(fresh)
    assert "latency_label" not in fresh.launch_document()


def test_the_schedule_command_notes_an_older_kernels_time(conv, older, current):
    args = ["schedule", "conv2d", "--n", "64", "--h", "28", "--w", "28", "--c", "128"]
    args += ["--k", "128", "--r", "3", "--s", "3", "--pad", "1", "--gpu", "h100", "--db"]
    old = runner.invoke(app, [*args, older])
    assert old.exit_code == 0, old.output
    assert "note: the µs below is an older kernel's: measured on revision 1" in old.stdout
    same = runner.invoke(app, [*args, current])
    assert same.exit_code == 0 and "note:" not in same.stdout


def test_an_export_labels_an_older_kernels_time_everywhere_it_shows_it(
    conv, older, current, tmp_path: Path
):
    _, _, now = conv
    out = tmp_path / "older"
    result = runner.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", older])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((out / "index.json").read_text())["workloads"]
    assert entry["device_name"] == "NVIDIA H100 80GB HBM3"  # the device that measured it
    assert entry["generator"] == "tensor_gemm.conv"
    assert (entry["measured_generator_revision"], entry["generator_revision"]) == (1, now)
    label = entry["latency_label"]
    assert label.startswith("measured on revision 1 of the tensor_gemm.conv kernel generator")
    assert label in (out / "pipetune_tuned.h").read_text()
    assert json.loads((out / entry["files"]["launch"]).read_text())["latency_label"] == label
    assert f"{entry['latency_us']:.2f}*" in result.stdout and f"* {label}" in result.stdout

    out = tmp_path / "current"
    result = runner.invoke(app, ["export", "--gpu", "h100", "--out-dir", str(out), "--db", current])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((out / "index.json").read_text())["workloads"]
    assert (entry["measured_generator_revision"], entry["generator_revision"]) == (now, now)
    assert "latency_label" not in entry
    assert f"{entry['latency_us']:.2f} " in result.stdout and "* measured" not in result.stdout
    assert "revision" not in (out / "pipetune_tuned.h").read_text()


def test_a_simulated_time_names_no_revision(tmp_path: Path):
    """The simulated runner times no kernel: its answer has no revision to compare."""
    workload, gpu = gemm(256, 128, 512), get_gpu("a100")
    schedules = list(Space.enumerate(workload, gpu))[:8]
    with make_runner("simulated", gpu=gpu, seed=0, time_scale=0) as sim:
        data = sweep(sim, workload, gpu, schedules, progress=None)
    url = _database(tmp_path, data, "simulated")
    answer = pipetune.best_schedule(workload, "a100", db=url)
    assert answer.source == "measured" and answer.runner == "simulated"
    assert answer.measured_generator_revision is None and answer.generator_revision is None
    assert answer.device_name is None  # (a simulated sweep names no device)
    assert pipetune.kernel(workload, "a100", db=url).older_kernel is None
