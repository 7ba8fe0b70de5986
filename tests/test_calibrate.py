"""Calibration without a GPU: raw timings (synthetic numbers) -> a valid hardware profile."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from pipetune.model.hardware import GPUSpec, get_gpu
from pipetune.workers.calibrate import (
    CalibrationError,
    CalibrationUnavailableError,
    Chase,
    Cycles,
    MmaRun,
    RawMeasurements,
    Throughput,
    build_profile,
    run_calibration,
    validate_profile,
    write_profile,
)
from pipetune.workers.calibrate.profile import MMA_FLOPS

GiB = 1 << 30


def synthetic(spec: GPUSpec, **changes) -> RawMeasurements:
    """An H100-like device: 3.0 TB/s DRAM, 6 TB/s L2, 600/200 ns, 1.7 GHz, 50% mma.sync."""
    clock_mhz = 1700.0
    mma_per_s = 0.5 * spec.tensor_fp16_flops_per_clk_per_sm * clock_mhz * 1e6 * 132 / MMA_FLOPS
    raw = RawMeasurements(
        device_name="NVIDIA H100 80GB HBM3",
        sm_count=132,
        l2_bytes=spec.l2_bytes,
        dram_copy=Throughput(2 * GiB, (2 * GiB / 3.0e12, 2 * GiB / 3.1e12, 2 * GiB / 2.9e12)),
        dram_write=Throughput(GiB, (GiB / 2.8e12,)),
        l2_read=Throughput(10 * GiB, (10 * GiB / 6.0e12,) * 3),
        dram_chase=Chase(100_000, (100_000 * 600e-9 + 5e-6,) * 3, (5e-6,) * 3),
        l2_chase=Chase(100_000, (100_000 * 200e-9 + 5e-6,) * 3, (5e-6,) * 3),
        mma=MmaRun(int(mma_per_s * 0.03), (0.03,) * 5),
        clock=Cycles(int(clock_mhz * 1e6 * 0.03), (0.03,) * 5),
        smem_chase_cycles_per_load=34.0,
    )
    return dataclasses.replace(raw, **changes)


@pytest.fixture
def h100() -> GPUSpec:
    return get_gpu("h100", calibrated=False)


def test_profile_from_synthetic_measurements(h100):
    doc = build_profile(synthetic(h100), h100, date="2024-05-01T00:00:00+00:00")
    assert doc["gpu"] == "h100" and doc["device_name"] == "NVIDIA H100 80GB HBM3"
    assert doc["date"] == "2024-05-01T00:00:00+00:00" and "mma.sync" in doc["method"]
    o = doc["overrides"]
    assert o["dram_bandwidth_gbs"] == pytest.approx(3000.0)
    assert o["dram_write_bandwidth_gbs"] == pytest.approx(2800.0)
    assert o["l2_bandwidth_gbs"] == pytest.approx(6000.0)
    assert o["dram_latency_ns"] == pytest.approx(600.0)
    assert o["l2_latency_ns"] == pytest.approx(200.0)
    assert o["boost_clock_mhz"] == pytest.approx(1700.0, rel=1e-6)
    assert o["smem_latency_ns"] == pytest.approx(34.0 / 1700.0 * 1e3)
    assert o["mma_sync_efficiency"] == pytest.approx(0.5, rel=1e-6)
    assert "sm_count" not in o and "l2_bytes" not in o  # same as the spec: no override
    # Every override is a GPUSpec field and model.hardware accepts the document.
    assert set(o) <= {f.name for f in dataclasses.fields(GPUSpec)}
    calibrated = validate_profile(doc, h100)
    assert calibrated.dram_bandwidth_gbs == pytest.approx(3000.0)
    # The model's tensor throughput is now the one measured.
    achieved = synthetic(h100).mma.mma_count * MMA_FLOPS / 0.03
    assert calibrated.sm_tensor_flops * 132 == pytest.approx(achieved, rel=1e-6)


def test_the_profile_file_loads_through_get_gpu(h100, tmp_path):
    doc = build_profile(synthetic(h100), h100)
    path = write_profile(doc, tmp_path / "h100.json")
    assert json.loads(path.read_text())["raw"]["sm_count"] == 132
    spec = get_gpu("h100", calibrated=False, profile=path)
    assert spec.l2_latency_ns == pytest.approx(200.0)
    assert spec.profile == "profile:h100.json"


def test_the_launch_time_is_the_timing_floor_where_it_was_measured(h100, monkeypatch):
    """The chases' lone empty launch between two events (9.8 us on the H100) was taken for
    what a launch adds to a measured latency, where the floor timed as trials are is 3.4 us
    and the fastest measured memops kernels 4.5 us: the model overpredicted them 1.5x."""
    without = build_profile(synthetic(h100), h100)
    assert without["overrides"]["kernel_launch_ns"] == pytest.approx(5000.0)  # the chases'
    floor = synthetic(h100, timing_floor_seconds=(3.5e-6, 3.4e-6, 3.45e-6))
    doc = build_profile(floor, h100)
    assert doc["overrides"]["kernel_launch_ns"] == pytest.approx(3450.0)
    assert list(doc["raw"]["timing_floor_seconds"]) == [3.5e-6, 3.4e-6, 3.45e-6]
    assert get_gpu("h100", calibrated=False).kernel_launch_ns < 4000  # the spec's, alike
    # The campaign hands its probe's floor to the calibration (workers/campaign/run.py).
    from pipetune.workers import calibrate
    from pipetune.workers.campaign import profile_phase

    seen = {}

    def calibration(gpu, *, device=0, timing_floor_us=None):
        seen["floor"] = timing_floor_us
        return build_profile(synthetic(h100), h100)

    monkeypatch.setattr(calibrate, "run_calibration", calibration)
    profile_phase.run_profile("h100", simulated=False, timing_floor_us=3.44)
    assert seen == {"floor": 3.44}


def test_calibrate_measures_the_timing_floor_as_the_campaign_does(h100, monkeypatch):
    """`pipetune calibrate` (no campaign to hand it the floor) wrote the chases' lone launch:
    a user's own profile replaced the shipped one and brought the 1.5x overprediction back.
    It times the empty kernel through the cupy runner, as the campaign's probe does."""
    from pipetune.workers import calibrate
    from pipetune.workers.runners import cupy_runner

    closed = []

    class FloorRunner:
        def __init__(self, spec, **kwargs):
            self.spec = spec

        def measure_floor(self):
            return 3.3

        def close(self):
            closed.append(True)

    monkeypatch.setattr(cupy_runner, "CupyRunner", FloorRunner)
    assert calibrate.measured_timing_floor(h100, 0) == 3.3 and closed == [True]

    class Unavailable(FloorRunner):
        def measure_floor(self):
            raise RuntimeError("no device")

    monkeypatch.setattr(cupy_runner, "CupyRunner", Unavailable)
    assert calibrate.measured_timing_floor(h100, 0) is None and closed == [True, True]


