"""`pipetune bench tuner` on real and pipetune datasets, and its error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Space
from pipetune.model.workloads import gemm
from pipetune.workers.datasets import write_t4
from pipetune.workers.runners import make_runner
from pipetune.workers.runners.sweep import sweep

runner = CliRunner()
KT_CACHE = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "datasets"
    / "convolution_A100.kt-cache.json.gz"
)


@pytest.fixture(scope="module")
def pipetune_dataset(tmp_path_factory) -> Path:
    """A small exhaustive simulated sweep (plumbing only: simulated, not measured)."""
    gpu = get_gpu("h100")
    workload = gemm(256, 128, 512)
    space = Space.enumerate(workload, gpu)
    with make_runner("simulated", gpu=gpu, seed=0, time_scale=0) as sim:
        dataset = sweep(sim, workload, gpu, list(space), progress=None)
    path = tmp_path_factory.mktemp("data") / "small.t4.json.gz"
    write_t4(dataset, path)
    return path


def _simulated_sweep(folder: Path, gpu_key: str, m: int) -> Path:
    gpu = get_gpu(gpu_key)
    workload = gemm(m, 128, 512)
    with make_runner("simulated", gpu=gpu, seed=0, time_scale=0) as sim:
        dataset = sweep(sim, workload, gpu, list(Space.enumerate(workload, gpu)), progress=None)
    path = folder / gpu_key / f"gemm{m}.t4.json.gz"
    path.parent.mkdir(exist_ok=True)
    write_t4(dataset, path)
    return path


def test_pipetune_priors_pair_by_workload_and_gpu(tmp_path):
    # Two operators (the same knobs, as every operator of the family) on two GPUs: each
    # H100 dataset takes the A100 dataset of its own workload as its prior (simulated data:
    # plumbing only).
    h100 = [_simulated_sweep(tmp_path, "h100", m) for m in (256, 512)]
    a100 = [_simulated_sweep(tmp_path, "a100", m) for m in (256, 512)]
    priors = [arg for path in a100 for arg in ("--prior", str(path))]
    args = ["bench", "tuner", *map(str, h100), *priors, "--strategies"]
    args += ["analytical+xgb", "--budgets", "5", "--seeds", "1", "--prior-trials", "8", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["priors"] == {
        "gemm256": "gemm256 (8 trials of auto)",
        "gemm512": "gemm512 (8 trials of auto)",
    }
    same_gpu = runner.invoke(app, [*args[:2], str(h100[0]), "--prior", str(h100[0])])
    assert same_gpu.exit_code == 2, same_gpu.output
    # (It said "no --prior file has the knobs of gemm256": the knobs were the same.)
    assert f"for gemm256, no file fits ({h100[0].name}: the same GPU (h100))" in same_gpu.output
    nothing = runner.invoke(app, [*args[:2], str(h100[0]), "--strategies", " , "])
    assert nothing.exit_code == 2 and "--strategies: name at least one" in nothing.output


def test_bench_pipetune_dataset_json(pipetune_dataset):
    args = [
        "bench",
        "tuner",
        "--dataset",
        str(pipetune_dataset),
        "--strategies",
        "random,analytical",
        "--budgets",
        "5,10",
        "--seeds",
        "2",
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {(r["strategy"], r["budget"]) for r in doc["results"]} == {
        ("random", 5),
        ("random", 10),
        ("analytical", 5),
        ("analytical", 10),
    }
    for r in doc["results"]:
        assert 0 < r["best_in_k"] <= 1
        assert set(r["per_dataset"]) == {"small"}
    assert doc["simulated"] == ["small"]


def test_bench_tables_of_a_simulated_dataset_say_so(pipetune_dataset):
    """A simulated sweep's best-in-k was shown as a GPU's would be (the JSON and the tables
    said nothing of it), and on it `analytical` is scored against its own predictions."""
    from pipetune.clients.library.labels import SIMULATED_LABEL

    args = ["bench", "tuner", str(pipetune_dataset), "--strategies", "random"]
    result = runner.invoke(app, [*args, "--budgets", "5", "--seeds", "2"])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.stdout.split())
    assert f"small: best-in-k ({SIMULATED_LABEL})" in shown
    assert f"1 of the 1 datasets are {SIMULATED_LABEL}: small." in shown


def test_bench_foreign_cache_with_knob_only_strategies():
    if not KT_CACHE.exists():
        pytest.skip("shared datasets are not next to this checkout")
    args = [
        "bench",
        "tuner",
        "--dataset",
        str(KT_CACHE),
        "--strategies",
        "random,xgb",
        "--budgets",
        "20",
        "--seeds",
        "2",
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["results"]) == 2
    assert json.loads(result.stdout)["simulated"] == []  # a GPU's recording
    refused = runner.invoke(
        app, ["bench", "tuner", "--dataset", str(KT_CACHE), "--strategies", "analytical"]
    )
    assert refused.exit_code == 2
    assert "not a pipetune dataset" in refused.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--strategies", "nope"], "unknown strategy"),
        (["--budgets", "0,10"], "at least 1"),
        (["--budgets", "ten"], "integers"),
    ],
)
def test_bench_bad_options_exit_2(pipetune_dataset, extra, message):
    result = runner.invoke(app, ["bench", "tuner", "--dataset", str(pipetune_dataset), *extra])
    assert result.exit_code == 2
    assert message in result.output


def test_bench_needs_a_readable_dataset(tmp_path):
    assert runner.invoke(app, ["bench", "tuner"]).exit_code == 2
    bad = tmp_path / "bad.t4.json.gz"
    bad.write_bytes(b"not gzip at all")
    assert runner.invoke(app, ["bench", "tuner", "--dataset", str(bad)]).exit_code == 2


def _partial(folder: Path, quarantined: bool) -> Path:
    """The first 6 schedules of a small GEMM's space (a task's export, a sweep with --limit);
    `quarantined`: a campaign's cut, which says which knob values it left out."""
    gpu = get_gpu("h100")
    workload = gemm(256, 128, 512)
    with make_runner("simulated", gpu=gpu, seed=0, time_scale=0) as sim:
        dataset = sweep(sim, workload, gpu, list(Space.enumerate(workload, gpu))[:6], progress=None)
    if quarantined:
        dataset.metadata["pipetune"]["quarantined"] = {"smem_stages": [1]}
    path = folder / f"cut{int(quarantined)}.t4.json.gz"
    write_t4(dataset, path)
    return path


def test_a_partial_recording_is_refused_with_exit_2_not_scored_against_its_own_best(tmp_path):
    """A task's export of 6 trials was benchmarked as the whole space: every strategy found
    "the optimum" (the best of the six), 1.000 at k=2, P score +1.00."""
    args = ["bench", "tuner", "--strategies", "random", "--budgets", "2", "--seeds", "1"]
    result = runner.invoke(app, [*args, str(_partial(tmp_path, quarantined=False))])
    assert result.exit_code == 2, result.output
    assert "cut0 holds 6 of the " in result.stderr
    assert "scored against the optimum of an exhaustive sweep" in result.stderr
    cut = runner.invoke(app, [*args, str(_partial(tmp_path, quarantined=True)), "--json"])
    assert cut.exit_code == 0, cut.output  # (a campaign's quarantine says what it lacks)
