"""The correctness phase launches each kernel twice: a kernel right on a clean workspace and
wrong once it has run (a stream-K arrival counter it does not reset, say) failed every timed
trial of the sweeps, where neither a quarantine nor the stop could act on it. Its second run
(the same inputs, the output NaN again, the workspaces as the first run left them, as the
timed runs find them) is checked by the check that follows the timed runs. On the CPU: the
cupy runner's child on the numpy stand-in for CuPy (tests/fake_cupy.py), in this process."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import fake_cupy
import numpy as np
import pytest

from pipetune.model.hardware import get_gpu
from pipetune.model.workloads import gemm
from pipetune.workers.campaign import correctness
from pipetune.workers.launch_plan import Buffer, KernelLaunch, LaunchPlan
from pipetune.workers.runners import cupy_child, sim_child
from pipetune.workers.runners.base import Runner
from pipetune.workers.runners.cupy_child import TrialSpec
from pipetune.workers.runners.isolation import CallOutcome
from pipetune.workers.runners.kernel_runner import KernelRunner, trial_result
from pipetune.workers.runners.timing import RepeatPolicy

WORKLOAD = gemm(64, 32, 48)


@pytest.fixture
def cupy(monkeypatch):
    fake = fake_cupy.make()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cupy_child, "MIN_FLUSH_BYTES", 1 << 16)
    monkeypatch.setitem(fake_cupy.KERNELS, b"dirty", _dirty_workspace)
    monkeypatch.setitem(fake_cupy.KERNELS, b"tidy", _tidy_workspace)
    monkeypatch.setitem(fake_cupy.KERNELS, b"right-once", _right_once)
    cupy_child.init_device(0)
    return fake


def _product(args) -> np.ndarray:
    a, b = args[:2]
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)


def _dirty_workspace(grid, block, args, shared_mem=0):
    """A stream-K-like kernel that stores a tile only when its arrival counter says it is
    the first, and never resets the counter: right on a zeroed workspace, and on the next
    run it stores nothing (the output keeps whatever it held)."""
    c, counters = args[2], args[-1]
    if counters[0] == 0:
        c[...] = _product(args)
    counters[0] += 1


def _tidy_workspace(grid, block, args, shared_mem=0):
    """The same kernel, resetting its counter once the tile is stored (as the real ones)."""
    c, counters = args[2], args[-1]
    if counters[0] == 0:
        c[...] = _product(args)
    counters[0] = 0


def _right_once(grid, block, args, shared_mem=0):
    """Right on its first launch, off by one on every later one."""
    args[2][...] = _product(args) + (0 if fake_cupy._State.launches == 1 else 1)


def spec(tmp_path, behaviour: str, policy: RepeatPolicy, workload=WORKLOAD, sid="s") -> TrialSpec:
    """A GEMM's run with a workspace of arrival counters after the scalars."""
    m, n, k = workload.m, workload.n, workload.k
    path = tmp_path / f"{behaviour}.cubin"
    path.write_bytes(behaviour.encode() + b"\n")
    launch = KernelLaunch(
        "k",
        (4, 1, 1),
        (128, 1, 1),
        1024,
        ("A", "B", "C", "M", "N", "K", "arrivals"),
        {"M": m, "N": n, "K": k},
        trailing=("arrivals",),
    )
    buffers = (
        Buffer("A", (m, k), "float16", "input"),
        Buffer("B", (k, n), "float16", "input"),
        Buffer("C", (m, n), "float16", "output"),
        Buffer("arrivals", (4,), "uint32", "workspace"),
    )
    return TrialSpec(
        workload_hash=workload.workload_hash,
        schedule_id=sid,
        cubin_path=str(path),
        plan=LaunchPlan(buffers, (launch,), output="C"),
        policy=policy,
    )


# ---- the child --------------------------------------------------------------------------------


@pytest.mark.parametrize("behaviour", ["ok", "tidy"])
def test_a_correct_kernel_is_verified_on_two_runs(cupy, tmp_path, behaviour):
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(tmp_path, behaviour, RepeatPolicy.verify_twice()))
    assert answer["status"] == "ok" and answer["verified"], answer.get("error")
    assert answer["samples_ms"] == []  # nothing timed
    assert cupy.state.launches == 2


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [("dirty", "outputs the kernel never wrote"), ("right-once", "outside the fp16 tolerance")],
)
def test_a_kernel_wrong_on_its_second_run_fails_its_verification(cupy, tmp_path, behaviour, why):
    # "dirty" left the first run's output in place: the output is NaN again before the
    # second run, so a run that stores nothing fails as one that stores wrong values.
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(tmp_path, behaviour, RepeatPolicy.verify_twice()))
    assert answer["status"] == "wrong_result" and not answer.get("poisoned")
    assert answer["error"].startswith(
        f"right on the first run, wrong {cupy_child.SECOND_RUN_WRONG}: "
    )
    assert why in answer["error"]
    assert "samples_ms" not in answer and cupy.state.launches == 2


