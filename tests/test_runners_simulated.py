"""The simulated runner: the model plus stated, seeded noise, in modelled wall time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipetune.model.analytical import evaluate
from pipetune.model.hardware import get_gpu
from pipetune.model.space import Schedule, Space
from pipetune.model.workloads import gemm
from pipetune.workers.runners import RunnerError, SimulatedRunner, make_runner
from pipetune.workers.runners.simulated import TIME_SCALE_ENV

WORKLOAD = gemm(256, 128, 64)
GPU = get_gpu("h100", calibrated=False)


@pytest.fixture(scope="module")
def space():
    return Space.enumerate(WORKLOAD, GPU)


def test_latency_is_the_model_times_lognormal_noise(space):
    with SimulatedRunner(GPU, time_scale=0, sigma=0.03) as runner:
        results = runner.measure(WORKLOAD, list(space))
    model_us = evaluate(space).latency_us
    ratio = np.log(np.array([r.latency_us for r in results]) / model_us)
    # log-ratio ~ N(0, 0.03) per schedule (plus the median of the repeat noise).
    assert abs(ratio.mean()) < 0.01
    assert 0.02 < ratio.std() < 0.04


def test_zero_noise_gives_the_model(space):
    with SimulatedRunner(GPU, time_scale=0, sigma=0, repeat_sigma=0) as runner:
        results = runner.measure(WORKLOAD, list(space)[:20])
    np.testing.assert_allclose(
        [r.latency_us for r in results], evaluate(space).latency_us[:20], rtol=1e-12
    )
    assert all(r.spread == 0 for r in results)


def test_seed_changes_the_noise_and_nothing_else(space):
    schedules = list(space)[:5]
    a = SimulatedRunner(GPU, time_scale=0, seed=1).measure(WORKLOAD, schedules)
    b = SimulatedRunner(GPU, time_scale=0, seed=2).measure(WORKLOAD, schedules)
    assert [r.latency_us for r in a] != [r.latency_us for r in b]
    assert [r.smem_bytes for r in a] == [r.smem_bytes for r in b]


def test_a_schedule_outside_the_space_is_a_launch_error():
    too_big = Schedule(4, 4, 4, 4, 8, 6, 2)  # far over the shared-memory limit
    with SimulatedRunner(GPU, time_scale=0) as runner:
        (result,) = runner.measure(WORKLOAD, [too_big])
    assert result.status == "launch_error"
    assert "simulated" in result.error and "shared memory" in result.error
    assert result.runner == "simulated"


def test_it_takes_the_modelled_wall_time(space):
    schedules = list(space)[:3]
    runner = SimulatedRunner(GPU, time_scale=0.02, compile_s=1.0)
    started = time.perf_counter()
    results = runner.measure(WORKLOAD, schedules)
    elapsed = time.perf_counter() - started
    repeats = 3 + 30  # warm-up + repeats of the default settings
    expected = 0.02 * (3 * 1.0 + sum(repeats * r.latency_us * 1e-6 for r in results))
    assert expected <= elapsed < expected + 0.5


def test_time_scale_from_the_environment(monkeypatch):
    monkeypatch.setenv(TIME_SCALE_ENV, "0")
    assert make_runner("simulated").time_scale == 0
    monkeypatch.setenv(TIME_SCALE_ENV, "2.5")
    assert make_runner("simulated").time_scale == 2.5
    monkeypatch.delenv(TIME_SCALE_ENV)
    assert make_runner("simulated").time_scale == 1.0
    for bad in ("fast", "-1", "nan", "inf"):
        monkeypatch.setenv(TIME_SCALE_ENV, bad)
        with pytest.raises(RunnerError, match=TIME_SCALE_ENV):
            make_runner("simulated")


def test_settings_state_the_noise():
    settings = SimulatedRunner(GPU, time_scale=0).settings
    assert settings["noise"] == "lognormal" and settings["sigma"] == 0.03
    assert settings["repeats"] == 30
