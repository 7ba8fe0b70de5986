"""A kernel whose blocks wait for each other (fused split rows) is launched cooperatively.

Its blocks spin until every block of the row has added its partials, so all must be resident
at once. pipetune.kernel launched it with a plain cuLaunchKernel: beside the caller's own work
on other streams some blocks may never be scheduled, and the rest spin for ever. With
cuLaunchCooperativeKernel the driver refuses a grid that cannot be resident instead. The
launch JSON says so, for a user's own launcher. (The driver is faked: no GPU here.)
"""

from __future__ import annotations

import contextlib
import types

import pytest

from pipetune.clients.library import cuda_launch
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.space import MemSchedule, MemSpace
from pipetune.model.memops.workloads import layernorm, reduce, softmax
from pipetune.model.space import Space
from pipetune.model.workloads import gemm
from pipetune.workers.codegen import generate as generate_gemm
from pipetune.workers.codegen import launch_plan as gemm_launch_plan
from pipetune.workers.codegen import stratified_sample
from pipetune.workers.codegen.memops import generate, launch_plan, shape_notes
from pipetune.workers.codegen.memops.generator import blocks_wait_for_each_other

FUSED_SPLIT = (softmax(3, 4200), MemSchedule(64, 1, 4, 8, 2, 1, 1))  # 4 blocks a row, fused
ONE_BLOCK_A_ROW = (softmax(37, 200), MemSchedule(32, 1, 1, 1, 0, 0, 0))


def _plan(workload, schedule):
    return launch_plan(generate(workload, schedule), workload, sm_count=132, blocks_per_sm=4)


def test_only_a_fused_split_rows_launch_is_cooperative():
    kernel = generate(*FUSED_SPLIT)
    assert blocks_wait_for_each_other(kernel)
    first = _plan(*FUSED_SPLIT).launches[0]
    assert first.cooperative and first.as_dict()["cooperative"] is True
    plain = _plan(*ONE_BLOCK_A_ROW).launches[0]
    assert not blocks_wait_for_each_other(generate(*ONE_BLOCK_A_ROW))
    assert not plain.cooperative and "cooperative" not in plain.as_dict()