def test_a_device_unlike_the_spec_overrides_its_counts(h100):
    doc = build_profile(synthetic(h100, sm_count=114, l2_bytes=50 << 20), h100)
    assert doc["overrides"]["sm_count"] == 114
    assert isinstance(validate_profile(doc, h100).sm_count, int)


def test_without_clock_the_spec_clock_is_used(h100):
    doc = build_profile(synthetic(h100, clock=None, smem_chase_cycles_per_load=None), h100)
    assert "boost_clock_mhz" not in doc["overrides"] and "smem_latency_ns" not in doc["overrides"]
    assert doc["overrides"]["mma_sync_efficiency"] == pytest.approx(0.5 * 1700 / 1830, rel=1e-6)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"dram_copy": Throughput(GiB, ())}, "DRAM copy: timings must be positive"),
        ({"l2_read": Throughput(GiB, (0.0,))}, "L2 read"),
        ({"dram_chase": Chase(1000, (1e-6,), (2e-6,))}, "no longer than an empty launch"),
        ({"mma": MmaRun(10**15, (0.03,))}, "spec peak"),
        ({"smem_chase_cycles_per_load": -1.0}, "cycles per load"),
    ],
)
def test_impossible_measurements_are_refused(h100, changes, reason):
    with pytest.raises(CalibrationError, match=reason):
        build_profile(synthetic(h100, **changes), h100)


def test_a_profile_for_another_gpu_is_refused(h100):
    doc = build_profile(synthetic(h100), h100)
    with pytest.raises(CalibrationError, match="not 'a100'"):
        validate_profile(doc, get_gpu("a100", calibrated=False))


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_without_cupy_calibration_is_unavailable():
    with pytest.raises(CalibrationUnavailableError, match="CuPy"):
        run_calibration("h100")


