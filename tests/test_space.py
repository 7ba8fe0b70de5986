"""The schedule space: enumeration, resource validity, ids, features."""

from __future__ import annotations

import numpy as np
import pytest

from pipetune.model.hardware import get_gpu, gpu_keys
from pipetune.model.operators import ALCOP
from pipetune.model.space import (
    FEATURE_NAMES,
    KNOBS,
    Schedule,
    ScheduleError,
    Space,
    schedule_problems,
)
from pipetune.model.workloads import gemm


def test_full_grid_size_and_valid_subset(h100):
    assert np.prod([len(v) for v in KNOBS.values()]) == 3888
    space = Space.enumerate(gemm(4096, 4096, 4096), h100)
    assert 1000 < len(space) < 3888
    assert len(set(space.ids)) == len(space)


@pytest.mark.parametrize("gpu_key", gpu_keys())
def test_every_valid_schedule_fits_the_gpu(gpu_key):
    gpu = get_gpu(gpu_key, calibrated=False)
    space = Space.enumerate(gemm(2048, 2048, 2048), gpu)
    assert np.all(space.smem_bytes <= gpu.smem_per_block_bytes)
    assert np.all(space.est_registers <= gpu.max_registers_per_thread)
    assert np.all(space.blocks_per_sm >= 1)
    threads = 32 * space.warps
    assert np.all((space.block_m * space.block_k // 8) % threads == 0)
    for schedule in list(space)[:: max(1, len(space) // 50)]:
        assert schedule_problems(schedule, space.workload, gpu) == []


def test_invalid_schedules_say_why(h100):
    big = Schedule(4, 4, 4, 4, 8, 6, 2)  # 256x256x128 tiles, six stages: 1.5 MiB of smem
    problems = schedule_problems(big, gemm(4096, 4096, 4096), h100)
    assert "shared memory per block over the limit" in problems
    overhang = Schedule(1, 4, 1, 4, 1, 2, 1)  # BN = 256 for N = 64
    assert "tile overhangs the problem" in schedule_problems(overhang, gemm(1024, 64, 2048), h100)
    deep = Schedule(1, 1, 1, 1, 4, 4, 1)  # BK = 64 and K = 64: one K tile, four stages
    assert "more pipeline stages than K tiles" in schedule_problems(
        deep, gemm(1024, 1024, 64), h100
    )


def test_schedule_ids_are_stable_and_documents_are_validated():
    s = Schedule.from_dict(
        {
            "block_row_warps": 2,
            "block_col_warps": 2,
            "warp_row_tiles": 4,
            "warp_col_tiles": 2,
            "chunk": 2,
            "smem_stages": 3,
            "reg_stages": 2,
        }
    )
    assert s.id == "s-2-2-4-2-2-3-2"
    assert (s.block_m, s.block_n, s.block_k, s.threads) == (128, 64, 32, 128)
    assert s.hash == Schedule.from_dict(s.as_dict()).hash
    for bad, message in (
        ({**s.as_dict(), "chunk": 3}, "chunk must be one of"),
        ({**s.as_dict(), "unroll": 1}, "unknown knob"),
        ({k: v for k, v in s.as_dict().items() if k != "reg_stages"}, "missing knob"),
        ({**s.as_dict(), "reg_stages": 2.0}, "reg_stages must be one of"),
    ):
        with pytest.raises(ScheduleError, match=message):
            Schedule.from_dict(bad)


def test_features_are_numeric_and_named(h100):
    space = Space.enumerate(gemm(1024, 768, 3072), h100)
    f = space.features()
    assert f.shape == (len(space), len(FEATURE_NAMES))
    assert np.isfinite(f).all()
    col = FEATURE_NAMES.index("smem_bytes")
    assert np.array_equal(f[:, col], space.smem_bytes)


@pytest.mark.parametrize("gpu_key", gpu_keys())
def test_every_benchmark_operator_has_a_space(gpu_key):
    gpu = get_gpu(gpu_key, calibrated=False)
    for name, workload in ALCOP.items():
        assert len(Space.enumerate(workload, gpu)) > 100, name