class _FakeDriver:
    """cuda.bindings.driver's launch calls, recorded; every call succeeds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)

    def CUstream(self, handle: int) -> int:
        return handle

    def cuLaunchKernel(self, *args):
        self.calls.append(("cuLaunchKernel", args))
        return (0,)

    def cuLaunchCooperativeKernel(self, *args):
        self.calls.append(("cuLaunchCooperativeKernel", args))
        return (0,)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> _FakeDriver:
    fake = _FakeDriver()
    monkeypatch.setattr(cuda_launch, "_driver", lambda: fake)
    monkeypatch.setattr(cuda_launch, "_current", lambda device: contextlib.nullcontext())
    return fake


def _launch(config) -> None:
    pointers = [0x1000 * (i + 1) for i in range(len(config.pointer_arguments))]
    cuda_launch.launch(0, "function", config, pointers, stream=7)


def test_the_library_launches_a_cooperative_kernel_cooperatively(driver):
    config = _plan(*FUSED_SPLIT).launches[0]
    _launch(config)
    [(name, args)] = driver.calls
    assert name == "cuLaunchCooperativeKernel"
    # (f, grid x3, block x3, dynamic smem, stream, kernelParams): no `extra` argument
    assert args[:9] == ("function", *config.grid, *config.block, config.smem_bytes, 7)
    assert len(args) == 10


def test_other_kernels_keep_the_plain_launch(driver):
    workload = gemm(256, 256, 256)
    schedule = stratified_sample(Space.enumerate(workload, get_gpu("h100", calibrated=False)), 1)[0]
    gemm_config = gemm_launch_plan(generate_gemm(workload, schedule), workload).launches[0]
    for config in (_plan(*ONE_BLOCK_A_ROW).launches[0], gemm_config):
        _launch(config)
    assert [name for name, _ in driver.calls] == ["cuLaunchKernel", "cuLaunchKernel"]
    assert all(len(args) == 11 and args[-1] == 0 for _, args in driver.calls)  # extra = NULL


@pytest.mark.parametrize(
    "workload",
    [softmax(4096, 8192), layernorm(4096, 8192), reduce(4096, 8192), reduce(128, 1048576, "max")],
    ids=lambda w: w.label(),
)
def test_cooperative_exactly_where_a_rows_blocks_wait_and_then_one_wave(workload):
    """Every valid schedule of the space: cooperative where the space says a row's blocks
    wait for each other (fused splitting of an op with an output pass), and then a grid the
    driver can hold at once. A fused reduce was marked cooperative too, with a grid of many
    waves: the model's own pick for reduce 128x1048576 (16,384 blocks against one wave of
    3,300) was refused by cuLaunchCooperativeKernel at every call of pipetune.kernel."""
    space = MemSpace.enumerate(workload, get_gpu("h100"))
    waits = space.geometry.fused_wait
    assert waits.any() == workload.has_output_pass
    cooperative_seen = plain_fused_seen = 0
    for i in range(len(space)):
        schedule = space[i]
        bps = int(space.blocks_per_sm[i])
        plan = launch_plan(generate(workload, schedule), workload, 132, bps)
        first = plan.launches[0]
        assert first.cooperative == bool(waits[i]), schedule.id
        if first.cooperative:
            cooperative_seen += 1
            assert first.grid[0] <= 132 * bps, schedule.id
        elif schedule.blocks_per_row > 1 and schedule.split_mode == 1:
            plain_fused_seen += 1
            notes = " ".join(shape_notes(generate(workload, schedule), workload))
            assert "wait for each other" not in notes, schedule.id
    # (Both kinds are in the spaces checked: the check saw what it is about.)
    assert cooperative_seen if workload.has_output_pass else plain_fused_seen


# ---- the cupy runner's child (the workers' and the campaign's launches) ---------------------


@pytest.mark.parametrize("cooperative", [True, False])
def test_the_worker_launches_a_cooperative_kernel_cooperatively(cooperative, monkeypatch, tmp_path):
    """The cupy runner's child made every launch through the RawKernel's call, a plain
    cuLaunchKernel, where pipetune.kernel launches a kernel whose blocks wait for each other
    cooperatively: on a GPU shared with other work its trial could spin until its timeout
    instead of being refused. (CuPy's stand-in, tests/fake_cupy.py: its loaded function
    records how each launch was made; a GEMM's plan marked cooperative stands for one.)"""
    import sys
    from dataclasses import replace

    import fake_cupy

    from pipetune.workers.runners import cupy_child
    from pipetune.workers.runners.timing import RepeatPolicy

    fake = fake_cupy.make()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cupy_child, "MIN_FLUSH_BYTES", 1 << 16)
    workload = gemm(64, 32, 48)
    cupy_child.init_device(0)
    cupy_child.prepare_workload(workload.canonical(), 0, None)
    schedule = stratified_sample(Space.enumerate(workload, get_gpu("h100", calibrated=False)), 1)[0]
    plan = gemm_launch_plan(generate_gemm(workload, schedule), workload)
    plan = replace(plan, launches=(replace(plan.launches[0], cooperative=cooperative),))
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"ok\n")
    spec = cupy_child.TrialSpec(
        workload_hash=workload.workload_hash,
        schedule_id=schedule.id,
        cubin_path=str(cubin),
        plan=plan,
        policy=RepeatPolicy(warmup=1, min_repeats=5, max_repeats=10, settle=0.03),
    )
    answer = cupy_child.run_trial(spec)
    assert answer["status"] == "ok", answer
    launches = fake.state.cooperative
    assert len(launches) >= 6  # the checked run, the warm-up and the timed ones
    assert set(launches) == {cooperative}