def test_the_k_step_cycles_are_recorded_and_not_applied(h100):
    # The model's k_step_cycles is a fit to the H200 sweeps; the microbenchmark measures only
    # the barrier-and-wait part of it, so a profile keeps it in raw until the two are judged.
    doc = build_profile(synthetic(h100, k_step_cycles=37.5), h100)
    assert doc["raw"]["k_step_cycles"] == 37.5
    assert "k_step_cycles" not in doc["overrides"]
    assert validate_profile(doc, h100).k_step_cycles == h100.k_step_cycles


def test_the_k_step_microbenchmark_reports_the_median_block_s_cycles_per_step():
    import types

    import numpy as np

    from pipetune.workers.calibrate import microbench

    class Array(np.ndarray):
        def get(self):
            return np.asarray(self)

    launches = []

    def kernel(name):
        def launch(grid, block, args):
            launches.append((name, grid, block))
            src, steps, cycles = args
            assert src.nbytes == 2048 and int(steps) == microbench.K_STEPS
            cycles[...] = np.array([40, 41, 90]) * int(steps)  # one slow SM

        return launch

    cp = types.SimpleNamespace(
        zeros=lambda n, dtype: np.zeros(n, dtype).view(Array),
        float32=np.float32,
        int64=np.int64,
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)),
    )
    assert microbench._k_step_cycles(cp, kernel, sms=3) == 41.0
    assert launches == [("k_step_kernel", (3,), (microbench.K_STEP_THREADS,))]


def test_calibrate_writes_to_the_users_profile_folder_not_into_the_package(
    h100, tmp_path, monkeypatch
):
    # Installed, model/profiles/ is inside site-packages: a calibration written there is lost
    # (or overwrites the shipped profile) at the next upgrade and outlives an uninstall.
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.model import hardware
    from pipetune.workers import calibrate as calibrate_module

    shipped = hardware.PROFILE_DIR / "h100.json"
    before = shipped.read_bytes()
    document = build_profile(synthetic(h100), h100)
    monkeypatch.setattr(calibrate_module, "run_calibration", lambda gpu, device=0: document)
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "profiles"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    written = tmp_path / "profiles" / "h100.json"
    assert json.loads(written.read_text())["overrides"] == document["overrides"]
    assert shipped.read_bytes() == before
    spec = get_gpu("h100")
    assert spec.profile == "calibrated(user):h100.json"
    assert spec.dram_bandwidth_gbs == pytest.approx(document["overrides"]["dram_bandwidth_gbs"])


def test_calibrate_without_gpu_checks_the_profile_folder_before_measuring(
    h100, tmp_path, monkeypatch
):
    # With --gpu the default file was checked before the GPU was measured; without it (the
    # device names the GPU) nothing was: minutes of measurement, then an exit 1 on a
    # FileExistsError (the profile folder a file) or an IsADirectoryError (<gpu>.json one).
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.model import hardware
    from pipetune.workers import calibrate as calibrate_module

    document = build_profile(synthetic(h100), h100)
    measured = []

    def measure(gpu, device=0):
        measured.append(gpu)
        return document

    monkeypatch.setattr(calibrate_module, "run_calibration", measure)
    monkeypatch.chdir(tmp_path)
    not_a_folder = tmp_path / "profiles"
    not_a_folder.write_text("")
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(not_a_folder))
    result = CliRunner().invoke(app, ["calibrate"])
    assert result.exit_code == 2, result.output
    assert "is not a directory" in result.output and measured == []

    folder = tmp_path / "own"
    (folder / "h100.json").mkdir(parents=True)
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(folder))
    result = CliRunner().invoke(app, ["calibrate"])
    assert result.exit_code == 2, result.output
    assert "h100.json is a directory" in result.output


def test_calibrate_with_a_gpu_that_is_not_the_device_exits_2(h100, tmp_path, monkeypatch):
    # `campaign --gpu` refuses a GPU that is not the device with exit 2; calibrate found the
    # same mistake before measuring, and answered exit 1, as if the GPU had failed.
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.model import hardware
    from pipetune.workers.calibrate import microbench
    from pipetune.workers.runners import isolation

    called = []

    class Device:
        def __init__(self, name):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def call(self, fn, *args, timeout_s=None):
            called.append(fn.__name__)
            return isolation.CallOutcome("ok", value="NVIDIA H100 80GB HBM3")

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "cupy" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(isolation, "IsolatedWorker", Device)
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "profiles"))
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "h200"])
    assert result.exit_code == 2, result.output
    assert "asked to calibrate h200, but the device is h100" in result.output
    assert called == [microbench.probe_device.__name__]
    assert not (tmp_path / "profiles" / "h200.json").exists()


