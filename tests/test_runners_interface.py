"""One interface test suite that every runner without a GPU must pass (replay, simulated),
for a workload of every kernel family.

The replay runner replays a dataset recorded by the simulated runner over the workload's
whole space, so both answer every schedule of that space.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipetune.model.family import family_names, family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.hopper.workloads import parse_hopper_workload
from pipetune.model.memops.workloads import softmax
from pipetune.model.trials import MeasureResult
from pipetune.model.workloads import gemm
from pipetune.workers.datasets import dataset_from_results
from pipetune.workers.runners import Runner, RunnerClosedError, make_runner

# One small workload per kernel family (a test below checks that every family has one).
WORKLOADS = {
    "tensor_gemm": gemm(256, 128, 64),
    "memops": softmax(512, 136),
    "hopper_gemm": parse_hopper_workload({"op": "hopper_gemm", "m": 256, "n": 128, "k": 64}),
}
GPU = get_gpu("h100", calibrated=False)


def test_every_family_has_a_workload_here():
    assert set(WORKLOADS) == set(family_names())
    assert all(family_of(w).name == name for name, w in WORKLOADS.items())


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def workload(request):
    return WORKLOADS[request.param]


@pytest.fixture(scope="module")
def space(workload):
    return family_of(workload).enumerate(workload, GPU)


@pytest.fixture(scope="module")
def recorded(workload, space):
    with make_runner("simulated", gpu=GPU, time_scale=0) as sim:
        results = sim.measure(workload, list(space))
        return dataset_from_results(
            workload, GPU, list(space), results, runner=sim.name, settings=sim.settings
        )


def build(name: str, recorded, workload) -> Runner:
    if name == "simulated":
        return make_runner("simulated", gpu=GPU, time_scale=0)
    return make_runner("replay", dataset=recorded, workload=workload, gpu=GPU)


RUNNERS = ["simulated", "replay"]


@pytest.fixture(params=RUNNERS)
def runner(request, recorded, workload):
    with build(request.param, recorded, workload) as r:
        yield r


def test_name_matches_the_factory(runner):
    assert runner.name in RUNNERS
    assert isinstance(runner, Runner)


def test_one_result_per_schedule_in_order(runner, space, workload):
    schedules = [space[i] for i in (5, 0, 17, 3)]
    results = runner.measure(workload, schedules)
    assert len(results) == len(schedules)
    assert all(isinstance(r, MeasureResult) for r in results)
    singles = [runner.measure(workload, [s])[0] for s in schedules]
    assert results == singles  # the answer for a schedule does not depend on its batch


def test_results_are_labelled_with_their_runner(runner, space, workload):
    for result in runner.measure(workload, [space[0], space[1]]):
        assert result.runner is not None
        assert result.runner.split(":")[0] == runner.name
        assert "simulated" in result.runner  # a replay of a simulated sweep says so


def test_ok_results_are_consistent_measurements(runner, space, workload):
    results = runner.measure(workload, list(space)[:40])
    assert all(r.ok for r in results)
    for r in results:
        assert r.latency_us > 0
        assert len(r.samples_us) >= 1
        assert r.latency_us == pytest.approx(float(np.median(r.samples_us)), rel=1e-12)
        p10, p90 = np.percentile(r.samples_us, [10, 90])
        assert r.spread == pytest.approx((p90 - p10) / float(np.median(r.samples_us)), rel=1e-9)
        assert math.isfinite(r.spread) and r.spread >= 0


def test_deterministic_across_calls_and_instances(runner, space, recorded, workload):
    schedules = list(space)[:10]
    first = runner.measure(workload, schedules)
    assert runner.measure(workload, schedules) == first
    with build(runner.name, recorded, workload) as other:
        assert other.measure(workload, schedules) == first


def test_duplicates_get_the_same_answer(runner, space, workload):
    a, b = runner.measure(workload, [space[2], space[2]])
    assert a == b


def test_empty_list(runner, workload):
    assert runner.measure(workload, []) == []


def test_closed_runner_refuses(recorded, space, workload):
    for name in RUNNERS:
        with build(name, recorded, workload) as r:
            assert not r.closed
        assert r.closed
        with pytest.raises(RunnerClosedError):
            r.measure(workload, [space[0]])
        r.close()  # idempotent