def test_a_timed_trial_is_not_launched_a_second_time_on_top(cupy, tmp_path):
    # Its timed runs are the later runs that are checked (the message says so).
    policy = RepeatPolicy(warmup=1, min_repeats=5, max_repeats=5, settle=0.03, check_again=True)
    cupy_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    answer = cupy_child.run_trial(spec(tmp_path, "right-once", policy))
    assert answer["status"] == "wrong_result" and "after the timed runs" in answer["error"]
    assert cupy.state.launches == 1 + 1 + 5
    assert cupy_child.run_trial(spec(tmp_path, "ok", RepeatPolicy.verify_only()))["status"] == "ok"
    assert cupy.state.launches == 1 + 1 + 5 + 1  # verify only: still one launch


def test_the_batch_plan_and_the_simulated_twin_count_the_second_launch(tmp_path, monkeypatch):
    twice, once = RepeatPolicy.verify_twice(), RepeatPolicy.verify_only()
    assert twice.second_run and not once.second_run and not twice.timed
    runner = object.__new__(KernelRunner)  # (its batches' sizes and timeouts)
    trial = SimpleNamespace(policy=twice, model_us=100.0)
    assert runner._expected_s(trial) - runner._expected_s(
        SimpleNamespace(policy=once, model_us=100.0)
    ) == pytest.approx(100e-6)
    # A rehearsal's GPU-side time: two launches of the kernel, not one.
    slept: list[float] = []
    monkeypatch.setattr(sim_child.time, "sleep", slept.append)
    sim_child.init_device(0, "h100")
    sim_child._STATE["scale"] = 1.0
    sim_child.prepare_workload(WORKLOAD.canonical(), 0, None)
    for policy in (once, twice):
        answer = sim_child.run_trial(replace(spec(tmp_path, "ok", policy), model_us=1000.0))
        assert answer["status"] == "ok" and "samples_ms" not in answer
    assert slept[1] == pytest.approx(2 * slept[0])


# ---- the correctness phase --------------------------------------------------------------------


class InProcessRunner(KernelRunner):
    """KernelRunner's own verify, its trials run by the cupy child in this process (on the
    stand-in CuPy): the schedules named in ``dirty`` leave their workspace dirty."""

    name = "cupy"
    simulated_launch = False

    def __init__(self, tmp_path, dirty: set[str]):
        Runner.__init__(self)
        self.tmp_path, self.dirty = tmp_path, dirty
        self.conv_reference, self.last_prepare = "cublas", None
        self.policies: list[RepeatPolicy] = []

    @property
    def device_name(self) -> str:
        return "NVIDIA H100 80GB HBM3"

    def compile_ahead(self, workload, schedules) -> None:
        pass

    def run_trials(self, workload, schedules, policy):
        self.policies.append(policy)
        self.last_prepare = cupy_child.prepare_workload(workload.canonical(), 0, None)
        compiled = SimpleNamespace(registers=96, spill_bytes=0, smem_bytes=1024, compile_ms=1.0)
        results = []
        for s in schedules:
            behaviour = "dirty" if s.id in self.dirty else "tidy"
            answer = cupy_child.run_trial(spec(self.tmp_path, behaviour, policy, workload, s.id))
            results.append(trial_result(CallOutcome("ok", value=answer), compiled, self.name))
        return results


@pytest.fixture
def one_case(monkeypatch):
    """The correctness phase on the first GEMM case's first 8 schedules."""
    gpu = get_gpu("h100")
    case, workload, schedules = correctness.selection(gpu, ["tensor_gemm"])[0]
    chosen = [(case, workload, schedules[:8])]
    monkeypatch.setattr(correctness, "selection", lambda gpu, families: chosen)
    return gpu, chosen[0]


def test_the_correctness_phase_fails_a_kernel_that_leaves_its_workspace_dirty(
    cupy, tmp_path, one_case
):
    gpu, (_, _, schedules) = one_case
    runner = InProcessRunner(tmp_path, {schedules[3].id})
    doc = correctness.run_correctness(runner, gpu, ["tensor_gemm"])
    assert (doc["schedules"], doc["failed"]) == (8, 1) and doc["verdict"] != "pass"
    assert runner.policies and set(runner.policies) == {RepeatPolicy.verify_twice()}
    (mismatch,) = doc["mismatches"]
    assert mismatch["schedule"] == schedules[3].as_dict()
    assert mismatch["status"] == "wrong_result"
    assert mismatch["error"].startswith(
        f"right on the first run, wrong {cupy_child.SECOND_RUN_WRONG}"
    )
    assert cupy.state.launches == 2 * 8  # one launch more per kernel, no more


def test_the_correctness_phase_passes_kernels_right_on_both_runs(cupy, tmp_path, one_case):
    gpu, _ = one_case
    doc = correctness.run_correctness(InProcessRunner(tmp_path, set()), gpu, ["tensor_gemm"])
    assert (doc["schedules"], doc["failed"], doc["verdict"]) == (8, 0, "pass")
    assert doc["mismatches"] == []