@pytest.mark.parametrize("hot", [False, True])
def test_the_cold_chase_starts_with_l2_written_over_after_the_chain_s_copy(hot):
    """The chain's copy to the device left up to an L2 of it cached, so the cold (DRAM)
    chase's first repeats hit L2 (the committed chases got slower over their repeats):
    between the copy and the first chase launch, a buffer of at least twice L2 must be
    written. The hot (L2) chase wants the chain in L2 and writes nothing over it."""
    import types

    import numpy as np

    from pipetune.workers.calibrate import microbench

    l2 = 1 << 20
    events: list[tuple[str, int]] = []

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    def asarray(a):
        events.append(("copy", a.nbytes))
        return a

    def zeros(n, dtype):
        a = np.zeros(n, dtype)
        events.append(("write", a.nbytes))
        return a

    def kernel(name):
        return lambda grid, block, args: events.append(("launch", int(args[1])))

    cp = types.SimpleNamespace(
        asarray=asarray,
        zeros=zeros,
        uint32=np.uint32,
        float32=np.float32,
        cuda=types.SimpleNamespace(
            Device=lambda: types.SimpleNamespace(synchronize=lambda: None),
            Event=Event,
            get_elapsed_time=lambda a, b: 1.0,
        ),
    )
    footprint = 4 * l2 if not hot else l2 // 4
    microbench._chase(cp, kernel, footprint, 300.0, seed=1, hot=hot, l2=l2)
    copied = next(i for i, (kind, _) in enumerate(events) if kind == "copy")
    first_launch = next(i for i, (kind, _) in enumerate(events) if kind == "launch")
    written_over = sum(n for kind, n in events[copied:first_launch] if kind == "write")
    if hot:
        assert written_over == 0
    else:
        assert written_over >= 2 * l2


def test_a_malformed_profile_is_refused_when_serve_starts_and_answered_in_one_line(
    tmp_path, monkeypatch
):
    """A user's h100.json that did not parse let `serve` start; every schedule and task
    request of the H100 then answered a bare 500 with a traceback in the log ("not a pipetune
    answer" at the CLI)."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.model import hardware

    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "h100.json").write_text("{bad")
    env = {hardware.USER_PROFILE_DIR_ENV: str(folder), "PIPETUNE_WORKER_TOKENS": "t" * 16}
    command = ["serve", "--db", f"sqlite:///{tmp_path / 'serve.db'}", "--port", "0"]
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 2, result.output
    assert "h100: profile" in result.output and "is not valid JSON" in result.output
    assert not (tmp_path / "serve.db").exists()
    # One broken while the service runs: the reason, in one line.
    from service_support import GEMM, client_for

    from pipetune.service.migrate import upgrade

    (folder / "h100.json").unlink()
    upgrade(f"sqlite:///{tmp_path / 'live.db'}")
    with client_for(f"sqlite:///{tmp_path / 'live.db'}") as client:
        monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(folder))
        (folder / "h100.json").write_text("{bad")
        # (A shape no other test asks for: the model's picks are cached per process.)
        shape = {**GEMM, "m": 776, "n": 328, "k": 552}
        answer = client.post("/v1/schedules", json={"workload": shape, "gpu": "h100"})
    assert answer.status_code == 500, answer.text
    assert answer.json()["detail"].startswith("the service's hardware model cannot be used: ")


def test_a_profile_folder_that_is_a_file_is_refused_not_ignored(tmp_path, monkeypatch):
    """PIPETUNE_PROFILE_DIR naming a file was ignored, the shipped profiles applied: replicas
    and workers told to share one folder modelled their GPUs apart without a word."""
    from typer.testing import CliRunner

    from pipetune.clients.cli.main import app
    from pipetune.model import hardware

    not_a_folder = tmp_path / "profiles"
    not_a_folder.write_text("")
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(not_a_folder))
    result = CliRunner().invoke(app, ["model", "gpus"])
    assert result.exit_code == 2, result.output
    assert f"PIPETUNE_PROFILE_DIR: {not_a_folder} is not a directory" in result.output
    # A folder not made yet is where calibrate will write: the shipped profiles apply.
    monkeypatch.setenv(hardware.USER_PROFILE_DIR_ENV, str(tmp_path / "later"))
    assert get_gpu("h100").profile == "calibrated:h100.json"
