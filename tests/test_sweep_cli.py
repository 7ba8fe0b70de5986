"""`pipetune sweep` and `pipetune calibrate` without a GPU: the simulated sweep -> T4 file ->
replay runner loop, the whole ALCOP suite in one go, and clear refusals of the GPU paths."""

from __future__ import annotations

import importlib.util
import json

import pytest
import typer
from typer.testing import CliRunner

from pipetune.clients.cli.main import app
from pipetune.clients.cli.sweep_cmds import calibrate, sweep_app
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import MemSchedule
from pipetune.model.memops.workloads import softmax
from pipetune.model.operators import ALCOP
from pipetune.model.space import Schedule
from pipetune.model.workloads import gemm
from pipetune.workers.campaign.operators import suite_in_order
from pipetune.workers.datasets import load_dataset
from pipetune.workers.runners import make_runner

cli = CliRunner()
GEMM = ["gemm", "--m", "256", "--n", "128", "--k", "64"]
no_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="has CuPy")


@pytest.fixture(autouse=True)
def instant(monkeypatch):
    monkeypatch.setenv("PIPETUNE_SIMULATED_TIME_SCALE", "0")


def test_simulated_sweep_then_replay_gives_the_same_latencies(tmp_path):
    out = tmp_path / "data" / "gemm.t4.json.gz"
    args = [*GEMM, "--runner", "simulated", "--gpu", "h100", "--out", str(out)]
    result = cli.invoke(sweep_app, [*args, "--limit", "12", "--seed", "5", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["datasets"]
    assert row["runner"] == "simulated" and row["schedules"] == 12 and row["valid"] == 12
    assert [p.name for p in out.parent.iterdir()] == ["gemm.t4.json.gz"]  # no temp left

    dataset = load_dataset(out)
    meta = dataset.metadata["pipetune"]
    assert meta["runner"] == "simulated" and meta["gpu"] == "h100"
    assert meta["workload"] == gemm(256, 128, 64).canonical()
    assert meta["settings"]["noise"] == "lognormal"
    schedules = [Schedule.from_dict(dict(r.configuration)) for r in dataset]

    workload = gemm(256, 128, 64)
    with make_runner("simulated", gpu=get_gpu("h100"), seed=5, time_scale=0) as simulated:
        fresh = simulated.measure(workload, schedules)
    with make_runner("replay", dataset=out, workload=workload, gpu="h100") as replay:
        replayed = replay.measure(workload, schedules)
    assert [r.runner for r in replayed] == ["replay:simulated"] * 12
    for a, b in zip(fresh, replayed, strict=True):
        assert b.status == a.status == "ok"
        # the file holds milliseconds: µs -> ms -> µs is exact to the last unit
        assert b.latency_us == pytest.approx(a.latency_us, rel=1e-15)
        assert b.samples_us == pytest.approx(a.samples_us, rel=1e-15)
    best = min(replayed, key=lambda r: r.latency_us)
    assert row["best_us"] == pytest.approx(best.latency_us, rel=1e-15)


def test_sweep_operators_by_name_as_the_campaign_takes_them(tmp_path):
    """`--operators MM_RN50_FC` was "unknown operator suite" where `campaign --operators`
    takes suites and operator names alike."""
    args = ["--operators", "MM_RN50_FC,swiglu", "--runner", "simulated", "--gpu", "h100"]
    result = cli.invoke(sweep_app, [*args, "--out-dir", str(tmp_path), "--limit", "1", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["datasets"]
    assert [r["operator"] for r in rows] == [
        "MM_RN50_FC", "GateUpSwiGLU_LLaMA2_7B_t1024", "GateUp_LLaMA2_7B_t1024",
    ]  # fmt: skip


def test_sweep_the_alcop_suite_one_file_per_operator(tmp_path):
    args = ["--operators", "alcop", "--runner", "simulated", "--gpu", "a100"]
    result = cli.invoke(sweep_app, [*args, "--out-dir", str(tmp_path), "--limit", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["datasets"]
    # In the campaign's order (its --operators and this one read the same way).
    assert [r["operator"] for r in rows] == list(suite_in_order("alcop"))
    assert sorted(suite_in_order("alcop")) == sorted(ALCOP)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{name}.t4.json.gz" for name in ALCOP
    )
    conv = load_dataset(tmp_path / "Conv2D_RN50_1.t4.json.gz")
    assert conv.metadata["pipetune"]["workload"] == ALCOP["Conv2D_RN50_1"].canonical()
    assert conv.metadata["pipetune"]["gpu"] == "a100" and len(conv) == 2


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ([], "name an operator"),
        (["--operators", "alcop", "--runner", "simulated"], "--out-dir"),
        (["--operators", "nope", "--runner", "simulated", "--out-dir", "x"], "unknown operator"),
        # Not "no valid schedule for hopper_gemm ... on a100" after a blank line: the options.
        (
            ["--operators", "hopper", "--runner", "simulated", "--out-dir", "x", "--gpu", "a100"],
            "--gpu a100: cannot run WG_MM_Square_1k",
        ),
        # The same for one operator: its error came after an empty line, naming no option.
        (
            [
                *("hopper_gemm", "--m", "64", "--n", "64", "--k", "64", "--gpu", "a100"),
                *("--runner", "simulated", "--out", "x.t4.json.gz"),
            ],
            "--gpu a100: cannot run hopper_gemm 64x64x64: no schedule of the Hopper",
        ),
        ([*GEMM, "--runner", "replay", "--out", "x.t4.json.gz"], "--runner"),
        ([*GEMM, "--runner", "simulated", "--out", "x.t4.json.gz", "--limit", "0"], "--limit"),
        ([*GEMM, "--runner", "simulated", "--gpu", "v100", "--out", "x.gz"], "unknown GPU"),
        (["--operators", "alcop", *GEMM, "--out", "x.gz"], "not with an operator command"),
        # A ValueError from numpy's generator once the sample was drawn (exit 1).
        (
            [*GEMM, "--runner", "simulated", "--out", "x.gz", "--limit", "3", "--seed", "-1"],
            "--seed",
        ),
        ([*GEMM, "--runner", "simulated", "--out", "x.gz", "--repeats", "10001"], "--repeats"),
        ([*GEMM, "--runner", "simulated", "--out", "x.gz", "--warmup", "-1"], "--warmup"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, args, reason):
    result = cli.invoke(sweep_app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.rstrip("\n").splitlines()  # (an empty first line is a line)
    assert len(lines) == 1 and reason in lines[0]


@no_cupy
def test_cupy_sweep_without_a_gpu_is_one_line_exit_1(tmp_path):
    out = tmp_path / "g.t4.json.gz"
    result = cli.invoke(sweep_app, [*GEMM, "--runner", "cupy", "--out", str(out)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the cupy runner needs CuPy")
    assert not out.exists()


calibrate_app = typer.Typer()
calibrate_app.command()(calibrate)


@no_cupy
def test_calibrate_without_a_gpu_is_one_line_exit_1(tmp_path):
    out = tmp_path / "h100.json"
    result = cli.invoke(calibrate_app, ["--gpu", "h100", "--out", str(out)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "calibrate needs CuPy and an NVIDIA GPU" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--out", "/usr"], "--out: /usr is a directory"),
        (["--out", "no/such/folder/h100.json"], "does not exist"),
        (["--device", "-1"], "--device: must be at least 0"),
    ],
)
def test_calibrate_checks_its_options_before_measuring(monkeypatch, args, reason):
    # The profile's path was checked when it was written, after minutes of measuring.
    from pipetune.workers import calibrate as calibration

    def measured(*_args, **_kwargs):
        raise AssertionError("measured before the options were checked")

    monkeypatch.setattr(calibration, "run_calibration", measured)
    result = cli.invoke(calibrate_app, ["--gpu", "h100", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.rstrip("\n").splitlines()  # (an empty first line is a line)
    assert len(lines) == 1 and reason in lines[0]


def test_calibrate_unknown_gpu_exits_2():
    result = cli.invoke(calibrate_app, ["--gpu", "v100"])
    assert result.exit_code == 2 and "unknown GPU 'v100'" in result.stderr


def test_a_memops_sweep_is_a_dataset_that_replays_and_benchmarks_the_tuner(tmp_path):
    """The memory-intensive family through the dataset loop: sweep -> T4 -> replay runner,
    and `bench tuner` over it (its analytical strategy ranks by the family's own model)."""
    out = tmp_path / "softmax.t4.json.gz"
    args = ["softmax", "--rows", "2048", "--cols", "768", "--runner", "simulated"]
    result = cli.invoke(sweep_app, [*args, "--gpu", "h100", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["datasets"]
    workload = softmax(2048, 768)
    space = family_of(workload).enumerate(workload, get_gpu("h100"))
    assert row["schedules"] == row["valid"] == len(space) >= 200

    dataset = load_dataset(out)
    assert dataset.metadata["pipetune"]["workload"] == workload.canonical()
    records = list(dataset)
    schedules = [MemSchedule.from_dict(dict(r.configuration)) for r in records]
    assert {s.id for s in schedules} == set(space.ids)
    with make_runner("replay", dataset=out, workload=workload, gpu="h100") as replay:
        replayed = replay.measure(workload, schedules[:5])
    for record, measured in zip(records[:5], replayed, strict=True):
        assert measured.runner == "replay:simulated"
        assert measured.latency_us == pytest.approx(record.time_ms * 1e3, rel=1e-12)

    bench = ["bench", "tuner", str(out), "--strategies", "analytical,random", "--json"]
    ran = cli.invoke(app, [*bench, "--budgets", "10", "--seeds", "2"])
    assert ran.exit_code == 0, ran.output
    by_strategy = {r["strategy"]: r for r in json.loads(ran.stdout)["results"]}
    assert set(by_strategy) == {"analytical", "random"}
    # The data are the family's model plus noise, so its ranking must find the optimum's
    # neighbourhood at once (circular, and said so: this checks the wiring, not the model).
    assert by_strategy["analytical"]["best_in_k"] > 0.95
